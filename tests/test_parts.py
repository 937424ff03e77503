"""The device plan's parts (bench/parts.yaml, run by bench/measure_check.py): every part expands to targets the
pipeline can make under its own configs (a Snakemake dry run per config set), and the patterns name what they say."""

import importlib.util
import re
import sys

import pytest
import yaml

from conftest import ROOT, snakemake

spec = importlib.util.spec_from_file_location("measure_check", ROOT / "bench/measure_check.py")
mc = importlib.util.module_from_spec(spec)
sys.modules["measure_check"] = mc
spec.loader.exec_module(mc)
PLAN = yaml.safe_load((ROOT / "bench/parts.yaml").read_text())
# one instance of each pattern, with the variants and batch sizes the plan names
INSTANCES = ["a-eager-bs1,24", "a-fixed-bs16", "a-dynamic-bs8", "a-cell-compile-gc-bs1,2,4,8,16",
             "a-profile-fp8-te-compile-gc-bs1,8", "c-cell-compile-ro,cached-compile-ro,pinned-cl", "c-profile-workers-3"]


def test_brace_expansion_and_patterns_read_as_bash_and_the_plan_say():
    assert mc.braces("a/{x,y}/b{1,2}") == ["a/x/b1", "a/x/b2", "a/y/b1", "a/y/b2"]
    assert mc.fill("{lmm}/{variant}/bs{batch}", {"lmm": "L", "variant": "v-gc", "batch": "8"}) == ["L/v-gc/bs8"]
    (run,) = mc.runs("a-cell-fp8-te-compile-gc-bs8,16", PLAN)
    assert [t.split("beans/")[1] for t in run["targets"]] == ["fp8-te-compile-gc/bs8/metrics.json",
                                                              "fp8-te-compile-gc/bs16/metrics.json"]
    (run,) = mc.runs("frontier-f", PLAN)
    assert run["each"] and len(mc.commands(run)) == 3  # one Snakemake call a target, in the order listed
    with pytest.raises(KeyError):
        mc.runs("a-cell-bs8", PLAN)  # no variant named


def test_an_option_is_never_taken_for_the_output_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert mc.main(["--help"]) == 0 and mc.main(["-x"]) == 2
    assert "measure_check.py --list" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no folder made, no part run


def test_every_part_asks_for_targets_its_configs_can_make(tmp_path):
    groups = {}
    for name in list(PLAN["parts"]) + INSTANCES:
        for run in mc.runs(name, PLAN):
            if "command" not in run:
                groups.setdefault(tuple(run["configs"]), []).extend(run["targets"])
    assert len(groups) >= 6
    for configs, targets in groups.items():
        cfg = ["--configfile"] + [str(ROOT / c) for c in ("config/config.yaml", *configs)]  # the default first
        proc = snakemake("-n", "--cores", "1", "--resources", "gpu=1", *cfg, "-d", str(tmp_path / "wd"), "--",
                         *sorted(set(targets)), cwd=tmp_path)
        assert proc.returncode == 0, f"{configs}: {(proc.stdout + proc.stderr)[-2000:]}"


@pytest.mark.parametrize("part, gpus", [("scale-8", 8), ("scale-top", 4), ("four-at-once", 1)])
def test_the_multi_gpu_parts_ask_for_the_gpus_of_their_host(tmp_path, monkeypatch, part, gpus):
    """The several-GPU plan as a dry run on a host with faked GPUs (FTBENCH_GPU_IDS): the 8-GPU part (issue 48,
    no such host lent yet) asks for 8 GPUs a training job, the 4-GPU parts for what their variants name, and the
    four one-GPU jobs at once for one each."""
    (run,) = [r for r in mc.runs(part, PLAN) if "command" not in r]
    host = {"scale-8": "eight", "scale-top": "four", "four-at-once": "four"}[part]
    assert run["host"] == host and f"gpu={ {'eight': 8, 'four': 4}[host]}" in mc.HOSTS[host]
    monkeypatch.setenv("FTBENCH_GPU_IDS", ",".join(str(i) for i in range(8)))
    cfg = ["--configfile"] + [str(ROOT / c) for c in ("config/config.yaml", *run["configs"])]
    proc = snakemake("-n", *mc.HOSTS[host], *cfg, "-d", str(tmp_path / "wd"), "--", *run["targets"], cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    asked = [int(g) for g in re.findall(r"rule train:.*?resources: [^\n]*gpu=(\d+)", proc.stdout, re.S)]
    assert len(asked) == len(run["targets"]) and max(asked) == gpus, asked
    if part == "four-at-once":
        assert asked == [1, 1, 1, 1]  # one GPU each: four at once on a 4-GPU host
