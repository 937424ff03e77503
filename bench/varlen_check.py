"""On a CUDA GPU: does `attention: varlen`'s kernel (torch.nn.attention.varlen.varlen_attn) compute what causal
SDPA computes per sequence, forward and backward, in bf16 at Qwen3-8B's head layout (32 query heads, 8 KV
heads, head dim 128)? And how long does each take on a packed row? Prints the differences and timings.

    python bench/varlen_check.py [LENGTH ...]     # the packed sequences' lengths (default 1000 700 1300 1100)
"""

import inspect
import sys

import torch

from ftbench.build import attention

lengths = [int(x) for x in sys.argv[1:]] or [1000, 700, 1300, 1100]
print("varlen_attn", inspect.signature(attention.varlen_attn), "torch", torch.__version__, torch.cuda.get_device_name())
g = torch.Generator(device="cuda").manual_seed(0)
T = sum(lengths)
pos = torch.cat([torch.arange(n) for n in lengths])[None]
kw = {k: (x.cuda() if torch.is_tensor(x) else x) for k, x in attention.step_kwargs(pos, 2048).items()}
shapes = {"q": (1, 32, T, 128), "k": (1, 8, T, 128), "v": (1, 8, T, 128)}
q, k, v = (torch.randn(*s, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True) for s in shapes.values())
scale = 128 ** -0.5


def varlen():
    return attention.varlen_attention(None, q, k, v, None, scaling=scale, **kw)[0]


def per_sequence():
    return attention._per_sequence(*(x[0].transpose(0, 1) for x in (q, k, v)), kw["cu_seq_lens_q"], scale)[None]


def masked():  # what the `mask` rung runs: SDPA over the whole row with the block-diagonal mask
    from ftbench.run.runners.causal_lm import document_mask

    mask = document_mask(pos.cuda())
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION):
        kk, vv = (x.repeat_interleave(4, dim=1) for x in (k, v))  # the efficient kernel takes no GQA
        return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scale).transpose(1, 2)


results = {}
for name, fn in (("varlen", varlen), ("per_sequence", per_sequence), ("masked", masked)):
    out = fn()
    out.float().square().sum().backward()
    results[name] = (out.detach().float(), [t.grad.float().clone() for t in (q, k, v)])
    for t in (q, k, v):
        t.grad = None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn().float().square().sum().backward()
    start.record()
    for _ in range(10):
        fn().float().square().sum().backward()
    end.record()
    torch.cuda.synchronize()
    for t in (q, k, v):  # the timed calls accumulated gradients: the next function starts from none
        t.grad = None
    print(f"{name}: forward+backward {start.elapsed_time(end) / 10:.2f} ms per call (T={T}, {len(lengths)} sequences)")
ref_out, ref_grads = results["per_sequence"]
for name in ("varlen", "masked"):
    out, grads = results[name]
    print(f"{name} vs per_sequence: max |out diff| {(out - ref_out).abs().max().item():.3g} "
          f"(|out| max {ref_out.abs().max().item():.3g}); max |grad diff| q,k,v "
          + ", ".join(f"{(a - b).abs().max().item():.3g}" for a, b in zip(grads, ref_grads)))
