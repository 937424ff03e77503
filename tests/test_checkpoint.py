"""Selective activation checkpointing (variant knob checkpoint_policy: selective): the same loss and gradients as no
checkpointing and as full checkpointing, with the GEMMs of the forward kept rather than recomputed."""

from __future__ import annotations

import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ftbench.config.settings import Variant
from ftbench.core.knobs import knob_problems
from ftbench.build.variants import apply_lora, checkpoint_kwargs


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("mm", "addmm", "bmm"):
            self.n += 1
        return func(*args, **(kwargs or {}))


def _step(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    with CountMatmuls() as counted:
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, counted.n


def test_selective_checkpointing_keeps_the_gemms_and_trains_the_same(tiny_qwen):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32)
    base = apply_lora(base, Variant("x"), {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"]})
    for n, p in base.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    ids = torch.randint(5, base.config.vocab_size, (2, 13))
    results = {}
    for policy in (None, "full", "selective"):
        model = copy.deepcopy(base)
        model.train()
        if policy:
            v = Variant("x", gradient_checkpointing=True, checkpoint_policy=policy)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(v))
            model.enable_input_require_grads()
        results[policy] = _step(model, ids)
    loss, grads, plain_mm = results[None]
    for policy in ("full", "selective"):
        torch.testing.assert_close(results[policy][0], loss)
        for n, g in grads.items():
            torch.testing.assert_close(results[policy][1][n], g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")
    full_mm, selective_mm = results["full"][2], results["selective"][2]
    assert full_mm > plain_mm  # full checkpointing recomputes the forward's GEMMs in the backward
    # selective keeps them: here 5 more GEMM calls than without checkpointing (29 with full), the backward of the
    # ops it recomputes (the LoRA B products on a recomputed input among them)
    assert selective_mm - plain_mm < (full_mm - plain_mm) / 4, (plain_mm, selective_mm, full_mm)


def test_checkpoint_policy_needs_checkpointing():
    assert knob_problems("causal_lm", Variant("x", gradient_checkpointing=True, checkpoint_policy="selective")) == []
    assert "without gradient_checkpointing" in knob_problems("causal_lm", Variant("x", checkpoint_policy="selective"))[0]
    assert "does not act on checkpoint_policy" in knob_problems(
        "lmm", Variant("x", gradient_checkpointing=True, checkpoint_policy="selective"))[0]
