"""FlashAttention-4 against FlashAttention-2 on the rows the frontier trains: the same variable-length causal
attention forward and backward, once through torch's bundled FA2 (`torch.nn.attention.varlen.varlen_attn`), and
through FA4 by two routes:

- `fa4_varlen`: the project's own operator (`ftbench.build.attention.fa4_varlen`, what flash_impl fa4 runs), eagerly and
  compiled with CUDA graphs (torch.compile, mode reduce-overhead, as the frontier's rungs run their layers), replayed
  on rows whose boundaries change from step to step;
- torch's FA4 registration (`torch.nn.attention.activate_flash_attention_impl`), which the rung ran before
  2026-11-27's twenty-first session, pointed at this script's shims of flash-attn-4's two functions; the check prints
  the arguments torch passes them.

Prints, for each case and route, the largest difference of the output and of the three gradients (relative to FA2's
largest value) and how many values are NaN or infinite.

    python3 bench/fa4_check.py            (PYTHONPATH with flash-attn-4 and the CuTe DSL's python_packages)

Why: the FA4 rung's loss was NaN from step 2 on an H100 (measurements/h100-2026-11-27-e) while its first forward
agreed with FA2's. The cases separate what the rows add to a plain causal call: several sequences in one row, the
fixed number of sequence slots (empty sequences: repeated cumulative bounds) and the trailing padding's pieces.
Exit status 1 where the project's route gives a NaN or infinity, or differs from FA2 beyond bf16's tolerance (torch's
route is reported, not judged: the project no longer runs it)."""
from __future__ import annotations

import inspect
import sys

import torch

from ftbench.build import attention

HEADS, KV_HEADS, DIM, T, MAX_LEN = 32, 8, 128, 8192, 2048  # Qwen3-8B's attention; 2 rows of 4,096 tokens
TOL = 0.05  # bf16 attention of two kernels: |a - b| over the largest |b|, per tensor
SLOTS = 133
SEEN: dict = {}  # what torch's FA4 registration passed this script's shims, by function


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
            "and empty slots (repeated bounds)": bounds_of(packed, slots=SLOTS),
            "and a padded tail in pieces": bounds_of(packed[1:4], pads=T - sum(packed[1:4]), slots=SLOTS)}


def inputs(seed: int) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(T, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    return q, k, v, torch.randn(T, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=g)


def run(attend, bounds: torch.Tensor, seed: int = 0) -> dict:
    q, k, v, grad = inputs(seed)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = attend(q, k, v, bounds)
    out.backward(grad)
    return {"out": out.detach().clone(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def fa2(q, k, v, bounds):
    return attention._flash(q, k, v, bounds, MAX_LEN, DIM ** -0.5)


def fa4(q, k, v, bounds):
    return attention.fa4_varlen(q, k, v, bounds, MAX_LEN, DIM ** -0.5)[0]


def compare(a: dict, b: dict) -> dict:
    return {name: {"nonfinite": int((~torch.isfinite(b[name])).sum()),
                   "rel_max_diff": float(((b[name].float() - a[name].float()).abs().max())
                                         / a[name].float().abs().max().clamp(min=1e-6))}
            for name in a}


def report(label: str, reference: dict, attempt) -> bool:
    """Print one comparison; True where it fails."""
    try:
        got = compare(reference, attempt())
    except Exception as e:  # noqa: BLE001 - the check reports every case
        print(f"  {label}: {type(e).__name__}: {str(e)[:300]}")
        return True
    fails = [t for t, c in got.items() if c["nonfinite"] or c["rel_max_diff"] > TOL]
    print(f"  {label}: " + "; ".join(f"{t} {c['rel_max_diff']:.4f} ({c['nonfinite']} non-finite)"
                                     for t, c in got.items()) + (f"  <- {', '.join(fails)}" if fails else ""))
    return bool(fails)


def _brief(x):
    return f"tensor{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else x


def _recording(name: str, keep: int):
    """flash-attn-4's function `name` as torch's FA4 registration unpacks it (its first `keep` outputs), the
    arguments of its last call recorded in SEEN."""
    def call(*args, **kwargs):
        from flash_attn.cute import interface

        SEEN[name] = {**{f"arg{i}": _brief(a) for i, a in enumerate(args)}, **{k: _brief(v) for k, v in kwargs.items()}}
        return tuple(getattr(interface, name)(*args, **kwargs)[:keep])

    return call


_flash_attn_fwd = _recording("_flash_attn_fwd", 2)  # (out, lse)
_flash_attn_bwd = _recording("_flash_attn_bwd", 3)  # (dq, dk, dv)


def torch_registration() -> str | None:
    """Torch's own FA4 registration pointed at this script's shims (torch 2.11's backward check refuses causal
    attention's own window (-1, 0), which its variable-length backward always passes: read as none here, as the
    project did until this session). Returns why it cannot, or None."""
    try:
        from torch.nn.attention import _fa4, activate_flash_attention_impl, register_flash_attention_impl
    except ImportError as e:
        return f"torch {torch.__version__} has no FA4 registration ({e})"
    if "module_path" not in inspect.signature(_fa4.register_flash_attention_fa4).parameters:
        return "torch's FA4 registration takes no module path"
    register_flash_attention_impl("FA4", register_fn=lambda: _fa4.register_flash_attention_fa4(module_path=__name__))
    check = getattr(_fa4, "_fa4_backward_support_error", None)
    if check is not None and list(inspect.signature(check).parameters)[-2:] == ["window_size_left",
                                                                                "window_size_right"]:
        def allowing_causal(*args):
            *rest, left, right = args
            if left in (None, -1) and right in (None, -1, 0):
                left = right = None
            return check(*rest, left, right)

        _fa4._fa4_backward_support_error = allowing_causal
    activate_flash_attention_impl("FA4")
    return None


def main() -> int:
    problem = (attention.flash_impl_problem("fa4", torch.device("cuda")) if torch.cuda.is_available()
               else "no CUDA GPU on this machine")
    if problem:
        print(f"FA4 cannot run here: {problem}")
        return 2
    print("torch", torch.__version__, "|", torch.cuda.get_device_name())
    rows = cases()
    reference = {name: run(fa2, b) for name, b in rows.items()}
    bad = False
    print("ftbench.build.attention.fa4_varlen, eager:")
    for name, b in rows.items():
        bad |= report(name, reference[name], lambda b=b: run(fa4, b))
    # compiled with CUDA graphs, as the rungs' layers: recorded on one row's bounds, replayed on others' (the bounds
    # tensor is an input; its values change every step)
    print("ftbench.build.attention.fa4_varlen, torch.compile reduce-overhead (CUDA graphs), rows changing step to step:")
    compiled = torch.compile(fa4, mode="reduce-overhead", fullgraph=True)
    slotted = [n for n, b in rows.items() if b.numel() == SLOTS + 1]
    for step, name in enumerate(slotted * 3):
        bad |= report(f"step {step + 1}, {name}", reference[name], lambda b=rows[name]: run(compiled, b))
    print("torch's FA4 registration (not what the project runs; reported, not judged):")
    why = torch_registration()
    if why:
        print("  cannot register:", why)
    else:
        for name, b in rows.items():
            report(name, reference[name], lambda b=b: run(fa2, b))
        for fn, seen in SEEN.items():
            print(f"  {fn} was called with: {seen}")
        torch.nn.attention.restore_flash_attention_impl()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
