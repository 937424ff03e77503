"""Fused projections (variant knob `fused_projections`, causal LM): q/k/v and gate/up each as one GEMM.

A decoder layer multiplies the same input by q_proj, k_proj and v_proj, and by gate_proj and up_proj: five GEMMs
(and with LoRA, five more pairs) where two would do. Here the frozen weights of each group are concatenated once,
after LoRA is applied (each projection's base weight becomes a view of the concatenation: no second copy), and
the layer's forward computes the group as one GEMM, its LoRA A matrices as one more (their concatenation is
rebuilt each step from the trainable parameters, so gradients reach each), then each projection's B on its own
slice. The LoRA modules stay where PEFT put them, so the trainable parameters, the optimizer's view and the
adapter PEFT saves are exactly those of the unfused model (an adapter from this rung loads into a plain PEFT
model: tests/test_fused.py). Attention and MLP forwards are those of transformers' Llama-family layers (Qwen3's
q/k norms included); any other layer is left as it is and counted as such.

With frozen weights already cast to FP8 (fp8_recipe static: ftbench.build.fp8.StaticFP8Linear), a group is one FP8 GEMM:
its concatenated weight cast once with one tensorwise scale for the group (each projection's FP8 weight becomes a
view of it), so the layer's input is cast to FP8 once for q/k/v and once for gate/up rather than once per projection,
and the backward casts the group's output gradient once and runs one GEMM for the input's gradient rather than one
per projection plus their sum. The scales differ from the unfused static rung's (one for the group, not one per
projection): numerics of its own, so a loss check of its own before it stands on the frontier.

Knob `fused_adapters` fuses the LoRA A matrices alone: each frozen projection keeps its own GEMM (and FP8 weight,
scale and kept transpose), so the frozen arithmetic is the unfused rung's, and the group's input is read once by one
LoRA A GEMM rather than once a projection (the backward: one GEMM for the A matrices' gradients and one for the
input's LoRA gradient a group).

Knob `lora_b_one_read` gives every LoRA product of the layer (the groups' and o_proj's and down_proj's, each of those
two as a group of one) a backward that reads its output gradient once for both B's gradient and the gradient into
the adapter's rank (ftbench.build.lora_grads: one Triton kernel where PyTorch runs two GEMMs over it).
"""

from __future__ import annotations

import importlib
import types

import torch
from torch import nn
from torch.nn import functional as F

from ftbench.build import lora_grads
from ftbench.build.fp8 import StaticFP8Linear, frozen_fp8, static_fp8_linear


def _base(p):
    return getattr(p, "base_layer", p)


class FusedProjections(nn.Module):
    """Projections of one input, computed together. `projections`: PEFT LoRA linears (or plain nn.Linear), kept
    where they are in the model (held here in a plain list, not as submodules); returns one output each."""

    def __init__(self, projections: list[nn.Module], frozen: bool = True, epilogue: bool = False,
                 one_read: bool = False):
        super().__init__()
        self._parts = list(projections)
        self.epilogue = epilogue
        self.one_read = one_read
        bases = [_base(p) for p in projections]
        self.sizes = [b.out_features for b in bases]
        self.frozen_fused = frozen
        if not frozen:  # the LoRA A matrices alone as one GEMM: each frozen projection stays as it is
            self.fp8 = False
            return
        with torch.no_grad():
            weight = torch.cat([b.weight for b in bases])
            bias = torch.cat([b.bias for b in bases]) if all(b.bias is not None for b in bases) else None
            if bias is None and any(b.bias is not None for b in bases):
                raise ValueError("fused projections: some have a bias and some not")
        kinds = {isinstance(b, StaticFP8Linear) for b in bases}
        if len(kinds) > 1:
            raise ValueError("fused projections: some frozen weights in FP8 and some not")
        self.fp8 = kinds == {True}
        if self.fp8:  # one FP8 weight and scale for the group
            w_fp8, w_inv, _ = frozen_fp8(weight)
            self.register_buffer("w_fp8", w_fp8, persistent=False)
            self.register_buffer("w_inv", w_inv, persistent=False)
        # each base weight (and FP8 weight) a view of the group's: no second copy
        rows = zip(bases, weight.split(self.sizes), bias.split(self.sizes) if bias is not None else [None] * len(bases),
                   w_fp8.split(self.sizes) if self.fp8 else [None] * len(bases))
        for b, w, bb, w8 in rows:
            b.weight = nn.Parameter(w, requires_grad=False)
            if bb is not None:
                b.bias = nn.Parameter(bb, requires_grad=False)
            if w8 is not None:
                b.w_fp8, b.w_inv = w8, w_inv
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def _frozen(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The group's frozen projections of `x`: one GEMM (in FP8 where the weights are), split, or (the LoRA A
        matrices alone fused) each projection's own."""
        if not self.frozen_fused:
            return tuple(_base(p)(x) for p in self._parts)
        return self._fused(x).split(self.sizes, dim=-1)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            return static_fp8_linear(x, self.w_fp8, self.w_inv, self.bias)
        return F.linear(x, self.weight, self.bias)

    def _adapters(self):
        """(A weights, B weights, scalings) of the active LoRA adapter of every projection, or None when any
        projection has none, has dropout, or is disabled (then each adds its own LoRA term)."""
        out = []
        for p in self._parts:
            names = getattr(p, "active_adapters", None)
            if not names or getattr(p, "disable_adapters", False) or getattr(p, "merged", False) or len(names) != 1:
                return None
            name = names[0]
            if name not in p.lora_A or not isinstance(p.lora_dropout[name], nn.Identity):
                return None
            out.append((p.lora_A[name].weight, p.lora_B[name].weight, p.scaling[name]))
        return out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = self._frozen(x)
        adapters = self._adapters()
        if adapters is None:
            if all(getattr(p, "active_adapters", None) is None for p in self._parts):
                return outs
            # a projection with dropout or several adapters: PEFT's own LoRA term per projection
            return tuple(o + (p(x) - _base(p)(x)) for o, p in zip(outs, self._parts))
        a_all = torch.cat([a for a, _, _ in adapters])
        xa = x.to(a_all.dtype) if not torch.is_autocast_enabled(x.device.type) else x
        low = F.linear(xa, a_all).split([a.shape[0] for a, _, _ in adapters], dim=-1)
        return tuple(_add_product(o, h, b, s, self.epilogue, self.one_read)
                     for o, h, (_, b, s) in zip(outs, low, adapters))


def _add_product(o: torch.Tensor, h: torch.Tensor, b: torch.Tensor, s: float, epilogue: bool,
                 one_read: bool = False) -> torch.Tensor:
    """o + s * h B^T: with `epilogue`, the sum formed by the GEMM (addmm: o read in its epilogue, one rounding), where
    autocast gives its operands one dtype or they share one; else (or with mixed dtypes: addmm takes one) as an add of
    its own. `one_read`: the same sum, its backward reading the output gradient once (ftbench.build.lora_grads)."""
    if one_read:
        return lora_grads.product(o, h, b, s, epilogue)
    if not epilogue or not (torch.is_autocast_enabled(o.device.type) or o.dtype == h.dtype == b.dtype):
        return (o + F.linear(h, b) * s).to(o.dtype)
    flat = torch.addmm(o.reshape(-1, o.shape[-1]), h.reshape(-1, h.shape[-1]), b.t(), alpha=s)
    return flat.reshape(o.shape).to(o.dtype)


def _attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
    """transformers' Llama-family attention forward (Qwen3's q/k norms where the layer has them), with q/k/v from
    one fused projection."""
    rotary, eager = self._fused_helpers
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q, k, v = self.qkv(hidden_states)
    q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
    if hasattr(self, "q_norm"):
        q, k = self.q_norm(q), self.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = position_embeddings
    q, k = rotary(q, k, cos, sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # transformers only where a model trains

    attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager)
    out, weights = attend(self, q, k, v, attention_mask, dropout=0.0 if not self.training else self.attention_dropout,
                          scaling=self.scaling, sliding_window=getattr(self, "sliding_window", None), **kwargs)
    return _single(self, "o_proj", out.reshape(*input_shape, -1).contiguous()), weights


def _mlp_forward(self, x):
    gate, up = self.gate_up(x)
    return _single(self, "down_proj", self.act_fn(gate) * up)


def _single(module, name: str, x: torch.Tensor) -> torch.Tensor:
    """The projection `name` of `module` applied to `x`: through its group of one where the layer has one
    (lora_b_one_read), else the projection itself."""
    group = getattr(module, f"{name}_single", None)
    return group(x)[0] if group is not None else getattr(module, name)(x)


ATTENTION = ("LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention")
MLP = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")


def fuse_projections(model, frozen: bool = True, epilogue: bool = False, one_read: bool = False) -> dict:
    """Fuse every supported attention's q/k/v and MLP's gate/up in place (after LoRA is applied, before compile):
    their frozen weights and LoRA A matrices, or with `frozen` false the LoRA A matrices alone (knob
    fused_adapters: each frozen projection keeps its own GEMM, weight and FP8 scale); `epilogue` (knob
    lora_epilogue): each LoRA product added by its B GEMM; `one_read` (knob lora_b_one_read): every LoRA product's
    backward reads its output gradient once, o_proj's and down_proj's too (each a group of one). Returns counts
    for the record."""
    counts = {"attention": 0, "mlp": 0, "left_unfused": [],
              "fused": "frozen weights and LoRA A" if frozen else "LoRA A alone",
              "lora_add": "in the LoRA B GEMM (addmm)" if epilogue else "a pass of its own",
              "lora_b_backward": ("one read of the output gradient (Triton, ftbench.build.lora_grads), o_proj and "
                                  "down_proj included" if one_read else "two GEMMs (PyTorch's autograd)")}
    for module in list(model.modules()):  # a list: fusing adds submodules
        kind = type(module).__name__
        if kind in ATTENTION:
            module.qkv = FusedProjections([module.q_proj, module.k_proj, module.v_proj], frozen, epilogue, one_read)
            if one_read:
                module.o_proj_single = FusedProjections([module.o_proj], False, epilogue, one_read)
            # the model file's own rotary embedding and eager attention, looked up once (not in the traced forward)
            source = importlib.import_module(type(module).__module__)
            module._fused_helpers = (source.apply_rotary_pos_emb, source.eager_attention_forward)
            module.forward = types.MethodType(_attention_forward, module)
            counts["attention"] += 1
        elif kind in MLP:
            module.gate_up = FusedProjections([module.gate_proj, module.up_proj], frozen, epilogue, one_read)
            if one_read:
                module.down_proj_single = FusedProjections([module.down_proj], False, epilogue, one_read)
            module.forward = types.MethodType(_mlp_forward, module)
            counts["mlp"] += 1
        elif kind.endswith(("Attention", "MLP")) and kind not in counts["left_unfused"]:
            counts["left_unfused"].append(kind)
    if not counts["attention"] and not counts["mlp"]:
        raise ValueError(f"fused_projections: no layer of {type(model).__name__} has a known form "
                         f"({', '.join(ATTENTION + MLP)}); found {counts['left_unfused']}")
    return counts
