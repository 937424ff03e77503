"""A frozen base built straight into FP8 on one GPU: each projection cast as it lands (its bf16 weight never whole),
its weight a stand-in; where it pays (the bf16 model would not fit) and what it holds."""

from __future__ import annotations

import time

import torch

from ftbench.build.slices import CheckpointSlices, skeleton_of
from ftbench.build.stages import GENERATOR, GIB, build_memory, name_special_tokens


def fp8_base_bytes(model) -> int:
    """What a skeleton converted to FP8 on the meta device takes once built with its frozen projections kept in FP8
    alone: a byte a weight (two where the transpose is kept), bf16's two for every other parameter."""
    from ftbench.build.fp8 import StaticFP8Linear

    fp8_weights, total = set(), 0
    for m in model.modules():
        if isinstance(m, StaticFP8Linear):
            total += m.weight.numel() * (2 if m.w_t_fp8 is not None else 1)
            fp8_weights.add(id(m.weight))
    return total + sum(2 * p.numel() for p in model.parameters() if id(p) not in fp8_weights)


def fp8_base_layerwise(variant) -> bool:
    """Whether a one-process build makes the variant's frozen projections FP8 as each lands (`build_fp8_base`): the
    static recipe (each weight cast once), unless fused_projections, which concatenates the bf16 weights after LoRA
    and casts each group again."""
    return variant.precision == "fp8" and variant.fp8_recipe == "static" and not variant.fused_projections


def build_fp8_base(manifest: dict, seed: int, device, variant) -> tuple:
    """A causal LM whose frozen decoder projections exist only in FP8, never whole in bf16 (fp8_recipe static): the
    skeleton on the meta device, its projections made StaticFP8Linear there, then every parameter drawn (in process:
    the seeded draws of `ftbench.build.stages`) or read from its checkpoint folder, one at a time on `device`; a projection's
    bf16 value is cast to FP8 as it lands (its transpose too with fp8_transpose_once) and freed, its `weight` left a
    stand-in (ftbench.build.fp8.stand_in). The peak is the model in FP8 and one weight in bf16: Qwen3-32B takes ~34 GiB
    where the whole bf16 model (61 GiB) came first before (out of memory on an 80-GB GPU before its first step). The
    FP8 tensors are those of casting the bf16 model's weights (tests/test_layerwise.py). Refused (TooLarge) before
    building where the FP8 model cannot fit. Returns (model, build facts, FP8 conversion summary)."""
    from ftbench.build import fp8
    from ftbench.build.stages import check_fits, draw_parameters

    t0 = time.perf_counter()
    model, _, in_process = skeleton_of(manifest, seed)
    info = fp8.convert_decoder(model, "static", variant.fp8_transpose_once, **fp8.static_options(variant))
    need = fp8_base_bytes(model)
    check_fits(model, device, f"{manifest.get('architecture_file') or manifest['path']} with an FP8 base", need=need)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    source = None if in_process else CheckpointSlices(manifest["path"])
    # FP8 in the forward only: the backward reads the bf16 weight; a bf16 tail: the last steps run from it
    keep = variant.fp8_grads == "bf16" or variant.fp8_until is not None
    counts = draw_parameters(model, seed, device, read=source.tensor if source else None, keep_weights=keep)
    if in_process:
        name_special_tokens(model, manifest)
    info["bf16_weights"] = ("kept: the backward's GEMM runs in bf16 from them (fp8_grads bf16), or the last steps "
                            "do (fp8_until)" if keep else
                            "not kept: each projection cast to FP8 as it landed, its weight a stand-in")
    facts = {"method": ("in_process" if in_process else "checkpoint") + ", FP8 base layer by layer (each frozen "
                       "projection cast to FP8 as it landed; the model never whole in bf16)",
             "build_s": time.perf_counter() - t0, "generator": GENERATOR if in_process else None, "seed": seed,
             "device": str(device), **counts, "expected_gib": need / GIB, **build_memory(device),
             "disk_bytes": manifest.get("disk_bytes"), "checkpoint_bf16_gib": manifest.get("checkpoint_bf16_gib")}
    model.eval()
    return model, facts, info


def stand_ins(model) -> list[str]:
    """The names of the parameters that are stand-ins for weights kept only in FP8 (ftbench.build.fp8.stand_in)."""
    from ftbench.build.fp8 import is_stand_in

    return [n for n, p in model.named_parameters() if is_stand_in(p)]
