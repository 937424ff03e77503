"""Attention over a padding-free row without a mask (variant knob `attention: varlen`, causal LM).

A padding-free batch is one row of concatenated sequences whose position ids restart at 0 at each. Keeping
them apart with a (T, T) block-diagonal mask makes SDPA run its masked kernels over the whole T x T square
(on an H100 the memory-efficient kernel: at batch 4 x ~1,000 tokens it computes 4x the attention it needs,
and the mask grows with T^2). Here each layer's attention runs on the cumulative sequence lengths instead:
PyTorch's variable-length flash kernel (`torch.nn.attention.varlen.varlen_attn`) on a CUDA GPU, one causal
SDPA call per sequence elsewhere (the same arithmetic, for CPUs and tests). The runner computes the lengths
once per step from the batch's position ids and passes them to every layer through the model's keyword arguments
(`cu_seq_lens_q`, `max_length_q`: transformers' own names): by default from the batch the loader has already moved
to the GPU (reading its values syncs the host with the device), with variant knob `sync_free` in the loader's
collator from host tensors (`HostBoundsCollator`).

Attention sinks and sliding windows (gpt-oss): each head has a sink logit that joins every query's softmax as
an extra key with no value, and half the layers see only the last `sliding_window` tokens. The flash kernel
computes neither the sink nor returns a gradient through its log-sum-exp, so `SinkAttention` folds the sink in
around it, exactly: with lse the row's log-sum-exp over the real keys and f = sigmoid(lse - sink), the output is
f * out, and the gradient is the kernel's own backward called with f * grad_out and the final output in place
of `out` (its softmax-backward term then reads f * <grad_out, final>, which is the sink-softmax's); the sink's
own gradient is -sum over tokens of (1 - f) <grad_out, final>. No T x T score matrix is ever formed (eager
attention with sinks forms one per layer: 16 GiB at batch 16 x 2,048 tokens on gpt-oss-120b). The window is
the kernel's left window (sliding_window - 1 earlier tokens and the token itself).
"""

from __future__ import annotations

import importlib.util
import inspect
import math

import torch

from ftbench.core.knobs import FLASH_IMPLS

NAME = "ftbench_varlen"  # the name it is registered under in transformers' AttentionInterface

try:  # torch >= 2.9; its keywords changed between releases, so read them once here, outside any traced code
    from torch.nn.attention.varlen import varlen_attn
    _PARAMS = set(inspect.signature(varlen_attn).parameters)
except ImportError:  # pragma: no cover - older torch
    varlen_attn, _PARAMS = None, set()
try:  # the flash kernel's forward (with its log-sum-exp) and backward, for attention with sinks
    _FLASH_KW = {a.name for a in torch.ops.aten._flash_attention_forward.default._schema.arguments}
except (AttributeError, RuntimeError):  # pragma: no cover - a build without them
    _FLASH_KW = set()


def flash_impl_problem(impl: str, device) -> str | None:
    """Why this machine cannot run the variable-length attention through `impl` (variant knob flash_impl), or None."""
    name, module, package, caps = FLASH_IMPLS[impl]
    where = " or ".join(f"{a}.{b}" for a, b in caps)
    if device.type != "cuda":
        return f"{name} runs on CUDA GPUs of compute capability {where}; this machine has none"
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) not in caps:
        return f"{name} runs on compute capability {where}; this GPU has {cap[0]}.{cap[1]}"
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        return f"{name}: {module} is not installed ({package})"
    return None


_IMPL: str | None = None  # the flash implementation `_flash` runs (variant knob flash_impl), once activated


def activate_flash(impl: str) -> str | None:
    """The variable-length attention of this process through `impl` (variant knob flash_impl): FA4 runs
    flash-attn-4's own varlen forward and backward (`fa4_varlen`); returns the implementation now active."""
    global _IMPL
    name, module = FLASH_IMPLS[impl][:2]
    importlib.import_module(module)
    _IMPL = name
    return _IMPL


def _fa4_interface():
    from flash_attn.cute import interface

    return interface


@torch.library.custom_op("ftbench::fa4_varlen", mutates_args=())
def fa4_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor, max_length: int,
               scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention over a packed row through flash-attn-4 (flash_attn.cute), as its own
    `flash_attn_varlen_func` calls it: q (T, Hq, D), k and v (T, Hkv, D), grouped-query heads native; returns the
    output (T, Hq, D) and the log-sum-exp (Hq, T). An operator of its own, opaque to torch.compile and captured
    whole in CUDA graphs. Why not torch's FA4 registration (torch.nn.attention.activate_flash_attention_impl): torch
    2.11's calls flash-attn-4 4.0.0b36's functions with arguments that have drifted from them (five forward outputs
    unpacked as two; every window refused in the backward, measurements/h100-2026-11-27-c, -d) and without the
    longest sequence's length, and the rung it ran trained NaN from its second step (measurements/h100-2026-11-27-e);
    here every argument is named, as flash-attn-4's own varlen function names it."""
    out, lse = _fa4_interface()._flash_attn_fwd(
        q, k, v, cu_seqlens_q=bounds, cu_seqlens_k=bounds, max_seqlen_q=max_length, max_seqlen_k=max_length,
        softmax_scale=scale, causal=True, return_lse=True)[:2]
    return out, lse


@fa4_varlen.register_fake
def _(q, k, v, bounds, max_length, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty((q.shape[1], q.shape[0]), dtype=_acc(q.dtype))


@torch.library.custom_op("ftbench::fa4_varlen_backward", mutates_args=())
def fa4_varlen_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, bounds: torch.Tensor, max_length: int,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fa4_varlen`'s backward: flash-attn-4's, with the arguments its varlen function's backward passes."""
    dq, dk, dv = _fa4_interface()._flash_attn_bwd(
        q, k, v, out, grad.contiguous(), lse, softmax_scale=scale, causal=True, cu_seqlens_q=bounds,
        cu_seqlens_k=bounds, max_seqlen_q=max_length, max_seqlen_k=max_length)[:3]
    return dq, dk, dv


@fa4_varlen_backward.register_fake
def _(grad, q, k, v, out, lse, bounds, max_length, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fa4_setup(ctx, inputs, output):
    q, k, v, bounds, max_length, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], bounds)
    ctx.max_length, ctx.scale = max_length, scale


def _fa4_backward(ctx, grad, grad_lse):
    q, k, v, out, lse, bounds = ctx.saved_tensors
    dq, dk, dv = fa4_varlen_backward(grad, q, k, v, out, lse, bounds, ctx.max_length, ctx.scale)
    return dq, dk, dv, None, None, None


fa4_varlen.register_autograd(_fa4_backward, setup_context=_fa4_setup)


def kernel(device, sinks: bool = False) -> str:
    """What computes the attention on this device, for the record."""
    if sinks:
        return ("flash attention forward/backward (torch.ops.aten._flash_attention_*, variable length) with the "
                "sink logits folded in through its log-sum-exp (ftbench.build.attention.SinkAttention)"
                if device.type == "cuda" and _FLASH_KW else
                "attention with sinks per sequence in fp32 (ftbench.build.attention.SinkAttention; no flash kernel here)")
    if device.type == "cuda" and _IMPL == "FA4":
        return "flash-attn-4's varlen forward and backward (ftbench.build.attention.fa4_varlen; variable length)"
    if device.type == "cuda" and varlen_attn is not None:
        return "torch.nn.attention.varlen.varlen_attn (flash, variable length)"
    return "causal SDPA per sequence (no variable-length kernel on this device)"


def trailing_pads(input_ids: torch.Tensor, position_ids: torch.Tensor, pad_id: int) -> int:
    """How many tokens end a padding-free row as padding: TRL's collator pads the row on the right with pad tokens
    at position 0 each (one row: 1-D tensors)."""
    pad = ((position_ids == 0) & (input_ids == pad_id)).flip(0)
    return int(pad.cumprod(0).sum())


def sequence_bounds(position_ids: torch.Tensor, pads: int = 0, max_length: int | None = None,
                    slots: int | None = None) -> torch.Tensor:
    """Cumulative sequence boundaries of a padding-free row, [0, end of sequence 1, ..., T], as int32 (what
    flash kernels call cu_seqlens), from its position ids (restarting at 0 at each sequence).

    With `slots` (rows of one shape: variant knob token_budget), the `pads` trailing pad tokens form sequences of
    at most `max_length` tokens of their own (they carry no labels), and the boundaries are padded to `slots` + 1
    entries by repeating T (empty sequences, which the kernels skip), so every step passes a tensor of one shape;
    a row with more sequences takes the next multiple of `slots` (a new shape, still correct)."""
    if position_ids.shape[0] != 1:
        raise ValueError(f"a padding-free batch is one row; got position ids of shape {tuple(position_ids.shape)}")
    pos = position_ids[0]
    n = pos.numel()
    starts = (pos[:n - pads] == 0).nonzero().flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("position ids of a padding-free row start at 0")
    parts = [starts]
    if pads:
        parts.append(torch.arange(n - pads, n, max_length or pads, device=pos.device))
    bounds = torch.cat([*parts, torch.tensor([n], device=pos.device)]).to(torch.int32)
    if slots:
        width = slots * -(-(bounds.numel() - 1) // slots) + 1
        bounds = torch.cat([bounds, bounds.new_full((width - bounds.numel(),), n)])
    return bounds


def step_kwargs(position_ids: torch.Tensor, max_length: int, pads: int = 0, slots: int | None = None) -> dict:
    """The keyword arguments a forward pass carries to each layer's attention. `max_length` bounds every
    sequence's length (the loader truncates to it): a constant, so compiled layers see no new value per step.
    `pads` and `slots`: a fixed-shape row's trailing padding and its fixed number of sequence slots."""
    bounds = sequence_bounds(position_ids, pads, max_length, slots)
    return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": max_length, "max_length_k": max_length}


def row_kwargs(batch: dict, max_length: int, pad_id: int | None = None, slots: int | None = None) -> dict:
    """A padding-free batch with its step keyword arguments (`step_kwargs`) added; with `slots` (rows of a token
    budget) the trailing pad tokens first. Reads the position ids' values: called on host tensors it costs the
    device nothing; on tensors already on the GPU each read is a host sync."""
    if batch.get("position_ids") is None or "cu_seq_lens_q" in batch:
        return batch
    pads = trailing_pads(batch["input_ids"][0], batch["position_ids"][0], pad_id) if slots else 0
    return {**batch, **step_kwargs(batch["position_ids"], max_length, pads, slots)}


class HostBoundsCollator:
    """The trainer's collator with `row_kwargs` added in the loader, from the batch's host tensors, before the
    loader moves the batch to the GPU (accelerate places batches on the device as it yields them): the step then
    reads no device value to find its sequences (variant knob sync_free). transformers' DataCollatorWithFlattening
    computes the same boundaries in its collator (`return_flash_attn_kwargs`)."""

    def __init__(self, collate, max_length: int, pad_id: int | None, slots: int | None):
        self.collate, self.max_length, self.pad_id, self.slots = collate, max_length, pad_id, slots

    def __call__(self, features):
        return row_kwargs(self.collate(features), self.max_length, self.pad_id, self.slots)


def _flash(q, k, v, bounds, max_length: int, scale: float):
    if _IMPL == "FA4":
        return fa4_varlen(q, k, v, bounds, max_length, scale)[0]
    kw = {}
    if "scale" in _PARAMS:
        kw["scale"] = scale
    elif not math.isclose(scale, q.shape[-1] ** -0.5):
        q = q * (scale * q.shape[-1] ** 0.5)
    if "window_size" in _PARAMS:
        kw["window_size"] = (-1, 0)  # causal
    else:
        kw["is_causal"] = True
    if k.shape[1] != q.shape[1]:  # grouped-query attention
        if "enable_gqa" in _PARAMS:
            kw["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    return varlen_attn(q, k, v, bounds, bounds, max_length, max_length, **kw)


@torch.compiler.disable  # reads the boundaries on the host: a graph break, not a recompile per step
def _per_sequence(q, k, v, bounds, scale: float):
    edges = bounds.tolist()
    gqa = k.shape[1] != q.shape[1]
    out = [torch.nn.functional.scaled_dot_product_attention(
        q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1), is_causal=True, scale=scale,
        enable_gqa=gqa).transpose(0, 1) for a, b in zip(edges, edges[1:]) if b > a]
    return torch.cat(out)


def _acc(dtype) -> torch.dtype:
    """The dtype sums are taken in: fp32, or fp64 for fp64 inputs (tests)."""
    return torch.promote_types(dtype, torch.float32)


def _window_mask(n: int, left: int, device) -> torch.Tensor:
    """(n, n) booleans: causal, and at most `left` earlier tokens where left >= 0."""
    i = torch.arange(n, device=device)
    d = i[:, None] - i[None, :]
    return (d >= 0) & ((d <= left) if left >= 0 else True)


def _sequences(q, k, v, edges, scale, left):
    """Each non-empty sequence of the row (empty slots of fixed-shape rows skipped): its span, its q, k and v as
    (H, t, D) in the summing dtype with the KV heads repeated per query head, and its masked scores (H, t, t)."""
    rep = q.shape[1] // k.shape[1]
    for a, b in zip(edges, edges[1:]):
        if b == a:
            continue
        qs, ks, vs = (x[a:b].transpose(0, 1).to(_acc(q.dtype)) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        s = (qs @ ks.transpose(1, 2) * scale).masked_fill(~_window_mask(b - a, left, q.device), float("-inf"))
        yield a, b, qs, ks, vs, s


def _math_forward(q, k, v, edges, scale, left):
    """What the flash kernel returns, one sequence at a time in fp32 (CPUs and tests): out (T, H, D) and the
    log-sum-exp of each query's scores over its keys, (H, T)."""
    outs, lses = [], []
    for _, _, _, _, vs, s in _sequences(q, k, v, edges, scale, left):
        lse = s.logsumexp(-1)
        outs.append(((s - lse[..., None]).exp() @ vs).transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses, dim=1)


def _math_backward(grad, q, k, v, out, lse, edges, scale, left):
    """The flash kernel's backward, one sequence at a time in fp32: dq, dk, dv from the output's gradient, the
    output and the log-sum-exp (the softmax is recomputed from them, as the kernel does)."""
    acc, h, rep = _acc(q.dtype), k.shape[1], q.shape[1] // k.shape[1]
    dq, dk, dv = (torch.zeros_like(x, dtype=acc) for x in (q, k, v))
    for a, b, qs, ks, vs, s in _sequences(q, k, v, edges, scale, left):
        gs, os_ = (x[a:b].transpose(0, 1).to(acc) for x in (grad, out))
        p = (s - lse[:, a:b, None]).exp()
        ds = p * (gs @ vs.transpose(1, 2) - (gs * os_).sum(-1, keepdim=True))
        dq[a:b] = (ds @ ks * scale).transpose(0, 1)
        dk[a:b] = (ds.transpose(1, 2) @ qs * scale).unflatten(0, (h, rep)).sum(1).transpose(0, 1)
        dv[a:b] = (p.transpose(1, 2) @ gs).unflatten(0, (h, rep)).sum(1).transpose(0, 1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _flash_forward(q, k, v, bounds, max_length: int, scale: float, left: int):
    """The flash kernel on a packed row (grouped-query heads native): out (T, H, D), lse (H, T)."""
    kw = {"scale": scale}
    if left >= 0:
        if "window_size_left" not in _FLASH_KW:
            raise RuntimeError("this PyTorch's flash kernel takes no sliding window")
        kw.update(window_size_left=left, window_size_right=0)
    out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, bounds, bounds, max_length, max_length, 0.0, left < 0, False, **kw)
    if tuple(lse.shape) != (q.shape[1], q.shape[0]):
        raise RuntimeError(f"the flash kernel's log-sum-exp has shape {tuple(lse.shape)}, expected (heads, tokens) "
                           f"{(q.shape[1], q.shape[0])}")
    return out, lse, rng, unused


class SinkAttention(torch.autograd.Function):
    """Causal attention over a packed row with per-head sink logits (and an optional left window); see the
    module's docstring for the arithmetic. q (T, Hq, D), k and v (T, Hkv, D), sinks (Hq,) or None."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, bounds, max_length, scale, left):
        flash = q.is_cuda and bool(_FLASH_KW)
        if flash:
            out, lse, rng, unused = _flash_forward(q, k, v, bounds, max_length, scale, left)
        else:
            edges = bounds.tolist()
            out, lse = _math_forward(q, k, v, edges, scale, left)
            rng = unused = None
        f = None
        if sinks is not None:  # the share of each query's softmax left to the real keys, (T, H, 1)
            f = torch.sigmoid(lse - sinks.to(lse.dtype)[:, None]).transpose(0, 1)[..., None]
            out = (out.to(f.dtype) * f).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, bounds, f, rng, unused)
        ctx.flash, ctx.max_length, ctx.scale, ctx.left = flash, max_length, scale, left
        ctx.sink_dtype = sinks.dtype if sinks is not None else None
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, bounds, f, rng, unused = ctx.saved_tensors
        grad = grad.contiguous()
        g = (grad.to(f.dtype) * f).to(q.dtype) if f is not None else grad
        if ctx.flash:
            kw = {"scale": ctx.scale}
            if ctx.left >= 0:
                kw.update(window_size_left=ctx.left, window_size_right=0)
            dq, dk, dv = torch.ops.aten._flash_attention_backward(
                g, q, k, v, out, lse, bounds, bounds, ctx.max_length, ctx.max_length, 0.0, ctx.left < 0, rng,
                unused, **kw)
        else:
            dq, dk, dv = _math_backward(g, q, k, v, out, lse, bounds.tolist(), ctx.scale, ctx.left)
        dsinks = None
        if f is not None and ctx.needs_input_grad[3]:
            dsinks = (-(1 - f[..., 0]) * (grad.to(f.dtype) * out.to(f.dtype)).sum(-1)).sum(0).to(ctx.sink_dtype)
        return dq, dk, dv, dsinks, None, None, None, None


def sink_attention(q, k, v, sinks, bounds, max_length: int, scale: float, sliding_window=None):
    """Attention with sinks and/or a sliding window over a packed row (T, H, D)."""
    left = sliding_window - 1 if sliding_window else -1
    return SinkAttention.apply(q, k, v, sinks, bounds, max_length, scale, left)


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: query (1, Hq, T, D), key and value (1, Hkv, T, D);
    returns (1, T, Hq, D) and no weights."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        raise RuntimeError("attention 'varlen' needs the sequence boundaries (cu_seq_lens_q) with every forward "
                           "pass; a padding-free batch carries them (ftbench.build.attention.step_kwargs)")
    if dropout:
        raise NotImplementedError("attention 'varlen' has no dropout")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, H, D)
    if q.is_cuda and torch.is_autocast_enabled("cuda") and torch.float32 in (q.dtype, k.dtype, v.dtype):
        # fp32 activations under 16-bit autocast (a k-bit model's norms and embeddings, upcast by PEFT's
        # preparation, make the rotated q and k fp32): flash kernels take one 16-bit dtype; SDPA's autocast casts
        # the same way
        q, k, v = (x.to(torch.get_autocast_dtype("cuda")) for x in (q, k, v))
    max_length = int(kwargs.get("max_length_q") or q.shape[0])
    sinks, window = kwargs.get("s_aux"), kwargs.get("sliding_window")
    if sinks is not None or window:  # gpt-oss: sink logits, and a left window in half its layers
        out = sink_attention(q.contiguous(), k.contiguous(), v.contiguous(), sinks, bounds, max_length, scale, window)
    elif q.is_cuda and varlen_attn is not None:
        out = _flash(q, k, v, bounds, max_length, scale)
    else:
        out = _per_sequence(q, k, v, bounds, scale)
    return out.unsqueeze(0), None


def has_sinks(model) -> bool:
    """Whether the model's attention has sink logits (gpt-oss)."""
    return any(name.endswith(".sinks") or name == "sinks" for name, _ in model.named_parameters())


def use_varlen(model) -> None:
    """Make the model's layers call `varlen_attention` (registered once with transformers)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(NAME)
    if base.config._attn_implementation != NAME:
        raise RuntimeError(f"{type(base).__name__} did not take attention {NAME!r} "
                           f"(it runs {base.config._attn_implementation!r})")
