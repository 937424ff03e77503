"""A frozen base built layer by layer (issue 61): each projection cast to FP8 (fp8_recipe static) or quantized to NF4
as it lands, from the seeded draws or from a checkpoint folder, equals casting the whole bf16 model; the FP8 base keeps
no bf16 copy of its projections, LoRA and the record read it as before, and data parallel leaves its stand-ins out."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftbench.config.architectures import load_architecture
from ftbench.build.stages import build_model
from ftbench.config.settings import Variant
from ftbench.build.fp8 import StaticFP8Linear, convert_decoder, is_stand_in
from ftbench.build.models import materialize_model
from ftbench.build.fp8_base import build_fp8_base, fp8_base_bytes, fp8_base_layerwise, stand_ins

ARCH = Path(__file__).resolve().parents[1] / "config" / "architectures"
STATIC = Variant("s", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static")


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    out = tmp_path_factory.mktemp("layerwise")
    arch = load_architecture(ARCH / "qwen3-32b.yaml", "tiny")
    return {"in_process": materialize_model(arch, "random", out / "p", 42, build="in_process"),
            "checkpoint": materialize_model(arch, "random", out / "w", 42, build="checkpoint")}


def whole_then_cast(manifest, transpose_once=False):
    """The reference: the whole model in bf16 first, then its decoder's projections cast (what the runner did)."""
    model, _ = build_model(manifest, 42, "cpu")
    convert_decoder(model, "static", transpose_once)
    return model


@pytest.mark.parametrize("source", ["in_process", "checkpoint"])
@pytest.mark.parametrize("transpose_once", [False, True])
def test_the_fp8_base_built_layer_by_layer_equals_casting_the_whole_bf16_model(manifests, source, transpose_once):
    ref = whole_then_cast(manifests["in_process"], transpose_once)
    variant = Variant("s", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static",
                      fp8_transpose_once=transpose_once)
    model, facts, info = build_fp8_base(manifests[source], 42, "cpu", variant)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, StaticFP8Linear)}
    ref_layers = {n: m for n, m in ref.named_modules() if isinstance(m, StaticFP8Linear)}
    assert set(layers) == set(ref_layers) and len(layers) >= 4 * model.config.num_hidden_layers
    assert info["converted"] == len(layers) and facts[f"parameters_{'drawn' if source == 'in_process' else 'read'}"]
    assert facts["fp8_cast"] == len(layers) and "layer by layer" in facts["method"]
    for name, m in layers.items():
        r = ref_layers[name]
        assert torch.equal(m.w_fp8.view(torch.uint8), r.w_fp8.view(torch.uint8)), name
        assert torch.equal(m.w_inv, r.w_inv), name
        assert (m.w_t_fp8 is None) == (not transpose_once)
        if transpose_once:
            assert torch.equal(m.w_t_fp8.view(torch.uint8), r.w_t_fp8.view(torch.uint8)), name
        # no bf16 copy: the weight is a stand-in with the shape and dtype PEFT reads, one element of storage, NaN
        assert is_stand_in(m.weight) and m.weight.shape == r.weight.shape and m.weight.dtype == torch.bfloat16
        assert m.weight.untyped_storage().nbytes() == 2 and torch.isnan(m.weight[0, 0])
    # every other parameter (embeddings, norms, LM head) is the whole build's, and the model computes the same
    plain = {n: p for n, p in model.named_parameters() if not is_stand_in(p)}
    ref_params = dict(ref.named_parameters())
    assert plain and all(torch.equal(p, ref_params[n]) for n, p in plain.items())
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_lora_trains_on_the_fp8_base_as_on_the_whole_build_and_the_record_reads_fp8(manifests):
    from ftbench.build.variants import apply_lora, parameter_counts, precision_ran

    lora = {"target_modules": "all-linear"}
    ref = apply_lora(whole_then_cast(manifests["in_process"]), STATIC, lora)
    model, _, info = build_fp8_base(manifests["in_process"], 42, "cpu", STATIC)
    model = apply_lora(model, STATIC, lora)
    assert parameter_counts(model) == parameter_counts(ref)
    adapters = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(p.dtype == dict(ref.named_parameters())[n].dtype for n, p in adapters.items())
    assert precision_ran(model, "bf16", info["converted"])["gemm"] == "fp8"
    mlp = model.get_submodule("base_model.model.model.layers.0.mlp")  # its frozen weights: stand-ins alone
    assert precision_ran(mlp, "bf16", 3)["frozen_weights"] == "fp8"
    assert precision_ran(ref.get_submodule("base_model.model.model.layers.0.mlp"), "bf16", 3)["frozen_weights"] == "bf16"
    for m in (model, ref):  # the same adapter start: B zero, A from one seed
        torch.manual_seed(0)
        for n, p in m.named_parameters():
            if p.requires_grad:
                torch.nn.init.normal_(p, std=0.02) if "lora_A" in n else torch.nn.init.zeros_(p)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    grads = []
    for m in (model, ref):
        m.train()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.requires_grad})
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[1])
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)
    # data parallel leaves the stand-ins out of its start-up broadcast (they hold no values)
    from ftbench.build.parallel import parallelize

    parallelize(model, "ddp", "cpu")
    ignored = set(model._ddp_params_and_buffers_to_ignore)
    assert ignored == set(stand_ins(model)) and len(ignored) == info["converted"]


def test_which_variants_build_layer_by_layer_and_what_the_fp8_base_is_expected_to_take(manifests):
    assert fp8_base_layerwise(STATIC)
    assert not fp8_base_layerwise(Variant("t", peft="lora", precision="fp8", fp8_backend="torchao",
                                          fp8_recipe="tensorwise"))  # torchao recasts the bf16 weight every step
    assert not fp8_base_layerwise(Variant("f", peft="lora", precision="fp8", fp8_backend="torchao",
                                          fp8_recipe="static", fused_projections=True))
    model, facts, _ = build_fp8_base(manifests["in_process"], 42, "cpu", STATIC)
    fp8_bytes = sum(m.w_fp8.numel() for m in model.modules() if isinstance(m, StaticFP8Linear))
    other = sum(2 * p.numel() for p in model.parameters() if not is_stand_in(p))
    assert fp8_base_bytes(model) == fp8_bytes + other and facts["expected_gib"] * 2**30 == fp8_bytes + other


def test_an_fp8_base_too_large_for_the_device_is_refused_before_building(manifests, monkeypatch):
    from ftbench.build import stages as build
    from ftbench.harness.meter import Unsupported

    monkeypatch.setattr(build, "available_bytes", lambda device: 1000)
    with pytest.raises(Unsupported, match=r"FP8 base: refused before building.*GiB available"):
        build_fp8_base(manifests["in_process"], 42, "cpu", STATIC)


def test_the_nf4_base_quantized_as_each_weight_lands_equals_quantizing_the_whole_bf16_model(manifests):
    """build_model with a 4-bit config quantizes each weight as it is drawn; quantizing the whole bf16 model's
    weights afterwards gives the same packed codes and scales."""
    import bitsandbytes.functional as bnbf

    from ftbench.build.variants import quantization_config

    v = Variant("q", precision="nf4")
    nf4, _ = build_model(manifests["in_process"], 42, "cpu", torch.bfloat16, quantization_config(v))
    whole = dict(build_model(manifests["in_process"], 42, "cpu")[0].named_parameters())
    checked = 0
    for name, p in nf4.named_parameters():
        if type(p).__name__ != "Params4bit":
            continue
        codes, state = bnbf.quantize_4bit(whole[name], blocksize=p.quant_state.blocksize, quant_type="nf4",
                                          compress_statistics=True, quant_storage=p.data.dtype)
        assert torch.equal(codes.view(-1), p.data.view(-1)), name
        assert torch.equal(state.absmax, p.quant_state.absmax), name
        checked += 1
    assert checked == 7 * nf4.config.num_hidden_layers


_PEAK = r"""
import json, resource, sys
import torch
from ftbench.config.architectures import load_architecture
from ftbench.config.settings import Variant
from ftbench.build.models import materialize_model
from ftbench.build.fp8_base import build_fp8_base
arch = load_architecture(sys.argv[1], "tiny")
arch["config"].update(hidden_size=1024, intermediate_size=4096, num_hidden_layers=14, head_dim=64,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=4096)
manifest = materialize_model(arch, "random", sys.argv[2], 42, build="in_process")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
model, facts, info = build_fp8_base(manifest, 42, "cpu", Variant("s", peft="lora", precision="fp8",
                                    fp8_backend="torchao", fp8_recipe="static"))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
proj = sum(m.weight.numel() for n, m in model.named_modules() if type(m).__name__ == "StaticFP8Linear")
print(json.dumps({"growth_gib": after - before, "bf16_proj_gib": 2 * proj / 2**30, "expected_gib": facts["expected_gib"]}))
"""


def test_an_fp8_base_never_holds_its_projections_in_bf16_in_host_memory(tmp_path):
    """A model whose projections take 0.40 GiB in bf16, built with an FP8 base on the CPU: the process's peak host
    memory grows by about the FP8 model (0.21 GiB with its bf16 embeddings; measured 0.24), where building it whole in
    bf16 first grows by the bf16 model and its FP8 copies (~0.62 GiB), in a fresh process whose allocator returns
    freed blocks."""
    import os

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PEAK, str(ARCH / "qwen3-32b.yaml"), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["bf16_proj_gib"] > 0.35
    assert got["growth_gib"] < got["expected_gib"] + 0.1 < 0.75 * got["bf16_proj_gib"] + 0.1, got


def test_the_layer_by_layer_build_keeps_the_variants_per_step_fp8_settings(manifests):
    """fp8_activation_scaling rowwise and fp8_fast_accum reach every projection the layer-by-layer build casts: each
    lands with its column scales (the weight's tensorwise scale as rows of its out and in features)."""
    variant = Variant("r", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static",
                      fp8_activation_scaling="rowwise", fp8_fast_accum="forward")
    model, _, info = build_fp8_base(manifests["in_process"], 42, "cpu", variant)
    assert info["activation_scaling"] == "rowwise" and info["fast_accumulation"].startswith("the forward's")
    layers = [m for m in model.modules() if isinstance(m, StaticFP8Linear)]
    assert layers and all(m.rows and m.fast_accum == "forward" for m in layers)
    for m in layers:
        assert m.col_out.shape == (1, m.out_features) and m.col_in.shape == (1, m.in_features)
        assert torch.all(m.col_out == m.w_inv) and torch.all(m.col_in == m.w_inv) and m.col_out.device.type == "cpu"
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_a_bf16_tail_keeps_the_bf16_weights_and_its_last_steps_compute_from_them(manifests):
    """fp8_until (issue 78: a recipe that ends on the base the adapters are served on): the layer-by-layer FP8 base
    keeps each projection's bf16 weight (no stand-ins), its forward is FP8's until the switch, and after
    `to_bf16` every frozen projection computes from the bf16 weight: the logits of the whole bf16 model, exactly.
    Where a weight was kept only in FP8 the switch is refused; the runner's callback switches before the first step
    past the FP8 share and records the step."""
    import types

    from ftbench.build.fp8 import to_bf16
    from ftbench.run.runners.causal_lm import bf16_tail_callback

    tail = Variant("t", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static", fp8_until=0.9)
    model, _, info = build_fp8_base(manifests["in_process"], 42, "cpu", tail)
    assert not stand_ins(model) and info["bf16_weights"].startswith("kept")
    whole, _ = build_model(manifests["in_process"], 42, "cpu")
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        reference, fp8 = whole(input_ids=ids).logits, model(input_ids=ids).logits
        assert not torch.equal(fp8, reference)  # FP8's error until the switch
        record = {"extra": {}}
        callback = bf16_tail_callback(model, 0.9, record)
        callback.on_step_begin(None, types.SimpleNamespace(global_step=8, max_steps=10), None)
        assert "bf16_tail" not in record["extra"] and torch.equal(model(input_ids=ids).logits, fp8)
        callback.on_step_begin(None, types.SimpleNamespace(global_step=9, max_steps=10), None)
        layers = [m for m in model.modules() if isinstance(m, StaticFP8Linear)]
        assert record["extra"]["bf16_tail"] == {"fp8_steps": 9, "steps": 10, "layers_switched": len(layers)}
        assert torch.equal(model(input_ids=ids).logits, reference)
    fp8_only, _, _ = build_fp8_base(manifests["in_process"], 42, "cpu", STATIC)
    with pytest.raises(RuntimeError, match="bf16 weight kept"):
        to_bf16(fp8_only)


def test_a_bf16_tail_is_refused_where_no_projection_could_switch():
    from ftbench.core.knobs import knob_problems

    static = dict(peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="static")
    assert knob_problems("causal_lm", Variant("a", **static, fp8_until=0.9)) == []
    for bad in (Variant("b", peft="lora", precision="fp8", fp8_backend="torchao", fp8_recipe="tensorwise",
                        fp8_until=0.9),
                Variant("c", **static, fused_projections=True, fp8_until=0.9)):
        assert any("fp8_until without" in p for p in knob_problems("causal_lm", bad)), bad.name
    assert any("fp8_until" in p for p in knob_problems("lmm", Variant("d", **static, fp8_until=0.9)))
