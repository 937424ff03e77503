"""FP8 conversion: which layers run in FP8, the shape rule, and the two backends (Transformer Engine, torchao).

FP8 GEMMs need every dimension of the input but the last divisible by 8 and the last by 16 (Transformer
Engine checks it; torchao's float8 needs the same alignment). CLIP-L/14-336 feeds 577 tokens per tile, so
its layers fail the rule; `PaddedLinear` pads the flattened token dimension to a multiple of 16 and slices
the output back, which is how `fp8_vision` runs the vision tower in FP8 too.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from ftbench.core.knobs import TE_RECIPES

LM_PATTERN = re.compile(r"(^|\.)(language_model|multi_modal_projector)\.")
DECODER_PATTERN = re.compile(r"(^|\.)layers\.\d+\.")  # a causal LM's decoder layers (not the embeddings, not the LM head)
VISION_PATTERN = re.compile(r"(^|\.)vision_tower\.")
ALIGN = 16  # the token dimension is padded to a multiple of this for FP8 GEMMs


def fp8_shape_ok(shape) -> bool:
    """The FP8 GEMM rule on an input's shape: the product of leading dims divisible by 8, the last by 16."""
    *lead, last = shape
    rows = 1
    for d in lead:
        rows *= d
    return rows % 8 == 0 and last % 16 == 0


def weight_fp8_ok(linear: nn.Linear) -> bool:
    return linear.in_features % 16 == 0 and linear.out_features % 16 == 0


def select_linears(model: nn.Module, include_vision: bool, pattern: re.Pattern = LM_PATTERN) -> list[str]:
    """Names of the nn.Linear layers to convert: those `pattern` finds (LLaVA: language model and projector;
    a causal LM: its decoder layers), and the vision tower if asked, never the LM head, and only those whose
    weights satisfy the FP8 shape rule."""
    names = []
    for name, mod in model.named_modules():
        if type(mod) is not nn.Linear or name.endswith("lm_head"):
            continue
        if pattern.search(name) or (include_vision and VISION_PATTERN.search(name)):
            if weight_fp8_ok(mod):
                names.append(name)
    return names


class PaddedLinear(nn.Module):
    """Runs `inner` on inputs whose flattened token dimension is padded to a multiple of `multiple`."""

    def __init__(self, inner: nn.Module, multiple: int = ALIGN):
        super().__init__()
        self.inner, self.multiple = inner, multiple

    def forward(self, x):
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1])
        pad = (-flat.shape[0]) % self.multiple
        if pad:
            flat = torch.nn.functional.pad(flat, (0, 0, 0, pad))
        out = self.inner(flat)
        return out[: flat.shape[0] - pad].reshape(*lead, out.shape[-1])


def _set(model, name, module):
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def swap_linears(model: nn.Module, names: list[str], factory, pad_names=()) -> int:
    """Replace each named nn.Linear by `factory(linear)` (weights carried over by the factory); layers in
    `pad_names` get the token-padding wrapper."""
    for name in names:
        new = factory(model.get_submodule(name))
        _set(model, name, PaddedLinear(new) if name in pad_names else new)
    return len(names)


def te_linear(linear: nn.Linear, recipe=None):
    """A Transformer Engine Linear holding the same weights (params_dtype of the original); with a TE `recipe`
    object, the weight held in FP8 alone in that recipe's format (TE's quantized_model_init: the copy below
    quantizes it once)."""
    import contextlib

    import transformer_engine.pytorch as te

    init = te.quantized_model_init(enabled=True, recipe=recipe) if recipe is not None else contextlib.nullcontext()
    with init:
        new = te.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None,
                        params_dtype=linear.weight.dtype, device=linear.weight.device)
    with torch.no_grad():
        new.weight.copy_(linear.weight)
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    new.weight.requires_grad_(False)
    return new


TE_WORDS = dict(zip(TE_RECIPES, (  # Transformer Engine's recipes (fp8_recipe with fp8_backend te), in words
    "delayed scaling: scales from an amax history of 16 steps, E4M3 forward, E5M2 gradients",
    "current scaling (Float8CurrentScaling): a scale a tensor from its own amax each GEMM, E4M3 forward, E5M2 gradients",
    "block scaling (Float8BlockScaling, DeepSeek-V3's): a scale each 1x128 block of activations and gradients and each "
    "128x128 block of weights, E4M3 throughout")))


def te_recipe(kind: str):
    """Transformer Engine's recipe object for `kind` (TE_WORDS)."""
    from transformer_engine.common import recipe

    if kind == "current":
        return recipe.Float8CurrentScaling()
    if kind == "block":
        return recipe.Float8BlockScaling()
    return recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")


def te_autocast(kind: str, recipe=None):
    """A factory of Transformer Engine's FP8 autocast context in recipe `kind`, one recipe object for the run (delayed
    scaling keeps its amax history in it; `recipe`: that object, where the layers were built with it)."""
    import transformer_engine.pytorch as te

    recipe = te_recipe(kind) if recipe is None else recipe
    if hasattr(te, "autocast"):  # TE 2.8+; fp8_autocast is deprecated there
        return lambda: te.autocast(enabled=True, recipe=recipe)
    return lambda: te.fp8_autocast(enabled=True, fp8_recipe=recipe)


def te_forward(model: nn.Module, kind: str, recipe=None) -> None:
    """The decoder's forward (the backbone, `model.model` of a causal LM) run under Transformer Engine's FP8 autocast:
    TE's layers compute in FP8 only inside it (their backward follows the forward's recipe). The backbone, not the
    whole model: TRL's fused LM head calls the backbone itself (trl.trainer.utils.add_fused_lm_head), so every path
    that trains or scores the model (the trainer's loss, the held-out split as trained) runs the decoder in FP8, and
    the LM head stays bf16."""
    import functools

    backbone = model.base_model  # transformers' name for the backbone (`model.model`)
    context, inner = te_autocast(kind, recipe), backbone.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        with context():
            return inner(*args, **kwargs)

    backbone.forward = forward


def convert_te_decoder(model: nn.Module, kind: str, weights_only: bool = False) -> dict:
    """A causal LM's decoder projections onto te.Linear (`convert_te`: their bf16 weights kept, TE casts them to FP8
    in each GEMM under its recipe; `weights_only`: held in FP8 alone, cast once, knob fp8_weights_only), and the
    backbone's forward under TE's autocast in recipe `kind` (`te_forward`), one recipe object for both. The adapters
    are served on a bf16 twin of their own (ftbench.data.heldout.ServedTwin), never on these layers."""
    recipe = te_recipe(kind)
    info = convert_te(model, include_vision=False, pattern=DECODER_PATTERN, recipe=recipe if weights_only else None)
    te_forward(model, kind, recipe)
    weights = ("none: FP8 alone (TE's quantized_model_init, cast once as built)" if weights_only
               else "kept (te.Linear holds them; cast each GEMM)")
    return {**info, "backend": "Transformer Engine", "recipe": TE_WORDS[kind], "bf16_weights": weights}


def convert_te(model: nn.Module, include_vision: bool, pattern: re.Pattern = LM_PATTERN, recipe=None) -> dict:
    """The linears `pattern` selects (LLaVA: language model and projector, and, padded, the vision tower; a causal LM:
    its decoder layers) onto te.Linear, before LoRA, so PEFT adapts te.Linear through its supported TE layer (no
    second bf16 copy of the weights); with a TE `recipe` object, their weights in FP8 alone (`te_linear`)."""
    import functools

    names = select_linears(model, include_vision, pattern)
    vision = [n for n in names if VISION_PATTERN.search(n)]
    swap_linears(model, names, functools.partial(te_linear, recipe=recipe), pad_names=set(vision))
    return {"converted": len(names), "vision_converted": len(vision)}


TORCHAO_RECIPES = ("tensorwise", "rowwise")  # torchao's named Float8LinearConfig recipes the variants may ask for
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _cast_scaled(x: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in `dtype` scaled by the dtype's largest value / `amax` (computed in float64; saturated), and the inverse
    scale the scaled GEMM takes: the one cast `tensorwise_fp8` and `rowwise_fp8` make with their own amax."""
    top = torch.finfo(dtype).max
    scale = (top / torch.clamp(amax.to(torch.float64), min=1e-12)).to(torch.float32)
    return (x.to(torch.float32) * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def tensorwise_fp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in `dtype` with one scale for the tensor, as torchao's tensorwise recipe casts it, and the inverse scale
    the scaled GEMM takes."""
    return _cast_scaled(x, dtype, x.abs().max())


def rowwise_fp8(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` [rows, features] in `dtype` with one scale a row (a token), each from that row's amax, and the inverse
    scales [rows, 1] the scaled GEMM takes. A row's scale needs only that row: compiled, the amax and the cast are one
    pass over the tensor (fused into the kernel that makes it), where a tensor's scale needs a reduction over all of
    it first."""
    return _cast_scaled(x, dtype, x.abs().amax(dim=-1, keepdim=True))


def fp8_gemm(x: torch.Tensor, dtype: torch.dtype, w_fp8_t: torch.Tensor, w_inv: torch.Tensor,
             fast_accum: bool = False) -> torch.Tensor:
    """x @ w_fp8_t in `x`'s dtype, `x` cast to `dtype` and `w_fp8_t` an FP8 weight laid out column-major (the
    transpose view of a row-major [out, in] weight; cuBLAS's FP8 GEMM takes its second operand so). `w_inv`: the
    weight's inverse scale, one value (x cast tensorwise, `tensorwise_fp8`) or one a column of the product, [1, N]
    (x cast a row at a time, `rowwise_fp8`: the scaled GEMM takes row scales only beside column scales).
    `fast_accum`: the tensor cores' fast FP8 accumulation (torchao runs its forward GEMM so by default)."""
    x_fp8, x_inv = (rowwise_fp8 if w_inv.dim() == 2 else tensorwise_fp8)(x, dtype)
    return torch._scaled_mm(x_fp8, w_fp8_t, scale_a=x_inv, scale_b=w_inv, out_dtype=x.dtype,
                            use_fast_accum=fast_accum)


# fp8_grads -> the dtype the output's gradient is cast to for the backward's GEMM (bf16: no FP8 in the backward)
FP8_GRADS = {"e5m2": E5M2, "e4m3": E4M3}

# fp8_fast_accum -> (the forward GEMM fast, the backward's fast, what the record says)
FAST_ACCUM = {None: (False, False, "none: every FP8 GEMM exact (FP32 promotion)"),
              "forward": (True, False, "the forward's GEMMs (use_fast_accum); the backward's exact"),
              "all": (True, True, "every FP8 GEMM, forward and backward (use_fast_accum)")}


def column_scales(w_inv: torch.Tensor, n: int) -> torch.Tensor:
    """A tensorwise inverse scale as the [1, n] row of column scales a row-scaled GEMM takes (every entry the same:
    the weight stays cast tensorwise)."""
    return w_inv.reshape(1, 1).expand(1, n).contiguous()


def frozen_fp8(weight: torch.Tensor, transpose: bool = False):
    """A frozen weight cast to FP8 once (tensorwise e4m3): (its FP8 copy, the inverse scale, and with `transpose`
    the FP8 copy transposed and contiguous, the backward's operand, else None)."""
    with torch.no_grad():
        w_fp8, w_inv = tensorwise_fp8(weight.detach(), E4M3)
    return w_fp8, w_inv, w_fp8.t().contiguous() if transpose else None


def frozen_fp8_channels(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A frozen [out, in] weight cast to FP8 once with fine-grained scales, one copy for each GEMM it enters, each
    scaled along the dimension its GEMM does not reduce over (as torchao's rowwise recipe casts a weight for each
    GEMM, and a per-channel scale must lie outside the reduction): the forward's copy a scale an output channel
    ([out, in], inverse scales as the [1, out] column scales of x W^T), the backward's copy the transpose with a scale
    an input channel ([in, out] contiguous, inverse scales [1, in] for dy W). Returns (w_fp8, col_out, w_t_fp8,
    col_in)."""
    with torch.no_grad():
        w = weight.detach()
        w_fp8, inv_out = rowwise_fp8(w, E4M3)  # [out, 1]
        w_t_fp8, inv_in = rowwise_fp8(w.t().contiguous(), E4M3)  # [in, 1]
    return w_fp8, inv_out.reshape(1, -1).contiguous(), w_t_fp8, inv_in.reshape(1, -1).contiguous()


class _StaticFP8Matmul(torch.autograd.Function):
    """y = x W^T with W already in FP8: x cast per step (e4m3), the output's gradient in e5m2, the input's gradient
    from W^T (cuBLAS's FP8 GEMM takes its second operand column-major: the FP8 weight transposed in every backward,
    or `w_t`, that transpose kept from the start); no gradient for the frozen weight, and none computed. Without
    `col_out`, `col_in` x and the gradient are cast tensorwise; with them (the weight's inverse scale as [1, out]
    and [1, in] rows, `column_scales`) a row (a token) at a time. `fast_accum`: which of its GEMMs run with the tensor
    cores' fast accumulation (a key of FAST_ACCUM: None, forward, all)."""

    @staticmethod
    def forward(ctx, x, w_fp8, w_inv, w_t=None, col_out=None, col_in=None, fast_accum=None, grads="e5m2",
                weight=None):
        ctx.save_for_backward(w_fp8, w_inv, w_t, col_in, weight if grads == "bf16" else None)
        forward, ctx.fast_backward, _ = FAST_ACCUM[fast_accum]
        ctx.grads = grads
        return fp8_gemm(x, E4M3, w_fp8.t(), w_inv if col_out is None else col_out, forward)

    @staticmethod
    def backward(ctx, grad):
        w_fp8, w_inv, w_t, col_in, weight = ctx.saved_tensors
        if ctx.grads == "bf16":  # FP8 in the forward only: the input's gradient from the kept high-precision weight
            return grad @ weight.to(grad.dtype), None, None, None, None, None, None, None, None
        if w_t is None:
            w_t = w_fp8.t().contiguous()  # [in, out] row-major: W column-major for the GEMM
        grad_in = fp8_gemm(grad, FP8_GRADS[ctx.grads], w_t.t(), w_inv if col_in is None else col_in,
                           ctx.fast_backward)
        return grad_in, None, None, None, None, None, None, None, None


class StaticFP8Linear(nn.Linear):
    """A frozen linear whose weight is cast to FP8 once (tensorwise e4m3, the scale torchao's tensorwise recipe
    computes) instead of every step: torchao's Float8Linear takes the weight's amax and casts it in every forward and
    casts its transpose in every backward, three passes over the 15 GB of Qwen3-8B's decoder weights a step that a
    frozen weight does not need (fp8_recipe: static). Activations and gradients are cast per step as in torchao's
    tensorwise recipe, so the casts are the same (its forward GEMM accumulates fast on a GPU, this one's only with
    `fast_accum` forward: a CPU ignores the mode, where the outputs agree bit for bit). The bf16 weight stays (PEFT,
    parameter counts, the state dict); the FP8 copy is a non-persistent buffer (+1 byte a weight). `transpose_once`:
    the FP8 weight's transpose, the backward's operand, kept too (+1 byte a weight more) rather than made in every
    backward (a read and a write of every FP8 weight a step; knob fp8_transpose_once): the same numbers, bit for bit.

    `rows` (knob fp8_activation_scaling: rowwise): activations and gradients cast with a scale a row (a token) rather
    than one a tensor, so each is cast in one pass, with no reduction over the whole tensor before it; the weight stays
    tensorwise, its inverse scale kept as the rows of column scales the row-scaled GEMM takes (`col_out`, `col_in`: 4
    bytes an input and an output feature). `fast_accum` (knob fp8_fast_accum): forward, the forward GEMM with the tensor
    cores' fast FP8 accumulation, as torchao's default config runs its output GEMM (the backward's in the exact mode, as
    torchao's); all, the backward's too; None, neither."""

    @classmethod
    def from_linear(cls, linear: nn.Linear, transpose_once: bool = False, rows: bool = False,
                    fast_accum: str | None = None, grads: str = "e5m2", channels: bool = False) -> "StaticFP8Linear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new.weight.requires_grad_(False)
        new.rows, new.fast_accum, new.grads, new.channels = rows or channels, fast_accum, grads, channels
        for name in ("w_fp8", "w_inv", "w_t_fp8", "col_out", "col_in"):
            new.register_buffer(name, None, persistent=False)
        new._cast(linear.weight, transpose_once or channels)
        return new

    def _cast(self, weight: torch.Tensor, transpose: bool) -> None:
        if self.channels:  # a scale an output channel (forward) and an input channel (the kept transpose, backward)
            self.w_fp8, self.col_out, self.w_t_fp8, self.col_in = frozen_fp8_channels(weight)
            self.w_inv = self.col_out
            return
        self.w_fp8, self.w_inv, self.w_t_fp8 = frozen_fp8(weight, transpose)
        if self.rows:
            self.col_out = column_scales(self.w_inv, self.out_features)
            self.col_in = column_scales(self.w_inv, self.in_features)

    def land(self, value: torch.Tensor, keep_weight: bool = True) -> None:
        """Give a layer converted on the meta device its frozen weight `value` (on its device): cast to FP8 as
        `from_linear` casts it (and transposed, where this layer keeps the transpose). `keep_weight` false: the bf16
        value is not kept; `weight` becomes a stand-in (`stand_in`) and the FP8 copy is the only one."""
        if self.grads == "bf16" and not keep_weight:
            raise ValueError("fp8_grads='bf16' computes the backward from the bf16 weight: it must be kept")
        self._cast(value, self.w_t_fp8 is not None)
        self.weight = (nn.Parameter(value, requires_grad=False) if keep_weight
                       else stand_in(value.shape, value.dtype, value.device))

    bf16 = False  # the last steps of a bf16 tail (knob fp8_until, `to_bf16`): the GEMMs from the bf16 weight

    def forward(self, x):
        if self.bf16:
            return F.linear(x, self.weight, self.bias)
        return static_fp8_linear(x, self.w_fp8, self.w_inv, self.bias, self.w_t_fp8, self.col_out, self.col_in,
                                 self.fast_accum, self.grads, self.weight if self.grads == "bf16" else None)


def to_bf16(model: nn.Module) -> int:
    """Every StaticFP8Linear of `model` computing in bf16 from its kept weight from now on (a bf16 tail, knob
    fp8_until); refused where a weight was kept only in FP8 (its `weight` a stand-in). Returns how many switched."""
    layers = [m for m in model.modules() if isinstance(m, StaticFP8Linear)]
    if any(is_stand_in(m.weight) for m in layers):
        raise RuntimeError("a bf16 tail needs every frozen projection's bf16 weight kept (fp8_until keeps them)")
    for m in layers:
        m.bf16 = True
    return len(layers)


def stand_in(shape, dtype, device) -> nn.Parameter:
    """A frozen weight kept only in FP8, as a parameter: its shape, dtype and device (what PEFT, parameter counts and
    data parallel's shape check read) over one element of storage, NaN, so that a reader of its values reads NaN
    rather than a plausible number. `fp8_only` marks it (the record counts it as FP8; data parallel leaves it out of
    its start-up broadcast, ftbench.build.parallel)."""
    p = nn.Parameter(torch.full((), float("nan"), dtype=dtype, device=device).expand(tuple(shape)),
                     requires_grad=False)
    p.fp8_only = True
    return p


def is_stand_in(p) -> bool:
    return bool(getattr(p, "fp8_only", False))


def static_fp8_linear(x: torch.Tensor, w_fp8: torch.Tensor, w_inv: torch.Tensor, bias=None,
                      w_t: torch.Tensor | None = None, col_out: torch.Tensor | None = None,
                      col_in: torch.Tensor | None = None, fast_accum: str | None = None, grads: str = "e5m2",
                      weight: torch.Tensor | None = None) -> torch.Tensor:
    """x W^T (+ bias) with W already in FP8 (`w_inv`: its inverse scale; `w_t`: its transpose, contiguous, if kept;
    `col_out`, `col_in`: that scale as column scales, where activations and gradients are cast a row at a time),
    for inputs of any leading shape: the one form StaticFP8Linear and a fused group of them (ftbench.build.fused)
    compute."""
    lead = x.shape[:-1]
    y = _StaticFP8Matmul.apply(x.reshape(-1, x.shape[-1]), w_fp8, w_inv, w_t, col_out, col_in,
                               fast_accum, grads, weight).reshape(*lead, w_fp8.shape[0])
    return y + bias if bias is not None else y


def convert_static(model: nn.Module, pattern: re.Pattern = LM_PATTERN, transpose_once: bool = False,
                   rows: bool = False, fast_accum: str | None = None, grads: str = "e5m2",
                   channels: bool = False) -> dict:
    """The frozen projections `pattern` selects onto StaticFP8Linear (weights cast to FP8 once, and with
    `transpose_once` their transposes too; `rows`, `fast_accum`, `grads`, `channels`: StaticFP8Linear's), before
    LoRA."""
    names = select_linears(model, False, pattern)
    swap_linears(model, names, lambda linear: StaticFP8Linear.from_linear(linear, transpose_once, rows, fast_accum,
                                                                          grads, channels))
    kept = transpose_once or channels
    fp8_bytes = sum(model.get_submodule(n).w_fp8.numel() for n in names) * (2 if kept else 1)
    scaling = "a scale a row (token), amax and cast in one pass" if rows or channels else "tensorwise"
    weights = "a scale an output channel, its transpose a scale an input channel" if channels else "tensorwise"
    backward = ("bf16 (FP8 in the forward only)" if grads == "bf16" else f"gradients {grads} per step")
    return {"converted": len(names), "vision_converted": 0,
            "recipe": f"static: weights cast to FP8 once (e4m3, {weights}), activations e4m3 and {backward}, "
                      f"{scaling}", "fp8_weight_gib": fp8_bytes / 2**30,
            "weight_transpose": "kept from the start" if kept else "made in every backward",
            "activation_scaling": "rowwise" if rows or channels else "tensorwise",
            "weight_scaling": "per channel" if channels else "tensorwise", "backward": backward,
            "fast_accumulation": FAST_ACCUM[fast_accum][2]}


def convert_torchao(model: nn.Module, include_vision: bool, pattern: re.Pattern = LM_PATTERN,
                    recipe: str | None = None) -> dict:
    """torchao float8 training: nn.Linear subclasses that PEFT wraps and torch.compile traces through. For a
    frozen weight torchao's backward still computes the weight's gradient; under torch.compile that GEMM's
    unused output is dropped from the graph, which is why the FP8 variants are compiled ones. `recipe`: one of
    TORCHAO_RECIPES (scales per tensor, or per row of each operand), else torchao's default config (tensorwise)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    names = set(select_linears(model, include_vision, pattern))
    named = recipe in TORCHAO_RECIPES
    config = Float8LinearConfig.from_recipe_name(recipe) if named else None
    convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn in names, config=config)
    return {"converted": len(names), "vision_converted": sum(1 for n in names if VISION_PATTERN.search(n)),
            "recipe": recipe if named else "tensorwise (torchao's default config)"}


def static_options(variant) -> dict:
    """What `convert_decoder` takes from a variant's knobs beside its recipe: the backend, and the static recipe's
    per-step settings (fp8_activation_scaling, fp8_fast_accum, fp8_grads, fp8_weight_scaling)."""
    return {"rows": variant.fp8_activation_scaling == "rowwise", "fast_accum": variant.fp8_fast_accum,
            "grads": variant.fp8_grads, "channels": variant.fp8_weight_scaling == "channel",
            "backend": variant.fp8_backend, "weights_only": variant.fp8_weights_only}


def convert_decoder(model: nn.Module, recipe: str | None, transpose_once: bool = False, rows: bool = False,
                    fast_accum: str | None = None, grads: str = "e5m2", channels: bool = False,
                    backend: str | None = "torchao", weights_only: bool = False) -> dict:
    """A causal LM's decoder projections in FP8, before LoRA wraps them: cast once (`recipe` static,
    StaticFP8Linear, with `transpose_once` their transposes too, `rows` and `fast_accum` its), by torchao's float8
    linears in `recipe`'s scaling, or (`backend` te) Transformer Engine's linears in its recipe `recipe`; the one
    entry for every way a causal LM is built (one process, or sharded on the meta device). `weights_only`: TE's
    weights in FP8 alone (knob fp8_weights_only)."""
    if backend == "te":
        return convert_te_decoder(model, recipe, weights_only)
    if recipe == "static":
        return convert_static(model, pattern=DECODER_PATTERN, transpose_once=transpose_once, rows=rows,
                              fast_accum=fast_accum, grads=grads, channels=channels)
    return convert_torchao(model, include_vision=False, pattern=DECODER_PATTERN, recipe=recipe)


def te_checkpoint_function():
    """Activation checkpointing for models with Transformer Engine layers: TE's checkpoint (non-reentrant), which
    recomputes under the forward's FP8 autocast state, in the form transformers' layers call it."""
    import functools

    from transformer_engine.pytorch.distributed import checkpoint

    return functools.partial(checkpoint, use_reentrant=False)
