"""Fused projections (ftbench.fused, variant knob fused_projections): q/k/v and gate/up as one GEMM each give the
unfused model's outputs and LoRA gradients, and the adapter PEFT saves loads into a plain, unfused PEFT model."""

from __future__ import annotations

import copy

import torch

from ftbench.config import Variant
from ftbench.fused import fuse_projections
from ftbench.variants import apply_lora

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
