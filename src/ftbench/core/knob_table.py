"""Every knob a variant can set, declared once: its name, its type and default, what it does in words, its values
in config's schema, and the runners that honour it with the values each honours. ftbench.core.knobs makes the
`Variant` type and `HONOURED` from this table, ftbench.config.settings the schema's variant block
(`schema_properties`, over config/schema/config.schema.yaml), and docs/techniques.md lists it (`knobs_page`)."""

from __future__ import annotations

from dataclasses import dataclass

ANY = None  # any value of the knob's type
FAMILIES = ("causal_lm", "lmm", "diffusion")  # the runners: TRL's SFTTrainer, the LLaVA-NeXT loop, diffusers' recipe
# every runner: the supervisor (time limit, allocator), the Meter (gc freeze), torch.compile's backend, the run's
# settings (seed, steps)
EVERY = {family: ANY for family in FAMILIES}


@dataclass(frozen=True)
class Knob:
    name: str
    type: str  # its Python annotation, as the Variant type declares it
    default: object
    words: str  # what it does, as the schema and the docs say it
    schema: dict  # its JSON schema beyond its type and words (enum, bounds; a type of its own where it is narrower)
    honoured: dict  # runner family -> the values it honours (ANY: every value of its type); absent: it does not act


K = Knob
KNOBS = [
    K("peft", "str", "lora",
      'lora | none',
      {'enum': ['lora', 'none']},
      {"causal_lm": {'lora', 'none'}, "lmm": {'lora', 'none'}, "diffusion": {'lora'}}),
    K("precision", "str", "bf16",
      'bf16 | fp16 | fp32 | nf4 | fp8',
      {'enum': ['bf16', 'fp16', 'fp32', 'nf4', 'fp8']},
      {"causal_lm": {'bf16', 'fp16', 'fp32', 'fp8', 'nf4'},
       "lmm": {'bf16', 'fp32', 'fp8', 'nf4'},
       "diffusion": {'bf16', 'fp16', 'fp32'}}),
    K("nf4_compute", "str", "bf16",
      "QLoRA's compute dtype (bitsandbytes' bnb_4bit_compute_dtype; precision nf4 only), bf16 as published",
      {'enum': ['bf16', 'fp32']},
      {"causal_lm": ANY, "lmm": ANY}),
    K("kbit_upcast", "bool", True,
      "nf4, causal LM: PEFT's k-bit preparation casts the parameters it does not quantize (embeddings, LM head, "
      "norms) to fp32 (true, PEFT's default); false keeps them in the compute dtype, as Unsloth's 4-bit models "
      'do',
      {},
      {"causal_lm": ANY}),
    K("fp8_backend", "str | None", None,
      'te | torchao (precision fp8 only)',
      {'enum': ['te', 'torchao', None]},
      {"causal_lm": ANY, "lmm": ANY}),
    K("fp8_recipe", "str", "delayed",
      'Transformer Engine: delayed | current | block scaling (ftbench.core.knobs.TE_RECIPES); torchao: delayed (its '
      'default, tensorwise dynamic) | tensorwise | rowwise | static (the frozen weights cast to FP8 once, '
      'ftbench.build.fp8.StaticFP8Linear)',
      {'enum': ['delayed', 'current', 'block', 'static', 'tensorwise', 'rowwise']},
      {"causal_lm": {'block', 'current', 'delayed', 'rowwise', 'static', 'tensorwise'},
       "lmm": {'current', 'delayed'}}),
    K("fp8_vision", "bool", False,
      'FP8 for the vision tower too (LMM)',
      {},
      {"lmm": ANY}),
    K("fp8_transpose_once", "bool", False,
      "fp8_recipe static: each FP8 weight's transpose (the backward's operand) kept from the start rather than "
      'made in every backward; the same numbers',
      {},
      {"causal_lm": ANY}),
    K("fp8_weights_only", "bool", False,
      "fp8_backend te: the frozen weights held in FP8 alone, cast once as the layers are built (Transformer Engine's "
      "quantized_model_init, its way for LoRA-like fine-tuning, where the base does not change): no bf16 copy "
      "beside them and no cast of them in each GEMM; meant to give the same numbers (the quality study's one seed "
      "checks it)",
      {},
      {"causal_lm": ANY}),
    K("fp8_until", "float | None", None,
      "fp8_recipe static: the share of the optimizer steps that run the frozen GEMMs in FP8; from the step after, "
      "they run in bf16 from the kept bf16 weights, so the adapters' last steps train on the base they are served "
      "on; 0: bf16 from the first step (the tail's own phase, for its speed: a tail's speed is the mix of its two "
      "phases, each measured alone); null: FP8 throughout",
      {'minimum': 0, 'exclusiveMaximum': 1},
      {"causal_lm": ANY}),
    K("fp8_activation_scaling", "str", "tensorwise",
      'fp8_recipe static: activations and output gradients scaled tensorwise (one scale a tensor) or rowwise '
      '(one a token: amax and cast in one pass); the weights stay tensorwise',
      {'enum': ['tensorwise', 'rowwise']},
      {"causal_lm": {'rowwise', 'tensorwise'}}),
    K("fp8_fast_accum", "str | None", None,
      "fp8_recipe static: which FP8 GEMMs run with the tensor cores' fast accumulation: forward (torchao's "
      'default for its output GEMM) or all; null: none',
      {'enum': ['forward', 'all', None]},
      {"causal_lm": {None, 'all', 'forward'}}),
    K("fp8_grads", "str", "e5m2",
      "fp8_recipe static: the backward's GEMM: the output's gradient in e5m2 (the hybrid format), e4m3 "
      "(torchao's rowwise recipe, DeepSeek-V3), or bf16 (FP8 in the forward only, from the kept bf16 weight)",
      {'enum': ['e5m2', 'e4m3', 'bf16']},
      {"causal_lm": {'bf16', 'e4m3', 'e5m2'}}),
    K("fp8_weight_scaling", "str", "tensorwise",
      "fp8_recipe static: the frozen weights' scales: tensorwise, or channel (a scale an output channel for the "
      "forward's copy, an input channel for the backward's kept transpose; activations and gradients a scale a "
      'token)',
      {'enum': ['tensorwise', 'channel']},
      {"causal_lm": {'channel', 'tensorwise'}}),
    K("lm_head", "str | None", None,
      "causal LM, PEFT, trainer_metrics false: the LM head's loss in two GEMMs a chunk of tokens, the hidden "
      "states' gradient formed in the forward (Liger Kernel's fused linear cross-entropy scheme; "
      "ftbench.build.head); null: TRL's fused head (three GEMMs); two-gemm: bf16 GEMMs; fp8: FP8 GEMMs, the "
      "head's weight cast once (precision fp8)",
      {'enum': ['two-gemm', 'fp8', None]},
      {"causal_lm": {None, 'fp8', 'two-gemm'}}),
    K("compile", "str | None", None,
      'None | default | reduce-overhead | max-autotune',
      {'enum': ['default', 'reduce-overhead', 'max-autotune', None]},
      {"causal_lm": ANY, "lmm": ANY, "diffusion": ANY}),
    K("compile_backend", "str", "inductor",
      "torch.compile's backend (compiled variants only); aot_eager captures graphs without code generation",
      {'enum': ['inductor', 'aot_eager']},
      EVERY),
    K("compile_scope", "str", "model",
      'model: one torch.compile of the whole model; layers: each repeated block (decoder and vision-encoder '
      'layers) compiled on its own, one graph shared by all layers (regional compilation; LMM and causal LM)',
      {'enum': ['model', 'layers']},
      {"causal_lm": {'layers', 'model'}, "lmm": {'layers', 'model'}}),
    K("coordinate_descent_tuning", "bool", False,
      'compile_scope layers, Inductor: coordinate-descent tuning of each Triton kernel Inductor generates (its '
      'block sizes and warps)',
      {},
      {"causal_lm": ANY}),
    K("shape_policy", "str", "dynamic",
      'dynamic (AnyRes, dynamic padding) | fixed | bucketed',
      {'enum': ['dynamic', 'fixed', 'bucketed']},
      {"causal_lm": {'bucketed', 'dynamic', 'fixed'}, "lmm": {'bucketed', 'dynamic', 'fixed'}}),
    K("sdpa_backend", "str | None", None,
      'None (PyTorch picks) | flash | efficient | cudnn | math',
      {'enum': ['flash', 'efficient', 'cudnn', 'math', None]},
      {"causal_lm": ANY, "lmm": ANY, "diffusion": ANY}),
    K("framework", "str", "hf",
      "hf (transformers and PEFT) | unsloth (Unsloth's FastLanguageModel) | nemo (NVIDIA NeMo AutoModel's model "
      'build and LoRA, in envs/nemo.yaml)',
      {'enum': ['hf', 'unsloth', 'nemo']},
      {"causal_lm": {'hf', 'nemo', 'unsloth'}}),
    K("gradient_checkpointing", "bool", False,
      "activation (gradient) checkpointing: each layer's activations recomputed in the backward rather than kept",
      {},
      {"causal_lm": ANY, "lmm": ANY, "diffusion": ANY}),
    K("checkpoint_policy", "str", "full",
      "with gradient_checkpointing: full (the backward recomputes each layer's forward) or selective (GEMM and "
      "attention outputs kept, the ops between them recomputed; PyTorch's selective activation checkpointing)",
      {'enum': ['full', 'selective']},
      {"causal_lm": {'full', 'selective'}}),
    K("padding_free", "bool", False,
      'causal LM only; one row of concatenated sequences a batch (TRL padding_free)',
      {},
      {"causal_lm": ANY}),
    K("liger", "bool", False,
      "causal LM only; Liger Kernel's fused RMSNorm, SwiGLU, RoPE (CUDA)",
      {},
      {"causal_lm": ANY}),
    K("token_budget", "int | None", None,
      'causal LM with padding_free: sequences packed whole (best fit decreasing) into rows of this many tokens, '
      'each row padded to exactly this many; a batch of B rows is one row of B x token_budget tokens, so every '
      'step has one shape',
      {'minimum': 64},
      {"causal_lm": ANY}),
    K("pack_order", "str | None", None,
      "causal LM with token_budget: how sequences are dealt to the rows; null: TRL's best fit decreasing (longest "
      "first: rows of like lengths, the same rows under every seed, a short remainder row); shuffled: in the run's "
      "seeded random order, each whole into the first row with room (first fit), the rows filled evenly where that "
      "costs no row (ftbench.data.packing.first_fit), so a row mixes lengths as a padded batch does and each seed "
      "packs other rows",
      {'enum': ['shuffled', None]},
      {"causal_lm": ANY}),
    K("trainer_metrics", "bool", True,
      "causal LM: TRL's per-step entropy and token-accuracy metrics (each read with .item(): two host syncs a "
      "step); false computes the same loss from TRL's fused LM head without them",
      {},
      {"causal_lm": ANY}),
    K("sync_free", "bool", False,
      "causal LM: no host sync between a step's backward and the next forward (variable-length attention's "
      "boundaries computed in the loader's collator on the host; the Trainer's per-step NaN/Inf check of the "
      'loss off), so the host queues the next step while the GPU runs this one',
      {},
      {"causal_lm": ANY}),
    K("activation_offloading", "bool", False,
      "causal LM; the saved activations go to pinned host memory, overlapped with compute (TRL's)",
      {},
      {"causal_lm": ANY}),
    K("optim", "str | None", None,
      'the optimizer (a transformers optim name, e.g. adamw_torch_fused), over training.optim',
      {},
      {"causal_lm": ANY}),
    K("fused_projections", "bool", False,
      'causal LM: q/k/v and gate/up each as one GEMM over weights concatenated once at load, LoRA kept per '
      "projection (adapters saved in PEFT's format)",
      {},
      {"causal_lm": ANY}),
    K("fused_adapters", "bool", False,
      'causal LM: the LoRA A matrices of q/k/v and of gate/up as one GEMM each, the frozen projections as they '
      'are',
      {},
      {"causal_lm": ANY}),
    K("lora_epilogue", "bool", False,
      "fused_adapters or fused_projections: each projection's LoRA product added to its frozen output by the "
      'LoRA B GEMM (addmm) rather than by a pass of its own',
      {},
      {"causal_lm": ANY}),
    K("lora_b_one_read", "bool", False,
      "fused_adapters or fused_projections, CUDA: every LoRA product's backward (o_proj's and down_proj's too) "
      "reads its output gradient once for B's gradient and the gradient into the adapter's rank (one Triton "
      'kernel where autograd runs two GEMMs)',
      {},
      {"causal_lm": ANY}),
    K("experts", "str", "loop",
      "gpt-oss's frozen experts: loop (one at a time) | grouped (one grouped GEMM per projection per layer)",
      {'enum': ['loop', 'grouped']},
      {"causal_lm": {'grouped', 'loop'}}),
    K("expert_lora", "bool", False,
      "mixture of experts: LoRA on each expert's projections too (PEFT: gpt-oss with experts grouped; Unsloth: "
      "the MLP target names kept, which it maps onto every expert; false: attention only, as the study's "
      'Unsloth)',
      {},
      {"causal_lm": ANY}),
    K("unsloth_compile", "bool", True,
      "framework unsloth: Unsloth's own torch.compile of the model's modules (default true, as Unsloth runs); "
      'false sets UNSLOTH_COMPILE_DISABLE=1 before Unsloth is imported',
      {},
      {"causal_lm": ANY}),
    K("attention", "str", "mask",
      'how attention keeps sequences apart: mask (padding or block-diagonal mask), varlen (causal LM with '
      'padding_free: per-sequence variable-length kernel, no mask), causal (LMM: right padding, causal mask '
      'only)',
      {'enum': ['mask', 'varlen', 'causal']},
      {"causal_lm": {'mask', 'varlen'}, "lmm": {'causal', 'mask'}}),
    K("flash_impl", "str | None", None,
      "causal LM with attention varlen: the flash attention implementation of the job (null: PyTorch's own, "
      "FlashAttention-2; fa4: flash-attn-4's CuTe kernels for Hopper and Blackwell, its varlen forward and "
      'backward)',
      {'enum': ['fa4', None]},
      {"causal_lm": {None, 'fa4'}}),
    K("dataloader_workers", "int", 0,
      'data-loader worker processes (0: batches made in the training process)',
      {'minimum': 0},
      {"causal_lm": ANY, "lmm": ANY, "diffusion": ANY}),
    K("pin_memory", "bool", False,
      'batches in page-locked host memory, copied to the GPU without blocking',
      {},
      {"causal_lm": ANY, "lmm": ANY, "diffusion": ANY}),
    K("cached_latents", "bool", False,
      'diffusion: train from pre-encoded latents',
      {},
      {"diffusion": ANY}),
    K("clip_grad_sync_free", "bool", False,
      'diffusion: clip gradients without a host sync',
      {},
      {"diffusion": ANY}),
    K("channels_last", "bool", False,
      'diffusion: UNet, VAE and their inputs in channels-last (NHWC) memory format',
      {},
      {"diffusion": ANY}),
    K("gc_freeze", "bool", False,
      "the objects alive once the model, data and trainer are built moved to Python's permanent GC generation "
      '(gc.freeze): full collections no longer walk them',
      {},
      EVERY),
    K("time_limit_s", "float | None", None,
      "this variant's time budget in seconds (over the study's training.time_limit_s)",
      {'type': 'number', 'exclusiveMinimum': 0},
      EVERY),
    K("expandable_segments", "bool", False,
      "the CUDA caching allocator's expandable segments in the training process "
      '(PYTORCH_ALLOC_CONF=expandable_segments:True, set by the supervisor)',
      {},
      EVERY),
    K("gpus", "int", 1,
      'GPUs (ranks) the job trains on, launched by the job itself (torchrun); more than 1 needs parallel',
      {'minimum': 1},
      {"causal_lm": ANY}),
    K("nodes", "int", 1,
      "torchrun launchers the job's ranks are spread over (gpus / nodes ranks each), joined by c10d rendezvous; "
      'srun starts them inside a SLURM allocation, else they start side by side on this host',
      {'minimum': 1},
      {"causal_lm": ANY}),
    K("parallel", "str | None", None,
      'ddp: data parallel, a whole model per GPU; fsdp2: parameters, gradients and optimizer state sharded over '
      'the GPUs (PyTorch FSDP2 through accelerate). Causal LM only',
      {'enum': ['ddp', 'fsdp2', None]},
      {"causal_lm": {None, 'ddp', 'fsdp2'}}),
    K("ddp_bucket_mb", "int | None", None,
      "data parallel's gradient bucket size in MB: unset keeps DDP's 25 MB (all-reduced during the backward as "
      'each fills); one larger than the trainable gradients makes a single all-reduce after it',
      {'minimum': 1},
      {"causal_lm": ANY}),
    K("ddp_graph_split", "bool", False,
      "Dynamo's DDPOptimizer under data parallel: each compiled graph split at DDP's bucket boundaries "
      "(Dynamo's default); false (here the default) compiles each graph whole",
      {},
      {"causal_lm": ANY}),
    K("balance_ranks", "bool", False,
      "several ranks on rows of a token budget: each step's rows dealt so that the ranks' attention work is "
      "even (the step's rows stay the same)",
      {},
      {"causal_lm": ANY}),
    K("seed", "int | None", None,
      "the run's seed (LoRA's initial A, the data order), over config's seed (the quality study's seeds of its "
      'baseline)',
      {},
      EVERY),
    K("steps_scale", "float | None", None,
      "the run's steps times this, the learning rate's schedule stretched over them: the quality study's longer "
      'arm',
      {'exclusiveMinimum': 0},
      EVERY),
]
BY_NAME = {k.name: k for k in KNOBS}


JSON_TYPES = {"bool": "boolean", "int": "integer", "float": "number", "str": "string"}


def json_type(annotation: str):
    """A knob's JSON schema type from its Python annotation: "int | None" -> ["integer", "null"]."""
    parts = [p.strip() for p in annotation.split("|")]
    types = [JSON_TYPES[p] for p in parts if p != "None"]
    return [*types, "null"] if "None" in parts else types[0]


def schema_properties() -> dict:
    """The schema's properties of a variant's knobs: the type its annotation says (unless its schema narrows it),
    its words as the description, and the rest of its schema."""
    return {k.name: {"description": k.words, "type": json_type(k.type), **k.schema} for k in KNOBS}


def knobs_page() -> list[str]:
    """The knobs as a Markdown table: name, type, default, the runners that honour it, what it does."""
    rows = ["| knob | type | default | honoured by | what it does |", "|---|---|---|---|---|"]
    for k in KNOBS:
        who = "every runner" if k.honoured == EVERY else ", ".join(
            f.replace("_", " ") + ("" if v is ANY else " (" + ", ".join(str(x) for x in sorted(v, key=str)) + ")")
            for f, v in k.honoured.items())
        rows.append(f"| `{k.name}` | `{k.type}` | `{k.default!r}` | {who} | {k.words.replace('|', '/')} |")
    return rows
