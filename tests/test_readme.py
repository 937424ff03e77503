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


PROSE = ["README.md", "docs/frontier.md", "docs/quality.md", "docs/running.md", "config/your_model.yaml",
         "config/quality_gpu.yaml", "report/quality.rst"]
QUALITY_FIGURE = re.compile(r"[+\-]?\d+\.\d+\s*(?:nats|standard errors|sd\b)")


def prose_outside_generated(path) -> str:
    """A page's text less its generated blocks (between `<!-- NAME: SCRIPT -->` and `<!-- /NAME -->`)."""
    return re.sub(r"<!-- (\w+): [^>]+ -->.*?<!-- /\1 -->", "", (ROOT / path).read_text(), flags=re.S)


def test_no_quality_figure_is_typed_by_hand_and_the_generated_verdicts_are_current():
    """Issue 78: prose typed by hand went stale within a day. The quality verdicts' figures live in docs/quality.md's
    generated table (bench/quality_docs.py, current); the README, the docs and the config comments quote none."""
    for path in PROSE:
        found = QUALITY_FIGURE.findall(prose_outside_generated(path))
        assert not found, f"{path} quotes quality figures by hand: {found[:3]}"
    proc = subprocess.run([sys.executable, str(ROOT / "bench/quality_docs.py"), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_speed_figure_in_prose_is_a_shipped_records():
    """Each "N real tokens/s" the README, the frontier page and config/your_model.yaml quote is the rounded
    throughput of a shipped ok record (measurements/)."""
    import json

    measured = set()
    for f in (ROOT / "measurements").rglob("*.json"):
        if f.name not in ("metrics.json", "run.json"):
            continue
        d = json.loads(f.read_text())
        tps = (d.get("throughput") or {}).get("tokens_per_s") if d.get("status") == "ok" else None
        if tps:
            measured.add(round(tps))
    pages = {"README.md": [r"([\d,]{5,}) (?:real tokens/s|for the fastest)"],
             "config/your_model.yaml": [r"([\d,]{5,}) real tokens/s"],
             "docs/frontier.md": [r"\| ([\d,]{5,})(?: \(H200\)| \(batch 1\))? \|",  # its table, and its prose
                                  r"([\d,]{5,}) real tokens/s", r"([\d,]{5,}) and [\d,]{5,} real tokens/s"]}
    for path, patterns in pages.items():
        text = (ROOT / path).read_text()
        figures = [int(x.replace(",", "")) for pattern in patterns for x in re.findall(pattern, text)]
        assert figures, path
        assert not [x for x in figures if x not in measured], (path, [x for x in figures if x not in measured])


def test_every_report_caption_opens_with_the_question_its_page_answers():
    """Issue 80: each page's caption says which question it answers, first."""
    for caption in sorted((ROOT / "report").glob("*.rst")):
        if caption.name == "workflow.rst":  # the front page: its three questions are its headings
            continue
        first = caption.read_text().split("?")[0]
        assert "?" in caption.read_text() and "\n\n" not in first and len(first) < 120, caption.name
