"""The LM head's loss in two GEMMs a chunk (ftbench.build.head, knob lm_head) and FP8 weights' transposes kept
(knob fp8_transpose_once): the same loss and gradients as the model's own, on a CPU."""

import csv
import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ftbench.config.settings import Variant
from ftbench.build.head import IGNORE, HeadWeights, add_head_loss, head_loss
from ftbench.core.knobs import knob_problems, required_packages


def _case(dtype=torch.float32, rows=2, tokens=37, hidden=64, vocab=304, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, tokens, hidden, generator=g).to(dtype)
    w = (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(dtype)
    labels = torch.randint(0, vocab, (rows, tokens), generator=g)
    labels[0, :5] = IGNORE  # a prompt not trained on
    labels[1, 20] = IGNORE  # a sequence's first token in a packed row
    return h, w, labels


def _reference(h, w, labels, num_items=None):
    """The causal LM loss as transformers computes it: logits in full, shifted labels, cross-entropy."""
    logits = (h @ w.t()).float()
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, w.shape[0]), labels[:, 1:].reshape(-1), ignore_index=IGNORE,
                           reduction="sum")
    return loss / (num_items if num_items is not None else (labels[:, 1:] != IGNORE).sum())


@pytest.mark.parametrize("chunk", [16, 4096])
def test_the_two_gemm_head_gives_the_models_loss_and_gradient_in_chunks(chunk):
    """Every position goes through the head (no boolean indexing of the tokens); an ignored label and each row's
    last position add nothing; the chunks give what the whole does."""
    h, w, labels = _case()
    ha, hb = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
    ref = _reference(ha, w, labels)
    ref.backward()
    loss = head_loss(hb, labels, HeadWeights(w, "two-gemm"), chunk=chunk)
    loss.backward()
    assert torch.allclose(loss, ref, rtol=1e-5) and torch.allclose(hb.grad, ha.grad, atol=1e-6, rtol=1e-4)
    assert hb.grad[0, :4].abs().sum() == 0  # positions whose next label is ignored get no gradient
    assert hb.grad[:, -1].abs().sum() == 0  # nor each row's last position
    # the Trainer's count of the batch's items (every rank's, under data parallel) as the denominator
    assert torch.allclose(head_loss(h, labels, HeadWeights(w, "two-gemm"), num_items=100, chunk=chunk),
                          _reference(h, w, labels, num_items=100), rtol=1e-5)
    with torch.no_grad():  # evaluation: the loss alone, no gradient GEMM
        assert torch.allclose(head_loss(h, labels, HeadWeights(w, "two-gemm"), chunk=chunk), ref, rtol=1e-5)


def test_the_fp8_head_is_fp8_arithmetic_near_the_bf16_loss():
    """lm_head fp8: both GEMMs in FP8 (hidden states e4m3 tensorwise per chunk, the logits' gradient e5m2 at a fixed
    scale, the head's weight cast once with its transpose): near the bf16 head's loss and gradient, and not equal
    to them."""
    h, w, labels = _case(torch.bfloat16, tokens=48, hidden=64, vocab=512)
    ha, hb = h.clone().requires_grad_(True), h.clone().requires_grad_(True)
    bf16 = head_loss(ha, labels, HeadWeights(w, "two-gemm"), chunk=32)
    fp8 = head_loss(hb, labels, HeadWeights(w, "fp8"), chunk=32)
    bf16.backward()
    fp8.backward()
    assert fp8.item() != bf16.item() and abs(fp8.item() - bf16.item()) < 0.02 * bf16.item()
    cos = F.cosine_similarity(ha.grad.float().flatten(), hb.grad.float().flatten(), dim=0)
    assert 0.98 < cos < 1.0
    weights = HeadWeights(w, "fp8")
    assert weights.w8.dtype == torch.float8_e4m3fn and weights.w8_t.shape == (64, 512)
    assert weights.w8_t.is_contiguous() and torch.equal(weights.w8_t.t(), weights.w8)


def _tiny_lora(tiny_qwen, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    from conftest import LORA
    from ftbench.build.variants import apply_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=dtype)
    model = apply_lora(model, Variant("l", peft="lora"), LORA)
    for name, p in model.named_parameters():  # LoRA's B starts at zero: move it so every LoRA weight has a gradient
        if "lora_B" in name:
            nn.init.normal_(p, std=0.02)
    return model


def test_a_peft_model_with_the_head_trains_on_the_same_loss_and_gradients(tiny_qwen):
    """add_head_loss wraps the transformers model's forward under PEFT's wrappers: called with head_loss_on, the
    model returns the same loss as its own forward with labels, and every LoRA weight gets the same gradient."""
    model = _tiny_lora(tiny_qwen)
    twin = copy.deepcopy(model)
    info = add_head_loss(twin.get_base_model(), "two-gemm")
    assert info["kind"] == "two-gemm" and info["gemms_a_chunk"] == 2
    ids = torch.randint(0, model.config.vocab_size, (1, 24))
    position_ids = torch.cat([torch.arange(10), torch.arange(14)])[None]  # two packed sequences
    labels = ids.clone()
    labels[0, 10] = IGNORE  # the second sequence's first token: not predicted from the first sequence
    batch = {"input_ids": ids, "position_ids": position_ids, "labels": labels}
    ref = model(**batch, use_cache=False).loss  # (no cache: packed rows read from the position ids, as in training)
    ref.backward()
    loss = twin(**batch, head_loss_on=True).loss
    loss.backward()
    assert torch.allclose(loss, ref, rtol=1e-5)
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    twins = {n: p.grad for n, p in twin.named_parameters() if p.requires_grad}
    assert grads.keys() == twins.keys() and len(grads) > 0
    for n in grads:
        assert torch.allclose(twins[n], grads[n], atol=1e-6, rtol=1e-4), n
    # without the flag, the model's own forward (logits, as generation and evaluation take them)
    assert twin(**batch).logits.shape == (1, 24, model.config.vocab_size)


def test_a_trainable_head_is_refused(tiny_qwen):
    model = _tiny_lora(tiny_qwen)
    model.get_base_model().lm_head.weight.requires_grad_(True)
    with pytest.raises(ValueError, match="frozen"):
        add_head_loss(model.get_base_model(), "two-gemm")


def test_the_head_knobs_are_refused_where_they_cannot_hold():
    top = dict(peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static", padding_free=True,
               attention="varlen", compile="reduce-overhead", compile_scope="layers", token_budget=4096,
               trainer_metrics=False)
    assert knob_problems("causal_lm", Variant("a", **top, lm_head="fp8", fp8_transpose_once=True)) == []
    assert knob_problems("causal_lm", Variant("b", lm_head="two-gemm", trainer_metrics=False)) == []
    assert required_packages(Variant("b", lm_head="two-gemm", trainer_metrics=False)) == ["liger_kernel"]
    refused = {
        "metrics": Variant("c", lm_head="two-gemm"),  # TRL's metrics come from TRL's head
        "full": Variant("d", peft="none", lm_head="two-gemm", trainer_metrics=False),  # the head trains
        "model scope": Variant("e", lm_head="two-gemm", trainer_metrics=False, compile="default"),
        "fp8 head in bf16": Variant("f", lm_head="fp8", trainer_metrics=False),
        "transpose without static": Variant("g", **{**top, "fp8_recipe": "tensorwise"}, fp8_transpose_once=True),
        "transpose fused": Variant("h", **top, fused_projections=True, fp8_transpose_once=True),
        "unknown head": Variant("i", lm_head="three-gemm", trainer_metrics=False),
    }
    for why, variant in refused.items():
        assert knob_problems("causal_lm", variant), why
    assert any("lm_head" in p for p in knob_problems("lmm", Variant("j", lm_head="two-gemm")))


def test_a_kept_transpose_computes_the_same_numbers_bit_for_bit():
    """fp8_transpose_once: the FP8 weight's transpose made once and kept, the backward's operand; outputs and input
    gradients identical to the rung that transposes in every backward, one FP8 byte a weight more."""
    from ftbench.build.fp8 import DECODER_PATTERN, StaticFP8Linear, convert_static

    torch.manual_seed(0)
    plain = nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    each, once = StaticFP8Linear.from_linear(copy.deepcopy(plain)), StaticFP8Linear.from_linear(copy.deepcopy(plain),
                                                                                             transpose_once=True)
    assert each.w_t_fp8 is None and once.w_t_fp8.shape == (64, 48) and once.w_t_fp8.is_contiguous()
    assert torch.equal(once.w_t_fp8.t(), once.w_fp8) and "w_t_fp8" not in once.state_dict()
    x = torch.randn(32, 64, dtype=torch.bfloat16) * 3
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = each(xa), once(xb)
    g = torch.randn_like(ya) * 1e-3
    ya.backward(g)
    yb.backward(g)
    assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
    model = nn.Module()
    model.layers = nn.ModuleList([nn.Sequential(nn.Linear(32, 64, bias=False))]).to(torch.bfloat16)
    info = convert_static(model, DECODER_PATTERN, transpose_once=True)
    assert info["weight_transpose"] == "kept from the start" and info["fp8_weight_gib"] == 2 * 32 * 64 / 2**30


def test_the_runner_trains_the_same_steps_through_the_two_gemm_head(tmp_path, tiny_qwen, instruction_data):
    """lm_head two-gemm on a CPU (PyTorch's cross-entropy step in place of Liger's kernel): the same per-step losses
    as the model's own loss, and the record says which head ran."""
    from test_runner import run

    losses = {}
    for name, knobs in (("own", {}), ("head", {"lm_head": "two-gemm"})):
        torch.manual_seed(0)
        rec = run(tmp_path / name, tiny_qwen, instruction_data, Variant(name, trainer_metrics=False, **knobs))
        assert rec["status"] == "ok", rec["reason"]
        losses[name] = [float(r["loss"]) for r in csv.DictReader(open(tmp_path / name / "steps.csv"))]
        if knobs:
            assert rec["extra"]["lm_head"]["kind"] == "two-gemm" and rec["extra"]["loss_path"].startswith("ftbench.build.head")
    assert len(losses["own"]) == 5
    assert losses["head"] == pytest.approx(losses["own"], rel=1e-4)
