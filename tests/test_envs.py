"""Environments parse, agree with the pip pins, and every rule declares env, log and benchmark."""

import re
import tomllib

import pytest
import yaml

from conftest import ROOT, snakemake

PINS = {}
for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
    name, version = spec.split("==")
    PINS[name.lower()] = version
ENVS = sorted((ROOT / "envs").glob("*.yaml"))


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_env_parses_and_pins_agree_with_pyproject(env):
    spec = yaml.safe_load(env.read_text())
    pip = next(d["pip"] for d in spec["dependencies"] if isinstance(d, dict))
    assert "python=3.11" in spec["dependencies"]
    for req in pip:
        name, _, version = req.partition("==")
        assert version, f"{env.name}: {req} is not pinned"
        name = re.sub(r"\[.*\]", "", name).lower()
        if name in PINS:
            assert PINS[name] == version, f"{env.name}: {name}=={version}, pyproject pins {PINS[name]}"


def test_gpu_extra_is_not_in_the_cpu_install():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("unsloth", "transformer-engine")) for d in meta["dependencies"])
    assert any(d.startswith("unsloth") for d in meta["optional-dependencies"]["gpu"])


def test_every_rule_names_env_log_and_benchmark():
    text = "".join(p.read_text() for p in (ROOT / "rules").glob("*.smk"))
    for rule in re.split(r"\nrule ", "\n" + text)[1:]:
        name = rule.split(":")[0]
        for directive in ("conda:", "log:", "benchmark:"):
            assert directive in rule, f"rule {name} lacks {directive}"


def test_snakemake_lint_is_clean(tmp_path):
    proc = snakemake("--lint", "--configfile", str(ROOT / "config/config.yaml"), "-d", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0 and "Lints for" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_snakemake_files_are_snakefmt_clean():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "snakefmt"
    assert exe.exists() or shutil.which("snakefmt"), "snakefmt is a dev dependency (pip install -e '.[dev]')"
    proc = subprocess.run([str(exe) if exe.exists() else "snakefmt", "--check", "Snakefile", "rules"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
