"""Every snakemake command in the README works as written: each runs as a dry run (-n) in a fresh copy of
the project, as a new user's clone would be."""

import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, copy_tracked

README = (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    """The snakemake lines of the README's shell blocks, continuation lines joined, comments dropped."""
    cmds = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("snakemake"):
                cmds.append(line)
    return cmds


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The tracked files of the working tree, copied as a clone would have them."""
    return copy_tracked(tmp_path_factory.mktemp("clone"))


def test_the_readme_has_the_commands_a_user_needs():
    cmds = readme_commands()
    assert len(cmds) >= 6 and any("--forcerun" in c for c in cmds) and any("--report" in c for c in cmds)


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_works_as_written(clone, command):
    args = shlex.split(command)
    if "config/your_model.yaml" in args:  # needs the user's checkpoint and data: tests/test_your_model.py runs it
        pytest.skip("runs in tests/test_your_model.py, with a checkpoint and data where the config says")
    exe = [sys.executable, "-m", "snakemake"]
    if "--report" in args:  # a report needs results: check that it parses and names what is missing
        proc = subprocess.run(exe + args[1:] + ["--lint"], cwd=clone, capture_output=True, text=True, timeout=300)
        assert "Error" not in proc.stderr.split("Lints for")[0], proc.stderr[-2000:]
        return
    # a dry run needs no cores, a real run does ("cores have to be specified for local execution")
    assert {"--cores", "-c", "--profile", "--executor"} & set(args), f"{command}: runs jobs without --cores"
    dash = args.index("--") if "--" in args else len(args)
    args = args[:dash] + ["-n"] + args[dash:]
    proc = subprocess.run(exe + args[1:], cwd=clone, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, command + "\n" + proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "This was a dry-run" in proc.stdout + proc.stderr or "Nothing to be done" in proc.stdout + proc.stderr


def test_the_readme_is_a_page_and_measurements_readme_a_current_table():
    """Issue 72: the README is a newcomer's page (at most 150 lines); measurements/README.md holds a row a folder,
    generated from the folders themselves and current."""
    assert len(README.splitlines()) <= 150
    proc = subprocess.run([sys.executable, str(ROOT / "bench/measurements_table.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = (ROOT / "measurements/README.md").read_text()
    folders = [f.name for f in (ROOT / "measurements").iterdir() if f.is_dir()]
    assert all(f"| `{f}` |" in table for f in folders)
