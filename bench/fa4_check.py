"""FlashAttention-4 against FlashAttention-2 on the rows the frontier trains: the same variable-length causal
attention (ftbench.attention's own call) forward and backward, once through torch's bundled FA2 and once through FA4
(`ftbench.attention.activate_flash`), on one H100 or another GPU FA4 runs on. Prints, for each case, the largest
difference of the output and of the three gradients (relative to FA2's largest value), and how many of FA4's values
are NaN or infinite.

    python3 bench/fa4_check.py            (PYTHONPATH with flash-attn-4 and the CUTLASS DSL's dsl_packages)

Why: the FA4 rung's loss was NaN from step 2 on an H100 (measurements/h100-2026-11-27-e) while its first forward
agreed with FA2's. The cases separate what the rows add to a plain causal call: several sequences in one row, the
fixed number of sequence slots (empty sequences: repeated cumulative bounds) and the trailing padding's pieces.
Exit status 1 where FA4's results hold a NaN or infinity, or differ from FA2's beyond bf16's tolerance."""
from __future__ import annotations

import sys

import torch

from ftbench import attention

HEADS, KV_HEADS, DIM, T, MAX_LEN = 32, 8, 128, 8192, 2048  # Qwen3-8B's attention; 2 rows of 4,096 tokens
TOL = 0.05  # bf16 attention of two kernels: |a - b| over the largest |b|, per tensor


def bounds_of(lengths: list[int], pads: int = 0, slots: int | None = None) -> torch.Tensor:
    """The bounds the rung passes for a row of these sequences and `pads` trailing pad tokens (each at position 0,
    as TRL's collator pads), through the project's own `attention.sequence_bounds`."""
    pos = torch.cat([torch.arange(n) for n in lengths] + [torch.zeros(pads, dtype=torch.long)])
    return attention.sequence_bounds(pos[None], pads, MAX_LEN, slots).cuda()


def cases() -> dict:
    """Name -> a row's cumulative sequence bounds (every sequence at most MAX_LEN tokens, as the loader truncates)."""
    packed = [2048, 2048, 1500, 1300, 900, 396]
    return {"whole sequences": bounds_of([MAX_LEN] * (T // MAX_LEN)),
            "sequences of a packed row": bounds_of(packed),
            "and empty slots (repeated bounds)": bounds_of(packed, slots=133),
            "and a padded tail in pieces": bounds_of(packed[1:4], pads=T - sum(packed[1:4]), slots=133)}


def run(bounds: torch.Tensor, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k, v = (torch.randn(T, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
            for _ in range(2))
    out = attention._flash(q, k, v, bounds, MAX_LEN, DIM ** -0.5)
    grad = torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=g)
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def compare(a: dict, b: dict) -> dict:
    return {name: {"nonfinite": int((~torch.isfinite(b[name])).sum()),
                   "rel_max_diff": float(((b[name].float() - a[name].float()).abs().max())
                                         / a[name].float().abs().max().clamp(min=1e-6))}
            for name in a}


def main() -> int:
    problem = (attention.flash_impl_problem("fa4", torch.device("cuda")) if torch.cuda.is_available()
               else "no CUDA GPU on this machine")
    if problem:
        print(f"FA4 cannot run here: {problem}")
        return 2
    rows = cases()
    reference = {name: run(b) for name, b in rows.items()}
    print("active:", attention.activate_flash("fa4"), "| torch", torch.__version__)
    bad = False
    for name, b in rows.items():
        try:
            got = compare(reference[name], run(b))
        except Exception as e:  # noqa: BLE001 - the check reports every case
            print(f"{name}: {type(e).__name__}: {e}")
            bad = True
            continue
        fails = [t for t, c in got.items() if c["nonfinite"] or c["rel_max_diff"] > TOL]
        bad |= bool(fails)
        print(f"{name}: " + "; ".join(f"{t} {c['rel_max_diff']:.4f} ({c['nonfinite']} non-finite)"
                                      for t, c in got.items()) + (f"  <- {', '.join(fails)}" if fails else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
