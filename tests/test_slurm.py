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
