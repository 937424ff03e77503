"""What the measurement itself costs: the same fixed-shape training step timed bare (one synchronisation at
each end of N steps) and through the harness's Meter (a CUDA event per step, the NVML sampler thread, the
memory log), alternated over rounds. Prints per-step times and the overhead in percent with its spread.

    python bench/meter_overhead.py [--steps 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from ftbench.config.settings import MeasureSettings  # noqa: E402
from ftbench.harness.meter import Meter, pick_device, synchronize  # noqa: E402


def workload(device, width: int, layers: int, tokens: int):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randn(tokens, width, device=device, dtype=dtype)

    def step():
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def bare(device, step, n: int) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    synchronize(device)
    return (time.perf_counter() - t0) / n


def metered(device, step, n: int) -> float:
    meter = Meter(device, MeasureSettings(warmup_steps=0, steps=n, repeats=1), memory_log_every=10)
    with meter:
        meter.start()
        t0 = time.perf_counter()
        for _ in range(n):
            meter.step(1, loss=step(), tokens=1)
        meter.finish()
        return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    device = pick_device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {name}, torch {torch.__version__}, {args.steps} steps x {args.rounds} rounds, alternated")
    shapes = [(4096, 8, 8192), (4096, 2, 2048)] if device.type == "cuda" else [(512, 4, 256)]
    for width, layers, tokens in shapes:
        step = workload(device, width, layers, tokens)
        bare(device, step, 20)  # warm-up: allocator, kernels
        b, m = [], []
        for _ in range(args.rounds):
            b.append(bare(device, step, args.steps))
            m.append(metered(device, step, args.steps))
        diffs = [(mi - bi) / bi * 100 for bi, mi in zip(b, m)]
        print(f"width {width} x {layers} layers, {tokens} tokens: bare {statistics.median(b) * 1e3:.3f} ms/step "
              f"(CV {statistics.stdev(b) / statistics.fmean(b):.2%}), metered {statistics.median(m) * 1e3:.3f} ms/step "
              f"(CV {statistics.stdev(m) / statistics.fmean(m):.2%}); overhead median {statistics.median(diffs):+.2f}% "
              f"(rounds: min {min(diffs):+.2f}%, max {max(diffs):+.2f}%)")


if __name__ == "__main__":
    main()
