"""Supervision: a training (or profiling) job runs in a child process that the job watches, so a hard fault
is a record too. The child is killed when it outlives its time limit (`timeout`) or its host-memory budget
(`crashed`); when it dies by a signal or exits without a record (host OOM killer, segfault, CUDA abort), the
job writes a complete `crashed` record with the signal, exit code, last step reached and the tail of the
child's log, creates the job's other outputs, and exits 0, so the matrix goes on.

    python -m ftbench.run.supervise JOB.json   # the child: runs the job the file describes
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ftbench.run import forkserver
from ftbench.config.resources import alloc_conf, run_alloc_conf, run_gpus, run_limits, run_nodes, stall_limit
from ftbench.harness.gpus import HOST_MEMORY, describe, gpu_slots, share, shares_gpu, this_machine
from ftbench.core.records import COMPILE_CACHE_NOTES, compile_cache_kind, new_record_from_template, write_json_atomic
from ftbench.harness.source import code_identity, library_first
from ftbench.run.launch import Launchers, _kill, launch_plan

POLL_S = 0.5


def release_host_memory(job: Path, shm: Path = HOST_MEMORY) -> list[str]:
    """Remove what the job left in host memory: the /dev/shm folders named after its temporary folder
    (harness.host_memory_dir), which a killed child cannot remove itself. Returns the folders removed."""
    import shutil

    gone = []
    for folder in shm.glob(f"{job.name}-*") if shm.is_dir() else []:
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(str(folder))
    return gone


def _family(root: int) -> tuple[int, dict[int, str]]:
    """The child's processes: every process in its session (data-loader workers included) and every descendant,
    wherever its session (torchrun starts each rank in a session of its own). Returns their resident memory in bytes
    and {pid: its start time}, which identifies a process beyond the reuse of its pid."""
    page, procs = os.sysconf("SC_PAGE_SIZE"), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            procs[int(entry)] = (int(fields[1]), int(fields[3]), fields[19])  # ppid, session id, start time
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    family, todo = {pid for pid, (_, sid, _) in procs.items() if sid == root}, [root]
    while todo:
        pid = todo.pop()
        family.add(pid)
        todo += [c for c in children.get(pid, []) if c not in family]
    total = 0
    for pid in family:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total, {pid: procs[pid][2] for pid in family if pid in procs}


def _kill_left(seen: dict[int, str]) -> list[int]:
    """SIGKILL every process of the child's family still alive (the same start time: not a reused pid), so that no
    rank is left holding a GPU when torchrun has gone. Returns the pids killed."""
    killed = []
    for pid, start in seen.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat[stat.rindex(")") + 2:].split()[19] != start:
                continue
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return killed


def rank_progress(path: Path) -> dict[int, dict]:
    """Each rank's last report ({rank: its progress file's content, with `age_s`}): rank 0 writes `path`, rank r
    `path`.rank<r> (ftbench.harness.trackers.Progress)."""
    out = {}
    for f in [path, *path.parent.glob(path.name + ".rank*")]:
        try:
            r = 0 if f == path else int(f.name.rsplit(".rank", 1)[1])
            age = time.time() - f.stat().st_mtime
            data = json.loads(f.read_text() or "{}")
        except (OSError, ValueError):  # not there yet, or caught mid-write: the next poll reads it
            continue
        out[r] = {**data, "age_s": age}
    return out


# torchrun's summary of a failed job: each failed rank with its exit code, the first observed failure last
FAILURE = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*exitcode\s*:\s*(-?\d+)")


def first_failed_rank(log_text: str) -> tuple[int, str] | None:
    """(rank, how it ended) from torchrun's last failure summary in a job's log, or None: a rank killed by a signal
    other than torchrun's own SIGTERM where there is one (it wrote nothing; a peer that failed in the collective it
    left exits after it, and torchrun may observe that peer first), else the summary's first observed failure."""
    start = log_text.rfind("Failures:")
    found = [(int(r), int(c)) for r, c in FAILURE.findall(log_text[start:] if start >= 0 else log_text)]
    if not found:
        return None
    # SIGTERM is torchrun's own stop of the survivors: a rank killed by another signal is the cause
    r, code = next(((r, c) for r, c in found if c < 0 and c != -signal.SIGTERM), found[-1])
    try:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    except ValueError:
        how = f"exited with code {code}"
    return r, how


def _tail(path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# the output each kind of job is judged by (its child writes it; the supervisor writes it where the child could not)
OUTPUT = {"train": "metrics", "profile": "summary", "generate": "json", "materialize": "manifest"}


def supervise(kind: str, params: dict, paths: dict, log_path, gpus: int | None = None) -> dict:
    """Run `kind` ("train", "profile", "generate" or "materialize") in a child process under its limits (a
    run's: its variant's over its study's; generate and materialize: `time_limit_s` in params), on the
    variant's number of GPUs (`gpus`: a lower count from the caller wins); return its record (a profile's
    summary, generate's answers, materialize's manifest) as written, a `crashed`/`timeout` one where the child
    could not write it, an `unsupported` one where this host has too few GPUs."""
    if kind in ("train", "profile"):
        time_limit, mem_limit = run_limits(params)
    else:
        time_limit, mem_limit = params.get("time_limit_s"), params.get("host_memory_limit_gib")
    gpus = gpus or run_gpus(params)
    out = Path(paths[OUTPUT[kind]])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)  # a record found when the child has ended is then the child's own
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ftbench-"))
        stack.callback(release_host_memory, Path(tmp))  # runs after the child has ended, killed or not
        job, progress = Path(tmp) / "job.json", Path(tmp) / "progress.json"
        job.write_text(json.dumps({"kind": kind, "params": params, "paths": paths}))
        env = library_first(Path(__file__).resolve().parents[2], dict(os.environ, FTBENCH_PROGRESS=str(progress)))
        if kind in ("train", "profile"):  # the variant's allocator settings, in the unified variable torch reads first
            conf = run_alloc_conf(params, alloc_conf(env))
            if conf:
                env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
                env["PYTORCH_ALLOC_CONF"] = conf
        # a job at tiny scale on a host whose GPUs are shared (tiny_jobs_per_gpu): one slot of one GPU
        scale = (params.get("run") or {}).get("scale") or params.get("scale")
        shared = shares_gpu(gpus, scale, (params.get("settings") or {}).get("share_gpu"))
        try:
            slots = stack.enter_context(gpu_slots(gpus, shared=shared))
        except RuntimeError as e:  # the variant asks for more GPUs than this host has
            with open(log_path, "a") as log:
                print(f"unsupported: {e}", file=log)
            return _fallback(kind, params, paths, "unsupported", str(e), {"gpu_slots": [], "gpus": gpus})
        if slots:  # the child sees only the GPUs this job holds
            env["CUDA_VISIBLE_DEVICES"] = ",".join(slots)
            if shared:
                env["FTBENCH_GPU_SHARED"] = str(share())
        # one process per GPU (on a CPU machine: per rank, gloo), started by torchrun: one launcher, or one a node
        plan = launch_plan(gpus, run_nodes(params) if kind in ("train", "profile") else 1, slots, job, env,
                           f"ftbench-{Path(tmp).name}")
        proc, launcher = _start(plan, env, log_path, gpus, params)
        t0 = time.monotonic()
        verdict, peak_rss, seen = _watch(proc, progress, time_limit, mem_limit,
                                         stall_limit(params) if kind in ("train", "profile") else None)
        for p in getattr(proc, "procs", [proc]):  # whatever each left behind in its session (loader workers) goes too
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = _kill_left(seen)  # ... and every rank torchrun started in sessions of their own
        elapsed = time.monotonic() - t0
        ranks = rank_progress(progress)
        last = {k: v for k, v in ranks.get(0, {}).items() if k != "age_s"}
    supervision = {"launcher": launcher, "launchers": [p["where"] for p in plan], "gpu_slots": slots,
                   "time_limit_s": time_limit, "host_memory_limit_gib": mem_limit, "elapsed_s": elapsed,
                   "exit_code": proc.returncode, "host_peak_rss_gib_session": peak_rss / 1024**3 or None,
                   "last_step": last.get("step"), "compiled_graphs_at_last_step": last.get("compiled_graphs"),
                   "host_step_ends_s": last.get("host_step_ends_s"), "processes_killed_after": len(left),
                   "last_step_by_rank": {str(r): p.get("step") for r, p in sorted(ranks.items())} if gpus > 1 else None}
    return _outcome(kind, params, paths, out, log_path, proc.returncode, verdict, supervision, ranks, gpus, elapsed)


def _start(plan: list[dict], env: dict, log_path, gpus: int, params: dict):
    """The child: forked from the warm server where it serves (one process, not Unsloth's), else each launcher of
    the plan started in a session of its own. Returns (the process or the launchers, how it started)."""
    proc, launcher = None, ("srun" if plan[0]["cmd"][0] == "srun" else "subprocess" if len(plan) == 1
                            else f"{len(plan)} torchrun launchers")
    if forkserver.enabled() and gpus <= 1 and (params.get("variant") or {}).get("framework") != "unsloth":
        try:  # forked from a server that imported the libraries once (ftbench.run.forkserver)
            proc, launcher = forkserver.spawn(plan[0]["cmd"][2:], env, log_path), "fork server"
        except forkserver.Unavailable as e:
            with open(log_path, "a") as log:
                print(f"fork server unavailable ({e}); starting the child the plain way", file=log)
    if proc is None:
        with open(log_path, "a") as log:
            log.flush()
            procs = [subprocess.Popen(p["cmd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      env=p["env"]) for p in plan]
        proc = procs[0] if len(procs) == 1 else Launchers(procs)
    return proc, launcher


def _watch(proc, progress: Path, time_limit, mem_limit, stall) -> tuple:
    """Poll the child until it ends or a limit ends it (killed): its time, its host memory (the whole process
    family), a stall (stepped, then silent on every rank). A job Snakemake cancels takes its child with it.
    Returns (the verdict or None, the peak resident bytes, every process seen)."""
    previous = {}  # (signal handlers live in the main thread)
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda *_: (_kill(proc), sys.exit(1))) for s in (signal.SIGTERM,
                                                                                          signal.SIGINT)}
    t0, verdict, peak_rss, seen, checked = time.monotonic(), None, 0, {}, 0.0
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            elapsed = time.monotonic() - t0
            rss = 0
            for p in getattr(proc, "procs", [proc]):
                used, family = _family(p.pid)
                rss += used
                seen.update(family)
            peak_rss = max(peak_rss, rss)
            if time_limit and elapsed > time_limit:
                verdict = ("timeout", f"exceeded its time limit of {time_limit:g} s")
            elif mem_limit and rss > mem_limit * 1024**3:
                verdict = ("crashed", f"exceeded its host-memory budget of {mem_limit:g} GiB "
                                      f"({rss / 1024**3:.1f} GiB resident)")
            elif stall and elapsed - checked >= 1:  # stepped, then silent on every rank for the stall limit
                checked = elapsed
                reports = rank_progress(progress).values()
                quiet = min((p["age_s"] for p in reports), default=0)
                if any(p.get("step") for p in reports) and quiet > stall:
                    verdict = ("timeout", f"stalled: no progress from any rank for {quiet:.0f} s (stall limit "
                                          f"{stall:g} s)")
            if verdict:
                _kill(proc)
                break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return verdict, peak_rss, seen


def _outcome(kind: str, params: dict, paths: dict, out: Path, log_path, rc, verdict, supervision: dict,
             ranks: dict, gpus: int, elapsed: float) -> dict:
    """The job's record once its child has ended: the child's own (what it measured stands; a failure after it
    said beside it), else a `crashed` or `timeout` record naming the cause, the step reached and the log's tail."""
    last = {k: v for k, v in ranks.get(0, {}).items() if k != "age_s"}
    sig = signal.Signals(-rc).name if rc and rc < 0 else None
    how = f"killed by {sig}" if sig else f"exited with code {rc}"
    # the rank torchrun's summary names, where ranks ran and no limit of ours ended them
    first = first_failed_rank(_tail(log_path, 400)) if gpus > 1 and verdict is None else None
    if out.is_file():  # the child wrote its record (last of its outputs): what it measured stands
        result = json.loads(out.read_text())
        failed_rank = (result.get("parallel") or {}).get("failed_rank")
        # another rank was killed (a signal: it wrote nothing) and this one failed after it, in the collective it
        # left (gloo reads the closed connection as an error): the kill is the cause
        if failed_rank is not None and first is not None and first[0] != failed_rank and first[1].startswith("killed by"):
            supervision["failed_rank"] = first[0]
            result["parallel"]["failed_rank"] = first[0]
            result.update(status="crashed", reason=f"rank {first[0]} {first[1]} without a record ({_reached(ranks)}); "
                                                   f"then {result.get('reason')}")
        if failed_rank is not None and verdict is None:  # a rank failed, wrote the record and left (ftbench.harness.ranks)
            if kind == "train":
                _fill_train_outputs(paths, result.get("status"), result.get("reason"))
            supervision.update(signal=sig, log_tail=_tail(log_path))
            result.setdefault("extra", {})["teardown"] = (
                f"rank {failed_rank}'s run failed ({result.get('status')}): it wrote the record and left without "
                f"its peers, and torchrun stopped the other ranks ({how})")
        elif verdict is not None or rc != 0:  # ... whatever happened after it: said, never in its place
            supervision.update(signal=sig, log_tail=_tail(log_path))
            result.setdefault("extra", {})["teardown"] = (
                f"{verdict[1] if verdict else how} after writing its record ({verdict[0] if verdict else 'crashed'} "
                f"in teardown; the record is kept, the log's tail is in extra.supervision.log_tail)")
        result.setdefault("extra", {})["supervision"] = supervision
        mark_injected(result, params)
        write_json_atomic(out, result)
        return result
    if first is not None:  # torchrun names the rank that failed first; it stopped the others
        supervision["failed_rank"] = first[0]
        verdict = ("crashed", f"rank {first[0]} {first[1]} without a record; torchrun stopped the other ranks and "
                              f"{how}")
    if verdict is None:
        verdict = ("crashed", how if sig else f"{how} without a record")
    status, why = verdict
    step = last.get("step")
    reached = _reached(ranks) if gpus > 1 and len(ranks) > 1 else (
        f"last step reached: {step if step is not None else 'none'}")
    reason = f"{why} ({reached}"
    if last.get("compiled_graphs") is not None:
        reason += f", {last['compiled_graphs']} graphs compiled"
    if took := _host_steps(last.get("host_step_ends_s")):
        reason += f", {took}"
    reason += f", after {elapsed:.0f} s)"
    supervision.update(signal=sig, log_tail=_tail(log_path))
    return _fallback(kind, params, paths, status, reason, supervision)


def _reached(ranks: dict[int, dict]) -> str:
    """Each rank's last step, from their progress files: "last step reached: rank 0 at 5, rank 1 at 3"."""
    return "last step reached: " + ", ".join(
        f"rank {r} at {p.get('step') if p.get('step') is not None else 'none'}" for r, p in sorted(ranks.items()))


def _host_steps(ends) -> str | None:
    """What the steps a killed run finished took on the host's clock (Progress's [step, end s] pairs): the first
    step (compile, warm-up) apart from the median of the rest, e.g. "step 1 in 151.5 s, then a median 12.3 s
    over 6 steps (host clock)"."""
    took, (prev_step, prev_end) = [], (0, 0.0)  # step 0 "ends" when the first step starts
    for step, end in ends or []:
        if step == prev_step + 1:  # beside the gap where the middle steps were left out
            took.append((step, end - prev_end))
        prev_step, prev_end = step, end
    if not took:
        return None
    text = f"step 1 in {took[0][1]:.1f} s" if took[0][0] == 1 else ""
    if rest := [t for step, t in took if step != 1]:
        text += f"{', then a' if text else 'a'} median {statistics.median(rest):.1f} s over {len(rest)} step" + \
            "s" * (len(rest) > 1)
    return text + " (host clock)"


def _fallback(kind, params, paths, status, reason, supervision) -> dict:
    """The record (and the job's other outputs) of a child that could not write them."""
    if kind == "materialize":  # training jobs on this model record an error naming this
        manifest = {"status": status, "reason": reason, "family": None, "supervision": supervision}
        write_json_atomic(paths["manifest"], manifest)
        return manifest
    if kind == "generate":
        from ftbench.run.generate import write_failed

        return write_failed(paths["json"], paths["html"], params, status, reason, supervision)
    rec = new_record_from_template(params["run"], {"name": params["run"]["variant"], **params["variant"]})
    rec.update(status=status, reason=reason)
    rec["extra"]["supervision"] = supervision
    mark_injected(rec, params)
    if supervision.get("failed_rank") is not None:  # torchrun named the rank that failed first
        rec["parallel"].update(strategy=params["variant"].get("parallel"), world_size=run_gpus(params),
                               failed_rank=supervision["failed_rank"])
    if cache := compile_cache_kind(params["variant"].get("compile")):
        rec["extra"]["compile_cache"] = COMPILE_CACHE_NOTES[cache]
    rec["compile"]["unique_graphs"] = supervision.get("compiled_graphs_at_last_step")
    rec["provenance"] = {"config_hash": params["config_hash"], "scale": params["run"]["scale"],
                         "data_source": params["dataset"].get("source"),
                         "device": describe(supervision.get("gpu_slots") or []),
                         "host": platform.node(), "machine": this_machine(),
                         # the code that timed out or failed, as a finished run names it (a campaign's README and
                         # the front page compare runs by it)
                         **(code_identity(paths["base_dir"]) if paths.get("base_dir") else {})}
    if kind == "train":
        write_json_atomic(paths["metrics"], rec)
        _fill_train_outputs(paths, status, reason)
        return rec
    summary = {"run": rec["run"], "status": status, "reason": reason, "step_time_s": None, "gpu": None,
               "supervision": supervision}
    with gzip.open(paths["trace"], "wt") as f:
        json.dump({"traceEvents": []}, f)
    write_json_atomic(paths["summary"], summary)
    return summary


def mark_injected(record: dict, params: dict) -> None:
    """A run with a fault injected (training.inject, for tests) says so in its record: a test of the supervisor, not a
    measurement; runs merged from elsewhere leave such records out (ftbench.judge.analysis.read_runs)."""
    inject = (params.get("settings") or {}).get("inject")
    if inject:
        record.setdefault("extra", {})["fault_injected"] = inject


def _fill_train_outputs(paths, status, reason) -> None:
    """A failed training job's other outputs, where its process did not leave them (killed first: torchrun stops a
    failed rank's peers, which may be the rank writing them): empty step and memory logs, the adapter folder with
    the status in it."""
    for key in ("steps", "memory"):
        if not Path(paths[key]).is_file():
            Path(paths[key]).write_text("step\n")
    if paths.get("adapter") and not (Path(paths["adapter"]) / "status.txt").is_file():
        Path(paths["adapter"]).mkdir(parents=True, exist_ok=True)
        (Path(paths["adapter"]) / "status.txt").write_text(f"{status} {reason}\n")


def _child(job_path) -> None:
    """The child: run the job the file describes, writing its own record."""
    from ftbench.run.execute import context_from_params, execute

    job = json.loads(Path(job_path).read_text())
    p, params = job["paths"], job["params"]
    if (params.get("inject") or {}).get("kill_at_start"):  # fault injection (tests): die as a segfault would
        os.kill(os.getpid(), signal.SIGKILL)
    if job["kind"] == "materialize":
        from ftbench.build.models import materialize

        print(materialize(params, p["manifest"]), flush=True)
        return
    if job["kind"] == "generate":
        from ftbench.run.generate import generate_job

        generate_job(params, p["json"], p["html"])
        return
    from ftbench.harness.ranks import FAILED_RANK_EXIT, finish, rank, world_size

    if rank() != 0:  # several ranks: rank 0 keeps the records and adapter; each rank reports its own progress
        if os.environ.get("FTBENCH_PROGRESS"):
            os.environ["FTBENCH_PROGRESS"] += f".rank{rank()}"
        p = {**p, "adapter": None}
    ctx = context_from_params(params, p["model"], p["train"], p["eval"], p["base_dir"],
                              adapter_dir=p.get("adapter"), cache_path=p.get("cache"))
    if job["kind"] == "train":
        record = execute(ctx, p["metrics"], p["steps"], p["memory"])
        print(record["status"], record["reason"] or "", flush=True)
        if world_size() > 1 and record["status"] != "ok":  # its peers may wait in a collective it will never join:
            _exit_now(FAILED_RANK_EXIT)  # no teardown of the process group; torchrun stops them
    else:
        from ftbench.run.profiling import profile_run

        profile_run(ctx, p["trace"], p["summary"])
    finish()
    if (params["settings"].get("inject") or {}).get("abort_after_record") and rank() == 0:  # fault injection (tests):
        os.abort()  # rank 0 dies in teardown, after its record


def _exit_now(code: int = 0) -> None:
    """End the child once its outputs are written, without the interpreter's teardown: the C++ destructors of
    threads a library leaves running (gloo's, with torchrun's ranks) can abort a process that has finished its
    work ("terminate called without an active exception"). Nothing is left to do by then; the streams are
    flushed, and the supervisor takes the rest of the session (loader workers) down."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _child(sys.argv[1])
    _exit_now()
