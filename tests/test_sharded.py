"""FSDP2 built the torchtitan way (ftbench.parallel), on two gloo ranks of a CPU: the sharded build of a tiny model,
gathered, holds exactly the one-process build's weights (in process and from a checkpoint); each rank holds only its
rows; an adapter trained and saved from the two ranks loads in PEFT on one process and equals the gathered LoRA."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftbench.architectures import load_architecture
from ftbench.build import build_model
from ftbench.config import Variant
from ftbench.models import materialize_model
from ftbench.variants import apply_lora, load_pretrained

ROOT = Path(__file__).resolve().parents[1]
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
ONE = Variant("lora", peft="lora", precision="bf16")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharded")
    arch = load_architecture(ROOT / "config/architectures/qwen3-8b.yaml", "tiny")
    manifests = {"in_process": materialize_model(arch, "random", tmp / "p", 42, build="in_process"),
                 "checkpoint": materialize_model(arch, "random", tmp / "c", 42, build="checkpoint")}
    for name, m in manifests.items():
        (tmp / f"{name}.json").write_text(json.dumps(m))
    out = tmp / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(ROOT / "tests/sharded_ranks.py"), str(tmp / "in_process.json"),
                           str(tmp / "checkpoint.json"), str(out)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return manifests, out, json.loads((out / "result.json").read_text())


def one_process(manifest):
    from transformers import AutoModelForCausalLM

    from ftbench.parallel import seed_adapters

    if manifest["build"] == "in_process":
        model, _ = build_model(manifest, 42, "cpu")
    else:
        model = load_pretrained(AutoModelForCausalLM, manifest["path"], ONE, torch.device("cpu"))
    model = apply_lora(model, ONE, LORA)
    seed_adapters(model, 42)
    return model


@pytest.mark.parametrize("source", ["in_process", "checkpoint"])
def test_the_sharded_build_gathered_equals_the_one_process_build(sharded, source):
    manifests, out, result = sharded
    gathered = torch.load(out / f"{source}.pt")
    ref = dict(one_process(manifests[source]).named_parameters())
    assert set(gathered) == set(ref)
    for name, tensor in ref.items():
        assert gathered[name].dtype == tensor.dtype, name
        assert torch.equal(gathered[name], tensor.detach()), name
    facts = result[source]["facts"]
    assert facts["world_size"] == 2 and facts["adapters_seeded"] > 0
    drawn = facts["parameters_drawn"] if source == "in_process" else facts["parameters_read"]
    assert drawn == len([n for n in ref if ".lora_" not in n])
    # FSDP2 wrapped every decoder layer and the root; the trainer is told FSDP2 (accelerate then keeps the model)
    assert {"FSDPQwen3DecoderLayer", "FSDPPeftModelForCausalLM"} <= set(result[source]["types"])
    assert result[source]["trainer_args"]["fsdp_config"]["version"] == 2


def test_each_rank_holds_only_its_rows(sharded):
    _, _, result = sharded
    local, full = result["in_process"]["local_shapes"], result["in_process"]["global_shapes"]
    name = "base_model.model.model.layers.0.mlp.up_proj.base_layer.weight"
    assert local[name][0] * 2 == full[name][0] and local[name][1:] == full[name][1:]
    held = sum(torch.Size(s).numel() for s in local.values())
    assert held < 0.55 * sum(torch.Size(s).numel() for s in full.values())


def test_an_adapter_saved_from_two_ranks_loads_in_peft_and_equals_the_gathered_lora(sharded):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM  # noqa: F401

    manifests, out, result = sharded
    trained = torch.load(out / "trained.pt")
    assert any(".lora_B." in n and t.abs().sum() > 0 for n, t in trained.items())  # it trained: B left zero
    assert result["save"]["tensors"] == len(trained) and (out / "adapter" / "adapter_model.safetensors").exists()
    base, _ = build_model(manifests["in_process"], 42, "cpu")
    loaded = PeftModel.from_pretrained(base, out / "adapter")
    got = {n: p for n, p in loaded.named_parameters() if ".lora_" in n}
    assert set(got) == set(trained)
    for name, tensor in trained.items():
        assert torch.equal(got[name].detach().to(tensor.dtype), tensor), name


def test_fsdp2_is_checked_before_any_job():
    from ftbench.knobs import knob_problems

    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="fsdp2")) == []
    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp", precision="fp8", fp8_backend="torchao")) == []
    assert any("fused" in p for p in knob_problems("causal_lm", Variant("x", gpus=2, parallel="fsdp2",
                                                                         fused_projections=True)))
    assert any("Transformer Engine" in p for p in knob_problems("causal_lm", Variant(
        "x", gpus=2, parallel="ddp", precision="fp8", fp8_backend="te")))


def test_a_mixture_of_experts_builds_sharded_trains_a_step_and_gathers(tmp_path):
    """gpt-oss (tiny: its experts, router and attention sinks) through the same meta-device build as Qwen3: every
    rank draws only its rows, a forward and backward under bf16 autocast give every LoRA matrix a gradient, and the
    gathered model holds every parameter, experts included (the path gpt-oss-120b takes over 4 GPUs)."""
    arch = load_architecture(ROOT / "config/architectures/gpt-oss-120b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path / "p", 42, build="in_process")
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(ROOT / "tests/sharded_moe_ranks.py"), str(tmp_path / "m.json"), str(tmp_path / "r.json")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["loss"] > 0 and r["facts"]["world_size"] == 2 and "sharded" in r["facts"]["method"]
    one, _ = build_model(manifest, 42, "cpu")
    assert r["parameters"] == len(dict(one.named_parameters())) + r["lora_grads"]  # the base and every LoRA matrix
    assert r["experts"] > 0 and r["lora_grads"] > 0
