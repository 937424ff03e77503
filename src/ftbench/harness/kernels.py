"""Kernels by name: which kernels of a profiled step are GEMMs, FP8's casts and scaling, bitsandbytes' 4-bit
dequantization, collective communication or attention (and which implementation ran it). Pure functions over
names, read by the profiler's summary (ftbench.run.profiling) and by the analysis of summaries written before
(ftbench.judge.analysis), neither of which the other needs for this."""

from __future__ import annotations

import collections
import re

# collective communication kernels by name (NCCL's all-reduce, all-gather, reduce-scatter, broadcast ...)
COMMUNICATION_NAME = re.compile(r"nccl", re.IGNORECASE)
GPU_BOUND_SHARE = 0.8  # kernels busy at least this share of the steps: GPU-bound; below it, host-bound
# matrix-multiply kernels by name: cuBLAS(Lt) (gemm, nvjet on Hopper, xmma), CUTLASS GEMMs, Inductor's Triton
# GEMM templates; flash attention's kernels name cutlass types but are not GEMMs of the model's projections
GEMM_NAME = re.compile(r"gemm|nvjet|xmma|triton_tem_", re.IGNORECASE)


# the work FP8 adds around its GEMMs, by kernel name: Transformer Engine's casts (cast_transpose, quantize), amax
# reductions and scale updates (delayed scaling), torchao's float8 casts and amax (Inductor names its fused kernels
# after them); an FP8 GEMM itself (e4m3 in a cuBLAS/CUTLASS name) counts as a GEMM
# (torchao under Inductor: the casts fuse into `triton_*_fused__scaled_mm_*` and the amax into
# `triton_red_fused_abs_*max*` kernels with their neighbours, so that share is an upper bound). bitsandbytes' 4-bit
# dequantization (kDequantizeBlockwise: NF4 codes to bf16) is not FP8 work: it is counted on its own
FP8_WORK_NAME = re.compile(r"amax|fp8|float8|e4m3|e5m2|cast_transpose|(?<!de)quantiz|compute_scale|scaling"
                           r"|triton_\w*fused_\w*_scaled_mm|triton_red_fused_abs_\w*max", re.IGNORECASE)
# the names summaries counted before 2026-11-25 (analysis.kernel_shares corrects those summaries on read)
FP8_WORK_NAME_BEFORE = re.compile(r"amax|fp8|float8|e4m3|e5m2|cast_transpose|quantiz|compute_scale|scaling", re.IGNORECASE)
DEQUANT_4BIT_NAME = re.compile(r"kDequantize|dequantize_4bit|kgemm_4bit|kQuantizeBlockwise")
# attention kernels by name, and which implementation ran them: cuDNN's fused SDPA (its kernel names also say
# "flash", so it is tried first), PyTorch's memory-efficient attention (CUTLASS `fmha_cutlassF/B`), flash attention
ATTENTION_BACKENDS = (("cuDNN SDPA", re.compile(r"cudnn\w*sdpa", re.IGNORECASE)),
                      ("memory-efficient (CUTLASS fmha)", re.compile(r"fmha|MemEffAtten", re.IGNORECASE)),
                      ("flash attention", re.compile(r"flash", re.IGNORECASE)))


def is_gemm(name: str) -> bool:
    return bool(GEMM_NAME.search(name)) and "flash" not in name.lower()


def is_fp8_work(name: str) -> bool:
    return bool(FP8_WORK_NAME.search(name)) and not is_gemm(name) and not is_dequant_4bit(name)


def is_dequant_4bit(name: str) -> bool:
    return bool(DEQUANT_4BIT_NAME.search(name))


def attention_backend(name: str) -> str | None:
    """The attention implementation a kernel belongs to (ATTENTION_BACKENDS), or None for any other kernel."""
    return next((label for label, rx in ATTENTION_BACKENDS if rx.search(name)), None)


def by_attention_backend(amounts) -> dict[str, float]:
    """(kernel name, amount) pairs summed per attention implementation, largest first; other kernels left out."""
    out = collections.Counter()
    for name, amount in amounts:
        if backend := attention_backend(name):
            out[backend] += amount
    return dict(out.most_common())


def gemm_share(summary: dict) -> tuple[float | None, bool]:
    """The GEMM kernels' share of the device's summed kernel time, and whether it is exact: summaries written
    before `gemm_share` was counted over every kernel give a lower bound from their top operators."""
    if summary.get("gemm_share") is not None:
        return summary["gemm_share"], True
    tops = [o for o in summary.get("top_operators") or [] if o.get("share") is not None]
    if summary.get("device") != "cuda" or not tops:
        return None, False
    return sum(o["share"] for o in tops if is_gemm(o["name"])), False
