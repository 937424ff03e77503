"""Mixture-of-experts layers in the forms LoRA and the GEMMs want: each expert split into its own linear layers
(PEFT's per-expert LoRA, a loop), or packed back into grouped GEMMs (one GEMM over every expert's tokens)."""

from __future__ import annotations

import torch
from torch import nn


class SplitExperts(nn.Module):
    """gpt-oss experts as Study B trained them (Unsloth's bnb-4bit checkpoint): one gate_up and one down linear
    layer per expert (`gate_up_projs.N`, `down_projs.N`), which bitsandbytes quantizes like any linear layer; the
    stock module keeps them as 3-D parameters that stay bf16. Same arithmetic as transformers' GptOssExperts
    (interleaved gate/up, clamped, gated SiLU with alpha 1.702, `up + 1`), one expert at a time over the tokens
    routed to it. The (token, slot) pairs are sorted by expert once per layer and split by the experts' counts, read
    back in one host sync per layer (upstream reads the hit experts, then each expert's tokens: one sync per expert,
    128 a layer at full scale). LoRA's projection names do not match these, so only attention is adapted, as in the
    study."""

    def __init__(self, config):
        super().__init__()
        h, d, self.num_experts = config.hidden_size, config.intermediate_size, config.num_local_experts
        self.gate_up_projs = nn.ModuleList(nn.Linear(h, 2 * d, bias=True) for _ in range(self.num_experts))
        self.down_projs = nn.ModuleList(nn.Linear(d, h, bias=True) for _ in range(self.num_experts))
        self.alpha, self.limit = 1.702, getattr(config, "swiglu_limit", 7.0)
        self.lora = None  # expert LoRA (add_lora): per projection A (E, r, in) and B (E, out, r), trainable

    grouped = False  # variant knob experts: grouped (group_experts): one grouped GEMM per projection per layer

    def forward(self, hidden_states, router_indices=None, routing_weights=None):
        if self.grouped:
            return self._forward_grouped(hidden_states, router_indices, routing_weights)
        out = torch.zeros_like(hidden_states)
        k = router_indices.shape[-1]
        with torch.no_grad():
            flat = router_indices.reshape(-1)
            order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert, tokens in order within each
            counts = torch.bincount(flat, minlength=self.num_experts).tolist()  # the layer's one host sync
        start = 0
        for e, n in enumerate(counts):
            if not n:
                continue
            pairs = order[start:start + n]
            start += n
            token_idx, top_k_pos = pairs // k, pairs % k
            gate_up = self.gate_up_projs[e](hidden_states[token_idx])
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
            y = self.down_projs[e]((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))
            out.index_add_(0, token_idx, (y * routing_weights[token_idx, top_k_pos, None]).to(out.dtype))
        return out

    def _forward_grouped(self, hidden_states, router_indices, routing_weights):
        """What the per-expert loop computes, with one grouped GEMM per projection over all of the layer's experts
        (torch._grouped_mm on the (token, slot) rows sorted by expert, the experts' offsets on the device): a few
        dozen launches a layer instead of ~10 per expert hit, and no host sync (the loop reads its counts back).
        The frozen weights live packed, one buffer per projection (`pack`), and are dequantized to the compute
        dtype in a few launches inside the GEMM's own autograd function, in its forward and again in its
        backward, never kept (a full-scale layer's experts are ~6 GB in bf16)."""
        k = router_indices.shape[-1]
        flat = router_indices.reshape(-1)
        order = flat.argsort(stable=True)
        # counts by scatter, not bincount: CUDA's bincount reads the input's maximum back to the host
        counts = torch.zeros(self.num_experts, dtype=torch.int32, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offsets = counts.cumsum(0, dtype=torch.int32)
        token_idx, slot, expert = order // k, order % k, flat[order]
        gate_up_w, down_w = self.packed["gate_up"], self.packed["down"]
        dtype = gate_up_w.dtype
        x = hidden_states[token_idx].to(dtype)
        gate_up = _GroupedLinear.apply(x, offsets, gate_up_w) + gate_up_w.bias[expert] + self._lora("gate_up", x, offsets)
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate, up = gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)
        act = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))
        y = _GroupedLinear.apply(act, offsets, down_w) + down_w.bias[expert] + self._lora("down", act, offsets)
        weighted = (y * routing_weights[token_idx, slot, None]).to(hidden_states.dtype)
        return torch.zeros_like(hidden_states).index_add_(0, token_idx, weighted)

    packed = None
    lora_scaling = 1.0

    def _lora(self, name: str, x, offsets):
        """LoRA's update for every expert at once, two grouped GEMMs (x A_e^T, then B_e^T, times alpha / r), in
        the activations' dtype (as autocast runs PEFT's adapters); 0 without expert LoRA."""
        if self.lora is None:
            return 0
        a, b = self.lora[f"{name}_A"].to(x.dtype), self.lora[f"{name}_B"].to(x.dtype)
        low = torch._grouped_mm(x, a.transpose(-2, -1), offs=offsets)
        return self.lora_scaling * torch._grouped_mm(low, b.transpose(-2, -1), offs=offsets)

    def add_lora(self, r: int, alpha: float, dtype) -> int:
        """LoRA on each expert's gate_up and down projections, as Unsloth adapts gpt-oss's per-expert layers for the
        study's gate/up/down target modules: A drawn as PEFT draws it (Kaiming uniform, a = sqrt(5)), B zero, so
        the model's outputs are unchanged until it trains. Returns the trainable parameters added."""
        if not self.grouped:
            raise ValueError("expert LoRA runs in the grouped path (experts: grouped)")
        device = self.packed["gate_up"].bias.device
        params = {}
        for name, packed in self.packed.items():
            out, inp = packed.shape
            a = torch.empty(self.num_experts, r, inp, dtype=dtype, device=device)
            for e in range(self.num_experts):
                nn.init.kaiming_uniform_(a[e], a=5 ** 0.5)
            params[f"{name}_A"] = nn.Parameter(a)
            params[f"{name}_B"] = nn.Parameter(torch.zeros(self.num_experts, out, r, dtype=dtype, device=device))
        self.lora, self.lora_scaling = nn.ParameterDict(params), alpha / r
        return sum(p.numel() for p in params.values())

    def pack(self) -> None:
        """Each projection's frozen expert weights in one buffer, the experts' own parameters made views into it
        (no second copy; the per-expert loop and the checkpoint writer read them as before), so the grouped path
        dequantizes a layer's experts in a few launches rather than a few per expert."""
        self.packed = {"gate_up": PackedExperts(self.gate_up_projs), "down": PackedExperts(self.down_projs)}

    @classmethod
    def from_stock(cls, experts, config) -> "SplitExperts":
        """The split module holding a stock GptOssExperts' weights (tests compare their outputs)."""
        split = cls(config).to(device=experts.gate_up_proj.device, dtype=experts.gate_up_proj.dtype)
        with torch.no_grad():
            for e in range(split.num_experts):
                split.gate_up_projs[e].weight.copy_(experts.gate_up_proj[e].T)
                split.gate_up_projs[e].bias.copy_(experts.gate_up_proj_bias[e])
                split.down_projs[e].weight.copy_(experts.down_proj[e].T)
                split.down_projs[e].bias.copy_(experts.down_proj_bias[e])
        return split


def _compute_dtype(linear) -> torch.dtype:
    """The dtype a (possibly bitsandbytes 4-bit) linear layer multiplies in."""
    return getattr(linear, "compute_dtype", None) or (
        linear.weight.dtype if linear.weight.dtype.is_floating_point else torch.bfloat16)


class PackedExperts:
    """One projection's experts (E linear layers of one shape, frozen) packed: bf16 weights as one (E, out, in)
    tensor, or bitsandbytes 4-bit weights as one buffer of packed codes with their block scales (double-quantized
    scales kept as they are: uint8 codes, the second level's scales and each expert's offset). `weight()`
    dequantizes all E at once: exactly bitsandbytes' per-expert arithmetic (code[q] * absmax2[block // 256] +
    offset, then the 4-bit codes), in a handful of launches."""

    def __init__(self, linears):
        first = linears[0]
        self.num, self.shape = len(linears), (first.out_features, first.in_features)
        self.dtype = _compute_dtype(first)
        self.bias = torch.stack([lin.bias.detach().to(self.dtype) for lin in linears])  # frozen: (E, out)
        weights = [lin.weight for lin in linears]
        if type(first.weight).__name__ != "Params4bit":
            self.weight_bf16 = torch.stack([w.detach() for w in weights])
            for i, w in enumerate(weights):
                w.data = self.weight_bf16[i]
            self.quant = None
            return
        states = [w.quant_state for w in weights]
        q0 = states[0]
        n = weights[0].data.numel()
        if any(w.data.numel() != n or s.blocksize != q0.blocksize or s.nested != q0.nested for w, s in zip(weights, states)):
            raise ValueError("experts of one projection quantized differently: cannot pack")
        self.data = _pack([w.data for w in weights])
        for i, w in enumerate(weights):
            w.data = self.data[i * n:(i + 1) * n].view(w.data.shape)
        self.quant = (q0.blocksize, q0.quant_type, q0.code)
        self.absmax = _pack([s.absmax for s in states])
        for i, s in enumerate(states):
            s.absmax = self.absmax.view(self.num, -1)[i]
        self.nested = q0.nested
        if self.nested:
            self.absmax2 = _pack([s.state2.absmax for s in states])
            for i, s in enumerate(states):
                s.state2.absmax = self.absmax2.view(self.num, -1)[i]
            self.offsets = torch.stack([s.offset.reshape(()) for s in states]).float()
            self.code2, b2 = q0.state2.code, q0.state2.blocksize
            nblk = q0.absmax.numel()
            self.block2 = torch.arange(nblk, device=self.absmax.device) // b2  # each first-level block's scale

    def weight(self, dtype) -> torch.Tensor:
        """All E experts' weights, (E, out, in), in `dtype` (read only: in bf16 it may be the packed tensor itself)."""
        if self.quant is None:
            return self.weight_bf16.to(dtype)
        import bitsandbytes.functional as bnbf

        blocksize, quant_type, code = self.quant
        absmax = self.absmax
        if self.nested:
            scales2 = self.absmax2.view(self.num, -1)[:, self.block2]  # (E, blocks)
            absmax = (self.code2[self.absmax.view(self.num, -1).long()] * scales2 + self.offsets[:, None]).reshape(-1)
        state = bnbf.QuantState(absmax=absmax, shape=(self.num * self.shape[0], self.shape[1]), code=code,
                                blocksize=blocksize, quant_type=quant_type, dtype=dtype)
        return bnbf.dequantize_4bit(self.data, state).view(self.num, *self.shape)


def _pack(tensors) -> torch.Tensor:
    """One flat buffer holding the tensors in turn (the caller re-points each at its slice)."""
    return torch.cat([t.reshape(-1) for t in tensors])


class _GroupedLinear(torch.autograd.Function):
    """x (rows sorted by expert, `offsets` the experts' cumulative row counts) times each expert's frozen weight, as
    one grouped GEMM; the weights (E, out, in) are dequantized again in the backward rather than saved."""

    @staticmethod
    def forward(ctx, x, offsets, packed):
        ctx.save_for_backward(offsets)
        ctx.packed = packed
        return torch._grouped_mm(x, packed.weight(x.dtype).transpose(-2, -1), offs=offsets)

    @staticmethod
    def backward(ctx, grad):
        (offsets,) = ctx.saved_tensors
        return torch._grouped_mm(grad.contiguous(), ctx.packed.weight(grad.dtype), offs=offsets), None, None


def group_experts(model) -> int:
    """Switch every SplitExperts module to its grouped path (variant knob experts: grouped); the number switched."""
    modules = [m for m in model.modules() if isinstance(m, SplitExperts)]
    for m in modules:
        m.grouped = True
        m.pack()
    return len(modules)


def adapt_experts(model, lora: dict) -> dict:
    """LoRA (the config's r and alpha) on every grouped SplitExperts module's experts (variant knob expert_lora), in
    the dtype PEFT gave the model's other adapters; what was added, for the record. PEFT does not know these
    adapters: its saved adapter holds attention's only."""
    modules = [m for m in model.modules() if isinstance(m, SplitExperts)]
    peft = next((p for n, p in model.named_parameters() if "lora_A" in n), None)
    dtype = peft.dtype if peft is not None else torch.float32
    r, alpha = lora.get("r", 8), lora.get("alpha", 16)
    added = sum(m.add_lora(r, alpha, dtype) for m in modules)
    return {"modules": len(modules), "projections": ["gate_up", "down"], "r": r, "alpha": alpha,
            "dtype": str(dtype).removeprefix("torch."), "parameters": added}


def split_experts(model) -> None:
    """Replace every gpt-oss expert module by SplitExperts (on the meta device: before weights exist)."""
    for module in model.modules():
        if type(getattr(module, "experts", None)).__name__ == "GptOssExperts":
            with torch.device("meta"):
                module.experts = SplitExperts(model.config)
