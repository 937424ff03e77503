"""config/your_model.yaml, the README's way to train your own causal LM with the fastest measured configuration:
with a local checkpoint and a local JSONL file where it says to put them, its one command runs through Snakemake on
the fastest rung that keeps quality whose packages are installed (`pick`). On this CPU, without the fast extras, that
is the bf16 rung 6, which records `unsupported` with its reason (pinned batches need a GPU), and the same config with
rung 5 trains and writes its adapter; with FlashAttention-4 and Liger Kernel importable, the dry run names the FA4
rung."""

import json
import os
import shutil
import subprocess
import sys
import tomllib

import yaml

from conftest import ROOT, copy_tracked

COMMAND = "snakemake --cores 8 --resources gpu=1 --configfile config/your_model.yaml"


def test_the_readme_names_the_command():
    assert COMMAND in (ROOT / "README.md").read_text() and COMMAND in (ROOT / "config/your_model.yaml").read_text()


def test_your_model_trains_through_the_one_command(tmp_path, tiny_qwen):
    work = copy_tracked(tmp_path / "project")
    (work / "your_model").mkdir()
    shutil.copytree(tiny_qwen["path"], work / "your_model" / "checkpoint")
    with open(work / "your_model" / "train.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"instruction": f"Say {i} twice.", "input": "", "output": f"{i} {i}"}) + "\n")
    cfg = yaml.safe_load((work / "config/your_model.yaml").read_text())
    cfg["datasets"]["mine"]["num_samples"] = 30
    cfg["datasets"]["mine"]["eval_samples"] = 4
    cfg["studies"]["llm"]["training"]["measure"] = {"warmup_steps": 1, "steps": 2, "min_seconds": 0, "repeats": 1}
    cfg["studies"]["llm"]["matrix"][0]["variants"].append("lora-tb-cg-lean-fused-async")
    (work / "config/your_model.yaml").write_text(yaml.safe_dump(cfg))
    args = COMMAND.split()[1:]
    args[args.index("8")] = "2"
    run = "results/runs/llm/mine/full/mine/{}/bs2/metrics.json"
    bf16 = "lora-tb-cg-lean-fused-async"  # rung 5 in bf16: what a CPU can run (rung 6 pins memory for a GPU)
    picked = "lora-tb-cg-lean-fused-async-pinned"  # without flash-attn-4 and liger-kernel, the list's second
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args, "--", run.format(picked), run.format(bf16)],
                          cwd=work, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (f"pick.fastest: {picked}, the first of its list" in proc.stderr
            and "passed over: lora-tb-cg-lean-fused-async-pinned-fa4-lce (needs liger_kernel, flash_attn" in proc.stderr)
    rec = json.loads((work / run.format(picked)).read_text())
    assert rec["status"] == "unsupported" and "GPU" in rec["reason"] and rec["run"]["variant"] == picked
    ours = json.loads((work / run.format(bf16)).read_text())
    assert ours["status"] == "ok" and ours["run"]["scale"] == "full", ours["reason"]
    assert (work / run.format(bf16)).parent.joinpath("adapter", "adapter_config.json").exists()


def test_with_the_fast_extras_the_dry_run_names_the_fastest_rung_that_keeps_quality(tmp_path):
    """`pip install -e '.[fast]'` brings flash-attn-4 and liger-kernel; importable (here: empty packages of their
    names, enough for the pick, which asks importlib whether they are installed), the pick takes the FA4 rung and the
    dry run's job is that rung's."""
    work = copy_tracked(tmp_path / "project")
    fake = tmp_path / "fast"
    for pkg in ("flash_attn", "flash_attn/cute", "liger_kernel"):
        (fake / pkg).mkdir(parents=True)
        (fake / pkg / "__init__.py").write_text("")
    (work / "your_model" / "checkpoint").mkdir(parents=True)
    (work / "your_model" / "checkpoint" / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    (work / "your_model" / "train.jsonl").write_text("")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    proc = subprocess.run([sys.executable, "-m", "snakemake", *COMMAND.split()[1:], "-n"], cwd=work,
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    top = "lora-tb-cg-lean-fused-async-pinned-fa4-lce"
    assert f"pick.fastest: {top}, the first of its list" in out, out[-3000:]
    assert f"results/runs/llm/mine/full/mine/{top}/bs2/metrics.json" in out, out[-3000:]
    fast = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["fast"]]
    assert any(d.startswith("flash-attn-4") for d in fast) and any(d.startswith("liger-kernel") for d in fast)
