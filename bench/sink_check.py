"""On a CUDA GPU: does gpt-oss's attention with sinks through the flash kernel (ftbench.build.attention.SinkAttention, what
`attention: varlen` runs for gpt-oss) compute what gpt-oss's eager attention computes per sequence, forward and
backward (q, k, v and the sinks), in bf16 at gpt-oss-120b's head layout (64 query heads, 8 KV heads, head dim 64),
with and without its 128-token sliding window? And how long does each take, with how much memory, on a packed row?
Seconds on a lent GPU: run it before a full-scale gpt-oss cell (bench/measure_check.sh part `sink-check`).
Exits 1 when a difference exceeds bf16's tolerance. Without a GPU it runs the same comparison on the CPU (the
per-sequence path in fp32, short sequences): a check of this script, not of the kernel.

    python bench/sink_check.py [LENGTH ...]     # the packed sequences' lengths (default 2048 1500 700 1900)
"""

import sys
import time

import torch

from ftbench.build import attention

cuda = torch.cuda.is_available()
DEV, DT = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
lengths = [int(x) for x in sys.argv[1:]] or ([2048, 1500, 700, 1900] if cuda else [300, 200, 90])
print("torch", torch.__version__, torch.cuda.get_device_name() if cuda else "cpu", "flash keywords:",
      sorted(attention._FLASH_KW))
g = torch.Generator(device=DEV).manual_seed(0)
T, edges = sum(lengths), [0, *torch.tensor(lengths).cumsum(0).tolist()]
bounds = torch.tensor(edges, dtype=torch.int32, device=DEV)
q = torch.randn(T, 64, 64, device=DEV, dtype=DT, generator=g, requires_grad=True)
k, v = (torch.randn(T, 8, 64, device=DEV, dtype=DT, generator=g, requires_grad=True) for _ in range(2))
sinks = torch.randn(64, device=DEV, dtype=DT, generator=g, requires_grad=True)
scale = 64 ** -0.5


def eager(window):
    """gpt-oss's own eager attention (transformers), one sequence at a time, its mask causal and windowed."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = type("M", (), {"sinks": sinks, "num_key_value_groups": 8, "training": False})
    outs = []
    for a, b in zip(edges, edges[1:]):
        i = torch.arange(b - a, device=DEV)
        ok = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] < window) if window else True)
        mask = torch.zeros(b - a, b - a, device=DEV, dtype=DT).masked_fill(~ok, float("-inf"))
        out, _ = eager_attention_forward(module, *(x[a:b].transpose(0, 1)[None] for x in (q, k, v)), mask[None, None],
                                         scale)
        outs.append(out[0])
    return torch.cat(outs)


def flash(window):
    return attention.sink_attention(q, k, v, sinks, bounds, max(lengths), scale, window)


failed = False
for window in (None, 128):
    results = {}
    for name, fn in (("flash+sinks", flash), ("eager", eager)):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        out = fn(window)
        out.float().square().sum().backward()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
        results[name] = (out.detach().float(), [t.grad.float().clone() for t in (q, k, v, sinks)])
        for t in (q, k, v, sinks):
            t.grad = None
        t0 = time.perf_counter()
        for _ in range(5):
            fn(window).float().square().sum().backward()
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3 / 5
        for t in (q, k, v, sinks):
            t.grad = None
        print(f"window {window}: {name}: forward+backward {ms:.2f} ms, "
              f"{peak:.0f} MiB above the inputs (T={T}, {len(lengths)} sequences)")
    (o1, g1), (o2, g2) = results["flash+sinks"], results["eager"]
    for what, a, b in (("out", o1, o2), *zip(("dq", "dk", "dv", "dsinks"), g1, g2)):
        rel = ((a - b).norm() / b.norm()).item()
        bad = not rel < 2e-2
        failed |= bad
        print(f"window {window}: {what} relative difference {rel:.2e}{'  <-- FAIL' if bad else ''}")
sys.exit(1 if failed else 0)
