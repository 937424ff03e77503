"""LoRA B's backward in one read of the output gradient (variant knob `lora_b_one_read`).

A LoRA adapter adds s * (x A^T) B^T to a frozen projection's output. With h = x A^T (tokens x r, r small), the
backward of the B product needs two things from the output gradient dy (tokens x out features):

    dh = s * dy B        (tokens x r: what flows on to A and to the input)
    dB = s * dy^T h      (out features x r: B's gradient)

PyTorch's autograd runs them as two GEMMs, each reading all of dy: at rank 8 each GEMM is a few FLOPs per byte,
bound by memory, and dy is the largest tensor either touches (8,192 x 12,288 bf16, 192 MiB, for Qwen3-8B's gate at
two rows of 4,096 tokens). Here one Triton kernel reads each tile of dy once and forms both: a program owns a block
of columns (its dB block stays in registers across its rows) and a run of rows; each column block writes its fp32
share of dh (tokens x r) and each run its share of dB, summed after (no atomics: the same sums every run; the shares
are ~6 % of dy's bytes at 256 columns a block). So the adapter's backward reads dy once, not twice: at the power
limit a pass over memory saved is time saved. Measured: 1.5-1.7x the two GEMMs alone on an H100, but within noise in
the step at the card's power limit (1.003x; measurements/h100-2026-11-28-d), its profile with device-to-device copies
that came with it (-e).

Arithmetic: both products accumulate in fp32 from operands in dy's dtype (B cast to it, as autocast casts it for
PyTorch's GEMM), so the result is PyTorch's up to summation order; dB comes back in B's dtype (fp32 for PEFT's
adapters: one rounding, where autocast's GEMM rounds to bf16 first).

`lora_b_grads` is a PyTorch custom op (`torch.ops.ftbench.lora_b_grads`), so torch.compile keeps it whole in the
compiled backward and CUDA graphs capture it; on a CPU (tests) it runs the reference arithmetic, and
`triton_lora_b_grads` runs the kernel itself (on a CPU under Triton's interpreter, TRITON_INTERPRET=1).
"""

from __future__ import annotations

import functools

import torch


def reference_lora_b_grads(dy: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float):
    """(dh, dB) by two matrix products in fp32: the arithmetic the kernel must give."""
    dyf = dy.float()
    op = dy.dtype  # operands as the GEMMs see them (B and h in dy's dtype), products in fp32
    dh = dyf @ b.to(op).float() * scale
    db = dyf.t() @ h.to(op).float() * scale
    return dh.to(h.dtype), db.to(b.dtype)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def lora_b_grads_kernel(dy_ptr, h_ptr, b_ptr, p_ptr, q_ptr, M, N, R, tiles_per_prog, scale,
                            s_dym, s_dyn, s_hm, s_hr, s_bn, s_br,
                            BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        offs_n = pid_n * BN + tl.arange(0, BN)
        offs_r = tl.arange(0, BR)
        mask_n = offs_n < N
        mask_r = offs_r < R
        b = tl.load(b_ptr + offs_n[:, None] * s_bn + offs_r[None, :] * s_br,
                    mask=mask_n[:, None] & mask_r[None, :], other=0.0).to(dy_ptr.dtype.element_ty)
        acc = tl.zeros((BN, BR), dtype=tl.float32)
        for i in range(tiles_per_prog):
            offs_m = (pid_m * tiles_per_prog + i) * BM + tl.arange(0, BM)
            mask_m = offs_m < M
            dy = tl.load(dy_ptr + offs_m[:, None] * s_dym + offs_n[None, :] * s_dyn,
                         mask=mask_m[:, None] & mask_n[None, :], other=0.0)
            h = tl.load(h_ptr + offs_m[:, None] * s_hm + offs_r[None, :] * s_hr,
                        mask=mask_m[:, None] & mask_r[None, :], other=0.0).to(dy.dtype)
            acc += tl.dot(tl.trans(dy), h)
            # this column block's share of dh for these rows, a plane of its own (summed after: no atomics)
            tl.store(p_ptr + pid_n * M * R + offs_m[:, None] * R + offs_r[None, :], tl.dot(dy, b) * scale,
                     mask=mask_m[:, None] & mask_r[None, :])
        tl.store(q_ptr + pid_m * N * R + offs_n[:, None] * R + offs_r[None, :], acc * scale,
                 mask=mask_n[:, None] & mask_r[None, :])

    return lora_b_grads_kernel


# tiles and launch settings (BM rows by BN columns of dy a step), chosen on an H100 by bench/lora_grads_check.py
# --sweep over Qwen3-8B's shapes at M = 8,192, replayed from CUDA graphs (2026-11-28): at 4,096 and 1,024 columns
# 64 x 256 with 4 warps (43.0 and 16.7 us against the two GEMMs' 64.1 and 25.5); at 12,288 columns 32 x 512 (94.2 us
# against 159.7; 64 x 256 took 117.3). B's gradient formed the other way round (h^T dy) was no faster, and far slower
# at 32 x 512.
CONFIG = {"BM": 64, "BN": 256, "num_warps": 4, "num_stages": 3}
WIDE = {"BM": 32, "BN": 512, "num_warps": 4, "num_stages": 3}  # from 8,192 columns


def config_for(n: int) -> dict:
    """The kernel's settings for an output gradient of `n` columns."""
    return WIDE if n >= 8192 else CONFIG


def _grid(m: int, n: int, programs: int, bm: int = 64, bn: int = 256) -> tuple[int, int, int]:
    """(column blocks, row runs, row tiles a run): enough programs to fill `programs` slots, each run at least
    two row tiles long; fewer runs where the column blocks alone fill the slots (each run writes a partial dB)."""
    col_blocks = -(-n // bn)
    row_tiles = -(-m // bm)
    runs = max(1, min(-(-programs // col_blocks), row_tiles // 2 or 1))
    per_run = -(-row_tiles // runs)
    return col_blocks, -(-row_tiles // per_run), per_run


@functools.cache
def _sm_count(index: int | None) -> int:
    """The streaming multiprocessors of CUDA device `index` (the current one for None), asked once."""
    device = torch.cuda.current_device() if index is None else index
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_lora_b_grads(dy: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float, config: dict | None = None):
    """(dh, dB) from one read of dy by the Triton kernel. dy: [M, N]; h: [M, r]; b: [N, r]; r at most 64. Each
    column block writes its fp32 share of dh and each run of rows its fp32 share of dB; the shares are summed after
    (a fixed order: the same result every run)."""
    m, n = dy.shape
    r = h.shape[1]
    if r > 64:
        raise ValueError(f"lora_b_grads: rank {r} over the kernel's 64")
    if dy.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"lora_b_grads: output gradient in {dy.dtype}")
    cfg = {**config_for(n), **(config or {})}
    slots = 2 * (_sm_count(dy.device.index) if dy.is_cuda else 4)
    cols, runs, per_run = _grid(m, n, slots, cfg["BM"], cfg["BN"])
    p = torch.empty(cols, m, r, device=dy.device, dtype=torch.float32)
    q = torch.empty(runs, n, r, device=dy.device, dtype=torch.float32)
    launch = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]} if dy.is_cuda else {}
    _kernel()[(cols, runs)](dy, h, b, p, q, m, n, r, per_run, scale,
                            dy.stride(0), dy.stride(1), h.stride(0), h.stride(1), b.stride(0), b.stride(1),
                            BM=cfg["BM"], BN=cfg["BN"], BR=max(16, 1 << (r - 1).bit_length()), **launch)
    return p.sum(0).to(h.dtype), q.sum(0).to(b.dtype)


@torch.library.custom_op("ftbench::lora_b_grads", mutates_args=())
def lora_b_grads(dy: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s dy B, s dy^T h): the kernel on a CUDA device, the reference arithmetic elsewhere."""
    if dy.is_cuda:
        return triton_lora_b_grads(dy, h, b, scale)
    return reference_lora_b_grads(dy, h, b, scale)


@lora_b_grads.register_fake
def _(dy, h, b, scale):
    return h.new_empty(h.shape), b.new_empty(b.shape)


class LoRAProduct(torch.autograd.Function):
    """o + s * h B^T for 2-D o (tokens x out features) and h (tokens x r): a LoRA adapter's product added to its frozen
    projection's output, whose backward forms B's gradient and h's from one read of the output gradient
    (`lora_b_grads`). `epilogue`: the sum formed by the GEMM (addmm), else as an add of its own. h and B^T meet in
    h's dtype (B cast, as autocast casts it); o must be in h's dtype. The forward returns a tensor of its own, never
    a view or an input: torch 2.11's Dynamo routes the gradient of an autograd.Function whose output aliases one of
    its intermediates to the wrong slot (pytorch/pytorch#180642), which here dropped o's gradient (the frozen
    projection's input gradient) and trained nothing. Reshape and cast outside (`product`)."""

    @staticmethod
    def forward(ctx, o, h, b, scale: float, epilogue: bool):
        b_op = b.to(h.dtype)
        out = torch.addmm(o, h, b_op.t(), alpha=scale) if epilogue else o + (h @ b_op.t()) * scale
        ctx.save_for_backward(h, b)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        h, b = ctx.saved_tensors
        dh, db = torch.ops.ftbench.lora_b_grads(grad, h, b, ctx.scale)
        return grad, dh, db, None, None


def product(o: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float, epilogue: bool) -> torch.Tensor:
    """o + s * h B^T through `LoRAProduct` for o and h of any leading shape, in o's dtype."""
    flat_o, flat_h = o.reshape(-1, o.shape[-1]), h.reshape(-1, h.shape[-1])
    if flat_o.dtype != flat_h.dtype:
        flat_o = flat_o.to(flat_h.dtype)
    return LoRAProduct.apply(flat_o, flat_h, b, scale, epilogue).reshape(o.shape).to(o.dtype)
