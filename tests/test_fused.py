"""Fused projections (ftbench.build.fused, variant knob fused_projections): q/k/v and gate/up as one GEMM each give the
unfused model's outputs and LoRA gradients, and the adapter PEFT saves loads into a plain, unfused PEFT model."""

from __future__ import annotations

import copy

import torch

from ftbench.config.settings import Variant
from ftbench.build.fused import fuse_projections
from ftbench.build.variants import apply_lora

LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                               "down_proj"]}


def _model(tiny_qwen):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32)
    model = apply_lora(model, Variant("x"), LORA)
    torch.manual_seed(0)
    for n, p in model.named_parameters():  # B starts at zero in PEFT; make every adapter count
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    return model


def test_fused_projections_give_the_same_outputs_and_gradients(tiny_qwen):
    plain = _model(tiny_qwen)
    fused = copy.deepcopy(plain)
    counts = fuse_projections(fused)
    layers = plain.config.num_hidden_layers
    assert counts["attention"] == layers and counts["mlp"] == layers
    attn = fused.base_model.model.model.layers[0].self_attn
    assert attn.qkv.weight.shape[0] == sum(p.base_layer.out_features for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    # the base weights are views of the fused one, not copies
    assert attn.q_proj.base_layer.weight.untyped_storage().data_ptr() == attn.qkv.weight.untyped_storage().data_ptr()
    ids = torch.randint(5, plain.config.vocab_size, (2, 11))
    out_p, out_f = plain(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(out_f.logits, out_p.logits, rtol=1e-5, atol=1e-5)
    out_p.loss.backward()
    out_f.loss.backward()
    grads_p = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    grads_f = {n: p.grad for n, p in fused.named_parameters() if p.requires_grad}
    assert grads_p.keys() == grads_f.keys() and any("q_proj.lora_A" in n for n in grads_f)
    for n, g in grads_p.items():
        torch.testing.assert_close(grads_f[n], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_the_fused_rungs_adapter_loads_into_a_plain_peft_model(tiny_qwen, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    fused = _model(tiny_qwen)
    fuse_projections(fused)
    fused.save_pretrained(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32)
    plain = PeftModel.from_pretrained(base, tmp_path / "adapter")
    ids = torch.randint(5, fused.config.vocab_size, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, fused(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    saved = set(__import__("safetensors.torch", fromlist=["load_file"]).load_file(
        tmp_path / "adapter" / "adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved) and not any("qkv" in k or "gate_up" in k for k in saved)


def _scaled_mms(fn) -> int:
    """How many FP8 GEMMs (aten._scaled_mm) `fn()` runs, forward and backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func is torch.ops.aten._scaled_mm.default
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def test_frozen_fp8_weights_fuse_into_one_fp8_gemm_a_group(tiny_qwen):
    """fused_projections with fp8_recipe static: each group's concatenated weight is cast to FP8 once with one scale
    (each projection's FP8 weight a view of it), a layer runs 4 FP8 GEMMs forward and 4 backward rather than 7 and 7,
    the LoRA gradients reach every projection, and its logits differ from bf16's by an FP8 rounding the size of the
    unfused rung's."""
    from transformers import AutoModelForCausalLM

    from ftbench.build.fp8 import DECODER_PATTERN, E4M3, convert_static, tensorwise_fp8

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.bfloat16)
    bf16 = copy.deepcopy(base)
    convert_static(base, pattern=DECODER_PATTERN)
    unfused = apply_lora(base, Variant("x"), LORA)
    bf16 = apply_lora(bf16, Variant("x"), LORA)
    torch.manual_seed(0)
    for model in (unfused, bf16):
        torch.manual_seed(0)
        for n, p in model.named_parameters():
            if "lora_" in n:
                torch.nn.init.normal_(p, std=0.05)
    fused = copy.deepcopy(unfused)
    fuse_projections(fused)
    attn = fused.base_model.model.model.layers[0].self_attn
    q, k = attn.q_proj.base_layer, attn.k_proj.base_layer
    assert attn.qkv.fp8 and attn.qkv.w_fp8.dtype == E4M3
    assert attn.qkv.w_fp8.shape == attn.qkv.weight.shape
    assert k.w_fp8.untyped_storage().data_ptr() == attn.qkv.w_fp8.untyped_storage().data_ptr()
    assert torch.equal(k.w_fp8.view(torch.uint8),
                       attn.qkv.w_fp8[q.out_features:q.out_features + k.out_features].view(torch.uint8))
    assert torch.equal(k.w_inv, attn.qkv.w_inv) and torch.equal(attn.qkv.w_inv, tensorwise_fp8(attn.qkv.weight, E4M3)[1])

    ids = torch.randint(5, fused.config.vocab_size, (2, 16))  # 32 tokens: the FP8 GEMM's row rule
    logits, grads = {}, {}
    for name, model in (("bf16", bf16), ("unfused", unfused), ("fused", fused)):
        def step(model=model, name=name):
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            logits[name] = out.logits.detach().float()
        count = _scaled_mms(step)
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        layers = model.config.num_hidden_layers
        # forward: one per projection (7) or per group (4) a layer; backward the same less layer 0's q/k/v, whose
        # input (the frozen embeddings, normed) needs no gradient
        assert count == {"bf16": 0, "unfused": 2 * 7 * layers - 3, "fused": 2 * 4 * layers - 1}[name], (name, count)
    assert grads["fused"].keys() == grads["unfused"].keys()
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads["fused"].values())
    # the group's one scale: an FP8 rounding of the bf16 model like the unfused rung's, of about its size
    err = {name: (logits[name] - logits["bf16"]).abs().mean().item() for name in ("unfused", "fused")}
    assert 0 < err["fused"] < 2 * err["unfused"], err


def test_fused_projections_take_fp8_only_cast_once():
    from ftbench.core.knobs import knob_problems

    ok = Variant("f", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static", fused_projections=True)
    assert knob_problems("causal_lm", ok) == []
    for recipe in ("tensorwise", "rowwise"):
        torchao = Variant("t", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe=recipe,
                          fused_projections=True)
        assert any("fused_projections" in p for p in knob_problems("causal_lm", torchao))


def test_the_lora_a_matrices_fuse_alone_and_the_frozen_projections_stay_as_they_are(tiny_qwen):
    """fused_adapters: q/k/v's and gate/up's LoRA A matrices as one GEMM a group; each frozen projection keeps its
    own weight (no concatenated copy) and GEMM; outputs and every gradient as the plain model's."""
    plain = _model(tiny_qwen)
    fused = copy.deepcopy(plain)
    counts = fuse_projections(fused, frozen=False)
    layers = plain.config.num_hidden_layers
    assert counts["attention"] == layers and counts["mlp"] == layers and counts["fused"] == "LoRA A alone"
    attn = fused.base_model.model.model.layers[0].self_attn
    assert not hasattr(attn.qkv, "weight") and attn.qkv.sizes == [p.base_layer.out_features for p in
                                                                   (attn.q_proj, attn.k_proj, attn.v_proj)]
    ids = torch.randint(5, plain.config.vocab_size, (2, 11))
    calls = []
    linear = torch.nn.functional.linear

    def counted(x, w, b=None):
        calls.append(tuple(w.shape))
        return linear(x, w, b)

    out_p = plain(input_ids=ids, labels=ids)
    torch.nn.functional.linear = counted
    try:
        out_f = fused(input_ids=ids, labels=ids)
    finally:
        torch.nn.functional.linear = linear
    r = plain.peft_config["default"].r
    assert calls.count((3 * r, plain.config.hidden_size)) == layers  # one A GEMM for q/k/v a layer
    assert calls.count((2 * r, plain.config.hidden_size)) == layers  # one for gate/up
    torch.testing.assert_close(out_f.logits, out_p.logits, rtol=1e-5, atol=1e-5)
    out_p.loss.backward()
    out_f.loss.backward()
    grads_p = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    grads_f = {n: p.grad for n, p in fused.named_parameters() if p.requires_grad}
    assert grads_p.keys() == grads_f.keys()
    for n, g in grads_p.items():
        torch.testing.assert_close(grads_f[n], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_fused_adapters_keep_the_static_fp8_projections_and_their_transposes(tiny_qwen):
    """On the static FP8 rung with kept transposes: each frozen projection is still its own StaticFP8Linear (its own
    scale, its kept transpose), so the frozen arithmetic is the unfused rung's; the knob is refused beside
    fused_projections."""
    from transformers import AutoModelForCausalLM

    from conftest import LORA
    from ftbench.config.settings import Variant
    from ftbench.build.fp8 import DECODER_PATTERN, StaticFP8Linear, convert_static
    from ftbench.core.knobs import knob_problems
    from ftbench.build.variants import apply_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.bfloat16)
    convert_static(model, DECODER_PATTERN, transpose_once=True)
    model = apply_lora(model, Variant("l", peft="lora"), LORA)
    fuse_projections(model, frozen=False)
    attn = model.base_model.model.model.layers[0].self_attn
    assert isinstance(attn.q_proj.base_layer, StaticFP8Linear) and attn.q_proj.base_layer.w_t_fp8 is not None
    ids = torch.randint(5, model.config.vocab_size, (1, 16))
    assert torch.isfinite(model(input_ids=ids).logits).all()
    assert knob_problems("causal_lm", Variant("f", fused_adapters=True)) == []
    assert knob_problems("causal_lm", Variant("g", fused_adapters=True, fused_projections=True))


def test_the_lora_epilogue_adds_each_product_in_its_b_gemm_with_the_same_outputs_and_gradients(tiny_qwen):
    """lora_epilogue: each fused projection's LoRA product is added by its B GEMM (addmm), five a layer (q, k, v,
    gate, up), with the plain model's outputs and every gradient; under autocast too (LoRA's fp32 weights meet bf16
    outputs: autocast gives addmm one dtype)."""
    plain = _model(tiny_qwen)
    fused = copy.deepcopy(plain)
    counts = fuse_projections(fused, frozen=False, epilogue=True)
    assert counts["lora_add"].startswith("in the LoRA B GEMM")
    ids = torch.randint(5, plain.config.vocab_size, (2, 11))
    calls = []
    addmm = torch.addmm

    def counted(*args, **kwargs):
        calls.append(kwargs.get("alpha"))
        return addmm(*args, **kwargs)

    out_p = plain(input_ids=ids, labels=ids)
    torch.addmm = counted
    try:
        out_f = fused(input_ids=ids, labels=ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            auto = fused(input_ids=ids, labels=ids)
    finally:
        torch.addmm = addmm
    layers = plain.config.num_hidden_layers
    scaling = plain.base_model.model.model.layers[0].self_attn.q_proj.scaling["default"]
    assert calls == [scaling] * (2 * 5 * layers)
    assert torch.isfinite(auto.logits).all() and auto.logits.dtype == torch.bfloat16
    torch.testing.assert_close(out_f.logits, out_p.logits, rtol=1e-5, atol=1e-5)
    out_p.loss.backward()
    out_f.loss.backward()
    grads_f = {n: p.grad for n, p in fused.named_parameters() if p.requires_grad}
    for n, p in plain.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads_f[n], p.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")
