"""Building a causal LM for training: one route of stages in order, each a small function registered with the words
of what it applies and the variants it applies to, as torchtitan applies float8 and its parallelisms in one place.
Adding a recipe is one stage here and one line in the technique list (ftbench.config.techniques).

    materialize -> grouped experts -> FP8 GEMMs -> LoRA -> LoRA's A seeded -> expert LoRA -> fused projections -> place

Sharding over several GPUs with FSDP2 is the other route, in one place (ftbench.build.parallel.build_sharded): the
model built on the meta device, sharded, then each rank materializes only its rows. Unsloth and NeMo AutoModel build
their own models (ftbench.run.runners.peers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ftbench.build.parallel import build_sharded, ensure_process_group, parallelize, seed_adapters


@dataclass
class Build:
    """What a stage reads and changes: the run's inputs, the model so far, and what was built and how (the record)."""

    manifest: dict
    seed: int
    device: object
    variant: object
    lora: dict
    model: object = None
    info: dict = field(default_factory=dict)


ROUTE: list[tuple[str, Callable, Callable]] = []  # (what the stage applies, the variants it applies to, the stage)


def stage(words: str, when: Callable = lambda v: True):
    """Register a stage at the end of the route: `words` says what it applies, `when(variant)` whether it does."""
    def register(fn):
        ROUTE.append((words, when, fn))
        return fn
    return register


@stage("the frozen base: kept only in FP8 as each projection lands, drawn in process, or read from the checkpoint")
def materialize(b: Build) -> None:
    from ftbench.build.fp8_base import build_fp8_base, fp8_base_layerwise
    from ftbench.build.stages import build_model
    from ftbench.build.variants import compute_dtype, load_pretrained, quantization_config

    v, manifest = b.variant, b.manifest
    if fp8_base_layerwise(v):  # the frozen projections FP8 as each lands: never the whole model in bf16
        b.model, build, b.info["fp8"] = build_fp8_base(manifest, b.seed, b.device, v)
    elif manifest.get("build") == "in_process":
        b.model, build = build_model(manifest, b.seed, b.device, compute_dtype(v), quantization_config(v))
    else:
        from transformers import AutoModelForCausalLM

        b.model = load_pretrained(AutoModelForCausalLM, manifest["path"], v, b.device)
        build = {"method": "checkpoint", "disk_bytes": manifest.get("disk_bytes"),
                 "checkpoint_bf16_gib": manifest.get("checkpoint_bf16_gib")}
    b.info["build"] = build


@stage("gpt-oss's frozen experts as one grouped GEMM per projection per layer", lambda v: v.experts == "grouped")
def grouped_experts(b: Build) -> None:
    from ftbench.build.experts import group_experts
    from ftbench.harness.meter import Unsupported

    if not group_experts(b.model):
        raise Unsupported("experts: grouped needs a model with split experts (gpt-oss built by ftbench.build.stages)")
    b.info["experts"] = "grouped: one grouped GEMM per projection per layer (torch._grouped_mm)"


@stage("the decoder's frozen projections as FP8 GEMMs, before LoRA", lambda v: v.precision == "fp8")
def fp8_gemms(b: Build) -> None:
    from ftbench.build import fp8

    if "fp8" not in b.info:  # not already built in FP8 layer by layer
        v = b.variant
        b.info["fp8"] = fp8.convert_decoder(b.model, v.fp8_recipe, v.fp8_transpose_once, **fp8.static_options(v))


@stage("LoRA (PEFT) on the variant's target modules, or full fine-tuning")
def lora(b: Build) -> None:
    from ftbench.build.variants import apply_lora

    b.model = apply_lora(b.model, b.variant, b.lora)


@stage("LoRA's A from per-name seeded draws: the same start on one GPU and sharded", lambda v: v.peft == "lora")
def seeded_adapters(b: Build) -> None:
    b.info["adapters_seeded"] = seed_adapters(b.model, b.seed)


@stage("LoRA on each expert's projections (after PEFT, which freezes what it did not add)", lambda v: v.expert_lora)
def expert_lora(b: Build) -> None:
    from ftbench.build.experts import adapt_experts

    b.info["expert_lora"] = adapt_experts(b.model, b.lora)


@stage("q/k/v and gate/up as one GEMM each (or their LoRA A alone), LoRA kept per projection",
       lambda v: v.fused_projections or v.fused_adapters)
def fused_projections(b: Build) -> None:
    from ftbench.build import fused

    v = b.variant
    b.info["fused_projections"] = fused.fuse_projections(b.model, frozen=v.fused_projections,
                                                         epilogue=v.lora_epilogue, one_read=v.lora_b_one_read)


@stage("placed: one GPU, or whole on each rank with the trainer's DDP settings")
def place(b: Build) -> None:
    v = b.variant
    b.info["trainer_args"] = parallelize(b.model, v.parallel, b.device, bucket_mb=v.ddp_bucket_mb)


def stages_for(variant) -> list[str]:
    """The words of the stages a variant's build goes through, in order."""
    return [words for words, when, _ in ROUTE if when(variant)]


def build_causal_lm(manifest: dict, seed: int, device, variant, lora: dict) -> tuple:
    """The one place a causal LM is built for training (Hugging Face's classes): sharded over the ranks (FSDP2,
    `build_sharded`), else the route's stages in order. Returns (model, info): what was built and how, for the
    record, and the trainer's settings for the strategy."""
    if variant.parallel == "fsdp2":  # built on the meta device, sharded, each rank materializing only its rows
        ensure_process_group(device)
        model, build, trainer_args, fp8_info = build_sharded(manifest, seed, device, variant, lora)
        return model, {"build": build, "trainer_args": trainer_args, "fp8": fp8_info}
    b = Build(manifest, seed, device, variant, lora)
    for _, when, fn in ROUTE:
        if when(variant):
            fn(b)
    return b.model, b.info
