"""Variants as data: the knobs a variant sets (`Variant`) and the knobs each runner honours, both made from the one
table of knobs (ftbench.core.knob_table), and the checks the config reads before any job runs. A leaf module:
ftbench.config.settings imports it, never the other way.

A variant whose knob a runner does not act on is refused (a config error naming the variant and the knob),
never silently trained as something else. Machine-dependent limits (no CUDA, compute capability, missing
library) are not config errors: the job records them as `unsupported` (ftbench.build.variants.check_supported).
"""

from __future__ import annotations

import dataclasses

from ftbench.core.knob_table import ANY, FAMILIES, KNOBS  # noqa: F401  (ANY: re-exported)


class ConfigError(ValueError):
    """A config that is wrong in a way the JSON schema cannot see."""


def _from_config(cls, name: str, knobs: dict) -> "Variant":
    if unknown := sorted(set(knobs) - set(DEFAULTS)):  # every field but the name
        raise ConfigError(f"variants.{name}: unknown knob(s) {unknown}; known: {sorted(DEFAULTS)}")
    return cls(name=name, **knobs)


# one named set of knobs, a field a knob of the table (ftbench.core.knob_table: its type, default and words)
Variant = dataclasses.make_dataclass(
    "Variant", [("name", "str"), *((k.name, k.type, dataclasses.field(default=k.default)) for k in KNOBS)],
    frozen=True, namespace={"from_config": classmethod(_from_config)})
Variant.__module__, Variant.__doc__ = __name__, "One named set of knobs; every key of a variant in config maps to a field here."


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

# the knobs each runner honours (a knob absent from a family's table must keep its default), with the values it honours (ANY: every value of its type): from the knob table
HONOURED = {family: {k.name: k.honoured[family] for k in KNOBS if family in k.honoured} for family in FAMILIES}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Variant) if f.name != "name"}
# knobs that change how fast a step runs, never its numbers (the same seed gives the same losses bit for bit): a
# technique adding only these runs one seed in the quality study and inherits the verdict of the rung it stands on
# where its curve is bit-identical to that rung's (ftbench.judge.quality)
# (fp8_weights_only: Transformer Engine casts a frozen weight with the same recipe once or in every GEMM; a run
# that is not bit-identical to its rung says so, and needs its own seeds)
NUMERICS_FREE = frozenset({"trainer_metrics", "sync_free", "pin_memory", "gc_freeze", "expandable_segments",
                           "dataloader_workers", "time_limit_s", "fp8_weights_only"})


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
    return problems + parallel_problems(variant) + model_problems(variant) + fp8_problems(variant, family)


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
    if variant.pack_order and not variant.token_budget:
        problems.append("pack_order without token_budget (it orders the packing of rows of a budget)")
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


TE_RECIPES = ("delayed", "current", "block")  # Transformer Engine's recipes (fp8_recipe with fp8_backend te)


def fp8_problems(variant: Variant, family: str) -> list[str]:
    """FP8's knobs (and the LM head's) that contradict each other or the rest, for the runner `family`."""
    honoured, problems = HONOURED[family], []
    if variant.precision == "fp8" and variant.fp8_backend == "te" and variant.fp8_recipe not in TE_RECIPES:
        problems.append(f"fp8_recipe={variant.fp8_recipe!r} with fp8_backend='te' (Transformer Engine's recipes: "
                        f"{', '.join(TE_RECIPES)})")
    if variant.fp8_recipe in TE_RECIPES[1:] and variant.fp8_backend != "te":
        problems.append(f"fp8_recipe={variant.fp8_recipe!r} without fp8_backend='te' (a Transformer Engine recipe)")
    if variant.fp8_weights_only and (variant.fp8_backend != "te" or variant.precision != "fp8"):
        problems.append("fp8_weights_only without precision='fp8' and fp8_backend='te' (Transformer Engine's "
                        "quantized weights; torchao's weights cast once are fp8_recipe='static')")
    if variant.fp8_backend == "te" and variant.fused_projections:
        problems.append("fp8_backend='te' with fused_projections (each projection is its own te.Linear; a fused "
                        "group concatenates plain linears)")
    if variant.fp8_backend == "te" and variant.gradient_checkpointing and family == "causal_lm":
        problems.append("fp8_backend='te' with gradient_checkpointing on a causal LM (the recompute would run TE's "
                        "layers outside the autocast the forward ran them under; TE's own checkpoint is wired for "
                        "LLaVA's runner only)")
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
    if variant.fp8_until is not None and (variant.fp8_recipe != "static" or variant.fused_projections
                                          or variant.parallel == "fsdp2"):
        problems.append("fp8_until without fp8_recipe='static', or with fused_projections or FSDP2 (the switch to bf16 "
                        "runs each frozen projection from its own kept bf16 weight)")
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
