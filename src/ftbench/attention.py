"""Attention over a padding-free row without a mask (variant knob `attention: varlen`, causal LM).

A padding-free batch is one row of concatenated sequences whose position ids restart at 0 at each. Keeping
them apart with a (T, T) block-diagonal mask makes SDPA run its masked kernels over the whole T x T square
(on an H100 the memory-efficient kernel: at batch 4 x ~1,000 tokens it computes 4x the attention it needs,
and the mask grows with T^2). Here each layer's attention runs on the cumulative sequence lengths instead:
PyTorch's variable-length flash kernel (`torch.nn.attention.varlen.varlen_attn`) on a CUDA GPU, one causal
SDPA call per sequence elsewhere (the same arithmetic, for CPUs and tests). The runner computes the lengths
once per step from the loader's position ids (host tensors: no device sync) and passes them to every layer
through the model's keyword arguments (`cu_seq_lens_q`, `max_length_q`: transformers' own names).
"""

from __future__ import annotations

import inspect
import math

import torch

NAME = "ftbench_varlen"  # the name it is registered under in transformers' AttentionInterface

try:  # torch >= 2.9; its keywords changed between releases, so read them once here, outside any traced code
    from torch.nn.attention.varlen import varlen_attn
    _PARAMS = set(inspect.signature(varlen_attn).parameters)
except ImportError:  # pragma: no cover - older torch
    varlen_attn, _PARAMS = None, set()


def kernel(device) -> str:
    """What computes the attention on this device, for the record."""
    if device.type == "cuda" and varlen_attn is not None:
        return "torch.nn.attention.varlen.varlen_attn (flash, variable length)"
    return "causal SDPA per sequence (no variable-length kernel on this device)"


def sequence_bounds(position_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative sequence boundaries of a padding-free row, [0, end of sequence 1, ..., T], as int32 (what
    flash kernels call cu_seqlens), from its position ids (restarting at 0 at each sequence)."""
    if position_ids.shape[0] != 1:
        raise ValueError(f"a padding-free batch is one row; got position ids of shape {tuple(position_ids.shape)}")
    pos = position_ids[0]
    starts = (pos == 0).nonzero().flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        raise ValueError("position ids of a padding-free row start at 0")
    return torch.cat([starts, torch.tensor([pos.numel()], device=pos.device)]).to(torch.int32)


def step_kwargs(position_ids: torch.Tensor, max_length: int) -> dict:
    """The keyword arguments a forward pass carries to each layer's attention. `max_length` bounds every
    sequence's length (the loader truncates to it): a constant, so compiled layers see no new value per step."""
    bounds = sequence_bounds(position_ids)
    return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": max_length, "max_length_k": max_length}


def _flash(q, k, v, bounds, max_length: int, scale: float):
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
        enable_gqa=gqa).transpose(0, 1) for a, b in zip(edges, edges[1:])]
    return torch.cat(out)


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: query (1, Hq, T, D), key and value (1, Hkv, T, D);
    returns (1, T, Hq, D) and no weights."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None:
        raise RuntimeError("attention 'varlen' needs the sequence boundaries (cu_seq_lens_q) with every forward "
                           "pass; a padding-free batch carries them (ftbench.attention.step_kwargs)")
    if dropout:
        raise NotImplementedError("attention 'varlen' has no dropout")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (T, H, D)
    if q.is_cuda and varlen_attn is not None:
        if q.dtype == torch.float32 and torch.is_autocast_enabled("cuda"):
            # fp32 activations under 16-bit autocast (a k-bit model's norms, upcast by PEFT's preparation): the
            # flash kernel takes 16-bit inputs only; SDPA's autocast casts the same way
            q, k, v = (x.to(torch.get_autocast_dtype("cuda")) for x in (q, k, v))
        out = _flash(q, k, v, bounds, int(kwargs.get("max_length_q") or q.shape[0]), scale)
    else:
        out = _per_sequence(q, k, v, bounds, scale)
    return out.unsqueeze(0), None


def use_varlen(model) -> None:
    """Make the model's layers call `varlen_attention` (registered once with transformers)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(NAME)
    if base.config._attn_implementation != NAME:
        raise RuntimeError(f"{type(base).__name__} did not take attention {NAME!r} "
                           f"(it runs {base.config._attn_implementation!r})")
