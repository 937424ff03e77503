"""FP8 conversion without Transformer Engine: which layers convert, the shape rule, token padding."""

import re

import pytest
import torch
from torch import nn

from conftest import ROOT
from ftbench.config.architectures import load_architecture
from ftbench.build.fp8 import PaddedLinear, fp8_shape_ok, select_linears, swap_linears
from ftbench.build.models import materialize_model


def test_the_published_shape_rule():
    assert not fp8_shape_ok((5, 577, 1024))  # CLIP-L/14-336: 5 tiles x 577 tokens fails, as published
    assert fp8_shape_ok((4, 2048, 4096)) and not fp8_shape_ok((8, 16, 1000))


def test_padded_linear_matches_the_plain_layer_and_feeds_aligned_rows():
    torch.manual_seed(0)
    lin = nn.Linear(32, 48)
    seen = []

    class Spy(nn.Module):
        def forward(self, x):
            seen.append(tuple(x.shape))
            return lin(x)

    x = torch.randn(5, 577, 32)
    out = PaddedLinear(Spy())(x)
    assert torch.allclose(out, lin(x), atol=1e-6) and out.shape == (5, 577, 48)
    assert fp8_shape_ok(seen[0]) and seen[0][0] == 2896  # 2885 rows padded to a multiple of 16


def test_layer_selection_and_swap_on_a_real_llava(tmp_path):
    from transformers import LlavaNextForConditionalGeneration

    m = materialize_model(load_architecture(ROOT / "config/architectures/llava-v1.6-mistral-7b.yaml", "tiny"),
                          "random", tmp_path, 0)
    model = LlavaNextForConditionalGeneration.from_pretrained(m["path"])
    lm_only = select_linears(model, include_vision=False)
    with_vision = select_linears(model, include_vision=True)
    assert lm_only and all("vision_tower" not in n for n in lm_only)
    assert any("multi_modal_projector" in n for n in lm_only) and not any(n.endswith("lm_head") for n in lm_only)
    assert set(lm_only) < set(with_vision) and any("vision_tower" in n for n in with_vision)

    class Marked(nn.Linear):
        """Stands in for te.Linear: same weights, another class."""

    def factory(lin):
        new = Marked(lin.in_features, lin.out_features, bias=lin.bias is not None)
        new.load_state_dict(lin.state_dict())
        return new

    vision = {n for n in with_vision if "vision_tower" in n}
    assert swap_linears(model, with_vision, factory, pad_names=vision) == len(with_vision)
    assert all(isinstance(model.get_submodule(n), PaddedLinear) for n in vision)
    assert all(isinstance(model.get_submodule(n), Marked) for n in lm_only)


def test_fp8_batches_pad_text_to_the_fp8_multiple(tmp_path):
    """The language model's token dimension must satisfy the FP8 rule; bf16 batches keep dynamic padding."""
    from PIL import Image
    from transformers import AutoProcessor

    from ftbench.config.settings import TrainSettings, Variant
    from ftbench.run.runners.lmm import Collator, pad_multiple

    settings = TrainSettings(bucket_multiple=64)
    assert pad_multiple(Variant("fp8-te", precision="fp8", fp8_backend="te"), settings) == 16
    assert pad_multiple(Variant("bucketed", precision="bf16", shape_policy="bucketed"), settings) == 64
    assert pad_multiple(Variant("bf16", precision="bf16"), settings) == 1
    m = materialize_model(load_architecture(ROOT / "config/architectures/llava-v1.6-mistral-7b.yaml", "tiny"),
                          "random", tmp_path, 0)
    processor = AutoProcessor.from_pretrained(m["path"])
    examples = [{"image": Image.new("RGB", (500, 500), (40, 120, 40)), "labels": i} for i in (0, 2)]
    lengths = {}
    for multiple in (1, 16):
        batch = Collator(processor, "dynamic", 2048, multiple)(examples)
        lengths[multiple] = batch["input_ids"].shape[1]
        assert batch["attention_mask"].shape == batch["labels"].shape == batch["input_ids"].shape
        assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()  # padding is never a target
    assert lengths[16] % 16 == 0 and lengths[1] <= lengths[16] < lengths[1] + 16


def test_a_causal_lm_converts_its_decoder_projections_and_lora_wraps_them(tiny_qwen):
    """The causal-LM FP8 rung: every projection of every decoder layer becomes a torchao float8 linear (not
    the embeddings, not the LM head), and PEFT's LoRA adapts the converted layers."""
    from torchao.float8.float8_linear import Float8Linear
    from transformers import AutoModelForCausalLM

    from ftbench.config.settings import Variant
    from ftbench.build.fp8 import DECODER_PATTERN, convert_torchao
    from ftbench.build.variants import apply_lora, precision_ran

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.bfloat16)
    layers = model.config.num_hidden_layers
    info = convert_torchao(model, include_vision=False, pattern=DECODER_PATTERN)
    assert info == {"converted": 7 * layers, "vision_converted": 0, "recipe": "tensorwise (torchao's default config)"}
    assert not isinstance(model.lm_head, Float8Linear)
    model = apply_lora(model, Variant("l8", peft="lora", precision="fp8", fp8_backend="torchao"),
                       {"target_modules": "all-linear"})
    q = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")
    assert isinstance(q.base_layer, Float8Linear) and "default" in q.lora_A
    assert precision_ran(model, "bf16", info["converted"])["gemm"] == "fp8"


def test_under_compile_a_frozen_fp8_weight_costs_no_gradient_gemm():
    """torchao's float8 backward computes the weight's gradient even for a frozen weight; compiled, that GEMM
    is dropped (why the FP8 rungs compile): a frozen layer's backward keeps one scaled GEMM, a trainable two."""
    from torch._dynamo.backends.common import aot_autograd
    from torchao.float8 import convert_to_float8_training

    model = nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False)).to(torch.bfloat16)
    convert_to_float8_training(model)
    model[0].weight.requires_grad_(False)
    graphs = {}

    def keep(name):
        def compiler(gm, _):
            graphs[name] = [n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_mm.default]
            return gm.forward
        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")))
    x = torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)
    compiled(x).sum().backward()
    assert len(graphs["fw"]) == 2 and len(graphs["bw"]) == 3  # eager would run 4: the frozen weight's gradient


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "rowwise", "static"])
def test_the_fp8_conversion_leaves_loras_parameters_and_the_trainable_set_unchanged(tiny_qwen, recipe):
    """FP8 on the top rung: the frozen base's projections become torchao float8 linears under LoRA, in the scaling
    the variant names; LoRA's parameters (names, shapes, dtypes, values at init) and the trainable set are those of
    the bf16 model."""
    from torchao.float8.float8_linear import Float8Linear
    from transformers import AutoModelForCausalLM

    from ftbench.config.settings import Variant
    from ftbench.build.fp8 import DECODER_PATTERN, StaticFP8Linear, convert_static, convert_torchao
    from ftbench.build.variants import apply_lora

    lora = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}

    def adapted(fp8):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.bfloat16)
        convert = (lambda m: convert_static(m, DECODER_PATTERN)) if recipe == "static" else (
            lambda m: convert_torchao(m, False, DECODER_PATTERN, recipe=recipe))
        info = convert(model) if fp8 else None
        v = Variant("v", precision="fp8" if fp8 else "bf16", fp8_backend="torchao" if fp8 else None,
                    fp8_recipe=recipe if fp8 else "delayed")
        torch.manual_seed(1)
        model = apply_lora(model, v, lora)
        return model, info, {n: p for n, p in model.named_parameters() if p.requires_grad}

    plain, _, want = adapted(False)
    converted, info, got = adapted(True)
    if recipe == "static":
        assert info["recipe"].startswith("static: weights cast to FP8 once") and info["fp8_weight_gib"] > 0
    else:
        assert info["recipe"] == (recipe if recipe != "delayed" else "tensorwise (torchao's default config)")
    assert isinstance(converted.get_submodule("base_model.model.model.layers.0.mlp.down_proj").base_layer,
                      StaticFP8Linear if recipe == "static" else Float8Linear)
    assert list(got) == list(want) and all("lora_" in n for n in got)
    for name, p in want.items():
        assert got[name].shape == p.shape and got[name].dtype == p.dtype and torch.equal(got[name], p), name


def test_the_fp8_knob_on_a_cpu_records_unsupported_with_its_reason():
    from ftbench.config.settings import Variant
    from ftbench.harness.meter import Unsupported
    from ftbench.core.knobs import knob_problems
    from ftbench.build.variants import check_supported

    for recipe in ("rowwise", "static"):
        v = Variant("lora-tb-cg-lean-async-fp8", precision="fp8", fp8_backend="torchao", fp8_recipe=recipe)
        assert knob_problems("causal_lm", v) == []
        with pytest.raises(Unsupported,
                           match="FP8 needs a CUDA GPU of compute capability 8.9 or newer; this machine has none"):
            check_supported(v, torch.device("cpu"))
    assert any("fp8 only" in p for p in knob_problems("causal_lm", Variant("x", fp8_recipe="rowwise")))


def test_a_weight_cast_to_fp8_once_computes_what_torchaos_tensorwise_linear_computes():
    """fp8_recipe: static. The frozen weight is cast to FP8 once, with the scale torchao's tensorwise recipe takes
    each step; the input cast e4m3 and the output's gradient e5m2 per step as torchao does: the same outputs and input
    gradients as torchao's Float8Linear, no weight gradient, and no weight cast in a compiled step."""
    import copy

    from torch._dynamo.backends.common import aot_autograd
    from torchao.float8 import convert_to_float8_training

    from ftbench.build.fp8 import E4M3, StaticFP8Linear

    torch.manual_seed(0)
    plain = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    ref = nn.Sequential(copy.deepcopy(plain))
    convert_to_float8_training(ref)
    static = StaticFP8Linear.from_linear(copy.deepcopy(plain))
    assert static.w_fp8.dtype == E4M3 and static.w_fp8.shape == (48, 64) and not static.weight.requires_grad
    assert "w_fp8" not in static.state_dict() and torch.equal(static.weight, plain.weight)
    for shape in [(32, 64), (2, 16, 64)]:
        x = torch.randn(*shape, dtype=torch.bfloat16) * 3
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        ya, yb = ref(xa), static(xb)
        assert yb.shape == (*shape[:-1], 48) and torch.equal(ya, yb)
        g = torch.randn_like(ya) * 1e-3
        ya.backward(g)
        yb.backward(g)
        assert torch.equal(xa.grad, xb.grad) and static.weight.grad is None
    # and it is FP8 arithmetic, not bf16: it differs from the bf16 layer by the FP8 rounding
    assert not torch.equal(static(x.reshape(-1, 64)), plain(x.reshape(-1, 64)))
    # compiled: the forward casts the input alone (one amax reduction, no pass over the weight)
    graphs = {}

    def keep(name):
        def compiler(gm, _):
            graphs[name] = [n.target for n in gm.graph.nodes if n.op == "call_function"]
            return gm.forward
        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(static, backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")))
    compiled(torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True)).sum().backward()
    assert graphs["fw"].count(torch.ops.aten._scaled_mm.default) == 1
    assert graphs["fw"].count(torch.ops.aten.amax.default) + graphs["fw"].count(torch.ops.aten.max.default) == 1
    assert graphs["bw"].count(torch.ops.aten._scaled_mm.default) == 1  # the input's gradient alone


def test_the_static_fp8_recipe_is_refused_where_it_cannot_hold():
    from ftbench.config.settings import Variant
    from ftbench.core.knobs import knob_problems

    ok = Variant("s", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static")
    assert knob_problems("causal_lm", ok) == []
    sharded = Variant("s2", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static", gpus=2,
                      parallel="fsdp2")
    assert any("fp8_recipe='static'" in p for p in knob_problems("causal_lm", sharded))


def _graphs_of(module, x):
    """The forward and backward graphs AOTAutograd hands the compiler for module(x).sum().backward()."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def keep(name):
        def compiler(gm, _):
            graphs[name] = gm
            return gm.forward
        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw")))
    compiled(x).sum().backward()
    return graphs


def test_rowwise_activation_scaling_casts_each_token_with_its_own_scale():
    """fp8_activation_scaling: rowwise. The input is cast e4m3 and the output's gradient e5m2 with a scale a row (from
    that row's amax alone), the weight stays tensorwise: the outputs and input gradients are those of the row-scaled
    FP8 arithmetic written out, a token far smaller than the others keeps its precision (a tensor's scale rounds it
    away), and a compiled step reduces over rows only, never over a whole tensor."""
    import copy

    from ftbench.build.fp8 import E4M3, E5M2, StaticFP8Linear, convert_static

    torch.manual_seed(0)
    plain = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    rows = StaticFP8Linear.from_linear(copy.deepcopy(plain), transpose_once=True, rows=True)
    tensor = StaticFP8Linear.from_linear(copy.deepcopy(plain))
    assert rows.col_out.shape == (1, 48) and rows.col_in.shape == (1, 64) and tensor.col_out is None
    assert torch.equal(rows.w_fp8.view(torch.uint8), tensor.w_fp8.view(torch.uint8))  # the weight: tensorwise

    def by_rows(t, dtype):  # the row-scaled cast, written out
        top = torch.finfo(dtype).max
        scale = top / t.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
        return (t.float() * scale).clamp(-top, top).to(dtype).float() / scale

    w = rows.w_fp8.float() * rows.w_inv
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    x[3] *= 1e-5  # one token far smaller than the rest
    xr = x.clone().requires_grad_(True)
    y = rows(xr)
    torch.testing.assert_close(y.float(), by_rows(x, E4M3) @ w.t(), rtol=1e-2, atol=1e-3)
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(xr.grad.float(), by_rows(g, E5M2) @ w, rtol=1e-2, atol=1e-3)
    exact = x.float() @ plain.weight.float().t()
    err_rows = (y[3].float() - exact[3]).abs().max() / exact[3].abs().max()
    err_tensor = (tensor(x)[3].float() - exact[3]).abs().max() / exact[3].abs().max()
    assert err_rows < 0.1 and err_tensor > 0.3  # a tensor's scale flushes the small token's entries; a row's keeps them
    # compiled: every amax of the step is over the last dimension (a row), none over a whole tensor
    graphs = _graphs_of(rows, torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True))
    for name in ("fw", "bw"):
        reductions = [n for n in graphs[name].graph.nodes if n.target in (torch.ops.aten.amax.default,
                                                                          torch.ops.aten.max.default)]
        assert reductions and all(list(n.args[1]) in ([-1], [1]) for n in reductions), name
    info = convert_static(nn.Sequential(copy.deepcopy(plain)), pattern=re.compile(""), rows=True)
    assert info["activation_scaling"] == "rowwise" and "a scale a row" in info["recipe"]


def test_fast_accumulation_runs_in_the_gemms_the_knob_names():
    """fp8_fast_accum: forward, the forward's scaled GEMM asks for fast accumulation and the backward's does not
    (torchao's default config); all, both; none, neither. The record says which ran."""
    import copy

    from ftbench.build.fp8 import StaticFP8Linear, convert_static

    plain = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    for fast, expected in ((None, (False, False)), ("forward", (True, False)), ("all", (True, True))):
        layer = StaticFP8Linear.from_linear(copy.deepcopy(plain), fast_accum=fast)
        graphs = _graphs_of(layer, torch.randn(32, 64, dtype=torch.bfloat16, requires_grad=True))
        modes = []
        for name in ("fw", "bw"):
            (mm,) = [n for n in graphs[name].graph.nodes if n.target is torch.ops.aten._scaled_mm.default]
            modes.append(bool(mm.kwargs.get("use_fast_accum", mm.args[7] if len(mm.args) > 7 else False)))
        assert tuple(modes) == expected, fast
    info = convert_static(nn.Sequential(copy.deepcopy(plain)), pattern=re.compile(""), fast_accum="forward")
    assert info["fast_accumulation"].startswith("the forward's")


def test_the_static_recipes_per_step_knobs_are_refused_where_nothing_acts_on_them():
    from ftbench.config.settings import Variant
    from ftbench.core.knobs import knob_problems

    static = dict(peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static")
    assert knob_problems("causal_lm", Variant("a", **static, fp8_activation_scaling="rowwise",
                                              fp8_fast_accum="all")) == []
    assert any("fp8_fast_accum" in p for p in knob_problems("causal_lm", Variant("a2", **static, fp8_fast_accum="x")))
    for bad in (Variant("b", peft="lora", precision="fp8", fp8_backend="torchao", fp8_fast_accum="forward"),
                Variant("c", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="tensorwise",
                        fp8_activation_scaling="rowwise"),
                Variant("d", **static, fused_projections=True, fp8_fast_accum="forward")):
        assert any("fp8_fast_accum" in p for p in knob_problems("causal_lm", bad)), bad.name
    assert any("lora_epilogue" in p for p in knob_problems("causal_lm", Variant("e", lora_epilogue=True)))
    assert knob_problems("causal_lm", Variant("f", fused_adapters=True, lora_epilogue=True)) == []
    assert any("fp8_fast_accum" in p for p in knob_problems("lmm", Variant("g", fp8_fast_accum="forward")))


def test_weights_cast_once_per_channel_with_e4m3_gradients_or_fp8_in_the_forward_only():
    """fp8_weight_scaling channel: the forward's copy a scale an output channel, the backward's (the kept transpose)
    a scale an input channel, activations and gradients a scale a token; fp8_grads e4m3 casts the output's gradient
    to E4M3, bf16 computes the input's gradient from the bf16 weight (FP8 in the forward only). Each is the arithmetic
    written out; a channel far smaller than the others keeps its precision, where a tensor's scale flushes it."""
    import copy

    from ftbench.build.fp8 import E4M3, StaticFP8Linear, convert_static

    torch.manual_seed(0)
    plain = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        plain.weight[5] *= 1e-6  # one output channel far smaller than the rest
    ch = StaticFP8Linear.from_linear(copy.deepcopy(plain), rows=True, grads="e4m3", channels=True)
    fwd = StaticFP8Linear.from_linear(copy.deepcopy(plain), rows=True, grads="bf16", channels=True)
    assert ch.col_out.shape == (1, 48) and ch.col_in.shape == (1, 64) and ch.w_t_fp8.shape == (64, 48)

    def by_rows(t, dtype):  # the row-scaled cast, written out
        top = torch.finfo(dtype).max
        scale = top / t.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
        return (t.float() * scale).clamp(-top, top).to(dtype).float() / scale

    w = plain.weight.float()
    w_out = ch.w_fp8.float() * ch.col_out.reshape(-1, 1)  # [out, in], a scale an output channel
    w_in = ch.w_t_fp8.float() * ch.col_in.reshape(-1, 1)  # [in, out], a scale an input channel
    torch.testing.assert_close(w_out, w, rtol=0.07, atol=0)  # e4m3: 3 mantissa bits, every channel at its scale
    torch.testing.assert_close(w_in, w.t(), rtol=0.07, atol=1e-6)  # (the small channel: subnormal here)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    for layer, grad_of in ((ch, lambda g: by_rows(g, E4M3) @ w_in.t()), (fwd, lambda g: g.float() @ w)):
        xr = x.clone().requires_grad_(True)
        y = layer(xr)
        torch.testing.assert_close(y.float(), by_rows(x, E4M3) @ w_out.t(), rtol=1e-2, atol=1e-3)
        g = torch.randn_like(y)
        y.backward(g)
        torch.testing.assert_close(xr.grad.float(), grad_of(g), rtol=2e-2, atol=2e-3)
    exact = x.float() @ w.t()
    small = (ch(x)[:, 5].float() - exact[:, 5]).abs().max() / exact[:, 5].abs().max()
    tensor = StaticFP8Linear.from_linear(copy.deepcopy(plain))
    flushed = (tensor(x)[:, 5].float() - exact[:, 5]).abs().max() / exact[:, 5].abs().max()
    assert small < 0.1 and flushed > 0.3
    info = convert_static(nn.Sequential(copy.deepcopy(plain)), pattern=re.compile(""), rows=True, grads="bf16",
                          channels=True)
    assert info["weight_scaling"] == "per channel" and "forward only" in info["backward"]


def test_the_quality_recipes_knobs_are_refused_where_nothing_acts_on_them():
    from ftbench.config.settings import Variant
    from ftbench.core.knobs import knob_problems

    ok = Variant("x", precision="fp8", fp8_backend="torchao", fp8_recipe="static", fp8_grads="e4m3",
                 fp8_weight_scaling="channel", fp8_activation_scaling="rowwise")
    assert knob_problems("causal_lm", ok) == []
    assert any("fp8_grads or fp8_weight_scaling" in p for p in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="torchao", fp8_recipe="rowwise", fp8_grads="bf16")))
    assert any("fp8_activation_scaling='rowwise'" in p for p in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="torchao", fp8_recipe="static",
                             fp8_weight_scaling="channel")))


@pytest.fixture
def fake_te(monkeypatch):
    """A stand-in for Transformer Engine (GPU-only, not installable here) with its API's shape: te.Linear, te.autocast
    and the recipes. Each Linear call notes the recipe of the autocast it ran under (None: outside it)."""
    import contextlib
    import sys
    import types

    state = {"recipe": None, "calls": [], "init": None, "autocast": []}  # and "te": the stand-in module
    recipe = types.SimpleNamespace(  # each recipe an object of its own, as TE's are
        Float8CurrentScaling=lambda: types.SimpleNamespace(kind="current"),
        Float8BlockScaling=lambda: types.SimpleNamespace(kind="block"),
        DelayedScaling=lambda **kw: types.SimpleNamespace(kind="delayed"), Format=types.SimpleNamespace(HYBRID="hybrid"))

    class Linear(nn.Linear):
        def __init__(self, in_features, out_features, bias=True, params_dtype=None, device=None):
            super().__init__(in_features, out_features, bias=bias, dtype=params_dtype, device=device)
            self.quantized_in = state["init"]  # the recipe of the quantized_model_init it was built in (None: none)

        def forward(self, x):
            state["calls"].append(getattr(state["recipe"], "kind", None))
            return super().forward(x)

    @contextlib.contextmanager
    def autocast(enabled=True, recipe=None):
        state["recipe"] = recipe
        state["autocast"].append(recipe)
        try:
            yield
        finally:
            state["recipe"] = None

    @contextlib.contextmanager
    def quantized_model_init(enabled=True, recipe=None):
        state["init"] = recipe if enabled else None
        try:
            yield
        finally:
            state["init"] = None

    import importlib.machinery

    from peft import import_utils

    class LayerNormLinear(nn.Module):  # TE's other layers PEFT's dispatch asks about; none is built here
        pass

    pytorch = types.SimpleNamespace(Linear=Linear, autocast=autocast, LayerNormLinear=LayerNormLinear,
                                    LayerNormMLP=LayerNormLinear, quantized_model_init=quantized_model_init)
    common = types.SimpleNamespace(recipe=recipe)
    te = types.ModuleType("transformer_engine")
    te.pytorch, te.common = pytorch, common
    te.__spec__ = importlib.machinery.ModuleSpec("transformer_engine", None)
    state["te"] = te
    for name, mod in {"transformer_engine": te, "transformer_engine.pytorch": pytorch,
                      "transformer_engine.common": common, "transformer_engine.common.recipe": recipe}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    caches = (import_utils.is_te_available, import_utils.is_te_pytorch_available)  # PEFT's answers, cached
    for cached in caches:
        cached.cache_clear()
    yield state
    for cached in caches:
        cached.cache_clear()


@pytest.mark.parametrize("kind", ["current", "block"])
def test_transformer_engines_recipes_run_the_decoder_in_fp8_and_leave_the_head_bf16(tiny_qwen, fake_te, kind):
    """fp8_backend te on a causal LM (issue 78: TE's current and block scaling): every decoder projection becomes a
    te.Linear holding the same bf16 weight, and each runs under TE's autocast in the variant's recipe, whether the model
    is called whole or its backbone alone (TRL's fused LM head calls the backbone); the LM head stays a plain bf16
    linear. Off the autocast (the served twin's bf16 base) nothing changes: the same numbers as before conversion."""
    from transformers import AutoModelForCausalLM

    from ftbench.build.fp8 import TE_WORDS, convert_decoder

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    before = model(input_ids=ids).logits
    info = convert_decoder(model, kind, backend="te")
    te_linear_type = fake_te["te"].pytorch.Linear
    decoder = [n for n, m in model.named_modules() if isinstance(m, te_linear_type)]
    assert len(decoder) == 7 * model.config.num_hidden_layers == info["converted"]
    assert type(model.lm_head) is nn.Linear and info["recipe"] == TE_WORDS[kind]
    after = model(input_ids=ids).logits  # the fake computes in full precision: the same logits
    assert torch.allclose(before, after, atol=1e-5)
    assert fake_te["calls"] and set(fake_te["calls"]) == {kind}
    fake_te["calls"].clear()
    model.model(input_ids=ids)  # the backbone alone, as TRL's fused head calls it
    assert set(fake_te["calls"]) == {kind}
    assert all(model.get_submodule(n).quantized_in is None for n in decoder)  # bf16 weights kept: cast each GEMM
    assert info["bf16_weights"].startswith("kept")


@pytest.mark.parametrize("kind", ["current", "block"])
def test_transformer_engines_weights_alone_in_fp8_are_built_in_the_recipe_the_forward_runs(tiny_qwen, fake_te, kind):
    """fp8_weights_only (issue 78, TE at its best for a frozen base): every decoder te.Linear is built inside TE's
    quantized_model_init in the very recipe object the forward's autocast then runs, so TE holds each frozen weight
    in FP8 alone, cast once; the LM head stays a plain linear, and no bf16 copy is said to be kept."""
    from transformers import AutoModelForCausalLM

    from ftbench.build.fp8 import convert_decoder

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32)
    info = convert_decoder(model, kind, backend="te", weights_only=True)
    te_linear_type = fake_te["te"].pytorch.Linear
    decoder = [m for m in model.modules() if isinstance(m, te_linear_type)]
    assert len(decoder) == info["converted"] == 7 * model.config.num_hidden_layers
    assert {m.quantized_in.kind for m in decoder} == {kind} and type(model.lm_head) is nn.Linear
    model(input_ids=torch.randint(0, model.config.vocab_size, (1, 8)))
    assert all(m.quantized_in is fake_te["autocast"][-1] for m in decoder)  # one recipe object for both
    assert info["bf16_weights"].startswith("none: FP8 alone")


def test_transformer_engines_recipes_are_refused_with_other_backends_and_served_on_the_bf16_base():
    from ftbench.config.settings import Variant, load_yaml
    from ftbench.config.techniques import resolve
    from ftbench.core.knobs import knob_problems
    from ftbench.run.runners.served import served_variant

    assert knob_problems("causal_lm", Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="block")) == []
    assert any("Transformer Engine's recipes" in p for p in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="static")))
    assert any("without fp8_backend='te'" in p for p in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="torchao", fp8_recipe="current")))
    assert any("fused_projections" in p for p in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="current", fused_projections=True)))
    assert knob_problems("causal_lm", Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="block",
                                              fp8_weights_only=True)) == []
    assert any("fp8_weights_only without" in p for p in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="torchao", fp8_recipe="static", fp8_weights_only=True)))
    checkpointed = Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="current", gradient_checkpointing=True)
    assert any("outside the autocast" in p for p in knob_problems("causal_lm", checkpointed))
    assert knob_problems("lmm", checkpointed) == []  # LLaVA's runner recomputes under TE's own checkpoint
    pool = load_yaml(ROOT / "config/config.yaml")["variants"]
    for name, recipe in (("lora-tb-te-cs", "current"), ("lora-tb-te-bs", "block")):
        v = Variant(name, **resolve(name, pool))
        assert knob_problems("causal_lm", v) == []
        assert (v.precision, v.fp8_backend, v.fp8_recipe, v.token_budget) == ("fp8", "te", recipe, 4096)
        served = served_variant(v)
        assert (served.precision, served.fp8_backend, served.token_budget) == ("bf16", None, 4096)


@pytest.mark.parametrize("weights_only", [False, True])
def test_a_te_variant_builds_through_the_route_with_peft_lora_on_te_linears(tiny_qwen, fake_te, monkeypatch,
                                                                            weights_only):
    """The causal LM's one route with fp8_backend te (issue 78): the decoder's projections te.Linear before LoRA,
    PEFT's own Transformer Engine layer (TeLinear) adapting them, LoRA's A drawn as on every rung; a training step's
    forward runs the frozen GEMMs under TE's autocast and its backward reaches only the adapters."""
    from peft.tuners.lora import te as peft_te

    from ftbench.build import route
    from ftbench.config.settings import Variant

    te = fake_te["te"]
    monkeypatch.setattr(peft_te, "is_te_pytorch_available", lambda: True)
    monkeypatch.setattr(peft_te, "te", te, raising=False)
    v = Variant("te", precision="fp8", fp8_backend="te", fp8_recipe="block", fp8_weights_only=weights_only)
    assert any("FP8" in words for words in route.stages_for(v))
    model, info = route.build_causal_lm(tiny_qwen, 0, "cpu", v, {"target_modules": "all-linear", "r": 4})
    q = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj")
    assert isinstance(q, peft_te.TeLinear) and isinstance(q.base_layer, te.pytorch.Linear)
    assert (q.base_layer.quantized_in is not None) == weights_only  # the knob reaches the layers it names
    assert info["fp8"]["converted"] == 7 * model.config.num_hidden_layers and info["adapters_seeded"]
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert set(fake_te["calls"]) == {"block"}
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in n for n in trained)
