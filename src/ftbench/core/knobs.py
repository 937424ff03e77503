"""Variants as data: the knobs a variant sets (`Variant`) and the knobs each runner honours, declared in one place
the config check reads before any job runs. A leaf module: ftbench.config.settings imports it, never the other way.

A variant whose knob a runner does not act on is refused (a config error naming the variant and the knob),
never silently trained as something else. Machine-dependent limits (no CUDA, compute capability, missing
library) are not config errors: the job records them as `unsupported` (ftbench.build.variants.check_supported).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


class ConfigError(ValueError):
    """A config that is wrong in a way the JSON schema cannot see."""


@dataclass(frozen=True)
class Variant:
    """One named set of knobs; every key of a variant in config maps to a field here."""

    name: str
    peft: str = "lora"  # lora | none
    precision: str = "bf16"  # bf16 | fp16 | fp32 | nf4 | fp8
    nf4_compute: str = "bf16"  # nf4: the dtype 4-bit weights dequantize to for each GEMM (bf16 | fp32)
    # nf4, causal LM: PEFT's k-bit preparation casts every parameter it does not quantize (embeddings, LM head,
    # norms) to fp32; false keeps them in the compute dtype, as Unsloth's 4-bit models do
    kbit_upcast: bool = True
    fp8_backend: str | None = None  # te | torchao (precision fp8 only)
    # delayed | current (Transformer Engine's scaling); torchao (causal LM): delayed is its default config
    # (tensorwise dynamic scaling), or tensorwise | rowwise by name (torchao's Float8LinearConfig recipes), or
    # static: the frozen weights cast to FP8 once, activations and gradients tensorwise per step (ftbench.build.fp8)
    fp8_recipe: str = "delayed"
    fp8_vision: bool = False  # FP8 for the vision tower too (LMM)
    # fp8_recipe static (causal LM): each FP8 weight's transpose, the backward's GEMM operand, kept from the start
    # (+1 byte a weight) rather than made in every backward (a read and a write of every FP8 weight a step); the same
    # numbers bit for bit (ftbench.build.fp8.StaticFP8Linear)
    fp8_transpose_once: bool = False
    # fp8_recipe static: how activations and output gradients are scaled each step: tensorwise (one scale a tensor:
    # its amax, a reduction over all of it, before the cast) | rowwise (one scale a row, a token: amax and cast in one
    # pass); the weights stay tensorwise (ftbench.build.fp8.StaticFP8Linear)
    fp8_activation_scaling: str = "tensorwise"
    # fp8_recipe static: which FP8 GEMMs run with the tensor cores' fast accumulation: None (every one exact) |
    # forward (the forward's, as torchao's default config runs its output GEMM; the backward's exact) | all
    fp8_fast_accum: str | None = None
    # fp8_recipe static: the backward's GEMM (the input's gradient): e5m2 (the output's gradient cast to e5m2, the
    # hybrid format) | e4m3 (e4m3, as torchao's rowwise recipe and DeepSeek-V3 cast gradients) | bf16 (FP8 in the
    # forward only: the gradient from the kept bf16 weight)
    fp8_grads: str = "e5m2"
    # fp8_recipe static: the frozen weights' scales: tensorwise (one a weight) | channel (one an output channel for
    # the forward's copy, one an input channel for the backward's, kept transposed: ftbench.build.fp8.frozen_fp8_channels;
    # activations and gradients then a scale a token)
    fp8_weight_scaling: str = "tensorwise"
    # causal LM, PEFT, without trainer metrics: the LM head's loss in two GEMMs a chunk of tokens, the hidden states'
    # gradient formed in the forward (Liger Kernel's fused linear cross-entropy scheme, its cross-entropy kernel)
    # rather than TRL's fused head's three (None) | two-gemm (bf16 GEMMs) | fp8 (FP8 GEMMs, the head's weight cast
    # once; precision fp8): ftbench.build.head
    lm_head: str | None = None
    compile: str | None = None  # None | default | reduce-overhead | max-autotune
    compile_backend: str = "inductor"  # torch.compile's backend: inductor | aot_eager (graphs captured, no codegen)
    compile_scope: str = "model"  # model (one torch.compile of the whole model) | layers (each repeated block)
    # Inductor's coordinate-descent tuning of each Triton kernel it generates (block sizes, warps: its config
    # coordinate_descent_tuning), GEMMs left to cuBLAS and CUTLASS; compile_scope layers
    coordinate_descent_tuning: bool = False
    shape_policy: str = "dynamic"  # dynamic (AnyRes, dynamic padding) | fixed | bucketed
    sdpa_backend: str | None = None  # None (PyTorch picks) | flash | efficient | cudnn | math
    # hf | unsloth | nemo (NVIDIA NeMo AutoModel: the model built by its NeMoAutoModelForCausalLM.from_pretrained,
    # which applies its kernel patches, and LoRA from its own PeftConfig with its Triton kernels, as its LoRA
    # benchmark recipe sets them; trained in the TRL loop; in its own environment, envs/nemo.yaml: its transformers pin)
    framework: str = "hf"
    gradient_checkpointing: bool = False
    # with gradient_checkpointing, what the backward recomputes: full (the whole layer's forward) | selective (the
    # GEMM and attention outputs are kept, the cheap ops between them recomputed: PyTorch's selective activation
    # checkpointing; causal LM)
    checkpoint_policy: str = "full"
    padding_free: bool = False  # causal LM: a batch is one row of concatenated sequences (position ids restart)
    liger: bool = False  # causal LM: Liger Kernel's fused RMSNorm, SwiGLU and RoPE (Triton, CUDA only)
    # causal LM, padding-free: rows of exactly this many tokens (sequences packed whole, best fit decreasing; the
    # tail padded, not counted as real tokens): one shape for every step (ftbench.data.packing); with framework unsloth
    # the same rows, unpadded, reach Unsloth's own packed attention (each sequence's length from the row)
    token_budget: int | None = None
    # causal LM: TRL's per-step entropy/accuracy metrics (two host syncs a step); false also lists the model's
    # parameters once for the Trainer's per-step FLOP total and gradient clipping, where the Trainer walks every
    # module each step (~0.1-0.25 s a step on gpt-oss-120b)
    trainer_metrics: bool = True
    # causal LM: no host sync between a step's backward and the next forward, so the host queues the next step
    # while the GPU still runs this one: variable-length attention's boundaries computed in the loader's collator
    # from host tensors (else from the batch the loader already moved to the GPU: two syncs a step), and the
    # Trainer's per-step NaN/Inf check of the loss off (TrainingArguments.logging_nan_inf_filter: one sync a step);
    # with pin_memory, the loader's copies to the GPU non-blocking too (accelerate's non_blocking)
    sync_free: bool = False
    activation_offloading: bool = False  # causal LM: saved activations in pinned host memory (TRL's offloading)
    optim: str | None = None  # the optimizer (a transformers optim name), over training.optim
    fused_projections: bool = False  # causal LM: q/k/v and gate/up as one GEMM each, LoRA per projection
    # causal LM: the LoRA A matrices of q/k/v and of gate/up as one GEMM each, the frozen projections as they are
    # (ftbench.build.fused, frozen=False)
    fused_adapters: bool = False
    # fused_adapters or fused_projections: each projection's LoRA product added to its frozen output by the LoRA B
    # GEMM itself (addmm: cuBLAS's beta = 1 epilogue) rather than by a pass of its own over the output
    lora_epilogue: bool = False
    # fused_adapters or fused_projections: every LoRA product's backward (o_proj's and down_proj's too) reads its
    # output gradient once for both B's gradient and the gradient into the adapter's rank (one Triton kernel where
    # autograd runs two GEMMs over it: ftbench.build.lora_grads); CUDA only
    lora_b_one_read: bool = False
    # gpt-oss's frozen experts: loop (one expert at a time, ~10 launches each) | grouped (one grouped GEMM per
    # projection per layer over all experts, weights dequantized inside it: ftbench.build.experts.SplitExperts)
    experts: str = "loop"
    # mixture of experts: LoRA on each expert's projections too. PEFT (gpt-oss, experts grouped): gate_up and down
    # as grouped GEMMs (PEFT's names miss the split experts); Unsloth: the MLP target names kept, which its current
    # release maps onto every expert (false: they are left out, attention only, as the study's Unsloth adapted)
    expert_lora: bool = False
    # framework unsloth: Unsloth's own torch.compile of the model's modules (its unsloth_compiled_cache), on by
    # default as Unsloth runs; false sets UNSLOTH_COMPILE_DISABLE=1 before Unsloth is imported (on gpt-oss-120b, with
    # torch 2.11, a guard of its compiled router raised StopIteration at the third step, 2026-11-25)
    unsloth_compile: bool = True
    # how attention keeps a batch's sequences apart: mask (a padding or block-diagonal mask: SDPA's masked
    # kernels) | varlen (causal LM, padding-free: per-sequence kernel on the cumulative lengths, no mask;
    # ftbench.build.attention) | causal (LMM: no padding mask, the causal one alone; right padding means no real token
    # sees the pads after it, and pads carry no labels)
    attention: str = "mask"
    # causal LM, attention varlen: the flash attention implementation of the job (None:
    # PyTorch's own, FlashAttention-2) | fa4 (flash-attn-4's CuTe kernels for Hopper and Blackwell, its own varlen
    # forward and backward: ftbench.build.attention.fa4_varlen)
    flash_impl: str | None = None
    dataloader_workers: int = 0
    pin_memory: bool = False
    cached_latents: bool = False  # diffusion: train from pre-encoded latents
    clip_grad_sync_free: bool = False  # diffusion: clip gradients without a host sync
    # diffusion: the UNet and VAE weights and their inputs in channels-last (NHWC) memory format, the layout cuDNN's
    # convolutions run in on tensor cores (NCHW tensors are converted around every convolution)
    channels_last: bool = False
    # the objects alive once the model, data and trainer are built moved to Python's permanent GC generation
    # (gc.freeze): full collections stop walking the model's ~10^5-10^6 objects (ftbench.harness.trackers.GcClock)
    gc_freeze: bool = False
    time_limit_s: float | None = None  # the job's time budget, over the study's (ftbench.run.supervise)
    # the CUDA caching allocator's expandable segments (PYTORCH_ALLOC_CONF=expandable_segments:True in the training
    # process, set by the supervisor): memory freed inside a segment is reused by a larger request, where the default
    # allocator can fail with gigabytes reserved but unallocated (the record's provenance.cuda_alloc_conf says it ran)
    expandable_segments: bool = False
    gpus: int = 1  # GPUs (ranks) the job trains on; more than 1 needs `parallel`
    # torchrun launchers ("nodes") the ranks are spread over, gpus / nodes ranks each, joined by torchrun's c10d
    # rendezvous: in a SLURM allocation srun starts one a node, elsewhere they start side by side on this host, each
    # with its share of the GPUs (ftbench.run.launch.launch_plan)
    nodes: int = 1
    parallel: str | None = None  # None | ddp (data parallel) | fsdp2 (fully sharded, FSDP2): causal LM only
    # data parallel's gradient buckets (MB): None keeps DDP's 25 MB, each all-reduced as soon as it fills, during
    # the backward; a size above the trainable gradients' (LoRA r=8 on Qwen3-8B: 87 MB) makes one all-reduce after it
    ddp_bucket_mb: int | None = None
    # Dynamo's DDPOptimizer (torch.compile inside DDP's forward): each compiled graph split at DDP's bucket boundaries
    # (1 MB for the first) so that gradients can be reduced while the backward runs. Off here by default: a decoder
    # layer compiled on its own (compile_scope: layers) was cut into pieces that fuse less (+5 Triton kernels a layer,
    # +15 ms a step at the FP8 top rung, 2 x H100, 2026-11-26); true keeps Dynamo's default
    ddp_graph_split: bool = False
    # several ranks on rows of a token budget: each step's rows dealt so that every rank's attention work is even
    # (ftbench.build.parallel.BalancedRanks; the step's rows, and so the averaged gradient, stay the same)
    balance_ranks: bool = False
    # the run's seed (LoRA's initial A, the data order, dropout), over config's `seed`: the same fine-tune under
    # other seeds, for the quality study's noise (ftbench.judge.quality)
    seed: int | None = None
    # the run's optimizer steps times this, the learning rate's schedule stretched over them (the same shape): the
    # quality study's longer arm, where tokens to quality is read past the baseline's tokens (ftbench.judge.quality)
    steps_scale: float | None = None

    @classmethod
    def from_config(cls, name: str, knobs: dict) -> "Variant":
        if unknown := sorted(set(knobs) - set(DEFAULTS)):  # every field but the name
            raise ConfigError(f"variants.{name}: unknown knob(s) {unknown}; known: {sorted(DEFAULTS)}")
        return cls(name=name, **knobs)


FP8_MODULES = {"te": "transformer_engine", "torchao": "torchao"}  # fp8_backend -> the package that provides it


# flash_impl -> its name, its module, its PyPI package, the compute capabilities it runs on
FLASH_IMPLS = {"fa4": ("FA4", "flash_attn.cute", "flash-attn-4", ((9, 0), (10, 0)))}


def required_packages(variant: Variant) -> list[str]:
    """The importable packages beyond the base install that a variant's knobs need (Unsloth, the FP8 backend's,
    bitsandbytes for 4-bit, Liger Kernel, the flash attention implementation's): what `variants.check_supported`
    refuses a run without, and what a campaign holds a target back for."""
    needs = ["unsloth" if variant.framework == "unsloth" else None,
             "nemo_automodel" if variant.framework == "nemo" else None,
             FP8_MODULES.get(variant.fp8_backend) if variant.precision == "fp8" else None,
             "bitsandbytes" if variant.precision == "nf4" else None,
             "liger_kernel" if variant.liger or variant.lm_head else None,
             FLASH_IMPLS[variant.flash_impl][1].split(".")[0] if variant.flash_impl in FLASH_IMPLS else None]
    return [n for n in needs if n]


# the knobs that say how a job spreads over several GPUs: a one-GPU run has them at their defaults, so a several-GPU
# run's one-GPU twin is the same variant but these (ftbench.judge.coverage)
PARALLEL_KNOBS = ("gpus", "nodes", "parallel", "ddp_bucket_mb", "ddp_graph_split", "balance_ranks")

ANY = None  # any value of the knob's type

# family -> knob -> the values that runner honours (ANY: all). A knob absent from a family's table must keep
# its default (the dataclass default in Variant above).
HONOURED = {
    # TRL SFTTrainer (ftbench.run.runners.causal_lm)
    "causal_lm": {"peft": {"lora", "none"}, "precision": {"bf16", "fp16", "fp32", "nf4", "fp8"}, "nf4_compute": ANY,
                  "fp8_backend": {None, "torchao"}, "fp8_recipe": {"delayed", "tensorwise", "rowwise", "static"},
                  "compile": ANY, "compile_scope": {"model", "layers"}, "gpus": ANY, "nodes": ANY, "parallel": {None, "ddp", "fsdp2"},
                  "ddp_bucket_mb": ANY, "ddp_graph_split": ANY, "balance_ranks": ANY,
                  "shape_policy": {"dynamic", "bucketed", "fixed"}, "sdpa_backend": ANY,
                  "framework": {"hf", "unsloth", "nemo"}, "gradient_checkpointing": ANY, "dataloader_workers": ANY,
                  "pin_memory": ANY, "padding_free": ANY, "liger": ANY, "attention": {"mask", "varlen"},
                  "flash_impl": {None, "fa4"}, "fp8_transpose_once": ANY, "fused_adapters": ANY,
                  "fp8_activation_scaling": {"tensorwise", "rowwise"}, "fp8_fast_accum": {None, "forward", "all"},
                  "fp8_grads": {"e5m2", "e4m3", "bf16"}, "fp8_weight_scaling": {"tensorwise", "channel"},
                  "lora_epilogue": ANY, "lora_b_one_read": ANY, "coordinate_descent_tuning": ANY, "lm_head": {None, "two-gemm", "fp8"},
                  "token_budget": ANY, "trainer_metrics": ANY, "sync_free": ANY, "activation_offloading": ANY, "optim": ANY,
                  "fused_projections": ANY, "checkpoint_policy": {"full", "selective"}, "kbit_upcast": ANY,
                  "experts": {"loop", "grouped"}, "expert_lora": ANY, "unsloth_compile": ANY},
    # LLaVA-NeXT loop (ftbench.run.runners.lmm)
    "lmm": {"peft": {"lora", "none"}, "precision": {"bf16", "fp32", "nf4", "fp8"}, "nf4_compute": ANY,
            "fp8_backend": ANY, "fp8_recipe": {"delayed", "current"}, "fp8_vision": ANY, "compile": ANY,
            "compile_scope": {"model", "layers"}, "shape_policy": {"dynamic", "bucketed", "fixed"}, "sdpa_backend": ANY, "gradient_checkpointing": ANY,
            "dataloader_workers": ANY, "pin_memory": ANY, "attention": {"mask", "causal"}},
    # diffusers' LoRA recipe (ftbench.run.runners.diffusion)
    "diffusion": {"peft": {"lora"}, "precision": {"fp16", "bf16", "fp32"}, "compile": ANY, "sdpa_backend": ANY,
                  "gradient_checkpointing": ANY, "dataloader_workers": ANY, "pin_memory": ANY,
                  "cached_latents": ANY, "clip_grad_sync_free": ANY, "channels_last": ANY},
}
for _family in HONOURED.values():  # the supervisor, not the runner, honours the time limit
    _family["time_limit_s"] = ANY
    _family["expandable_segments"] = ANY  # the supervisor sets the training process's allocator
    _family["gc_freeze"] = ANY  # the harness's Meter freezes (every runner goes through it)
    _family["compile_backend"] = ANY  # every runner compiles through torch.compile (ftbench.build.variants.compile_kwargs)
    _family["seed"] = ANY  # every runner takes its seed from the run's settings (ftbench.config.settings.train_settings)
    _family["steps_scale"] = ANY  # and its steps (ftbench.config.settings.train_settings)
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Variant) if f.name != "name"}
# knobs that change how fast a step runs, never its numbers (the same seed gives the same losses bit for bit): a
# technique adding only these runs one seed in the quality study and inherits the verdict of the rung it stands on
# where its curve is bit-identical to that rung's (ftbench.judge.quality)
NUMERICS_FREE = frozenset({"trainer_metrics", "sync_free", "pin_memory", "gc_freeze", "expandable_segments",
                           "dataloader_workers", "time_limit_s"})


def same_numbers(a: dict, b: dict) -> bool:
    """Whether two variants' flat knobs differ only in knobs that change no numbers (NUMERICS_FREE) or the seed."""
    return all(a.get(k) == b.get(k) for k in set(a) | set(b) if k not in NUMERICS_FREE | {"seed"})


def knob_problems(family: str, variant: Variant) -> list[str]:
    """What the family's runner would not honour in this variant, one phrase each (empty: all honoured)."""
    honoured = HONOURED[family]
    problems = []
    for knob, default in DEFAULTS.items():
        value = getattr(variant, knob)
        if knob not in honoured:
            if value != default:
                problems.append(f"{knob}={value!r} (the {family} runner does not act on {knob})")
        elif honoured[knob] is not ANY and value not in honoured[knob]:
            problems.append(f"{knob}={value!r} (the {family} runner honours {sorted(honoured[knob], key=str)})")
    return problems + parallel_problems(variant) + model_problems(variant) + fp8_problems(variant, honoured)


def parallel_problems(variant: Variant) -> list[str]:
    """Knobs of several GPUs that contradict each other or the rest."""
    problems = []
    if variant.gpus > 1 and variant.parallel is None:
        problems.append(f"gpus={variant.gpus} without parallel (ddp or fsdp2)")
    if variant.parallel is not None and variant.gpus < 2:
        problems.append(f"parallel={variant.parallel!r} with gpus={variant.gpus} (needs 2 or more)")
    if variant.nodes > 1 and (variant.gpus % variant.nodes or variant.gpus < variant.nodes):
        problems.append(f"nodes={variant.nodes} with gpus={variant.gpus} (each node's launcher takes gpus / nodes "
                        "ranks: a whole number, at least one)")
    if variant.parallel is not None and variant.framework == "unsloth":
        problems.append("parallel with framework='unsloth' (Unsloth trains on one GPU)")
    if variant.ddp_bucket_mb is not None and variant.parallel != "ddp":
        problems.append(f"ddp_bucket_mb={variant.ddp_bucket_mb} without parallel='ddp'")
    if variant.balance_ranks and (variant.parallel is None or not variant.token_budget):
        problems.append("balance_ranks without parallel and token_budget (it deals packed rows to the ranks)")
    if variant.ddp_graph_split and (variant.parallel != "ddp" or not variant.compile):
        problems.append("ddp_graph_split without parallel='ddp' and compile (it splits compiled graphs under DDP)")
    if variant.framework == "nemo" and (variant.peft != "lora" or variant.precision != "bf16" or variant.parallel
                                        or variant.liger or variant.fused_projections or variant.sync_free):
        problems.append("framework='nemo' needs LoRA in bf16 on one GPU, without liger (NeMo AutoModel applies its "
                        "own kernel patches), fused_projections or sync_free (wired for PEFT's modules)")
    if variant.parallel == "fsdp2" and (variant.fused_projections or variant.experts != "loop" or variant.expert_lora):
        problems.append("parallel='fsdp2' with fused_projections, experts or expert_lora (they rewrite the model "
                        "after it is built; the sharded build is not rewritten)")
    return problems


def model_problems(variant: Variant) -> list[str]:
    """Knobs of the model's build, attention and framework that contradict each other."""
    problems = []
    if variant.expert_lora and variant.experts != "grouped" and variant.framework != "unsloth":
        problems.append("expert_lora without experts='grouped' (PEFT's expert LoRA runs in the grouped path)")
    if variant.attention == "varlen" and not variant.padding_free:
        problems.append("attention='varlen' without padding_free (it reads the packed row's sequence boundaries)")
    if not variant.unsloth_compile and variant.framework != "unsloth":
        problems.append("unsloth_compile: false without framework='unsloth'")
    if variant.attention == "varlen" and variant.framework == "unsloth":
        problems.append("attention='varlen' with framework='unsloth' (Unsloth chooses its own attention)")
    if not variant.kbit_upcast and (variant.precision != "nf4" or variant.framework == "unsloth"):
        problems.append("kbit_upcast=False without PEFT's 4-bit path (precision nf4, framework hf)")
    if variant.checkpoint_policy != "full" and not variant.gradient_checkpointing:
        problems.append(f"checkpoint_policy={variant.checkpoint_policy!r} without gradient_checkpointing")
    if variant.checkpoint_policy != "full" and variant.framework == "unsloth":
        problems.append("checkpoint_policy with framework='unsloth' (Unsloth checkpoints its own way)")
    if variant.token_budget and not variant.padding_free:
        problems.append("token_budget without padding_free (its rows are packed rows)")
    if variant.framework == "unsloth" and (not variant.trainer_metrics or variant.sync_free):
        problems.append("trainer_metrics: false or sync_free with framework='unsloth' (Unsloth computes its own loss "
                        "and runs its own loop; TRL's fused LM head and the host-side boundaries are wired for PEFT)")
    if variant.fused_projections and (variant.framework == "unsloth" or variant.precision == "nf4" or (
            variant.precision == "fp8" and variant.fp8_recipe != "static")):
        problems.append("fused_projections with Unsloth, nf4, or fp8 other than fp8_recipe='static' (the fused "
                        "weights are bf16/fp32 copies of the projections, or their FP8 copy cast once)")
    if variant.experts == "grouped" and variant.framework == "unsloth":
        problems.append("experts='grouped' with framework='unsloth' (Unsloth runs its own MoE kernels)")
    if variant.compile_backend != DEFAULTS["compile_backend"] and not variant.compile:
        problems.append(f"compile_backend={variant.compile_backend!r} without compile")
    if variant.nf4_compute != DEFAULTS["nf4_compute"] and variant.precision != "nf4":
        problems.append(f"nf4_compute={variant.nf4_compute!r} with precision={variant.precision!r} (nf4 only)")
    if variant.flash_impl and variant.attention != "varlen":
        problems.append(f"flash_impl={variant.flash_impl!r} without attention='varlen' (it replaces the flash kernels "
                        "the variable-length attention runs)")
    if variant.fused_adapters and (variant.fused_projections or variant.peft != "lora" or variant.framework != "hf"
                                   or variant.parallel == "fsdp2"):
        problems.append("fused_adapters needs PEFT LoRA, framework hf, no FSDP2, and not fused_projections (which "
                        "fuses the LoRA A matrices already, with the frozen weights)")
    if variant.coordinate_descent_tuning and (not variant.compile or variant.compile_scope != "layers"
                                              or variant.compile_backend != "inductor"):
        problems.append("coordinate_descent_tuning without Inductor compiling each layer (compile_scope 'layers': a "
                        "whole-model compile goes through the Trainer, which takes a mode, not Inductor's options)")
    if variant.lora_b_one_read and (variant.peft != "lora" or not (variant.fused_adapters
                                                                   or variant.fused_projections)):
        problems.append("lora_b_one_read without LoRA through fused_adapters or fused_projections (it is the backward "
                        "of the fused layers' LoRA products)")
    if variant.lora_epilogue and not (variant.fused_adapters or variant.fused_projections):
        problems.append("lora_epilogue without fused_adapters or fused_projections (it adds LoRA's product in the "
                        "fused groups' LoRA B GEMMs)")
    return problems


def fp8_problems(variant: Variant, honoured: dict) -> list[str]:
    """FP8's knobs (and the LM head's) that contradict each other or the rest."""
    problems = []
    if variant.fp8_recipe != DEFAULTS["fp8_recipe"] and variant.precision != "fp8":
        problems.append(f"fp8_recipe={variant.fp8_recipe!r} with precision={variant.precision!r} (fp8 only)")
    if variant.precision == "fp8" and variant.fp8_backend is None and "fp8_backend" in honoured:
        problems.append("precision='fp8' without fp8_backend (te or torchao)")
    if variant.precision == "fp8" and variant.framework == "unsloth":
        problems.append("precision='fp8' with Unsloth (FP8 layers are wired for PEFT only)")
    if variant.precision == "fp8" and variant.parallel and variant.fp8_backend != "torchao":
        problems.append("precision='fp8' on several GPUs with fp8_backend other than torchao (Transformer Engine's "
                        "layers are wired for one GPU)")
    if variant.fp8_recipe == "static" and (variant.fp8_backend != "torchao" or variant.parallel == "fsdp2"):
        problems.append("fp8_recipe='static' needs fp8_backend='torchao' and no FSDP2 (each GPU holds the FP8 copy of "
                        "the weights it casts once; FSDP2 shards the weights after)")
    if variant.fp8_transpose_once and (variant.fp8_recipe != "static" or variant.fused_projections):
        problems.append("fp8_transpose_once without fp8_recipe='static', or with fused_projections (it keeps the "
                        "transpose of each weight cast once; a fused group casts its weights again)")
    if ((variant.fp8_activation_scaling != DEFAULTS["fp8_activation_scaling"] or variant.fp8_fast_accum)
            and (variant.fp8_recipe != "static" or variant.fused_projections)):
        problems.append("fp8_activation_scaling or fp8_fast_accum without fp8_recipe='static', or with "
                        "fused_projections (they set the per-step casts and GEMMs of each weight cast once; a fused "
                        "group runs its own)")
    if ((variant.fp8_grads != DEFAULTS["fp8_grads"] or variant.fp8_weight_scaling != DEFAULTS["fp8_weight_scaling"])
            and (variant.fp8_recipe != "static" or variant.fused_projections or variant.parallel == "fsdp2")):
        problems.append("fp8_grads or fp8_weight_scaling without fp8_recipe='static', or with fused_projections or "
                        "FSDP2 (they set how each weight cast once enters its GEMMs; a fused group casts its own)")
    if variant.fp8_weight_scaling == "channel" and variant.fp8_activation_scaling != "rowwise":
        problems.append("fp8_weight_scaling='channel' without fp8_activation_scaling='rowwise' (a GEMM with a scale "
                        "an output channel takes its activations' scales a row: the scaled GEMM's outer scales)")
    if variant.lm_head and (variant.peft != "lora" or variant.framework != "hf" or variant.trainer_metrics
                            or variant.liger or variant.parallel == "fsdp2"
                            or (variant.compile and variant.compile_scope == "model")):
        problems.append(f"lm_head={variant.lm_head!r} needs PEFT LoRA (a frozen head), framework hf, trainer_metrics: "
                        "false (TRL's metrics come from TRL's head), no liger, no FSDP2 (a sharded head) and the LM "
                        "head outside a compiled graph (no compile_scope 'model')")
    if variant.lm_head == "fp8" and variant.precision != "fp8":
        problems.append("lm_head='fp8' without precision='fp8' (its GEMMs are FP8; the record says what ran)")
    return problems
