"""A campaign folder's README, written from its campaign.json and its records: the host and its GPUs, packages,
source digests, calls, wall time and GPU-hours, and the jobs that failed and why; which targets the folder holds."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kept_path(target: str, out: Path) -> Path:
    """Where a target's file lives in the campaign's folder (results/runs/X -> OUT/X, results/profiles/X ->
    OUT/profiles/X)."""
    rel = Path(target).relative_to("results")
    return out / (rel.relative_to("runs") if rel.parts[0] == "runs" else rel)


def pending(targets: list[str], out: Path) -> list[str]:
    """The targets the campaign's folder holds no file for yet: what a call (on this machine or a fresh one that
    carried the folder) still has to run."""
    return [t for t in targets if not kept_path(t, out).exists()]



def host_facts() -> dict:
    """This host: name, CPUs and their model, memory, and each GPU's name, UUID and driver (nvidia-smi; none on a CPU
    machine)."""
    from ftbench.harness.gpus import host_cpu

    facts = {"hostname": platform.node(), "cpus": os.cpu_count(), "cpu_model": host_cpu()["cpu_model"],
             "python": platform.python_version()}
    try:
        with open("/proc/meminfo") as f:
            facts["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
        facts["gpus"] = [dict(zip(("index", "name", "uuid", "driver", "memory"), (x.strip() for x in line.split(","))))
                         for line in out.splitlines() if line.strip()]
    except (OSError, subprocess.SubprocessError):
        facts["gpus"] = []
    return facts


def host_line(host: dict) -> str:
    """"vm, 64 CPUs (its model), 503.8 GiB of memory; 4 GPUs: 0 NVIDIA H200 (GPU-..., 143771 MiB); ...; driver D"."""
    gpus = host.get("gpus") or []
    return (f"{host.get('hostname')}, {host.get('cpus')} CPUs" + (f" ({host['cpu_model']})" if host.get("cpu_model")
                                                                  else "")
            + f", {host.get('memory_gib')} GiB of memory; {len(gpus)} GPUs: "
            + ("; ".join(f"{g['index']} {g['name']} ({g['uuid']}, {g['memory']})" for g in gpus) or "none (a CPU "
                                                                                                   "machine)")
            + (f"; driver {gpus[0]['driver']}" if gpus else ""))


def machines_lines(state: dict, records: list) -> list[str]:
    """The README's machine lines: one host, or each machine of a campaign split over leases (`machine_of` its
    calls' host and GPUs) with its calls, batches and records, and the batches whose records ran on more than one
    machine (a ratio across them is not comparable on the front page: ftbench.judge.coverage)."""
    from ftbench.harness.gpus import calls_machines, machine_named, machine_of

    calls = state["calls"]
    per_call = [machine_of(c.get("hostname"), c.get("gpu_uuids")) for c in calls]
    order = list(dict.fromkeys(per_call))
    facts = state.get("machines") or {}
    if len(order) <= 1:
        return [f"- **Host:** {host_line(state['host'])}."]
    named = calls_machines(calls)
    ran = {}  # machine -> batch -> records
    for _, r in records:
        prov = r.get("provenance") or {}
        m = machine_named(prov.get("machine"), (prov.get("device") or {}).get("uuid"), named)
        batch = (r.get("run") or {}).get("batch_size")
        ran.setdefault(m, {})[batch] = ran.get(m, {}).get(batch, 0) + 1
    lines = [f"- **Machines:** {len(order)} (the campaign's calls ran on {len(order)} leases; a ratio divides runs of "
             "one machine):"]
    for i, m in enumerate(order, 1):
        mine = [c for c, at in zip(calls, per_call) if at == m]
        batches = sorted(ran.get(m, {}), key=lambda b: (b is None, b))
        where = (host_line(facts[m]) if m in facts
                 else f"{mine[0].get('hostname')}, GPUs {', '.join(mine[0].get('gpu_uuids') or [])}")
        lines.append(f"  {i}. `{m}`: {where}"
                     + f"; {len(mine)} call(s), {mine[0]['start']} to {mine[-1].get('end') or mine[-1]['start']}; "
                     f"{sum(ran.get(m, {}).values())} records, at batch {', '.join(str(b) for b in batches) or '-'}.")
    both = sorted(b for b in {b for m in ran for b in ran[m]} if sum(b in ran[m] for m in ran) > 1)
    if both:
        lines.append(f"- **Batches measured on more than one machine:** {', '.join(map(str, both))}: a cell there "
                     "whose baseline ran on the other machine is not comparable on the front page.")
    return lines


def readme(camp: dict, state: dict, out: Path) -> str:
    """The campaign's README, from its state and the records it holds."""
    from ftbench.harness.gpus import machine_of
    from ftbench.core.records import read_record

    records = []
    for f in sorted(out.rglob("metrics.json")):
        try:
            records.append((f, read_record(f)))
        except Exception as e:  # noqa: BLE001  (an unreadable record is named, not skipped silently)
            records.append((f, {"status": "unreadable", "reason": str(e), "run": {}, "provenance": {}, "extra": {}}))
    calls, host = state["calls"], state["host"]
    start, end = calls[0]["start"], calls[-1].get("end") or calls[-1]["start"]
    wall = sum(c.get("wall_s") or 0 for c in calls)
    batches = sorted({c.get("batches") or "" for c in calls})  # one value where every call ran the same batches
    codes = sorted({c["code"] for c in calls if c.get("code")})  # the code the jobs ran, where not the tree's
    digests = sorted({d for _, r in records if (d := (r.get("provenance") or {}).get("source_digest"))}) or ["?"]
    unnamed = sum(not (r.get("provenance") or {}).get("source_digest") for _, r in records)
    gpu_h = sum(((r.get("extra") or {}).get("supervision") or {}).get("elapsed_s", 0) or 0
                for _, r in records if r.get("status") != "unreadable"
                for _ in range(int((r.get("variant") or {}).get("gpus") or 1))) / 3600
    versions = next(((r.get("provenance") or {}).get("versions") for _, r in records
                     if (r.get("provenance") or {}).get("versions")), {}) or {}
    failed = [(f, r) for f, r in records if r.get("status") != "ok"]
    missing = [t for t in pending(camp["targets"], out) if t.endswith("metrics.json")]
    gpus = host.get("gpus") or []
    lines = [f"# Campaign `{camp['name']}`: {camp.get('about', '')}", "",
             "Written by `bench/campaign.py` after each call; do not edit by hand.", ""]
    lines += machines_lines(state, records)
    lines += [
             "- **Packages:** " + (", ".join(f"{k} {v}" for k, v in versions.items() if v) or "no record yet") + ".",
             f"- **Code:** source digest{'s' if len(digests) > 1 else ''} {', '.join(digests)}"
             + (" (one version: every ratio in it divides runs of the same code)." if len(digests) == 1 else
                " (more than one: the calls ran different code; ratios across them are not comparable).")
             + (f" {unnamed} record(s) name no code (a job stopped by its supervisor before ftbench 2026-11-26's "
                "sixteenth session wrote no digest)." if unnamed else "")
             + (f" The jobs of {sum(bool(c.get('code')) for c in calls)} of the {len(calls)} call(s) ran "
                f"{', '.join(codes)} (`--code`), not the working tree's files." if codes else ""),
             f"- **When:** {start} to {end}, {len(calls)} call(s), {wall / 60:.1f} minutes of wall time; "
             f"{gpu_h:.2f} {'GPU' if gpus else 'CPU job'}-hours in the jobs' own time.",
             f"- **The one command:** `python3 bench/campaign.py {camp['name']} --out {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}"
             + (f" --batches {batches[0]}" if len(batches) == 1 and batches[0] else "")
             + (f" --code {codes[0].split()[-1]}" if len(codes) == 1 else "")
             + (" --tiny" if camp.get("tiny") else "") + (f" --variants {camp['variants']}" if camp.get("variants")
                                                          else "") + "` (again to resume).", "",
             f"Records: {len(records)} of {sum(t.endswith('metrics.json') for t in camp['targets'])} cells; "
             f"ok {sum(r.get('status') == 'ok' for _, r in records)}.", ""]
    if failed:
        lines += ["## Jobs that did not end ok", "", "| run | status | why |", "| --- | --- | --- |"]
        for f, r in failed:
            why = (r.get("reason") or "").replace("|", "/").replace("\n", " ")[:200]
            lines.append(f"| {f.parent.relative_to(out)} | {r.get('status')} | {why} |")
        lines.append("")
    if state.get("repeats"):
        lines += ["## Repeats added where the noise could not carry a verdict", "",
                  "| run | noise before | repeats | noise after | ended by |", "| --- | --- | --- | --- | --- |"]
        for t, e in state["repeats"].items():
            after = e.get("noise_after")
            lines.append(f"| {Path(t).parent.relative_to('results/runs')} | {100 * e['noise_before']:.1f} % | "
                         f"{e.get('repeats', '-')} | {'-' if after is None else f'{100 * after:.1f} %'} | "
                         f"{e.get('ended', '')} |")
        lines.append("")
    if missing:
        held = calls[-1].get("held") or {}
        lines += ["## Cells with no record yet (the next call runs them)", ""]
        lines += [f"- {Path(t).parent.relative_to('results/runs')}"
                  + (f" (held back in the last call, not installed on its host: {held[t]})" if t in held else "")
                  for t in missing] + [""]
    lines += ["## Calls", "", "| start | end | wall s | exit | machine | GPUs | batches | targets pending | "
              "records kept while it ran | cut |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {c['start']} | {c.get('end', '(none: still running, or killed with its machine)')} | "
              f"{c.get('wall_s', '')} | {c.get('exit', '')} | {machine_of(c.get('hostname'), c.get('gpu_uuids'))} | "
              f"{c.get('gpus')} | {c.get('batches') or 'all'} | {c.get('pending', '')} | "
              f"{c.get('kept_while_running', '')} | {c.get('cut', '')} |" for c in calls]
    return "\n".join(lines) + "\n"
