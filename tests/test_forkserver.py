"""The fork server: a job's child forked from a warm server is what a fresh `python -m` child would be (its own
session, the job's environment, working directory, log and exit status), and the supervisor's records say
which way the child started."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftbench.run import forkserver

PROBE = """
import json, os, sys, time
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "var": os.environ.get("PROBE_VAR"),
                  "sid": os.getsid(0), "pid": os.getpid(), "torch": "torch" in sys.modules}), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture()
def probe(tmp_path, monkeypatch):
    """A module the server can run, and a private socket folder and short idle time for this test's server."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "fsprobe.py").write_text(PROBE)
    monkeypatch.chdir(tmp_path)
    import tempfile

    short = tempfile.mkdtemp(prefix="fs", dir="/tmp")  # socket names are limited to 107 bytes
    monkeypatch.setenv("FTBENCH_FORKSERVER_DIR", short)
    monkeypatch.setenv("FTBENCH_FORKSERVER_IDLE_S", "5")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "pkg"), str(forkserver.SRC.parent)]))
    yield tmp_path, Path(short) / f"ftbench-forkserver-{os.getuid()}"


def test_a_forked_child_runs_the_job_as_a_fresh_one_would(probe):
    import json

    probe, sockets = probe
    log = probe / "job.log"
    env = dict(os.environ, PROBE_VAR="job-1")
    child = forkserver.spawn(["fsprobe", "run", "3"], env, log)
    assert child.wait(timeout=120) == 3  # its exit status
    out = json.loads(log.read_text().strip().splitlines()[-1])
    assert out["argv"] == ["run", "3"] and out["cwd"] == str(probe) and out["var"] == "job-1"
    assert out["sid"] == out["pid"] == child.pid  # its own session: the supervisor kills and measures it by that
    assert out["torch"]  # forked from the server that imported the libraries
    # a second job with another per-job value of the same server: forked again, with its own environment
    second = forkserver.spawn(["fsprobe", "run", "0"], dict(env, PROBE_VAR="job-2"), log)
    assert second.wait(timeout=60) == 0
    assert json.loads(log.read_text().strip().splitlines()[-1])["var"] == "job-2"
    assert len(list(sockets.glob("*.sock"))) == 1  # one server for both


def test_a_killed_forked_child_reports_the_signal_and_the_server_leaves_when_idle(probe):
    probe, sockets = probe
    log = probe / "job.log"
    child = forkserver.spawn(["fsprobe", "sleep", "0"], dict(os.environ), log)
    deadline = time.monotonic() + 60
    while not (log.exists() and "sid" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGKILL)  # what the supervisor does at a time or memory limit
    assert child.wait(timeout=30) == -signal.SIGKILL
    sock = next(sockets.glob("*.sock"))
    deadline = time.monotonic() + 30
    while sock.exists() and time.monotonic() < deadline:  # idle 5 s with no child left: gone
        time.sleep(0.5)
    assert not sock.exists()


def test_a_server_that_cannot_start_is_unavailable_not_a_hang(probe):
    probe, _ = probe
    env = dict(os.environ, FTBENCH_FORKSERVER_IDLE_S="soon")  # a server that cannot read its setting exits
    with pytest.raises(forkserver.Unavailable, match="exited with code"):
        forkserver.spawn(["fsprobe", "run", "0"], env, probe / "job.log", wait_s=60)
