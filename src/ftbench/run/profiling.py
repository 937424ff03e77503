"""Profiling: torch.profiler on a run (wait 1, warm-up 1, active 3, or `training.profile_active_steps`) and a summary
of its Chrome trace."""

from __future__ import annotations

import collections
import gzip
import json
import os
import shutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the report's environment renders profile pages without PyTorch
    import torch

SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}  # each profiled step adds trace to export and parse
DATA_LOADING_MARKERS = ("enumerate(DataLoader)", "ftbench.data")
IDLE_GAP_US = 50.0  # a gap between device kernels longer than this counts as idle
CAUSE_GAP_US = 10_000.0  # gaps this long are attributed to the host operator running through them
HOST_CATEGORIES = ("cpu_op", "python_function", "user_annotation")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
from ftbench.harness.kernels import (COMMUNICATION_NAME, GPU_BOUND_SHARE, by_attention_backend, gemm_share, is_dequant_4bit,
                      is_fp8_work, is_gemm)


def schedule(active: int | None = None) -> dict:
    """The profiler's schedule: SCHEDULE, with `active` profiled steps where given (a step of a large model can
    hold hundreds of thousands of kernels: gpt-oss-120b's experts, one at a time)."""
    return {**SCHEDULE, "active": active} if active else dict(SCHEDULE)


def make_profiler(device: torch.device, trace_path: str, summary_path: str, top: int = 15, plan: dict | None = None):
    """A profiler that, when its active window closes, writes the Chrome trace and its summary (`summarize_trace`,
    top operators included) as JSON to `summary_path`, both from the profiler's results in memory."""
    import torch  # here, not at the top: the report's environment renders profile pages without PyTorch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)

    def on_ready(prof):
        plain = trace_path[:-3] if trace_path.endswith(".gz") else trace_path
        prof.export_chrome_trace(plain)  # plain JSON, then gzip at level 1 (torch's own gzip export is ~6x slower)
        if plain != trace_path:
            with open(plain, "rb") as src, gzip.open(trace_path, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst)
            os.remove(plain)
        events = trace_events(prof)
        with open(summary_path, "w") as f:
            json.dump(summarize_trace(events, top_operators(events, top)), f, indent=2)

    return torch.profiler.profile(activities=acts, schedule=torch.profiler.schedule(repeat=1, **(plan or SCHEDULE)),
                                  on_trace_ready=on_ready, record_shapes=False, with_stack=False)


def trace_events(prof) -> list[dict]:
    """The profiler's events as its Chrome trace holds them (name, cat, ts and dur in microseconds, thread), read
    from its results in memory. One gpt-oss-120b step is ~10^6 events: parsing the exported trace back, or
    PyTorch's key_averages(), took longer than a lent GPU's 10-minute call (H100, 2026-11-25)."""
    events = prof.profiler.kineto_results.events()
    base = min((e.start_ns() for e in events), default=0)

    def category(e):  # torch 2.13 names each event's activity; the lent GPUs' torch 2.11 does not (2026-11-25)
        if hasattr(e, "activity_type"):
            return e.activity_type()
        on_device = str(e.device_type()).rsplit(".", 1)[-1] != "CPU"
        if e.is_user_annotation():
            return "gpu_user_annotation" if on_device else "user_annotation"
        return "kernel" if on_device else "cpu_op"

    return [{"ph": "X", "name": e.name(), "cat": category(e), "ts": (e.start_ns() - base) / 1e3,
             "dur": e.duration_ns() / 1e3, "tid": e.start_thread_id()} for e in events]


def top_operators(events: list[dict], top: int = 15) -> list[dict]:
    """Where the device's time goes: kernels, copies and memsets by summed device time; on a machine without a
    GPU, host operators by self time (their time less that of the operators they call, thread by thread). Share:
    of that summed time, so the rows of one table add up to at most 1."""
    times: dict[str, list] = {}
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    if device:
        for e in device:
            t = times.setdefault(e["name"], [0.0, 0])
            t[0] += e["dur"]
            t[1] += 1
    else:
        threads: dict = {}
        for e in events:
            if e.get("cat") == "cpu_op":
                threads.setdefault(e.get("tid", 0), []).append(e)
        for ops in threads.values():
            stack: list[list] = []  # [end, name, self time]
            for e in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
                while stack and stack[-1][0] <= e["ts"]:
                    _close(times, stack.pop())
                if stack:
                    stack[-1][2] -= e["dur"]
                stack.append([e["ts"] + e["dur"], e["name"], e["dur"]])
            while stack:
                _close(times, stack.pop())
    total = sum(t[0] for t in times.values()) or 1.0
    rows = sorted(times.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": name[:120], "self_time_ms": t / 1e3, "share": t / total, "calls": n} for name, (t, n) in rows]


def _close(times: dict, frame: list) -> None:
    t = times.setdefault(frame[1], [0.0, 0])
    t[0] += max(frame[2], 0.0)
    t[1] += 1


def _union_us(intervals) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _clip(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def summarize_trace(events: list[dict], top_ops: list[dict]) -> dict:
    """Device busy vs idle share per step and overall, data-loading share, idle gaps, top operators."""
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    # the host-side step annotations (the device-side copies, cat gpu_user_annotation, would count twice)
    steps = sorted((e for e in complete if e.get("name", "").startswith("ProfilerStep#")
                    and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    # communication kernels, and the rest (computation and copies): what communication costs a step is the time
    # only communication runs (compute does not hide it; it includes a rank waiting in a collective for the others)
    comm, other = [], []
    for e in complete:
        if e.get("cat") in DEVICE_CATEGORIES:
            collective = e["cat"] == "kernel" and COMMUNICATION_NAME.search(e.get("name", ""))
            (comm if collective else other).append((e["ts"], e["ts"] + e["dur"]))
    kernels = comm + other
    device = "cuda" if kernels else "cpu"
    device_us = sum(e["dur"] for e in complete if e.get("cat") in DEVICE_CATEGORIES)
    # each kernel name's summed time, so that each name is classified once (a step runs ~10^4 kernels of few names)
    by_name = collections.Counter()
    for e in complete:
        if e.get("cat") == "kernel":
            by_name[e.get("name", "")] += e["dur"]
    gemm_us, fp8_us, nf4_us = (sum(us for name, us in by_name.items() if kind(name))
                               for kind in (is_gemm, is_fp8_work, is_dequant_4bit))
    attention_us = by_attention_backend(by_name.items())
    if not kernels:  # on a CPU the "device" is the host: top-level operators stand in for kernels
        kernels = [(e["ts"], e["ts"] + e["dur"]) for e in complete if e.get("cat") == "cpu_op"]
    loading = [(e["ts"], e["ts"] + e["dur"]) for e in complete
               if any(m in e.get("name", "") for m in DATA_LOADING_MARKERS)]
    host_ops = [e for e in complete if e.get("cat") in HOST_CATEGORIES] if device == "cuda" else []
    per_step, causes = [], {}
    for st in steps:
        lo, hi = st["ts"], st["ts"] + st["dur"]
        busy = sorted(_clip(kernels, lo, hi))
        gaps, prev = [], lo  # (length, start, end)
        for s, e in busy:
            if s - prev > IDLE_GAP_US:
                gaps.append((s - prev, prev, s))
            prev = max(prev, e)
        if hi - prev > IDLE_GAP_US:
            gaps.append((hi - prev, prev, hi))
        named = {gap: host_op_in_gap(host_ops, *gap) for gap in gaps if gap[0] >= CAUSE_GAP_US}
        for gap, name in named.items():
            causes[name] = causes.get(name, 0.0) + gap[0] / 1e3
        largest = max(gaps, default=None)
        comm_us = _union_us(_clip(comm, lo, hi))
        exposed_us = _union_us(busy) - _union_us(_clip(other, lo, hi)) if comm_us else 0.0
        per_step.append({"step": st["name"], "duration_ms": st["dur"] / 1e3, "kernels": len(busy) if device == "cuda" else None,
                         "communication_ms": comm_us / 1e3, "communication_exposed_ms": exposed_us / 1e3,
                         "busy_share": _union_us(busy) / st["dur"] if st["dur"] else None,
                         "data_loading_share": _union_us(_clip(loading, lo, hi)) / st["dur"] if st["dur"] else None,
                         "idle_gaps": len(gaps), "idle_gap_ms_total": sum(g[0] for g in gaps) / 1e3,
                         "largest_gap_ms": largest[0] / 1e3 if largest else 0.0,
                         "largest_gap_host_op": (named.get(largest) or host_op_in_gap(host_ops, *largest))
                         if host_ops and largest else None,
                         **largest_gap_place(host_ops, largest, lo)})
    span = sum(s["duration_ms"] for s in per_step)

    def weighted(key):
        return sum(s[key] * s["duration_ms"] for s in per_step) / span if span else None

    def weighted_ms(key):  # a per-step time in ms as a share of the profiled steps' time
        return sum(s[key] for s in per_step) / span if span else None

    return {"device": device, "steps": len(per_step), "busy_share": weighted("busy_share"),
            "idle_share": 1 - weighted("busy_share") if span else None,
            "data_loading_share": weighted("data_loading_share"), "per_step": per_step,
            "gemm_share": gemm_us / device_us if device == "cuda" and device_us else None,
            "fp8_work_share": fp8_us / device_us if device == "cuda" and device_us else None,
            "dequant_4bit_share": nf4_us / device_us if device == "cuda" and device_us else None,
            # the device's summed kernel time per profiled step, and attention's share of it by implementation
            "kernel_ms_per_step": device_us / 1e3 / len(per_step) if device == "cuda" and per_step else None,
            "attention_shares": {k: v / device_us for k, v in attention_us.items()}
            if device == "cuda" and device_us else None,
            # collectives' share of the step (union of their kernels), and the share where nothing else ran
            "communication_share": weighted_ms("communication_ms") if comm else None,
            "communication_exposed_share": weighted_ms("communication_exposed_ms") if comm else None,
            "top_operators": top_ops, "cpu_bound": (weighted("busy_share") or 0) < GPU_BOUND_SHARE if device == "cuda" else None,
            "idle_causes": [{"host_op": k, "idle_ms": v} for k, v in sorted(causes.items(), key=lambda kv: -kv[1])]}


def host_op_in_gap(host_ops: list[dict], length: float, start: float, end: float) -> str:
    """What the host was doing while the device sat idle: the innermost host operator (the shortest)
    that overlaps at least half of the gap; "(no host operator)" when none does (Python between ops)."""
    best = None
    for e in host_ops:
        s, f = e["ts"], e["ts"] + e["dur"]
        if f <= start or s >= end or e.get("name", "").startswith("ProfilerStep#"):
            continue
        if min(f, end) - max(s, start) >= 0.5 * length and (best is None or e["dur"] < best["dur"]):
            best = e
    return best["name"][:120] if best else "(no host operator)"


def largest_gap_place(host_ops: list[dict], gap, step_start: float) -> dict:
    """Where in its step the largest idle gap lies (ms from the step's start) and the host operators around it:
    the last to end before it began and the first to begin inside it (what the host was doing just before the
    device went idle, and what it started next); {} without host operators."""
    if not host_ops or gap is None:
        return {}
    _, start, end = gap
    before = max((e for e in host_ops if e["ts"] + e["dur"] <= start and not e["name"].startswith("ProfilerStep#")),
                 key=lambda e: e["ts"] + e["dur"], default=None)
    inside = min((e for e in host_ops if start <= e["ts"] < end), key=lambda e: e["ts"], default=None)
    return {"largest_gap_at_ms": (start - step_start) / 1e3,
            "largest_gap_after_host_op": before["name"][:120] if before else None,
            "largest_gap_next_host_op": inside["name"][:120] if inside else None}


def profile_run(ctx, trace_path, summary_path) -> dict:
    """Rerun a training job under the profiler; write its trace and a summary (JSON)."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from ftbench.harness import ranks
    from ftbench.harness.meter import pick_device
    from ftbench.run.execute import execute

    device = pick_device()
    lead = ranks.rank() == 0  # over several GPUs rank 0 is profiled (every rank runs the same schedule of steps)
    trace_summary = Path(summary_path).with_suffix(".trace.json")  # written as the profiler's window closes
    plan = schedule(ctx.settings.profile_active_steps)
    m = ctx.settings.measure  # one window long enough for the profiler's schedule
    measure = dataclasses.replace(m, repeats=1, min_seconds=0, max_window_steps=None,  # no steps past the window's
                                  steps=max(1, sum(plan.values()) + 1 - m.warmup_steps))
    settings = dataclasses.replace(ctx.settings, measure=measure)
    ctx = dataclasses.replace(ctx, settings=settings,
                              profiler=make_profiler(device, str(trace_path), str(trace_summary), plan=plan)
                              if lead else None)
    with tempfile.TemporaryDirectory() as tmp:
        record = execute(ctx, f"{tmp}/metrics.json", f"{tmp}/steps.csv", f"{tmp}/memory.csv")
    if not lead:  # the other ranks trained beside it; rank 0 writes the trace and the summary
        return {"run": record["run"], "status": record["status"], "reason": record["reason"]}
    summary = {"run": record["run"], "status": record["status"], "reason": record["reason"],
               "step_time_s": record["timing"]["step_time_s"], "schedule": plan,
               "gpu": (record["provenance"].get("device") or {}).get("name"),
               "host_syncs": record["extra"].get("host_syncs"),  # with FTBENCH_SYNC_DEBUG=1 (SyncWatch)
               "ranks": ranks.world_size(), "profiled_rank": 0}
    if record["status"] == "ok":
        summary.update(json.loads(trace_summary.read_text()))
    else:  # keep the DAG whole: an empty trace stands for a run that could not be profiled
        with gzip.open(trace_path, "wt") as f:
            json.dump({"traceEvents": []}, f)
    Path(summary_path).write_text(json.dumps(summary, indent=2))
    return summary


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


# the summary's tables as a reader sees them: named columns, shares in percent
PROFILE_COLUMNS = {
    "per_step": {"step": "step", "duration_ms": "duration ms", "busy_share": "GPU busy %",
                 "data_loading_share": "data loading %", "idle_gaps": "idle gaps", "idle_gap_ms_total": "idle ms",
                 "largest_gap_ms": "largest gap ms", "largest_gap_host_op": "host operator in the largest gap",
                 "communication_ms": "collectives ms", "communication_exposed_ms": "collectives alone ms"},
    "top_operators": {"name": "operator or kernel", "self_time_ms": "self time ms", "share": "share %",
                      "calls": "calls"},
    "idle_causes": {"host_op": "host operator", "idle_ms": "idle ms"},
    "host_syncs": {"site": "file:line", "count": "syncs", "per_step": "per step"},
}


def profile_table(rows: list[dict], kind: str):
    """One of the summary's lists as a table: its known columns renamed, shares (0-1) shown as percent."""
    import polars as pl

    from ftbench.judge.analysis import named_columns

    return named_columns(pl.DataFrame(rows), PROFILE_COLUMNS[kind])


def profile_page(summary_path, html_path) -> None:
    """The profile summary as a page of the report: busy/idle share, per-step gaps, top operators."""
    from pathlib import Path

    from ftbench.judge.analysis import html_page

    summary = json.loads(Path(summary_path).read_text())
    status = summary["status"] + (f" ({summary['reason']})" if summary.get("reason") else "")
    blocks = [f"status {status}; device {summary.get('device')}"
              f"{' (' + summary['gpu'] + ')' if summary.get('gpu') else ''}; "
              f"GPU busy {_pct(summary.get('busy_share'))} of the profiled steps; "
              f"data loading {_pct(summary.get('data_loading_share'))}"]
    share, exact = gemm_share(summary)
    if share is not None:
        blocks[0] += (f"; GEMM kernels {_pct(share)} of the device's kernel time"
                      + ("" if exact else " (at least: from the top kernels listed below)"))
    if summary.get("communication_share") is not None:
        blocks.append(f"Rank {summary.get('profiled_rank', 0)} of {summary.get('ranks')}: collective communication "
                      f"(NCCL kernels) runs {_pct(summary['communication_share'])} of the profiled steps' time, and "
                      f"{_pct(summary.get('communication_exposed_share'))} with no other kernel beside it: the share "
                      "computation does not hide (waiting in a collective for a slower rank counts here too).")
    if summary.get("per_step") and summary.get("device") == "cuda":
        idle = sum(st["idle_gap_ms_total"] for st in summary["per_step"])
        long_ = sum(c["idle_ms"] for c in summary.get("idle_causes", []))
        gaps = sum(st["idle_gaps"] for st in summary["per_step"])
        text = (f"Over {summary['steps']} step{'s' if summary['steps'] != 1 else ''} the device sits idle {idle:.0f} ms: {long_:.0f} ms in gaps of 10 ms "
                f"or more, {idle - long_:.0f} ms in {gaps} shorter gaps between kernels (launch and Python "
                "overhead on the host).")
        if summary.get("idle_causes"):
            top = summary["idle_causes"][0]
            text += f" The longest gaps pass in <code>{top['host_op']}</code> ({top['idle_ms']:.0f} ms)."
        blocks.append(text)
    if summary.get("idle_causes"):
        blocks.append(("Idle gaps of 10 ms or more, by the host operator running through them",
                       profile_table(summary["idle_causes"], "idle_causes"), "idle_causes"))
    if summary.get("per_step"):
        blocks.append(("Per step", profile_table(summary["per_step"], "per_step"), "per_step"))
        blocks.append(("Where the device's time goes: kernels by device time (host operators by self time "
                       "without a GPU)", profile_table(summary["top_operators"], "top_operators"),
                       "top_ops"))
        blocks.append("Share: of the summed device time of all kernels, copies and memsets (on a machine without a "
                      "GPU: of the summed self time of all host operators); kernels that overlap each count whole, so a "
                      "share is of the device's work, not of the step's wall time.")
    syncs = summary.get("host_syncs")
    if syncs and syncs.get("sites"):
        blocks.append((f"Host syncs in the measured steps (FTBENCH_SYNC_DEBUG=1: PyTorch's CUDA sync debug mode from "
                       f"step {syncs['from_step']}, {syncs['steps']} step(s) watched), by the Python line that made "
                       "them; the harness's reads at each window's end count here too",
                       profile_table(syncs["sites"], "host_syncs"), "host_syncs"))
    run = summary["run"]
    title = f"Profile: {run['model']} / {run['dataset']} / {run['variant']} / batch {run['batch_size']}"
    Path(html_path).write_text(html_page(title, blocks))


SYNC_DEBUG_ENV = "FTBENCH_SYNC_DEBUG"  # =1: a run counts where its measured steps make the host wait for the GPU
SYNC_WARNING = "synchronizing CUDA operation"  # PyTorch's sync-debug warning text


class SyncWatch:
    """Where the host waits for the GPU in the measured steps: PyTorch's CUDA sync debug mode (`warn`) from the
    first measured step (`arm`) to the end of training, each synchronizing call counted at its Python site (folder,
    file and line of the caller). On with FTBENCH_SYNC_DEBUG=1 on a CUDA device; `summary()` is None otherwise. A site
    counted about once per measured step is a per-step sync; the harness's own synchronisation at each window's end
    (and the reads of the window's per-step values just after it) show up as sites too, a few times per window."""

    def __init__(self, device):
        self.enabled = device.type == "cuda" and os.environ.get(SYNC_DEBUG_ENV) == "1"
        self.armed_at_step = None
        self._caught: list = []
        self._ctx = None

    def __enter__(self):
        if self.enabled:
            import warnings

            self._ctx = warnings.catch_warnings(record=True)
            self._caught = self._ctx.__enter__()
            warnings.simplefilter("always")
        return self

    def arm(self, step: int) -> None:
        if self.enabled and self.armed_at_step is None:
            import torch

            torch.cuda.set_sync_debug_mode("warn")
            self.armed_at_step = step

    def __exit__(self, *exc):
        if self.enabled:
            import torch

            torch.cuda.set_sync_debug_mode("default")
            self._ctx.__exit__(*exc)

    def summary(self, steps: int) -> dict | None:
        """{'from_step', 'steps', 'sites': [{'site', 'count', 'per_step'}]} most frequent first; None when off."""
        if not self.enabled:
            return None
        counts: dict[str, int] = {}
        for w in self._caught:
            if SYNC_WARNING in str(w.message):
                site = f"{'/'.join(w.filename.replace(os.sep, '/').split('/')[-2:])}:{w.lineno}"  # package/file
                counts[site] = counts.get(site, 0) + 1
        watched = max(steps - (self.armed_at_step or steps), 1)
        return {"from_step": self.armed_at_step, "steps": watched,
                "sites": [{"site": k, "count": c, "per_step": round(c / watched, 2)}
                          for k, c in sorted(counts.items(), key=lambda kv: -kv[1])]}
