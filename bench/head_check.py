"""The LM head's loss on the frontier's step, three ways: TRL's fused head (per-token log-probabilities in chunks,
three bf16 GEMMs: the forward's, the backward's recomputation, the input's gradient; what the FA4 rung runs), and
ftbench.build.head's two GEMMs a chunk of tokens with the gradient formed in the forward (knob lm_head), in bf16
(two-gemm) and in FP8 (fp8). Qwen3-8B's head on one step of the rung: 8,192 positions of 4,096 hidden values, a
151,936-token vocabulary, 1 % of the labels ignored.

Prints for each: the loss against TRL's, the hidden states' gradient against TRL's (largest difference over TRL's
largest value, and the cosine of the two), forward + backward time (CUDA events; 3 warm-up calls, then 10 timed;
median and CV) and peak memory above the inputs'.

    python3 bench/head_check.py        (a CUDA GPU with TRL and Liger Kernel; ~1 min)

Exit status 1 where the bf16 head's loss differs from TRL's by more than 1e-3 relative or a gradient is not
finite; 2 without a CUDA GPU."""
from __future__ import annotations

import statistics
import sys

import torch

from ftbench.build.head import IGNORE, HeadWeights, head_loss

N, HIDDEN, VOCAB = 8192, 4096, 151936
WARMUP, REPEATS = 3, 10


def inputs(seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(1, N, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    labels = torch.randint(0, VOCAB, (1, N), device="cuda", generator=g)
    labels[torch.rand(1, N, device="cuda", generator=g) < 0.01] = IGNORE
    return hidden, weight, labels


def trl_loss(hidden, weight, labels):
    """TRL's fused head as its patched forward calls it (the masked positions selected, labels shifted)."""
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, _ChunkedLogProbFunction

    h, t = hidden[:, :-1], labels[:, 1:]
    mask = t != IGNORE
    logp = _ChunkedLogProbFunction.apply(h[mask], weight, None, t[mask], 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0,
                                         ("log_probs",))[0]
    return -logp.sum() / mask.sum()


def measure(fn, hidden) -> dict:
    """fn(h) -> loss; forward and backward timed with CUDA events."""
    times = []
    for i in range(WARMUP + REPEATS):
        h = hidden.detach().requires_grad_(True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if i == WARMUP:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start.record()
        loss = fn(h)
        loss.backward()
        end.record()
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(end))
    med = statistics.median(times)
    return {"loss": loss.detach().float(), "grad": h.grad.float(), "ms": med,
            "cv": statistics.stdev(times) / statistics.mean(times), "peak_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}


def main() -> int:
    if not torch.cuda.is_available():
        print("head_check: no CUDA GPU")
        return 2
    hidden, weight, labels = inputs()
    print(f"head_check: {torch.cuda.get_device_name()}, torch {torch.__version__}; {N} positions x {HIDDEN} -> {VOCAB}")
    results = {"trl (3 bf16 GEMMs)": measure(lambda h: trl_loss(h, weight, labels), hidden)}
    for kind in ("two-gemm", "fp8"):
        weights = HeadWeights(weight, kind)
        results[f"ftbench.build.head {kind}"] = measure(lambda h, w=weights: head_loss(h, labels, w), hidden)
    ref = results["trl (3 bf16 GEMMs)"]
    status = 0
    for name, r in results.items():
        rel_loss = abs(r["loss"].item() - ref["loss"].item()) / abs(ref["loss"].item())
        diff = (r["grad"] - ref["grad"]).abs().max().item() / ref["grad"].abs().max().item()
        cos = torch.nn.functional.cosine_similarity(r["grad"].flatten(), ref["grad"].flatten(), dim=0).item()
        finite = bool(torch.isfinite(r["grad"]).all())
        print(f"  {name:24s} loss {r['loss'].item():.5f} (rel. diff {rel_loss:.2e}), grad max diff {diff:.3e}, "
              f"cosine {cos:.6f}, finite {finite}; {r['ms']:.2f} ms fwd+bwd (CV {100 * r['cv']:.1f} %), "
              f"peak +{r['peak_gib']:.2f} GiB; x TRL's time {ref['ms'] / r['ms']:.2f}")
        if not finite or (name.endswith("two-gemm") and rel_loss > 1e-3):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
