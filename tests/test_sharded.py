"""FSDP2 built the torchtitan way (ftbench.build.parallel), on two gloo ranks of a CPU: the sharded build of a tiny model,
gathered, holds exactly the one-process build's weights (in process and from a checkpoint); each rank holds only its
rows; an adapter trained and saved from the two ranks loads in PEFT on one process and equals the gathered LoRA; QLoRA
under FSDP2 (4-bit weights quantized whole, their bf16-viewed bytes sharded) computes what one process computes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ftbench.config.architectures import load_architecture
from ftbench.build.stages import build_model
from ftbench.config.settings import Variant
from ftbench.build.models import materialize_model
from ftbench.build.variants import apply_lora, load_pretrained, quantization_config

ROOT = Path(__file__).resolve().parents[1]
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
ONE = Variant("lora", peft="lora", precision="bf16")


def two_ranks(script: str, *args) -> None:
    """`tests/<script>` run by torchrun as two gloo ranks on this CPU (one thread each), its arguments as text."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(ROOT / "tests" / script), *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


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
    two_ranks("sharded_ranks.py", tmp / "in_process.json", tmp / "checkpoint.json", out)
    return manifests, out, json.loads((out / "result.json").read_text())


def one_process(manifest):
    from transformers import AutoModelForCausalLM

    from ftbench.build.parallel import seed_adapters

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
    from ftbench.core.knobs import knob_problems

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
    two_ranks("sharded_moe_ranks.py", tmp_path / "m.json", tmp_path / "r.json")
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["loss"] > 0 and r["facts"]["world_size"] == 2 and "sharded" in r["facts"]["method"]
    one, _ = build_model(manifest, 42, "cpu")
    assert r["parameters"] == len(dict(one.named_parameters())) + r["lora_grads"]  # the base and every LoRA matrix
    assert r["experts"] > 0 and r["lora_grads"] > 0


@pytest.mark.parametrize("source", ["in_process", "checkpoint"])
def test_qlora_under_fsdp2_equals_the_one_process_4bit_build_bit_for_bit(tmp_path, source):
    """Two gloo ranks build a tiny Qwen3 in NF4 sharded with FSDP2 (bf16 quant storage), with checkpointing as
    qlora-gc-fsdp2 has it, from the seeded draws or from a checkpoint folder of the same weights (read a tensor at a
    time, as a user's own model is): gathered, the packed 4-bit bytes and quant states equal the one-process 4-bit
    build's; the logits, the loss and every LoRA gradient on the same tokens are equal too (one thread each: the
    CPU's bf16 GEMMs sum in another order with more); the adapter written by rank 0 loads in PEFT on the 4-bit
    model."""
    from peft import PeftModel

    from ftbench.build.parallel import _no_cpu_repack, adapters_as_trl_casts, seed_adapters

    arch = load_architecture(ROOT / "config/architectures/qwen3-8b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path / "p", 42, build="in_process")
    ranks_built = manifest if source == "in_process" else materialize_model(arch, "random", tmp_path / "c", 42,
                                                                             build="checkpoint")
    (tmp_path / "m.json").write_text(json.dumps(ranks_built))
    out = tmp_path / "out"
    out.mkdir()
    two_ranks("sharded_4bit_ranks.py", tmp_path / "m.json", out, "qlora-gc-fsdp2", "1")
    result, sharded = json.loads((out / "result.json").read_text()), torch.load(out / "sharded.pt", weights_only=False)
    facts = result["facts"]
    assert facts["world_size"] == 2 and facts["quantized_4bit"] == 14 and facts["quant_storage"] == "bfloat16"
    assert facts["quantized_at_once_max"] == 7  # one layer's projections whole at a time, never the whole model
    assert facts["adapters_bf16"] == 28  # LoRA in TRL's dtype before sharding (after it, FSDP2 kept fp32: GPU error)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        variant = Variant("qlora-gc", peft="lora", precision="nf4", gradient_checkpointing=True)
        model, _ = build_model(manifest, 42, "cpu", torch.bfloat16, quantization_config(variant))
        model = apply_lora(model, variant, LORA)
        seed_adapters(model, 42)
        _no_cpu_repack(model)
        adapters_as_trl_casts(model)  # what TRL does to a quantized model's LoRA when the trainer is built
        one = dict(model.named_parameters())
        assert set(sharded["full"]) == set(one)
        packed = 0
        for name, tensor in sharded["full"].items():
            mine = one[name].detach()
            if mine.dtype != tensor.dtype:  # the 4-bit bytes: uint8 here, viewed as bf16 there
                packed += 1
                assert torch.equal(mine.reshape(-1), tensor.reshape(-1).view(torch.uint8)), name
            else:
                assert torch.equal(mine, tensor), name
        assert packed == 14
        for name, module in model.named_modules():
            if name in sharded["states"]:
                assert torch.equal(module.quant_state.absmax, sharded["states"][name]["absmax"]), name
        ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
        model.train()
        with torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits.float(), sharded["logits"])
            for name, p in model.named_parameters():
                if ".lora_B." in name:
                    p.copy_(torch.randn(tuple(p.shape), generator=torch.Generator().manual_seed(len(name))) * 0.01)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() == sharded["loss"]
    assert sharded["dtypes"] == [("torch.bfloat16", "torch.bfloat16")]  # LoRA and its gradients, as the optimizer met them
    assert set(sharded["grads"]) == {n for n, p in model.named_parameters() if p.requires_grad}
    for name, grad in sharded["grads"].items():
        assert grad.abs().sum() > 0 and torch.equal(one[name].grad, grad), name

    base, _ = build_model(manifest, 42, "cpu", torch.bfloat16, quantization_config(variant))
    loaded = PeftModel.from_pretrained(base, out / "adapter")
    got = {n: p for n, p in loaded.named_parameters() if ".lora_" in n}
    assert set(got) == set(sharded["trained"]) == set(sharded["grads"])
    for name, tensor in sharded["trained"].items():  # after the ranks' optimizer step
        assert not torch.equal(tensor, one[name].detach()), name
        assert torch.equal(got[name].detach().to(tensor.dtype), tensor), name
