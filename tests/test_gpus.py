"""One GPU per job: concurrent jobs on a multi-GPU host hold distinct GPU slots, and a job's child sees only
its own (simulated here with FTBENCH_GPU_IDS: the locking is the same on a real host)."""

import json
import threading
import time

import pytest

from ftbench.harness.gpus import gpu_slots


@pytest.fixture
def two_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("FTBENCH_GPU_IDS", "0,1")
    monkeypatch.setenv("FTBENCH_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def test_concurrent_jobs_hold_distinct_gpus_and_a_third_waits(two_gpus):
    got, release = {}, threading.Event()

    def job(name, count=1):
        with gpu_slots(count, wait_s=30, poll_s=0.05) as slots:
            got[name] = (slots, time.monotonic())
            release.wait(10)

    a, b = threading.Thread(target=job, args=("a",)), threading.Thread(target=job, args=("b",))
    a.start(), b.start()
    time.sleep(0.5)
    c = threading.Thread(target=job, args=("c",))
    c.start()
    time.sleep(0.5)
    assert sorted(got["a"][0] + got["b"][0]) == ["0", "1"] and "c" not in got  # c waits for a free GPU
    release.set()
    for t in (a, b, c):
        t.join()
    assert got["c"][0] in (["0"], ["1"])


def test_a_job_asking_for_more_gpus_than_the_host_has_is_refused(two_gpus):
    with pytest.raises(RuntimeError, match="asks for 3 GPUs"):
        with gpu_slots(3):
            pass
    with gpu_slots(2) as slots:
        assert slots == ["0", "1"]


def test_no_gpus_no_locks(monkeypatch):
    monkeypatch.setenv("FTBENCH_GPU_IDS", "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi
    with gpu_slots(1) as slots:
        assert slots == []


def test_the_child_sees_only_the_gpu_its_job_holds(two_gpus, tmp_path, monkeypatch):
    """Two supervised children at once (the fault-injection hang keeps the first alive) get different
    CUDA_VISIBLE_DEVICES; each records it in its provenance."""
    from ftbench.run import supervise as sup

    seen = []

    class Fake:  # stands in for the training child: records the GPU it was given, then ends
        def __init__(self, cmd, stdout, stderr, start_new_session, env):
            seen.append(env.get("CUDA_VISIBLE_DEVICES"))
            self.pid, self.returncode = 10**7, 1

        def poll(self):
            time.sleep(0.3)
            return self.returncode

        def wait(self):
            return self.returncode

    monkeypatch.setattr(sup.subprocess, "Popen", Fake)
    monkeypatch.setattr(sup.os, "killpg", lambda *a: None)
    params = {"run": {"study": "llm", "model": "m", "scale": "tiny", "dataset": "d", "variant": "v", "batch_size": 1},
              "variant": {}, "settings": {}, "dataset": {"source": "synthetic"}, "config_hash": "x"}

    def job(i):
        paths = {k: str(tmp_path / f"{i}" / f"{k}.out") for k in ("metrics", "steps", "memory")}
        (tmp_path / f"{i}").mkdir()
        sup.supervise("train", params, dict(paths, adapter=None), tmp_path / f"{i}.log")

    threads = [threading.Thread(target=job, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == ["0", "1"]
    rec = json.loads((tmp_path / "0" / "metrics.out").read_text())
    assert rec["status"] == "crashed" and rec["extra"]["supervision"]["gpu_slots"] in (["0"], ["1"])


def test_tiny_jobs_share_a_gpu_and_a_whole_gpu_job_waits_for_all_of_its_slots(tmp_path, monkeypatch):
    """tiny_jobs_per_gpu (FTBENCH_GPU_SHARE): shared jobs take one slot of a GPU each, up to the share; a job
    that holds its GPU needs every slot of it, so it never runs beside tiny ones, nor they beside it."""
    monkeypatch.setenv("FTBENCH_GPU_IDS", "0")
    monkeypatch.setenv("FTBENCH_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("FTBENCH_GPU_SHARE", "2")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with gpu_slots(1, shared=True, wait_s=5, poll_s=0.05) as a, gpu_slots(1, shared=True, wait_s=5, poll_s=0.05) as b:
        assert a == b == ["0"]  # two tiny jobs on the one GPU
        with pytest.raises(TimeoutError):  # a third waits
            with gpu_slots(1, shared=True, wait_s=0.3, poll_s=0.05):
                pass
    with gpu_slots(1, shared=True, wait_s=5, poll_s=0.05):
        with pytest.raises(TimeoutError):  # the whole GPU is not free while a tiny job holds a slot
            with gpu_slots(1, wait_s=0.3, poll_s=0.05):
                pass
    with gpu_slots(1, wait_s=5, poll_s=0.05) as whole:
        assert whole == ["0"]
        with pytest.raises(TimeoutError):  # nor may a tiny job join a job that holds the GPU
            with gpu_slots(1, shared=True, wait_s=0.3, poll_s=0.05):
                pass


def test_a_whole_gpu_job_waiting_behind_tiny_ones_is_not_starved(tmp_path, monkeypatch):
    """While a job waits for a whole GPU, tiny jobs take no new slots of it: it gets the GPU as soon as the
    tiny jobs already on it end (before, a stream of tiny jobs kept it waiting for minutes)."""
    monkeypatch.setenv("FTBENCH_GPU_IDS", "0")
    monkeypatch.setenv("FTBENCH_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("FTBENCH_GPU_SHARE", "2")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    got = {}

    def whole():
        with gpu_slots(1, wait_s=10, poll_s=0.05) as slots:
            got["whole"] = (slots, time.monotonic())

    with gpu_slots(1, shared=True, wait_s=5, poll_s=0.05):
        t = threading.Thread(target=whole)
        t.start()
        time.sleep(0.5)  # the whole-GPU job now waits, holding the gate and the free slot
        assert "whole" not in got
        with pytest.raises(TimeoutError):  # a new tiny job does not slip in
            with gpu_slots(1, shared=True, wait_s=0.3, poll_s=0.05):
                pass
        released = time.monotonic()
    t.join(10)
    assert got["whole"][0] == ["0"] and got["whole"][1] >= released
