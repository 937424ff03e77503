"""What a campaign's pending jobs cost, from the same jobs' own times in earlier leases' records: GPU-minutes, the
wall time on N GPUs in calls of at most a call's limit, and a split by batch where one lease cannot hold them."""

from __future__ import annotations

import json
from pathlib import Path

from campaign_readme import kept_path, pending

PROFILE_S = 90.0  # a profile job's own time, where no record says (README: ~1.5 min)
START_S = 150.0  # a lent machine's start and its carries before the first job (2026-11-27: 140 s to TE ready)
JOB_OVERHEAD_S = 15.0  # Snakemake's start of a job, beyond the training process's own wall time


def batch_of(target: str) -> int | None:
    """The batch size in a target's path (its bsN folder)."""
    part = next((p for p in Path(target).parts if p.startswith("bs") and p[2:].isdigit()), None)
    return int(part[2:]) if part else None



def longest_first(targets: list[str], gpus: int, sources: list[Path], prefer: str | None) -> list[str]:
    """The `gpus` longest of the targets by their jobs' own times in earlier leases (none where no lease ran any):
    the first wave, so that the shorter jobs fill the GPUs around them."""
    timed = [(s, t) for t in targets if (s := job_seconds(t, sources, prefer)[0]) is not None]
    return [t for _, t in sorted(timed, reverse=True)[:max(gpus, 1)]]


def job_seconds(target: str, sources: list[Path], prefer: str | None) -> tuple[float | None, str]:
    """How long `target`'s job ran before: the training process's wall time (`extra.supervision.elapsed_s`) of the
    same run (study, model, scale, dataset, variant, batch) in a measurements folder, on a GPU whose name holds
    `prefer` where one ran there, else on any; (None, "no record") where none did. Profiles: PROFILE_S."""
    if "/profiles/" in f"/{target}":
        return PROFILE_S, "profile (assumed)"
    rel = Path(target).relative_to("results/runs")
    found = []
    for src in sources:
        f = src / rel
        if f.exists():
            rec = json.loads(f.read_text())
            elapsed = ((rec.get("extra") or {}).get("supervision") or {}).get("elapsed_s")
            if elapsed and rec.get("status") in ("ok", "oom"):  # (a timeout says only that it ran longer)
                gpu = ((rec.get("provenance") or {}).get("device") or {}).get("name") or "?"
                found.append((prefer is not None and prefer.lower() in gpu.lower(), str(rec["provenance"].get(
                    "timestamp", "")), elapsed, f"{src.name} ({gpu})"))
    if not found:
        return None, "no record"
    _, _, elapsed, where = max(found)  # the preferred GPU first, then the latest
    return elapsed + JOB_OVERHEAD_S, where


def estimate(targets: list[str], gpus: int, limit_s: float, sources: list[Path], prefer: str | None = None,
             unknown_s: float | None = None) -> dict:
    """The campaign's cost before a lease, from the jobs' own times in earlier leases: GPU-seconds, the shortest
    wall time on `gpus` GPUs (longest job first, each to the GPU with the least work), and the calls of `limit_s`
    it needs (a job cut at a call's end is lost, so a call holds only whole jobs: first fit, longest first). A target
    with no earlier record counts the median of those found (or `unknown_s`); the data and model jobs before the
    first training job are not counted."""
    jobs = {t: job_seconds(t, sources, prefer) for t in targets}
    known = sorted(s for s, _ in jobs.values() if s is not None)
    fill = unknown_s if unknown_s is not None else (known[len(known) // 2] if known else 0.0)
    times = {t: (s if s is not None else fill) for t, (s, _) in jobs.items()}
    order = sorted(times, key=lambda t: -times[t])
    load = [0.0] * max(gpus, 1)
    for t in order:
        load[load.index(min(load))] += times[t]
    calls: list[list[float]] = []  # each call: the work on each GPU
    too_long = [t for t in order if times[t] > limit_s]
    for t in order:
        if times[t] > limit_s:
            continue
        for call in calls:
            free = min(range(len(call)), key=lambda g: call[g])
            if call[free] + times[t] <= limit_s:
                call[free] += times[t]
                break
        else:
            calls.append([times[t]] + [0.0] * (max(gpus, 1) - 1))
    return {"jobs": len(targets), "gpu_s": sum(times.values()), "wall_s": max(load), "calls": len(calls),
            "limit_s": limit_s, "gpus": gpus, "assumed": sorted(t for t, (s, _) in jobs.items() if s is None),
            "assumed_s": fill, "too_long": too_long, "sources": {t: w for t, (_, w) in jobs.items()}}


def split_by_batch(targets: list[str], gpus: int, lease_s: float, sources: list[Path], prefer: str | None = None,
                   start_s: float = START_S) -> list[dict]:
    """A campaign too long for one lease, cut into consecutive groups of whole batch sizes (each cell beside its
    baseline on one machine) whose estimated wall time on `gpus` GPUs, plus a machine's start and carries
    (`start_s`), fits `lease_s`: [{"batches": "1,2,4", "jobs": n, "wall_s": s, "fits": bool}, ...]. A batch that
    alone does not fit is a group of its own, marked."""
    by_batch: dict[int | None, list[str]] = {}
    for t in targets:
        by_batch.setdefault(batch_of(t), []).append(t)
    def cost(batches: list) -> dict:
        return estimate([t for b in batches for t in by_batch[b]], gpus, float("inf"), sources, prefer)

    groups: list[tuple[list, dict]] = []  # (batches, their estimate)
    for b in sorted(by_batch, key=lambda b: (b is None, b)):
        if groups and (est := cost(trial := groups[-1][0] + [b]))["wall_s"] + start_s <= lease_s:
            groups[-1] = (trial, est)
        else:
            groups.append(([b], cost([b])))
    return [{"batches": ",".join(str(b) for b in g if b is not None), "jobs": est["jobs"], "wall_s": est["wall_s"],
             "fits": est["wall_s"] + start_s <= lease_s} for g, est in groups]


def split_batches(targets: list[str], out: Path, calls: list[dict], machine: str | None) -> dict[int, list[str]]:
    """The batches this call would finish on `machine` while the folder holds records of the same batch from another
    machine (a campaign resumed on a fresh lease): batch -> those machines. A cell run here against a baseline kept
    from there is not comparable on the front page; run such a batch whole on one machine."""
    from ftbench.harness.gpus import calls_machines, machine_named

    named = calls_machines(calls)
    todo = {batch_of(t) for t in pending(targets, out) if t.endswith("metrics.json")}
    found: dict[int, set] = {}
    for t in targets:
        f = kept_path(t, out)
        if batch_of(t) in todo and t.endswith("metrics.json") and f.exists():
            prov = json.loads(f.read_text()).get("provenance") or {}
            m = machine_named(prov.get("machine"), (prov.get("device") or {}).get("uuid"), named)
            if m and m != machine:
                found.setdefault(batch_of(t), set()).add(m)
    return {b: sorted(ms) for b, ms in sorted(found.items(), key=lambda x: (x[0] is None, x[0]))}


def only_batches(targets: list[str], batches: str) -> list[str]:
    """The targets at the batch sizes listed ("1,2,4,8": their paths' bsN folder)."""
    keep = {f"/bs{b.strip()}/" for b in batches.split(",") if b.strip()}
    return [t for t in targets if any(k in t for k in keep)]
