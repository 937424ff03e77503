"""LoRA B's backward in one read of the output gradient (ftbench.build.lora_grads, knob lora_b_one_read): the Triton
kernel's arithmetic (run by Triton's interpreter on this CPU), the autograd function's outputs and gradients against
PyTorch's own, the fused layers through it (o_proj and down_proj included) with the plain model's gradients, under
torch.compile, and the knob's refusals."""

from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from ftbench.config.settings import Variant
from ftbench.build.fused import fuse_projections
from ftbench.core.knobs import knob_problems
from ftbench.build.lora_grads import _grid, product, reference_lora_b_grads
from ftbench.build.variants import check_supported

from test_fused import _model

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_grid_covers_every_row_tile_once_and_fills_the_programs():
    for m, n, slots in [(8192, 12288, 264), (8192, 1024, 264), (8192, 4096, 264), (300, 520, 8), (64, 1024, 4),
                        (1000, 70, 8)]:
        cols, runs, per_run = _grid(m, n, slots)
        tiles = -(-m // 64)
        assert cols == -(-n // 256)
        assert runs * per_run >= tiles and (runs - 1) * per_run < tiles  # every tile, no run wholly past the end
        assert per_run >= min(2, tiles) or runs == 1
    cols, runs, _ = _grid(8192, 1024, 264)  # k/v: few column blocks, so the rows are split among programs
    assert cols * runs >= 132


KERNEL_CHECK = textwrap.dedent("""
    import torch
    from ftbench.build.lora_grads import reference_lora_b_grads, triton_lora_b_grads
    torch.manual_seed(0)
    cases = [(300, 520, 8, torch.float16, None), (128, 256, 8, torch.float32, None), (1000, 70, 5, torch.float16, None),
             (64, 1024, 16, torch.float32, None), (700, 512, 8, torch.float16, (900, 100))]
    configs = [None, {"BM": 32, "BN": 512}, {"BM": 32, "BN": 64}, {"BM": 16, "BN": 128}]
    for (m, n, r, dt, wide), config in [(c, k) for c in cases for k in configs]:
        if wide:  # a column slice of a wider gradient (a fused group's split): strided rows
            dy = torch.randn(m, wide[0], dtype=dt)[:, wide[1]:wide[1] + n]
            assert not dy.is_contiguous()
        else:
            dy = torch.randn(m, n, dtype=dt)
        h, b = torch.randn(m, r, dtype=dt), torch.randn(n, r)
        dh, db = triton_lora_b_grads(dy, h, b, 0.5, config)
        rh, rb = reference_lora_b_grads(dy, h, b, 0.5)
        assert dh.dtype == h.dtype and db.dtype == b.dtype, (dh.dtype, db.dtype)
        tol = 1e-5 if dt == torch.float32 else 2e-3
        for got, ref in ((dh, rh), (db, rb)):
            err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
            assert err < tol, (m, n, r, dt, config, err)
        again = triton_lora_b_grads(dy, h, b, 0.5, config)
        assert torch.equal(again[0], dh) and torch.equal(again[1], db)  # fixed summation order
    print("kernel ok", len(cases) * len(configs))
""")


def test_the_triton_kernel_gives_both_products_from_one_pass_under_the_interpreter():
    """The kernel itself, on this CPU under Triton's interpreter (TRITON_INTERPRET=1, set before Triton loads: a
    process of its own): row and column counts off the tiles, ranks padded to the dot's 16, a strided gradient,
    several tile shapes, the same bits on a second call; fp32 and fp16 operands (the interpreter's bf16 dot is not numpy's: bf16 runs on the GPU, bench/lora_grads_check.py)."""
    interp = ROOT / ".venv" / "triton-interp"  # `make test` installs Triton there (Makefile)
    if not interp.is_dir():
        pytest.skip("no Triton for the interpreter: `make test` installs it in .venv/triton-interp")
    path = os.pathsep.join(p for p in (str(interp), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kernel ok 20" in done.stdout


def _product(o, h, b, s, epilogue):
    return (o + (h @ b.to(h.dtype).t()) * s).to(o.dtype) if not epilogue else torch.addmm(o, h, b.t(), alpha=s)


@pytest.mark.parametrize("epilogue", [False, True])
def test_the_product_has_autograds_outputs_and_gradients(epilogue):
    torch.manual_seed(0)
    o, h, b = torch.randn(2, 5, 12), torch.randn(2, 5, 3), torch.randn(12, 3)
    leaves = [t.clone().requires_grad_() for t in (o, h, b)]
    mine = [t.clone().requires_grad_() for t in (o, h, b)]
    ref = _product(leaves[0].reshape(10, 12), leaves[1].reshape(10, 3), leaves[2], 0.7, epilogue).reshape(2, 5, 12)
    out = product(*mine, 0.7, epilogue)
    torch.testing.assert_close(out, ref)
    up = torch.randn_like(ref)
    ref.backward(up)
    out.backward(up)
    for a, r in zip(mine, leaves):
        torch.testing.assert_close(a.grad, r.grad)


def test_the_reference_is_two_products_in_the_gradients_dtype():
    dy = torch.randn(7, 9, dtype=torch.bfloat16)
    h, b = torch.randn(7, 2, dtype=torch.bfloat16), torch.randn(9, 2)
    dh, db = reference_lora_b_grads(dy, h, b, 3.0)
    assert dh.dtype == torch.bfloat16 and db.dtype == torch.float32
    torch.testing.assert_close(db, dy.float().t() @ h.float() * 3.0)
    torch.testing.assert_close(dh.float(), (dy.float() @ b.bfloat16().float() * 3.0).bfloat16().float())


def test_every_lora_product_of_the_fused_layers_runs_the_one_read_backward(tiny_qwen, monkeypatch):
    """lora_b_one_read: seven products a layer (q, k, v, gate, up in their groups; o and down each a group of one)
    go through the op, with the plain model's outputs and every LoRA gradient; with the epilogue too."""
    plain = _model(tiny_qwen)
    layers = plain.config.num_hidden_layers
    ids = torch.randint(5, plain.config.vocab_size, (2, 11))
    out_p = plain(input_ids=ids, labels=ids)
    out_p.loss.backward()
    import ftbench.build.lora_grads as lg

    calls = []
    real = lg.reference_lora_b_grads

    def counted(dy, h, b, s):
        calls.append(tuple(dy.shape))
        return real(dy, h, b, s)

    monkeypatch.setattr(lg, "reference_lora_b_grads", counted)
    for frozen, epilogue in ((False, False), (False, True), (True, True)):
        fused = copy.deepcopy(plain)
        fused.zero_grad()
        counts = fuse_projections(fused, frozen=frozen, epilogue=epilogue, one_read=True)
        assert counts["lora_b_backward"].startswith("one read")
        attn = fused.base_model.model.model.layers[0].self_attn
        assert attn.o_proj_single._parts == [attn.o_proj]
        calls.clear()
        out_f = fused(input_ids=ids, labels=ids)
        torch.testing.assert_close(out_f.logits, out_p.logits, rtol=1e-5, atol=1e-5)
        out_f.loss.backward()
        assert len(calls) == 7 * layers, (frozen, epilogue, len(calls))
        grads_f = {n: p.grad for n, p in fused.named_parameters() if p.requires_grad}
        for n, p in plain.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(grads_f[n], p.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_the_one_read_layers_compile_with_the_op_whole(tiny_qwen):
    """Under torch.compile (each layer, as compile_scope layers does) the op stays one node of the backward graph:
    the compiled model's gradients are the eager one's, without a graph break at the autograd function."""
    model = _model(tiny_qwen)
    fuse_projections(model, frozen=False, epilogue=True, one_read=True)
    twin = copy.deepcopy(model)
    ids = torch.randint(5, model.config.vocab_size, (1, 9))
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    for layer in twin.base_model.model.model.layers:
        layer.compile(backend="aot_eager")
    model(input_ids=ids, labels=ids).loss.backward()
    twin(input_ids=ids, labels=ids).loss.backward()
    assert not counters["graph_break"], dict(counters["graph_break"])
    grads = {n: p.grad for n, p in twin.named_parameters() if p.requires_grad}
    for n, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{n}: {m}")


def test_the_knob_is_refused_where_nothing_acts_on_it_and_unsupported_on_a_cpu():
    assert any("lora_b_one_read" in p for p in knob_problems("causal_lm", Variant("a", lora_b_one_read=True)))
    assert any("lora_b_one_read" in p for p in knob_problems("causal_lm", Variant("b", peft="none",
                                                                                   fused_adapters=True,
                                                                                   lora_b_one_read=True)))
    ok = Variant("c", fused_adapters=True, lora_b_one_read=True)
    assert knob_problems("causal_lm", ok) == []
    from ftbench.harness.meter import Unsupported

    with pytest.raises(Unsupported, match="Triton kernel on a CUDA GPU"):
        check_supported(ok, torch.device("cpu"))
