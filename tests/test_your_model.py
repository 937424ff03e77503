"""config/your_model.yaml, the README's way to train your own causal LM with the fastest measured configuration:
with a local checkpoint and a local JSONL file where it says to put them, its one command runs through Snakemake.
On this CPU the FP8 run records `unsupported` with its reason, and the same config with rung 5 in bf16 trains and
writes its adapter."""

import json
import shutil
import subprocess
import sys

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
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args, "--",
                           run.format("lora-tb-cg-lean-async-pinned-fp8"), run.format(bf16)],
                          cwd=work, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    fp8 = json.loads((work / run.format("lora-tb-cg-lean-async-pinned-fp8")).read_text())
    assert fp8["status"] == "unsupported" and "GPU" in fp8["reason"]
    ours = json.loads((work / run.format(bf16)).read_text())
    assert ours["status"] == "ok" and ours["run"]["scale"] == "full", ours["reason"]
    assert (work / run.format(bf16)).parent.joinpath("adapter", "adapter_config.json").exists()
