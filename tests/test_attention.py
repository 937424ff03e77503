"""Attention with sinks and sliding windows over a packed row (ftbench.build.attention.SinkAttention): the sink folded
in through the kernel's log-sum-exp gives gpt-oss's eager attention, forward and gradients, without a T x T mask."""

from __future__ import annotations

import pytest
import torch

from conftest import ROOT
from ftbench.build import attention
from ftbench.config.architectures import load_architecture


def _eager(q, k, v, sinks, edges, scale, window):
    """gpt-oss's own eager attention (transformers), each sequence of the row on its own, its mask causal and
    windowed as transformers' sliding-window mask is."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = type("M", (), {"sinks": sinks, "num_key_value_groups": q.shape[1] // k.shape[1], "training": False})
    outs = []
    for a, b in zip(edges, edges[1:]):
        n = b - a
        i = torch.arange(n)
        ok = (i[:, None] >= i[None, :]) & ((i[:, None] - i[None, :] < window) if window else True)
        mask = torch.zeros(n, n).masked_fill(~ok, float("-inf"))[None, None]
        out, _ = eager_attention_forward(module, *(x[a:b].transpose(0, 1)[None] for x in (q, k, v)), mask, scale)
        outs.append(out[0])
    return torch.cat(outs)


@pytest.mark.parametrize("window", [None, 3])
def test_sink_attention_equals_gpt_oss_eager_attention_with_its_gradients(window):
    g = torch.Generator().manual_seed(0)
    edges = [0, 5, 14, 15, 20]  # a one-token sequence too
    q = torch.randn(20, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(20, 2, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(20, 4, 8, generator=g, dtype=torch.float64)
    want = _eager(q, k, v, sinks, edges, 0.35, window)
    got = attention.sink_attention(q, k, v, sinks, torch.tensor(edges, dtype=torch.int32), 16, 0.35, window)
    torch.testing.assert_close(got, want)
    for a, b, name in zip(torch.autograd.grad(got, (q, k, v, sinks), grad),
                          torch.autograd.grad(want, (q, k, v, sinks), grad), ("q", "k", "v", "sinks")):
        torch.testing.assert_close(a, b, msg=lambda m: f"gradient of {name}: {m}")


def test_sink_attention_without_sinks_is_windowed_causal_attention():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(9, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    got = attention.sink_attention(q, k, v, None, torch.tensor([0, 9], dtype=torch.int32), 9, 0.5, 4)
    i = torch.arange(9)
    ok = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < 4)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(0, 1) for x in (q, k, v)), attn_mask=ok, scale=0.5).transpose(0, 1)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), (q, k, v)), torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b)


def test_gpt_oss_trains_on_a_packed_row_with_varlen_attention_as_each_sequence_alone():
    """A tiny gpt-oss (sinks in every layer, a sliding window in half of them) on one packed row with
    `attention: varlen` gives the loss and gradients of each sequence run alone through its eager attention."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ftbench.build.attention import step_kwargs, use_varlen

    cfg = dict(load_architecture(ROOT / "config/architectures/gpt-oss-120b.yaml", "tiny")["config"])
    cfg["sliding_window"] = 4  # shorter than the sequences below, so the window matters
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    assert {layer.self_attn.sliding_window for layer in model.model.layers} == {None, 4}
    lengths = (7, 11, 3)
    seqs = [torch.randint(5, 3000, (n,)) for n in lengths]

    def summed_loss(logits, ids):  # summed over next-token predictions
        return torch.nn.functional.cross_entropy(logits[0, :-1], ids[1:], reduction="sum")

    alone = sum(summed_loss(model(input_ids=s[None]).logits, s) for s in seqs)
    alone.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    use_varlen(model)
    row = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    logits = model(input_ids=row, position_ids=pos, **step_kwargs(pos, 64)).logits
    edges = [0, 7, 18, 21]
    packed = sum(summed_loss(logits[:, a:b], row[0, a:b]) for a, b in zip(edges, edges[1:]))
    packed.backward()
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert any("sinks" in n for n in want)
    for n, p in model.named_parameters():
        if n in want:
            torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-5, msg=lambda m: f"{n}: {m}")


def test_the_flash_path_calls_the_kernel_with_the_window_and_folds_the_sink(monkeypatch):
    """The CUDA path (run here with the flash kernel's forward and backward replaced by the per-sequence ones
    under its signature): the row's bounds, a causal flag only without a window, left window = sliding_window - 1,
    and the same output and gradients as the CPU path."""
    calls = []

    def fwd(q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug, *, scale=None, window_size_left=None,
            window_size_right=None):
        calls.append(("fwd", max_q, causal, window_size_left, window_size_right))
        assert cu_q is cu_k and dropout == 0.0
        out, lse = attention._math_forward(q, k, v, cu_q.tolist(), scale,
                                           -1 if window_size_left is None else window_size_left)
        return out, lse, torch.zeros(2), torch.zeros(0), torch.zeros(0)

    def bwd(g, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, dropout, causal, rng, unused, *, scale=None,
            window_size_left=None, window_size_right=None):
        calls.append(("bwd", max_q, causal, window_size_left, window_size_right))
        return attention._math_backward(g, q, k, v, out, lse, cu_q.tolist(), scale,
                                        -1 if window_size_left is None else window_size_left)

    g = torch.Generator().manual_seed(2)
    q = torch.randn(12, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(12, 2, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    bounds = torch.tensor([0, 5, 12], dtype=torch.int32)
    want = [attention.sink_attention(q, k, v, sinks, bounds, 2048, 0.3, w) for w in (None, 3)]
    want_grads = [torch.autograd.grad(w.sum(), (q, k, v)) for w in want]
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_forward", fwd, raising=False)
    monkeypatch.setattr(torch.ops.aten, "_flash_attention_backward", bwd, raising=False)
    monkeypatch.setattr(attention, "_FLASH_KW", {"window_size_left", "window_size_right", "scale"})
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    for w, out_want, grads_want in zip((None, 3), want, want_grads):
        out = attention.sink_attention(q, k, v, sinks, bounds, 2048, 0.3, w)
        torch.testing.assert_close(out, out_want)
        for a, b in zip(torch.autograd.grad(out.sum(), (q, k, v)), grads_want):
            torch.testing.assert_close(a, b)
    assert calls == [("fwd", 2048, True, None, None), ("bwd", 2048, True, None, None),
                     ("fwd", 2048, False, 2, 0), ("bwd", 2048, False, 2, 0)]


def test_flash_attention_through_another_implementation_is_refused_where_it_cannot_run_and_runs_where_it_can(
        monkeypatch):
    """Variant knob flash_impl (fa4): PyTorch's flash attention ops through FlashAttention-4. On a CPU the run is
    refused with its reason before any job; it needs attention varlen and flash-attn-4 (the campaign holds such a
    target back until it is installed); where it can run, torch's own registry activates it and the record's kernel
    names it."""
    from ftbench.config.settings import Variant
    from ftbench.harness.meter import Unsupported
    from ftbench.core.knobs import knob_problems, required_packages
    from ftbench.build.variants import check_supported

    v = Variant("fa4", peft="lora", padding_free=True, attention="varlen", flash_impl="fa4")
    assert knob_problems("causal_lm", v) == [] and "flash_attn" in required_packages(v)
    masked = Variant("fa4m", peft="lora", flash_impl="fa4")
    assert any("flash_impl='fa4' without attention='varlen'" in p for p in knob_problems("causal_lm", masked))
    assert any("flash_impl" in p for p in knob_problems("lmm", Variant("l", flash_impl="fa4")))
    with pytest.raises(Unsupported, match="FA4 runs on CUDA GPUs of compute capability 9.0 or 10.0; this machine"):
        check_supported(v, torch.device("cpu"))
    # on a GPU of another generation, and without the package
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "this GPU has 8.0" in attention.flash_impl_problem("fa4", torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("flash_attn") else
                        real(name, *a))
    assert attention.flash_impl_problem("fa4", torch.device("cuda")) == (
        "FA4: flash_attn.cute is not installed (flash-attn-4)")
    # activation imports flash-attn-4 and routes the variable-length attention through it; the record names it
    monkeypatch.setattr(attention, "_IMPL", None)
    _fake_flash_attn_4(monkeypatch)
    assert attention.activate_flash("fa4") == "FA4"
    assert attention.kernel(torch.device("cuda")).startswith("flash-attn-4's varlen forward and backward")


def _fake_flash_attn_4(monkeypatch, seen=None):
    """flash_attn.cute.interface with flash-attn-4 4.0.0b36's two functions (five forward outputs), computing what
    its kernels compute one sequence at a time in fp32 (attention._math_forward/_backward); each refuses a call
    that is not causal attention over the sequences `cu_seqlens` bound, with the longest sequence's length given."""
    import sys
    import types

    def common(kwargs):
        assert kwargs["causal"] is True and kwargs.get("window_size_left") is None
        assert kwargs["cu_seqlens_q"] is kwargs["cu_seqlens_k"] and kwargs["max_seqlen_q"] == kwargs["max_seqlen_k"]
        edges = kwargs["cu_seqlens_q"].tolist()
        assert max(b - a for a, b in zip(edges, edges[1:])) <= kwargs["max_seqlen_q"]
        return edges, kwargs["softmax_scale"]

    def forward(q, k, v, **kwargs):
        edges, scale = common(kwargs)
        assert kwargs["return_lse"] is True
        if seen is not None:
            seen["forward"] = seen.get("forward", 0) + 1
        return (*attention._math_forward(q, k, v, edges, scale, -1), None, None, None)

    def backward(q, k, v, out, dout, lse, **kwargs):
        edges, scale = common(kwargs)
        if seen is not None:
            seen["backward"] = seen.get("backward", 0) + 1
        return attention._math_backward(dout, q, k, v, out, lse, edges, scale, -1)

    fake = types.ModuleType("flash_attn.cute.interface")
    fake._flash_attn_fwd, fake._flash_attn_bwd = forward, backward
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["flash_attn.cute"].interface = fake
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake)


def test_fa4_varlen_is_causal_attention_per_sequence_with_its_gradients_and_an_operator_torch_can_trace(monkeypatch):
    """ftbench.build.attention.fa4_varlen (flash_impl fa4): flash-attn-4's varlen forward and backward as one operator
    with its own autograd. On a packed row of grouped-query heads, with the empty slots of a fixed-shape row, its
    output and gradients are those of causal attention over each sequence alone (SDPA per sequence); torch's operator
    check passes (its fake shapes, its autograd registration), and the layer's attention calls it once activated."""
    seen = {}
    _fake_flash_attn_4(monkeypatch, seen)
    torch.manual_seed(0)
    lengths, heads, kv_heads, dim = [5, 9, 3], 4, 2, 8
    t = sum(lengths)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    bounds = attention.sequence_bounds(pos, slots=6)
    assert bounds.tolist() == [0, 5, 14, 17, 17, 17, 17]
    q = torch.randn(t, heads, dim, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(t, kv_heads, dim, dtype=torch.float64, requires_grad=True) for _ in range(2))
    grad = torch.randn(t, heads, dim, dtype=torch.float64)
    scale = 0.3
    out, lse = attention.fa4_varlen(q, k, v, bounds, 9, scale)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))
    want_out = attention._per_sequence(q, k, v, bounds, scale)
    want = (want_out, *torch.autograd.grad(want_out, (q, k, v), grad))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert lse.shape == (heads, t) and seen == {"forward": 1, "backward": 1}
    torch.library.opcheck(attention.fa4_varlen, (q, k, v, bounds, 9, scale),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    monkeypatch.setattr(attention, "_IMPL", "FA4")
    torch.testing.assert_close(attention._flash(q, k, v, bounds, 9, scale), want_out)


def test_the_fa4_check_says_why_it_cannot_run_on_a_machine_without_a_cuda_gpu():
    """bench/fa4_check.py (FA4 against FA2 on the frontier's rows, for a lent GPU) exits 2 with its reason here."""
    import subprocess
    import sys

    from conftest import ROOT

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the check itself")
    done = subprocess.run([sys.executable, str(ROOT / "bench/fa4_check.py")], capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 2 and "FA4 cannot run here: no CUDA GPU" in done.stdout
