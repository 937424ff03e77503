"""One list of techniques, in words: each a readable name, a line saying what it does, and the knobs it sets.

A variant is a ladder rung: the variant it stands on (`base`) and the techniques it adds (`adds`, names from
`TECHNIQUES`), with knobs of its own for what no technique names (`{base: lora-tb, adds: [cuda-graphs]}`); or knobs
alone. `resolve` turns either into the flat knobs a runner reads (`ftbench.core.knobs.Variant`); `words` says a variant
in words for every page that shows it, from its config or, for a record's variant no longer in config, from the
knobs the record carries. A leaf module: ftbench.config.settings imports it, never the other way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ftbench.core.knobs import DEFAULTS


@dataclass(frozen=True)
class Technique:
    name: str  # what a variant's `adds` names
    title: str  # its name in words, as tables and legends show it
    description: str  # one line: what it does
    knobs: dict  # the knobs it sets (ftbench.core.knobs.Variant fields)
    short: str = ""  # a few words: a variant's display name is made of them (`display_name`)


T = Technique
TECHNIQUES = {t.name: t for t in [
    # precision
    T("qlora", "4-bit NF4 base (QLoRA)", "the frozen base quantized to NF4 by bitsandbytes, dequantized to bf16 for "
      "each GEMM", {"precision": "nf4"}, short="NF4 base (QLoRA)"),
    T("fp16", "fp16 compute", "weights and activations in fp16 with loss scaling", {"precision": "fp16"}, short="fp16"),
    T("fp32", "fp32 compute", "weights and activations in fp32", {"precision": "fp32"}, short="fp32"),
    T("fp8", "FP8 GEMMs on the frozen base (torchao, dynamic scales)", "every projection of the decoder layers a "
      "torchao float8 linear, scales from each tensor's amax every step; LoRA, attention and norms stay bf16",
      {"precision": "fp8", "fp8_backend": "torchao"}, short="FP8 dynamic"),
    T("fp8-tensorwise", "FP8 GEMMs on the frozen base (torchao, tensor-wise scales)", "torchao's tensorwise float8 "
      "recipe on the frozen projections", {"precision": "fp8", "fp8_backend": "torchao", "fp8_recipe": "tensorwise"},
      short="FP8 tensor-wise"),
    T("fp8-rowwise", "FP8 GEMMs on the frozen base (torchao, row-wise scales)", "torchao's rowwise float8 recipe: "
      "one scale a row", {"precision": "fp8", "fp8_backend": "torchao", "fp8_recipe": "rowwise"}, short="FP8 row-wise"),
    T("fp8-static", "FP8 base, weights cast once", "the frozen weights cast to FP8 once, activations and gradients "
      "scaled each step (ftbench.build.fp8.StaticFP8Linear)",
      {"precision": "fp8", "fp8_backend": "torchao", "fp8_recipe": "static"}, short="FP8 base cast once"),
    T("fp8-te", "FP8 GEMMs through Transformer Engine", "Transformer Engine's FP8 linear layers, delayed scaling",
      {"precision": "fp8", "fp8_backend": "te"}, short="FP8 (Transformer Engine)"),
    T("fp8-weights-once", "FP8 weights cast once", "the frozen weights cast to FP8 once rather than every step",
      {"fp8_recipe": "static"}, short="FP8 weights once"),
    T("fp8-weights-only", "FP8 weights alone (Transformer Engine)", "the frozen weights held in FP8 alone, cast once "
      "as built (Transformer Engine's quantized_model_init): no bf16 copy, no cast in each GEMM",
      {"fp8_weights_only": True}, short="TE FP8 weights alone"),
    T("bf16-tail", "the last tenth of the steps on the bf16 base", "FP8 GEMMs for the first 90 % of the optimizer "
      "steps, then the frozen projections in bf16 from their kept weights: the adapters' last steps train on the "
      "base they are served on", {"fp8_until": 0.9}, short="bf16 tail"),
    T("fp8-tensorwise-recipe", "FP8 tensor-wise recipe", "torchao's tensorwise recipe by name",
      {"fp8_recipe": "tensorwise"}, short="FP8 tensor-wise"),
    T("fp8-current", "FP8 current scaling", "Transformer Engine's current scaling: a scale a tensor from its own "
      "amax each GEMM", {"fp8_recipe": "current"}, short="FP8 current scaling"),
    T("fp8-block", "FP8 block scaling", "Transformer Engine's block scaling (DeepSeek-V3's): a scale each 1x128 "
      "block of activations and gradients and each 128x128 block of weights, E4M3 throughout",
      {"fp8_recipe": "block"}, short="FP8 block scaling"),
    T("fp8-vision", "FP8 in the vision tower too", "the vision tower's linears in FP8 as well", {"fp8_vision": True},
      short="FP8 vision tower"),
    T("fp8-transpose-once", "FP8 weights' transposes kept", "each FP8 weight's transpose (the backward's operand) "
      "kept rather than made every backward", {"fp8_transpose_once": True}, short="FP8 transposes kept"),
    T("fp8-rowwise-activations", "FP8 activations scaled per token", "activations and output gradients scaled a "
      "row at a time: amax and cast in one pass", {"fp8_activation_scaling": "rowwise"}, short="row-wise activations"),
    T("fp8-fast-accum-forward", "fast accumulation in the forward's FP8 GEMMs", "the tensor cores' fast "
      "accumulation in the forward, the backward's GEMMs exact", {"fp8_fast_accum": "forward"},
      short="fast accumulation (fwd)"),
    T("fp8-fast-accum-all", "fast accumulation in every FP8 GEMM", "the tensor cores' fast accumulation in the "
      "forward and the backward", {"fp8_fast_accum": "all"}, short="fast accumulation (all)"),
    T("fp8-e4m3-grads", "FP8 gradients in E4M3", "the output's gradient cast to E4M3 (more mantissa, as torchao's "
      "rowwise recipe and DeepSeek-V3 cast it) rather than E5M2 for the backward's GEMM", {"fp8_grads": "e4m3"},
      short="E4M3 gradients"),
    T("fp8-forward-only", "FP8 in the forward only", "the backward's GEMM in bf16 from the kept bf16 weight: only the "
      "forward's GEMMs in FP8", {"fp8_grads": "bf16"}, short="FP8 forward only"),
    T("fp8-channel-weights", "FP8 weights scaled per channel", "each frozen weight cast once with a scale an output "
      "channel (forward) and its transpose a scale an input channel (backward); activations and gradients a scale a "
      "token (ftbench.build.fp8.frozen_fp8_channels)", {"fp8_weight_scaling": "channel"}, short="per-channel weights"),
    T("longer-1.5x", "a longer arm, 1.5x the steps", "the same fine-tune over 1.5x the optimizer steps, its learning "
      "rate's schedule stretched with them: where tokens to quality is read beyond the baseline's tokens",
      {"steps_scale": 1.5}, short="1.5x the steps"),
    T("lm-head-two-gemm", "the LM head's loss in two bf16 GEMMs", "fused linear cross-entropy: the hidden states' "
      "gradient formed in the forward, a chunk of tokens at a time (ftbench.build.head)", {"lm_head": "two-gemm"},
      short="LM head in 2 GEMMs"),
    T("lm-head-fp8", "the LM head's loss in two FP8 GEMMs", "fused linear cross-entropy with the head's weight cast "
      "to FP8 once (ftbench.build.head)", {"lm_head": "fp8"}, short="FP8 LM head"),
    # compilation
    T("cuda-graphs", "compiled layers in CUDA graphs", "each decoder layer compiled by torch.compile and captured "
      "in CUDA graphs (reduce-overhead): the host launches a graph, not each kernel",
      {"compile": "reduce-overhead", "compile_scope": "layers"}, short="CUDA graphs"),
    T("compile-layers", "compiled layers", "each decoder layer compiled by torch.compile (regional compilation)",
      {"compile": "default", "compile_scope": "layers"}, short="compiled layers"),
    T("compile", "torch.compile", "the model compiled by torch.compile", {"compile": "default"}, short="torch.compile"),
    T("compile-graphs", "torch.compile with CUDA graphs", "torch.compile's reduce-overhead mode",
      {"compile": "reduce-overhead"}, short="compile + CUDA graphs"),
    T("max-autotune", "torch.compile max-autotune", "CUDA graphs, each GEMM's kernel tuned among cuBLAS and Triton "
      "templates", {"compile": "max-autotune"}, short="max-autotune"),
    T("per-layer", "compiled layer by layer", "each repeated block compiled on its own", {"compile_scope": "layers"},
      short="per-layer compile"),
    T("coordinate-descent", "Inductor's coordinate-descent tuning", "each generated Triton kernel's block sizes "
      "tuned", {"coordinate_descent_tuning": True}, short="coordinate descent"),
    # shapes and attention
    T("fixed-shapes", "fixed shapes", "every batch padded to one fixed length", {"shape_policy": "fixed"},
      short="fixed shapes"),
    T("bucketed-shapes", "bucketed shapes", "lengths padded up to a few buckets", {"shape_policy": "bucketed"},
      short="bucketed shapes"),
    T("efficient-attention", "memory-efficient attention kernel", "SDPA restricted to its memory-efficient kernel",
      {"sdpa_backend": "efficient"}, short="mem-efficient attention"),
    T("flash-sdpa", "SDPA's flash kernel", "SDPA restricted to its flash kernel", {"sdpa_backend": "flash"},
      short="flash SDPA"),
    T("cudnn-attention", "cuDNN attention", "SDPA restricted to its cuDNN kernel", {"sdpa_backend": "cudnn"},
      short="cuDNN attention"),
    T("math-attention", "SDPA's math kernel", "SDPA restricted to its math kernel", {"sdpa_backend": "math"},
      short="math attention"),
    T("padding-free", "padding-free rows", "a batch's sequences concatenated into one row, positions restarting",
      {"padding_free": True}, short="padding-free"),
    T("varlen", "per-sequence attention", "each packed sequence attends on its own: the variable-length flash "
      "kernel on the cumulative lengths, no mask", {"attention": "varlen"}, short="varlen attention"),
    T("causal-mask", "causal mask alone", "no padding mask: right padding, pads carry no labels",
      {"attention": "causal"}, short="causal mask"),
    T("fa4", "FlashAttention-4", "flash-attn-4's CuTe kernels for Hopper and Blackwell, its own varlen forward and "
      "backward", {"flash_impl": "fa4"}, short="FA4"),
    T("rows-4k", "rows of exactly 4,096 tokens", "sequences packed whole into rows of one token budget: one shape "
      "every step (ftbench.data.packing)", {"token_budget": 4096}, short="4k-token rows"),
    T("rows-8k", "rows of exactly 8,192 tokens", "twice the token budget", {"token_budget": 8192},
      short="8k-token rows"),
    T("mixed-rows", "rows packed in a seeded random order", "sequences dealt to the rows in the run's seeded "
      "random order, first fit: each row a mix of lengths as a padded batch is, other rows under each seed "
      "(best fit decreasing groups like lengths and packs the same rows under every seed)",
      {"pack_order": "shuffled"}, short="mixed rows"),
    # the host's part of a step
    T("no-metrics", "no per-step trainer metrics", "TRL's per-step entropy and accuracy (two host syncs a step) off",
      {"trainer_metrics": False}, short="no step metrics"),
    T("sync-free", "no host sync between steps", "the varlen boundaries from the loader's host tensors, no NaN "
      "check: the host queues the next step while the GPU runs this one", {"sync_free": True}, short="sync-free"),
    T("pinned", "pinned batches", "each batch in pinned host memory, copied without waiting",
      {"pin_memory": True}, short="pinned batches"),
    T("gc-freeze", "the model frozen out of the garbage collector", "gc.freeze once the model is built: full "
      "collections stop walking its objects", {"gc_freeze": True}, short="GC freeze"),
    T("expandable-segments", "expandable allocator segments", "the CUDA allocator's expandable segments",
      {"expandable_segments": True}, short="expandable segments"),
    # kernels and fusions
    T("fused-adamw", "fused AdamW", "one optimizer kernel for every adapter", {"optim": "adamw_torch_fused"},
      short="fused AdamW"),
    T("fused-projections", "q/k/v and gate/up as one GEMM each", "the frozen projections of a group concatenated, "
      "LoRA per projection (ftbench.build.fused)", {"fused_projections": True}, short="fused projections"),
    T("fused-lora-a", "LoRA A of q/k/v and gate/up as one GEMM each", "the group's input read once by LoRA "
      "(ftbench.build.fused)", {"fused_adapters": True}, short="fused LoRA A"),
    T("lora-epilogue", "LoRA's sum in its B GEMM", "each LoRA product added to the frozen output by the B GEMM "
      "itself (addmm's epilogue)", {"lora_epilogue": True}, short="LoRA epilogue"),
    T("lora-b-one-read", "LoRA B's backward in one read", "one Triton kernel reads the output gradient once for B's "
      "gradient and the gradient into the rank (ftbench.build.lora_grads)", {"lora_b_one_read": True},
      short="LoRA B in one read"),
    T("liger", "Liger Kernel", "Liger Kernel's fused RMSNorm, SwiGLU and RoPE", {"liger": True}, short="Liger"),
    T("grouped-experts", "experts as grouped GEMMs", "gpt-oss's frozen experts as one grouped GEMM a projection",
      {"experts": "grouped"}, short="grouped experts"),
    T("expert-lora", "LoRA on every expert", "LoRA on each expert's projections too", {"expert_lora": True},
      short="expert LoRA"),
    T("bf16-kept", "non-quantized parameters kept in bf16", "embeddings, LM head and norms in bf16, not PEFT's fp32 "
      "copies", {"kbit_upcast": False}, short="bf16 kept"),
    # memory
    T("checkpointing", "gradient checkpointing", "each layer's forward recomputed in the backward",
      {"gradient_checkpointing": True}, short="checkpointing"),
    T("selective-checkpointing", "selective activation checkpointing", "GEMM and attention outputs kept, the ops "
      "between them recomputed", {"gradient_checkpointing": True, "checkpoint_policy": "selective"},
      short="selective checkpointing"),
    T("offload", "activations offloaded", "saved activations in pinned host memory, overlapped (TRL's offloading)",
      {"activation_offloading": True}, short="offload"),
    # systems
    T("unsloth", "Unsloth", "Unsloth's model patches and kernels", {"framework": "unsloth"}, short="Unsloth"),
    T("unsloth-eager", "without Unsloth's compiled modules", "UNSLOTH_COMPILE_DISABLE=1", {"unsloth_compile": False},
      short="Unsloth eager"),
    T("nemo", "NVIDIA NeMo AutoModel", "NeMo AutoModel's from_pretrained, kernel patches and LoRA",
      {"framework": "nemo"}, short="NeMo AutoModel"),
    T("full-fine-tune", "full fine-tune", "every weight trained, no adapter", {"peft": "none"}, short="full fine-tune"),
    # several GPUs
    T("ddp", "data parallel (DDP)", "each rank a replica, gradients all-reduced", {"parallel": "ddp"}, short="DDP"),
    T("fsdp2", "fully sharded (FSDP2)", "parameters sharded over the ranks, gathered layer by layer",
      {"parallel": "fsdp2"}, short="FSDP2"),
    T("one-bucket", "one gradient all-reduce", "a 512-MB bucket: one all-reduce after the backward",
      {"ddp_bucket_mb": 512}, short="one all-reduce"),
    T("graph-split", "compiled graphs cut at DDP's buckets", "Dynamo's DDPOptimizer on",
      {"ddp_graph_split": True}, short="graph split"),
    T("balanced-ranks", "rows dealt by attention cost", "each step's rows dealt so every rank's attention work is "
      "even", {"balance_ranks": True}, short="balanced ranks"),
    # diffusion
    T("cached-latents", "cached latents", "training from latents encoded once", {"cached_latents": True},
      short="cached latents"),
    T("clip-sync-free", "gradient clipping without a host sync", "", {"clip_grad_sync_free": True},
      short="sync-free clipping"),
    T("channels-last", "channels-last memory format", "NHWC tensors, the layout cuDNN's convolutions run in",
      {"channels_last": True}, short="channels-last"),
]}
del T

# knobs whose value is a number or a name: said with their value
VALUED = {"gpus": "{} GPUs", "nodes": "{} launchers", "dataloader_workers": "{} data-loader workers",
          "token_budget": "rows of exactly {:,} tokens", "seed": "seed {}", "ddp_bucket_mb": "{}-MB gradient buckets",
          "time_limit_s": "a {:g}-s time limit", "optim": "optimizer {}", "nf4_compute": "NF4 dequantized to {}",
          "compile_backend": "torch.compile backend {}", "compile": "torch.compile {}",
          "compile_scope": "compiled per {}", "sdpa_backend": "SDPA's {} kernel", "precision": "{} compute",
          "fp8_backend": "FP8 through {}", "fp8_recipe": "FP8 {} recipe", "attention": "{} attention",
          "lm_head": "LM head {}", "flash_impl": "flash attention {}", "framework": "framework {}",
          "shape_policy": "{} shapes", "experts": "experts {}", "checkpoint_policy": "{} checkpointing",
          "fp8_activation_scaling": "FP8 activations {}", "fp8_fast_accum": "fast accumulation: {}",
          "fp8_grads": "FP8 backward: {}", "steps_scale": "{}x the steps", "fp8_weight_scaling": "FP8 weights scaled per {}",
          "peft": "adapter {}"}


class TechniqueError(ValueError):
    """A variant's base or adds that does not resolve (ftbench.config.settings raises it as a config error)."""


def resolve(name: str, pool: dict, _seen: tuple = ()) -> dict:
    """A variant's flat knobs: its base's, then each technique it adds, then its own knobs (the last wins)."""
    if name in _seen:
        raise TechniqueError(f"variants.{name}: its base leads back to itself ({' -> '.join((*_seen, name))})")
    if name not in pool:
        raise TechniqueError(f"variants.{_seen[-1] if _seen else name}: base {name!r} is not a variant")
    entry = dict(pool[name] or {})
    base, adds = entry.pop("base", None), entry.pop("adds", None) or []
    knobs = resolve(base, pool, (*_seen, name)) if base else {}
    for t in adds:
        if t not in TECHNIQUES:
            raise TechniqueError(f"variants.{name}: adds {t!r}, which is not a technique (ftbench.config.techniques; "
                                 f"docs/techniques.md lists them)")
        knobs.update(TECHNIQUES[t].knobs)
    knobs.update(entry)
    return knobs


def lineage(name: str, pool: dict) -> list[str]:
    """A variant and its bases, nearest first: "lora-tb-cg" -> ["lora-tb-cg", "lora-tb", ...]."""
    out = []
    while name in pool and name not in out:
        out.append(name)
        name = (pool[name] or {}).get("base")
    return out


def resolve_all(pool: dict) -> dict:
    """Every variant of `pool` as flat knobs."""
    return {name: resolve(name, pool) for name in pool}


def _said(knob: str, value) -> str:
    if knob in VALUED and not isinstance(value, bool):
        return VALUED[knob].format(value)
    return f"{knob.replace('_', ' ')}" if value is True else f"no {knob.replace('_', ' ')}" if value is False \
        else f"{knob.replace('_', ' ')} {value}"


def _covered(knobs: dict, defaults: dict | None = None) -> tuple[list[str], dict]:
    """The techniques that cover what differs from the defaults (the largest first; in the list's order: precision,
    compilation, shapes, the host, kernels, memory) and the knobs none of them names."""
    defaults = DEFAULTS if defaults is None else defaults
    left = {k: v for k, v in knobs.items() if k != "name" and v is not None and defaults.get(k, object()) != v}
    if not knobs.get("compile"):  # a compile scope without torch.compile compiles nothing: no technique of its own
        left.pop("compile_scope", None)
    found = []
    for t in sorted(TECHNIQUES.values(), key=lambda t: -len(t.knobs)):
        if t.knobs and all(k in left and left[k] == v for k, v in t.knobs.items()):
            found.append(t.name)
            for k in t.knobs:
                left.pop(k)
    order = list(TECHNIQUES)
    return sorted(found, key=order.index), left


def knob_words(knobs: dict, defaults: dict | None = None) -> list[str]:
    """Flat knobs in words: the techniques that cover what differs from the defaults, then each knob no technique
    names, with its value. LoRA in bf16 is the start every list reads from."""
    found, left = _covered(knobs, defaults)
    return [TECHNIQUES[n].title for n in found] + [_said(k, v) for k, v in left.items()]


# said first in a display name: the framework or fine-tune a variant is, then its precision (the list's order)
LEADS = ("unsloth", "nemo", "liger", "full-fine-tune", "qlora")
PEERS = ("unsloth", "nemo", "liger")  # the projects whose own fine-tuning code a variant runs: ftbench's peers


def peer(knobs: dict) -> str | None:
    """The peer a variant runs (its technique's short name: "Unsloth", "NeMo AutoModel", "Liger"), None for ftbench's
    own code."""
    found = _covered(knobs)[0]
    return next((TECHNIQUES[n].short for n in PEERS if n in found), None)


def display_name(knobs: dict, most: int = 3, first: tuple = ()) -> str:
    """A variant's short name in words from its flat knobs: what it is, then the short words of up to `most` of
    its techniques, `first` (technique names) first, then the framework and precision ("LoRA: FP8 row-wise, FA4,
    CUDA graphs +4 more"); plain LoRA in bf16 is "LoRA, bf16". A knob no technique names is said after them where
    it has a value in words (GPUs, data-loader workers, a seed), else counted among the more."""
    found, left = _covered(knobs)
    tail = [VALUED[k].format(left.pop(k)) for k in list(left) if k in VALUED and not isinstance(left[k], bool)]
    found = sorted(found, key=lambda n: (n not in PEERS, n not in first, first.index(n) if n in first else
                                         LEADS.index(n) if n in LEADS else len(LEADS)))
    start = "LoRA"
    for lead, said in (("full-fine-tune", "full fine-tune"), ("qlora", "QLoRA")):
        if lead in found:
            found.remove(lead)
            start = said
    shorts = [TECHNIQUES[n].short or TECHNIQUES[n].title for n in found]
    more = max(len(shorts) - most, 0) + len(left)
    name = f"{start}: {', '.join(shorts[:most])}" if shorts else start if start != "LoRA" else "LoRA, bf16"
    return ", ".join([name + (f" +{more} more" if more else ""), *tail])


def display_names(names, pool: dict | None = None, records=None, fallback: dict | None = None,
                  lineages: dict | None = None) -> dict[str, str]:
    """Each of a page's variants by its display name, from `pool`, else a record's knobs, else `fallback` (as
    `legend` finds them). A ladder's rung leads with what it adds to the rung it stands on (its base in the pool, or
    in `lineages`: name -> [name, base, ...]); names that would still read alike on one page lead with what tells
    them apart (the techniques not all of them have); variants alike in every knob, and one known nowhere, keep
    their code."""
    from_records = records if isinstance(records, dict) else record_knobs(records)
    names = list(dict.fromkeys(n for n in names if n))
    knobs, bases = {}, {}
    for name in names:
        source = pool if pool and name in pool else fallback if fallback and name in fallback else None
        known = resolve(name, source) if source else from_records.get(name)
        if known is None:
            continue
        knobs[name] = known
        chain = lineage(name, source) if source else (lineages or {}).get(name) or [name]
        if len(chain) > 1:
            base = resolve(chain[1], source) if source else from_records.get(chain[1])
            bases[name] = set(_covered(base)[0]) if base is not None else set()
    adds = {n: tuple(t for t in _covered(k)[0] if n in bases and t not in bases[n]) for n, k in knobs.items()}
    said = {n: display_name(k, first=adds[n]) for n, k in knobs.items()}
    leads = dict(adds)  # what each name leads with: what it adds, then what told it apart in each round
    for _ in range(3):  # each round tells apart those still alike (in the techniques they name)
        alike = {}
        for n, s in said.items():
            alike.setdefault(re.sub(r" \+\d+ more", "", s), []).append(n)
        groups = [g for g in alike.values() if len(g) > 1]
        if not groups:
            break
        for group in groups:
            sets = {n: set(_covered(knobs[n])[0]) for n in group}
            shared = set.intersection(*sets.values())
            for n in group:
                own = tuple(t for t in TECHNIQUES if t in sets[n] - shared)
                leads[n] = tuple(dict.fromkeys(own + leads[n]))  # an earlier round's difference kept
                said[n] = display_name(knobs[n], most=max(3, len(own)), first=leads[n])
    alike = {}
    for n, s in said.items():
        alike.setdefault(s, []).append(n)
    said = {n: f"{s} ({n})" if len(alike[s]) > 1 else s for n, s in said.items()}
    return {n: said.get(n, n) for n in names}


def words(name: str, pool: dict | None = None, knobs: dict | None = None) -> str:
    """A variant in words: "LoRA, bf16 + compiled layers in CUDA graphs + ..." from its flat knobs (`pool`'s entry
    resolved, else `knobs`: a record's), empty where neither knows it."""
    if pool and name in pool:
        knobs = resolve(name, pool)
    if knobs is None:
        return ""
    start = "full fine-tune" if knobs.get("peft") == "none" else "LoRA"
    return " + ".join([start, *[w for w in knob_words(knobs) if w != "full fine-tune"]])


def adds_words(name: str, pool: dict) -> str:
    """What a rung adds to the rung it stands on, in words: "lora-tb + compiled layers in CUDA graphs"; a variant
    of knobs alone, its words."""
    entry = (pool or {}).get(name) or {}
    if not entry.get("base"):
        return words(name, pool)
    own = {k: v for k, v in entry.items() if k not in ("base", "adds")}
    base = resolve(entry["base"], pool) if entry["base"] in pool else {}
    undone = [f"without {t.title}" for t in TECHNIQUES.values()  # a knob set back to its default: the technique
              if t.knobs and all(k in own and own[k] is None and base.get(k, v) == v  # the base had undone
                                 for k, v in t.knobs.items())]
    said = [TECHNIQUES[t].title for t in entry.get("adds") or []] + undone + \
        knob_words({k: v for k, v in own.items() if v is not None}, defaults={})
    return " + ".join([entry["base"], *said]) if said else f"{entry['base']}, renamed"


def record_knobs(records) -> dict:
    """Each variant's knobs as its first record gives them (`records`: rows with the flattened `variant.*` knobs)."""
    out = {}
    for r in records or []:
        if r.get("variant") and r["variant"] not in out:
            out[r["variant"]] = {k.removeprefix("variant."): v for k, v in r.items()
                                 if k.startswith("variant.") and k != "variant.name"}
    return out


def legend(names, pool: dict | None = None, records=None, fallback: dict | None = None) -> list[dict]:
    """The legend of a page: each variant it shows, what it adds to its base and its techniques in words, from
    `pool` (config's variants), else from a record of it (`records`: rows with the flattened `variant.*` knobs: what
    ran, for one no longer in config), else from `fallback` (every study's variants, for a page across studies)."""
    from_records = records if isinstance(records, dict) else record_knobs(records)
    rows = []
    for name in dict.fromkeys(n for n in names if n):
        source = pool if pool and name in pool else None if name in from_records else fallback
        rows.append({"variant": name, "stands on + adds": adds_words(name, source) if source and name in source
                     else "",
                     "techniques, in words": words(name, source, from_records.get(name))
                     or "not in this config and no record of it"})
    return rows


def techniques_page(pool: dict | None = None) -> str:
    """docs/techniques.md: every technique in words with the knobs it sets, then, with `pool` (config's variants),
    each variant as the rung it stands on and what it adds."""
    lines = ["# Techniques", "", "Generated from `ftbench.config.techniques` (`python -m ftbench.config.techniques > docs/techniques.md`;"
             " a test keeps it current). A variant in `config/config.yaml` names the rung it stands on (`base`) and the "
             "techniques it adds (`adds`) by the names below; `ftbench.config.techniques.resolve` turns it into the knobs a "
             "runner reads (the knobs: the table at the end of this page, from `ftbench.core.knob_table`).", "",
             "| name | technique | what it does | knobs |", "|---|---|---|---|"]
    for t in TECHNIQUES.values():
        knobs = ", ".join(f"`{k}: {str(v).lower() if isinstance(v, bool) else v}`" for k, v in t.knobs.items())
        lines.append(f"| `{t.name}` | {t.title} | {t.description} | {knobs} |")
    if pool:
        lines += ["", "## The variants of config/config.yaml", "", "| variant | stands on + adds |", "|---|---|"]
        lines += [f"| `{name}` | {adds_words(name, pool)} |" for name in pool]
    from ftbench.core.knob_table import knobs_page

    lines += ["", "## The knobs", "", "Every knob a variant can set, declared once in `ftbench.core.knob_table`: the "
              "`Variant` type, the runners' table of what each honours and the config schema's variant block are made "
              "from it.", "", *knobs_page()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import pathlib

    import yaml

    root = pathlib.Path(__file__).resolve().parents[3]
    print(techniques_page(yaml.safe_load((root / "config/config.yaml").read_text())["variants"]), end="")
