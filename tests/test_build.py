"""Models built in the training process (ftbench.build.stages): the same tensors as a written checkpoint, gpt-oss's split
experts computing what the stock module computes, a 4-bit build's host memory bounded, bad input refused."""

import json
import sys
from pathlib import Path

import pytest
import torch

from ftbench.config.architectures import load_architecture
from ftbench.build.experts import SplitExperts
from ftbench.build.stages import build_model, check_manifest
from ftbench.build.models import materialize_model

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "config" / "architectures"


def test_built_model_has_the_written_checkpoints_tensors(tmp_path):
    from transformers import AutoModelForCausalLM

    arch = load_architecture(ARCH / "qwen3-32b.yaml", "tiny")
    written = materialize_model(arch, "random", tmp_path / "w", 42, build="checkpoint")
    manifest = materialize_model(arch, "random", tmp_path / "p", 42, build="in_process")
    assert written["build"] == "checkpoint" and manifest["build"] == "in_process"
    assert not list((tmp_path / "p").rglob("*.safetensors")) and manifest["disk_bytes"] < 1_000_000
    ref = AutoModelForCausalLM.from_pretrained(written["path"], dtype=torch.bfloat16).state_dict()
    built, facts = build_model(manifest, 42, "cpu")
    got = built.state_dict()
    assert set(got) == set(ref) and facts["method"] == "in_process"
    for name, tensor in ref.items():
        assert torch.equal(got[name], tensor), name


def test_same_weights_in_every_build_and_per_name(tmp_path):
    arch = load_architecture(ARCH / "qwen3-8b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path, 42, build="in_process")
    a, _ = build_model(manifest, 42, "cpu")
    b, _ = build_model(manifest, 42, "cpu", dtype=torch.float32)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x.float(), y), name
    q = a.state_dict()
    assert not torch.equal(q["model.layers.0.self_attn.q_proj.weight"][:8, :8],
                           q["model.layers.1.self_attn.q_proj.weight"][:8, :8])


def test_seed_mismatch_and_bad_architecture_are_refused(tmp_path):
    arch = load_architecture(ARCH / "qwen3-8b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path, 42, build="in_process")
    with pytest.raises(ValueError, match=r"seed mismatch.*seed 42.*seed 7"):
        check_manifest(manifest, 7)
    edited = json.loads(json.dumps(manifest))
    edited["architecture_config"]["config"]["hidden_size"] = 65
    with pytest.raises(ValueError, match="qwen3-8b.yaml.*digest mismatch"):
        check_manifest(edited, 42)
    bad = load_architecture(ARCH / "qwen3-8b.yaml", "tiny")
    bad["config"]["num_attention_heads"] = 0
    with pytest.raises(ValueError, match="qwen3-8b.yaml"):
        materialize_model(bad, "random", tmp_path / "bad", 42, build="in_process")


def test_split_experts_compute_what_the_stock_module_computes():
    from transformers import AutoConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts, GptOssTopKRouter

    arch = load_architecture(ARCH / "gpt-oss-120b.yaml", "tiny")
    cfg = dict(arch["config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    stock, router = GptOssExperts(config), GptOssTopKRouter(config)
    for p in list(stock.parameters()) + list(router.parameters()):
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(10, config.hidden_size, requires_grad=True)
    _, scores, idx = router(x.detach())
    scores = scores.detach()
    split = SplitExperts.from_stock(stock, config)
    want, got = stock(x, idx, scores), split(x, idx, scores)
    torch.testing.assert_close(got, want)
    gx_want, = torch.autograd.grad(want.sum(), x)
    gx_got, = torch.autograd.grad(split(x, idx, scores).sum(), x)
    torch.testing.assert_close(gx_got, gx_want)


def test_gpt_oss_is_built_with_split_4bit_experts_and_only_attention_adapted(tmp_path):
    from ftbench.config.settings import Variant
    from ftbench.build.variants import adapted_modules, apply_lora, quantization_config

    arch = load_architecture(ARCH / "gpt-oss-120b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path, 42)  # auto: gpt-oss is always built in process
    assert manifest["build"] == "in_process"
    v = Variant(name="q", precision="nf4", nf4_compute="fp32", gradient_checkpointing=True)
    model, facts = build_model(manifest, 42, "cpu", torch.float32, quantization_config(v))
    n = arch["config"]["num_hidden_layers"] * (4 + 2 * arch["config"]["num_local_experts"])
    assert facts["quantized_4bit"] == n and getattr(model, "is_loaded_in_4bit", False)
    assert type(model.model.layers[0].mlp.experts.down_projs[0].weight).__name__ == "Params4bit"
    model = apply_lora(model, v, {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                     "up_proj", "down_proj"]})
    assert adapted_modules(model)["names"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    ids = torch.randint(0, 3000, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()


_PEAK_PROBE = r"""
import json, os, resource, sys
import torch, transformers, peft, bitsandbytes  # imported before the baseline is read
from ftbench.config.architectures import load_architecture
from ftbench.build.stages import build_model
from ftbench.config.settings import Variant
from ftbench.build.models import materialize_model
from ftbench.build.variants import quantization_config

arch = load_architecture(sys.argv[1], "tiny")
arch["config"].update(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=128, vocab_size=4096)
manifest = materialize_model(arch, "random", sys.argv[2], 42, build="in_process")
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
before = peak()
model, facts = build_model(manifest, 42, "cpu", torch.bfloat16, quantization_config(Variant("q", precision="nf4")))
print(json.dumps({"growth_gib": peak() - before, "bf16_gib": manifest["checkpoint_bf16_gib"],
                  "quantized": facts["quantized_4bit"]}))
"""


def test_a_4bit_build_never_holds_the_bf16_model_in_host_memory(tmp_path):
    """A 0.72 GiB (bf16) model built in NF4 layer by layer on the CPU: the process's peak host memory grows by less
    than half the bf16 size (measured here: 0.26 GiB, of which ~0.2 GiB is the NF4 model itself); a build that drew
    the model in bf16 before quantizing would grow by the whole bf16 size. Run in a fresh process whose allocator
    returns freed blocks (glibc's mmap threshold fixed), so the peak is the build's, not the allocator's history."""
    import subprocess
    import sys

    env = {**__import__("os").environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(ARCH / "qwen3-8b.yaml"), str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["quantized"] == 24 * 7 and got["bf16_gib"] > 0.7
    assert got["growth_gib"] < 0.5 * got["bf16_gib"], got


def test_evaluation_of_a_4bit_model_on_a_cpu_with_odd_widths(tmp_path):
    """bitsandbytes repacks 4-bit weights for its CPU inference kernel (AVX512-BF16 CPUs) and asserts a multiple of
    32 rows; layers that cannot be repacked keep the dequantizing path (ftbench.build.variants.unpackable_for_cpu), so an
    architecture with other widths still evaluates after training."""
    from ftbench.config.settings import Variant
    from ftbench.build.variants import apply_lora, quantization_config

    arch = load_architecture(ARCH / "qwen3-8b.yaml", "tiny")
    arch["config"].update(hidden_size=80, head_dim=20)  # q: 80 rows, k and v: 40
    manifest = materialize_model(arch, "random", tmp_path, 42, build="in_process")
    v = Variant(name="q", precision="nf4", nf4_compute="fp32")
    model, _ = build_model(manifest, 42, "cpu", torch.float32, quantization_config(v))
    model = apply_lora(model, v, {"target_modules": ["q_proj", "k_proj", "v_proj"]})
    model.eval()
    ids = torch.randint(0, 4000, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids).logits).all()


def test_kbit_upcast_false_keeps_the_unquantized_parameters_in_the_compute_dtype(tmp_path):
    """qlora-gc-pf-bf16: PEFT's k-bit preparation casts the embeddings, LM head and norms to fp32; with
    kbit_upcast false they stay bf16 (as in Unsloth's 4-bit models), only LoRA trains, and a step runs."""
    from ftbench.config.settings import Variant
    from ftbench.build.variants import apply_lora, quantization_config

    arch = load_architecture(ARCH / "qwen3-8b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path, 42, build="in_process")
    lora = {"target_modules": ["q_proj", "v_proj"]}
    dtypes = {}
    for upcast in (True, False):
        v = Variant(name="q", precision="nf4", gradient_checkpointing=True, kbit_upcast=upcast)
        model, _ = build_model(manifest, 42, "cpu", torch.bfloat16, quantization_config(v))
        model = apply_lora(model, v, lora)
        dtypes[upcast] = {n: p.dtype for n, p in model.named_parameters() if "lora_" not in n
                          and type(p).__name__ != "Params4bit"}
        assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    assert set(dtypes[True].values()) == {torch.float32}
    assert set(dtypes[False].values()) == {torch.bfloat16} and dtypes[False].keys() == dtypes[True].keys()
    ids = torch.randint(0, 3000, (1, 12))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model(input_ids=ids, labels=ids).loss.backward()
    assert any(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)


def test_a_model_too_large_for_the_host_is_refused_before_building(tmp_path, monkeypatch):
    """Counted on the meta device, compared with the memory it would be drawn in: refused with both numbers, at
    materialization (a written checkpoint) and in the training job (a build in process), before a byte is drawn."""
    import ftbench.build.stages as build
    from ftbench.build.models import materialize

    monkeypatch.setattr(build, "available_bytes", lambda device: 4 * 2**30)  # a host with 4 GiB free
    arch = load_architecture(ARCH / "qwen3-8b.yaml", "full")  # 8.2 B parameters: 15.3 GiB in bf16
    with pytest.raises(build.TooLarge, match=r"qwen3-8b.yaml at scale full: refused before building: its "
                                             r"8,190,735,360 parameters take 15\.3 GiB, and the host has 4\.0 GiB"):
        materialize_model(arch, "random", tmp_path / "w", 42, build="checkpoint")
    assert not list((tmp_path / "w").rglob("*.safetensors"))
    # the materialize job: a manifest that says so, which the training jobs on it record as unsupported
    params = {"architecture": str(ARCH / "qwen3-8b.yaml"), "scale": "full", "seed": 42,
              "model": {"source": "random", "build": "checkpoint"}}
    manifest = materialize(params, tmp_path / "job" / "model.json")
    assert manifest["status"] == "unsupported" and "15.3 GiB" in manifest["reason"] and "4.0 GiB" in manifest["reason"]
    # built in process by the training job: the same refusal, before drawing
    in_process = materialize_model(arch, "random", tmp_path / "p", 42, build="in_process")
    with pytest.raises(build.TooLarge, match="15.3 GiB, and the host has 4.0 GiB"):
        build_model(in_process, 42, "cpu")
    monkeypatch.undo()
    small = materialize_model(load_architecture(ARCH / "qwen3-8b.yaml", "tiny"), "random", tmp_path / "t", 42)
    assert small["build"] == "checkpoint"  # the real host takes the tiny model


def test_a_4bit_checkpoint_written_for_unsloth_holds_the_in_process_models_tensors(tmp_path, monkeypatch):
    """Unsloth loads from a path: a model built in process reaches it as a bitsandbytes 4-bit checkpoint of the same
    seeded weights (tiny scale, on the CPU), which transformers reads back tensor for tensor; a disk too small for it
    refuses before writing, with both numbers."""
    import shutil
    from collections import namedtuple

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import ftbench.build.stages as build
    from ftbench.core.knobs import Variant
    from ftbench.build.variants import quantization_config

    arch = load_architecture(ARCH / "qwen3-8b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path / "m", 42, build="in_process")
    quant = quantization_config(Variant("unsloth-qlora", precision="nf4", framework="unsloth"))
    facts = build.write_4bit_checkpoint(manifest, 42, "cpu", [(tmp_path / "ckpt", "disk")], quant)
    assert facts["route"] == build.UNSLOTH_ROUTE and facts["quantized_4bit"] == 14
    # the estimate counts a quantized weight's stored shape, not its packed storage: within 10 % of what was written
    weights = sum(f.stat().st_size for f in (tmp_path / "ckpt").glob("*.safetensors"))
    assert 0.95 <= facts["checkpoint_need_bytes"] / weights <= 1.1
    assert facts["checkpoint_disk_bytes"] > 0 and AutoTokenizer.from_pretrained(tmp_path / "ckpt").pad_token_id is not None
    ref, _ = build_model(manifest, 42, "cpu", torch.bfloat16, quant)
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", device_map={"": "cpu"})
    assert type(back.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    want, got = ref.state_dict(), back.state_dict()
    assert set(want) == set(got)
    for name, tensor in want.items():
        assert torch.equal(got[name].cpu(), tensor.cpu()), name
    Usage = namedtuple("Usage", "total used free")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(1, 1, 1000) if "full" in str(path) else real(path))
    with pytest.raises(build.TooLarge, match=r"4-bit checkpoint would take 0\.0 GiB and .*full \(disk\) has 0\.0 GiB "
                                             r"free; .*full-too \(host memory\) has 0\.0 GiB free: refused"):
        build.write_4bit_checkpoint(manifest, 42, "cpu", [(tmp_path / "full", "disk"),
                                                          (tmp_path / "full-too", "host memory")], quant)
    # the next route with room takes it, and the record says which routes were measured
    facts = build.write_4bit_checkpoint(manifest, 42, "cpu", [(tmp_path / "full", "disk"),
                                                              (tmp_path / "roomy", "host memory")], quant)
    assert facts["checkpoint_path"] == str(tmp_path / "roomy") and (tmp_path / "roomy" / "config.json").exists()
    assert [(t["kind"], t["fits"]) for t in facts["checkpoint_routes"]] == [("disk", False), ("host memory", True)]


@pytest.mark.parametrize("precision", ["bf16", "nf4"])
def test_grouped_experts_give_the_per_expert_loops_outputs_and_gradients(tmp_path, precision):
    """gpt-oss's experts as one grouped GEMM per projection (variant knob experts: grouped) against the per-expert
    loop, on the same built model, with routing that leaves some experts empty: the same outputs and the same
    gradients to the tokens and the routing weights, within bf16 tolerance; in NF4 the weights are dequantized
    inside the grouped GEMM."""
    import bitsandbytes.functional as bnbf

    from ftbench.build.experts import group_experts
    from ftbench.config.settings import Variant
    from ftbench.build.variants import quantization_config

    arch = load_architecture(ARCH / "gpt-oss-120b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path, 42)
    v = Variant(name="q", precision=precision)
    model, _ = build_model(manifest, 42, "cpu", torch.bfloat16, quantization_config(v))
    experts = model.model.layers[0].mlp.experts
    torch.manual_seed(0)
    h = arch["config"]["hidden_size"]
    x = torch.randn(24, h, dtype=torch.bfloat16, requires_grad=True)
    # 8 experts, top-2: only experts 1, 4 and 6 get rows (0, 2, 3, 5 and 7 are empty)
    idx = torch.tensor([[1, 4], [4, 6], [6, 1]] * 8)
    weights = torch.rand(24, 2, dtype=torch.bfloat16).softmax(-1).requires_grad_(True)

    def run():
        out = experts(x, idx, weights)
        gx, gw = torch.autograd.grad((out.float() * torch.linspace(-1, 1, h)).sum(), (x, weights))
        return out, gx, gw

    loop = run()
    assert group_experts(model) == arch["config"]["num_hidden_layers"] and experts.grouped
    grouped = run()
    packed = experts.packed["gate_up"]  # one buffer a projection: exactly each expert's own dequantized weight
    for e in (0, 4, 7):
        lin = experts.gate_up_projs[e]
        own = (bnbf.dequantize_4bit(lin.weight.data, lin.weight.quant_state) if precision == "nf4" else lin.weight)
        assert torch.equal(packed.weight(torch.bfloat16)[e], own.to(torch.bfloat16))
    if precision == "nf4":
        assert packed.nested and lin.weight.data.data_ptr() == packed.data[7 * lin.weight.data.numel():].data_ptr()
    experts.grouped = False
    assert all(torch.equal(a, b) for a, b in zip(run(), loop))  # the loop reads the packed views unchanged
    experts.grouped = True
    for want, got in zip(loop, grouped):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert grouped[0].abs().sum() > 0 and grouped[1].abs().sum() > 0
    ids = torch.randint(0, 3000, (2, 16))  # the whole model trains through the grouped path
    model.train()
    loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)


def test_expert_lora_is_the_merged_weights_update_with_gradients_only_where_experts_ran(tmp_path):
    """LoRA on every expert's projections (variant knob expert_lora), as two grouped GEMMs a projection, computes
    what the experts compute with W + (alpha / r) B A merged into their weights; A is drawn, B starts at zero (the
    outputs unchanged), and an expert no token reached gets no gradient."""
    from ftbench.build.experts import adapt_experts, group_experts

    arch = load_architecture(ARCH / "gpt-oss-120b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path, 42)
    model, _ = build_model(manifest, 42, "cpu", torch.bfloat16)
    group_experts(model)
    experts = model.model.layers[0].mlp.experts
    torch.manual_seed(0)
    h, n_experts = arch["config"]["hidden_size"], arch["config"]["num_local_experts"]
    x = torch.randn(24, h, dtype=torch.bfloat16, requires_grad=True)
    idx = torch.tensor([[1, 4], [4, 6], [6, 1]] * 8)  # experts 0, 2, 3, 5 and 7 get no rows
    weights = torch.rand(24, 2, dtype=torch.bfloat16).softmax(-1)
    plain = experts(x, idx, weights)
    facts = adapt_experts(model, {"r": 8, "alpha": 16})
    d = arch["config"]["intermediate_size"]
    per_expert = 8 * h + 2 * d * 8 + 8 * d + h * 8
    assert facts["parameters"] == arch["config"]["num_hidden_layers"] * n_experts * per_expert
    assert facts["dtype"] == "float32" and experts.lora_scaling == 2.0
    assert torch.equal(experts(x, idx, weights), plain)  # B = 0: nothing changes before training
    with torch.no_grad():
        for name in ("gate_up", "down"):
            experts.lora[f"{name}_B"].normal_(0, 0.02)
    got = experts(x, idx, weights)
    (got.float() ** 2).sum().backward()
    grad_b = experts.lora["gate_up_B"].grad
    assert grad_b[[1, 4, 6]].abs().sum() > 0 and grad_b[[0, 2, 3, 5, 7]].abs().sum() == 0
    lora, experts.lora = experts.lora, None  # the same update merged into the experts' weights
    with torch.no_grad():
        for name, packed in experts.packed.items():
            delta = 2.0 * lora[f"{name}_B"] @ lora[f"{name}_A"]
            packed.weight_bf16 += delta.to(torch.bfloat16)
    torch.testing.assert_close(experts(x, idx, weights).float(), got.float(), rtol=3e-2, atol=3e-2)


def test_a_jobs_folder_in_host_memory_goes_with_the_job(tmp_path, monkeypatch):
    """The Unsloth checkpoint's host-memory route: its /dev/shm folder is named after the job's temporary folder,
    and the supervisor's release removes it (a killed child cannot), leaving other jobs' folders alone."""
    from ftbench.harness import meter as harness
    from ftbench.run import supervise

    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(harness, "HOST_MEMORY", shm)
    job = tmp_path / "ftbench-abc123"
    job.mkdir()
    monkeypatch.setenv("FTBENCH_PROGRESS", str(job / "progress.json"))
    mine = harness.host_memory_dir("unsloth-4bit-")
    (mine / "model.safetensors").write_bytes(b"0" * 1024)
    other = shm / "ftbench-zzz999-unsloth-4bit-x"
    other.mkdir()
    assert mine.parent == shm and mine.name.startswith("ftbench-abc123-unsloth-4bit-")
    assert supervise.release_host_memory(job, shm) == [str(mine)]
    assert not mine.exists() and other.exists()


def test_unsloths_own_compile_is_a_knob_read_before_unsloth_is_imported(tmp_path, monkeypatch):
    from ftbench.core.knobs import Variant, knob_problems
    from ftbench.run.runners.peers import import_unsloth

    assert knob_problems("causal_lm", Variant("x", framework="unsloth", unsloth_compile=False)) == []
    assert "unsloth_compile: false without framework='unsloth'" in knob_problems(
        "causal_lm", Variant("x", unsloth_compile=False))
    # a stand-in module that notes what it saw when imported, as Unsloth reads UNSLOTH_COMPILE_DISABLE
    (tmp_path / "unsloth.py").write_text("import os\nSEEN = os.environ.get('UNSLOTH_COMPILE_DISABLE')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for compile_, seen in ((True, None), (False, "1")):
        monkeypatch.delenv("UNSLOTH_COMPILE_DISABLE", raising=False)
        monkeypatch.delitem(sys.modules, "unsloth", raising=False)
        assert import_unsloth(Variant("x", framework="unsloth", unsloth_compile=compile_)).SEEN == seen


def test_a_readers_renamed_parameters_get_the_checkpoints_tensors_and_the_rest_are_named(tmp_path):
    """Unsloth 2026.10.9 reads gpt-oss's router as `mlp.router.linear`, where the checkpoint holds `mlp.router`: those
    parameters would keep the reader's fresh initialisation. restore_renamed copies the checkpoint's tensors into
    them (sharded checkpoint, layers folded in the record) and names what the checkpoint does not hold."""
    import json

    from safetensors.torch import save_file
    from torch import nn

    from ftbench.build.stages import restore_renamed

    torch.manual_seed(0)
    saved = {f"model.layers.{i}.mlp.router.{p}": torch.randn(4, 3) if p == "weight" else torch.randn(4)
             for i in range(3) for p in ("weight", "bias")}
    saved["model.embed.weight"] = torch.randn(5, 3)
    shards = {"a.safetensors": [k for k in saved if ".0." in k], "b.safetensors": [k for k in saved if ".0." not in k]}
    for file, keys in shards.items():
        save_file({k: saved[k] for k in keys}, tmp_path / file)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: f for f, keys in shards.items() for k in keys}}))

    class Router(nn.Module):  # the reader's class: the same tensors one module deeper
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(3, 4)

    reader = nn.Module()
    reader.model = nn.Module()
    reader.model.embed = nn.Embedding(5, 3)
    reader.model.embed.weight.data.copy_(saved["model.embed.weight"])
    reader.model.layers = nn.ModuleList()
    for _ in range(3):
        layer = nn.Module()
        layer.mlp = nn.Module()
        layer.mlp.router = Router()
        layer.mlp.sinks = nn.Parameter(torch.zeros(2))  # held by no name in the checkpoint
        reader.model.layers.append(layer)
    facts = restore_renamed(reader, tmp_path)
    for i in range(3):
        assert torch.equal(reader.model.layers[i].mlp.router.linear.weight, saved[f"model.layers.{i}.mlp.router.weight"])
        assert torch.equal(reader.model.layers[i].mlp.router.linear.bias, saved[f"model.layers.{i}.mlp.router.bias"])
    assert facts["renamed"] == {"model.layers.{0...2}.mlp.router.linear.bias": "model.layers.{0...2}.mlp.router.bias",
                                "model.layers.{0...2}.mlp.router.linear.weight": "model.layers.{0...2}.mlp.router.weight"}
    assert facts["not_in_checkpoint"] == ["model.layers.{0...2}.mlp.sinks"]
    # a checkpoint in one file, read the same way; nothing renamed where every name matches
    (tmp_path / "one").mkdir()
    save_file({"model.embed.weight": saved["model.embed.weight"]}, tmp_path / "one" / "model.safetensors")
    plain = nn.Module()
    plain.model = nn.Module()
    plain.model.embed = nn.Embedding(5, 3)
    assert restore_renamed(plain, tmp_path / "one") == {"renamed": {}, "not_in_checkpoint": []}


def test_building_a_causal_lm_is_one_route_of_stages_in_order():
    """ftbench.build.route: every one-process build goes through the same stages in one order, each applied where
    its variant asks for it; the FSDP2 build is the other route (ftbench.build.parallel.build_sharded)."""
    from ftbench.build.route import ROUTE, stages_for
    from ftbench.core.knobs import Variant

    assert [fn.__name__ for _, _, fn in ROUTE] == ["materialize", "grouped_experts", "fp8_gemms", "lora",
                                                    "seeded_adapters", "expert_lora", "fused_projections", "place"]
    words = {fn.__name__: w for w, _, fn in ROUTE}
    plain = stages_for(Variant.from_config("p", {}))
    assert plain == [words[n] for n in ("materialize", "lora", "seeded_adapters", "place")]
    fp8_fused = stages_for(Variant.from_config("f", {"precision": "fp8", "fp8_backend": "torchao",
                                                     "fused_adapters": True}))
    assert fp8_fused == [words[n] for n in ("materialize", "fp8_gemms", "lora", "seeded_adapters",
                                            "fused_projections", "place")]
    full = stages_for(Variant.from_config("n", {"peft": "none"}))
    assert words["seeded_adapters"] not in full and words["lora"] in full  # apply_lora leaves a full fine-tune whole
