"""Records name the code that ran (ftbench.harness.source): a digest of the shaping files computed from the files, and
whether they are the commit's."""

import shutil
import subprocess

from conftest import ROOT
from ftbench.harness.source import SHAPING, code_identity, short_code


def _copy(tmp_path):
    """A repository of the shaping files as committed, plus a results folder, in a git history of its own."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in SHAPING:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, repo / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, repo / name)
    (repo / "results").mkdir()
    (repo / "results" / "metrics.json").write_text("{}")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", *SHAPING], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], cwd=repo, check=True)
    return repo


def test_the_digest_follows_the_source_files_not_the_results(tmp_path):
    repo = _copy(tmp_path)
    clean = code_identity(repo)
    assert clean["source_matches_commit"] is True and clean["source_digest"] == clean["commit_source_digest"]
    assert "the files of commit" in clean["source_note"]
    (repo / "results" / "metrics.json").write_text('{"status": "ok"}')  # a results file: not code
    (repo / "src" / "ftbench" / "__pycache__").mkdir(exist_ok=True)
    (repo / "src" / "ftbench" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert code_identity(repo)["source_digest"] == clean["source_digest"]
    with open(repo / "src" / "ftbench" / "harness" / "meter.py", "a") as f:  # a source file: other code ran
        f.write("\n# changed\n")
    changed = code_identity(repo)
    assert changed["source_digest"] != clean["source_digest"]
    assert changed["commit_source_digest"] == clean["commit_source_digest"] and changed["git_commit"] == clean["git_commit"]
    assert changed["source_matches_commit"] is False and changed["source_changed_files"] == ["src/ftbench/harness/meter.py"]
    assert "1 file(s) differ: src/ftbench/harness/meter.py" in changed["source_note"]
    assert short_code(changed).endswith(f"+ 1 changed (files {changed['source_digest']})")


def test_without_git_the_files_still_name_the_code(tmp_path):
    repo = _copy(tmp_path)
    digest = code_identity(repo)["source_digest"]
    shutil.rmtree(repo / ".git")  # a tarball, or a copy whose git metadata did not travel
    bare = code_identity(repo)
    assert bare["git_commit"] is None and bare["source_digest"] == digest and "no git history" in bare["source_note"]


def test_a_folder_with_no_source_files_names_no_code(tmp_path):
    """A run whose folder held no shaping files when it looked (a device's copy of the tree being replaced under a
    running job: seen on 2026-11-26, the digest of nothing, e3b0c44298fc1c14) records no digest, not that one."""
    empty = code_identity(tmp_path)
    assert empty["source_digest"] is None and "the code is unknown" in empty["source_note"]
