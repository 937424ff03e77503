"""Snakemake's SLURM executor plugin with the repo's profile (profiles/slurm) against a real SLURM: slurmctld,
slurmd and munged on this machine (tests/slurm_cluster.py). The tiny default's data, model and training jobs run
as SLURM jobs; their records are checked. Not in the default suite (it installs and starts daemons):

    pytest -m slurm            # root; installs slurm-wlm and munge with apt-get where missing
"""

import json

import pytest

from conftest import ROOT, snakemake
from slurm_cluster import cluster

pytestmark = pytest.mark.slurm

RUNS = ["results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora/bs1",
        "results/runs/llm/qwen3-8b/tiny/japanese_alpaca/lora-ddp2/bs4"]


def test_the_tiny_default_trains_through_slurm(tmp_path, monkeypatch):
    wd = tmp_path / "wd"
    wd.mkdir()
    with cluster(tmp_path / "slurm") as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        # this SLURM has no GPUs (no GRES): the GPU rules ask for none here; on a cluster the profile's
        # mapping sends gpu -> --gpus
        result = snakemake("-d", str(wd), "--configfile", str(ROOT / "config/config.yaml"),
                           "--profile", str(ROOT / "profiles/slurm"),
                           "--default-resources", "slurm_partition=debug", "runtime=30", "mem_mb=1000",
                           "cpus_per_task=1", "--set-resources", "train:gpu=0", "materialize_model:gpu=0",
                           "train:mem_mb=4000", "materialize_model:mem_mb=4000",
                           "--slurm-init-seconds-before-status-checks", "5", "--jobs", "4",
                           "--", *[f"{r}/metrics.json" for r in RUNS], timeout=1200)
        assert result.returncode == 0, result.stderr[-4000:]
        submitted = result.stderr.count("has been submitted with SLURM jobid")
        assert submitted == 4, result.stderr[-4000:]  # dataset, model, two training jobs
    jobs = set()
    for run in RUNS:
        rec = json.loads((wd / run / "metrics.json").read_text())
        assert rec["status"] == "ok", rec["reason"]
        assert rec["provenance"]["slurm_job_id"], rec["provenance"]  # it ran inside a SLURM job
        jobs.add(rec["provenance"]["slurm_job_id"])
    assert len(jobs) == 2
    ddp = json.loads((wd / RUNS[1] / "metrics.json").read_text())
    assert ddp["parallel"]["world_size"] == 2  # the job launched its two ranks inside its SLURM allocation


_LAUNCH = """
import json, sys
from ftbench.run.supervise import supervise
a = json.load(open(sys.argv[1]))
rec = supervise("train", a["params"], a["paths"], a["log"])
print("record:", rec["status"], rec["reason"])
"""


def test_a_job_of_two_launchers_starts_them_with_srun_and_meets_at_slurms_first_host(tmp_path, monkeypatch,
                                                                                      tiny_qwen, instruction_data):
    """A training job of 2 ranks over 2 launchers ("nodes": 2), supervised inside a SLURM allocation of two tasks:
    the supervisor reads the allocation from SLURM's environment, srun starts one torchrun launcher per task, and
    they meet through c10d rendezvous at the allocation's first host, under the SLURM job's id (on this one-node
    cluster both tasks share the node; on a cluster srun puts one on each node)."""
    import os
    import subprocess
    import sys

    from ftbench.config import settings as ftc
    from test_robustness import one_run_config

    cfg = one_run_config(measure={"warmup_steps": 2, "steps": 3, "min_seconds": 0.5, "repeats": 2})
    cfg["variants"]["lora-ddp2x2"] = {"peft": "lora", "precision": "bf16", "gpus": 2, "nodes": 2, "parallel": "ddp"}
    cfg["studies"]["llm"]["matrix"][0].update(variants=["lora-ddp2x2"], batch_sizes=[2])
    spec = ftc.RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", "lora-ddp2x2", 2)
    (tmp_path / "model.json").write_text(json.dumps(tiny_qwen))
    _, train, eval_ = instruction_data
    out = tmp_path / "run"
    paths = {"model": str(tmp_path / "model.json"), "train": str(train), "eval": str(eval_), "base_dir": str(ROOT),
             "metrics": str(out / "metrics.json"), "steps": str(out / "steps.csv"), "memory": str(out / "memory.csv"),
             "adapter": str(out / "adapter")}
    job = tmp_path / "job-args.json"
    job.write_text(json.dumps({"params": ftc.run_params(cfg, spec), "paths": paths, "log": str(tmp_path / "job.log")}))
    script = tmp_path / "launch.py"
    script.write_text(_LAUNCH)
    with cluster(tmp_path / "slurm") as env:
        env = {k: v for k, v in env.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
        done = subprocess.run(["sbatch", "--wait", "--ntasks=2", "--cpus-per-task=1", "--mem=6000",
                               f"--output={tmp_path / 'sbatch.out'}", f"--chdir={tmp_path}",
                               f"--wrap={sys.executable} {script} {job}"], env=env, capture_output=True, text=True,
                              timeout=900)
    log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
    sbatch_out = (tmp_path / "sbatch.out").read_text() if (tmp_path / "sbatch.out").exists() else ""
    assert done.returncode == 0, (done.stderr, sbatch_out[-2000:], log[-3000:])
    rec = json.loads((out / "metrics.json").read_text())
    assert rec["status"] == "ok", (rec["reason"], log[-3000:])
    par, sup = rec["parallel"], rec["extra"]["supervision"]
    assert par["world_size"] == 2 and par["launchers"] == 2
    assert sorted(r["launcher"] for r in par["per_rank"]) == [0, 1]
    (where,) = sup["launchers"]
    assert where.startswith("srun: 2 launchers of 1 ranks on ") and "c10d rendezvous at " in where, where
    assert sup["launcher"] == "srun"
    assert rec["provenance"]["slurm_job_id"]
