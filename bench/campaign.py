"""One command, one host, one commit, a whole study: run a campaign's cells, baselines, probes and profiles through
Snakemake, one job per GPU of this host, resumable, and write its folder under measurements/ with a README.

    python3 bench/campaign.py CAMPAIGN [--out measurements/NAME] [--dry-run] [--limit-s S]
    python3 bench/campaign.py CAMPAIGN --estimate --gpus 4 [--batches N,M]   (its cost, from earlier leases' jobs)
    python3 bench/campaign.py CAMPAIGN --out measurements/NAME --code COMMIT   (the jobs run that commit's files)
    python3 bench/campaign.py --list

A campaign is data (`campaigns:` in bench/parts.yaml): its config files and targets, in the parts' notation. The
host's GPUs (`ftbench.harness.gpus.visible_gpus`: CUDA_VISIBLE_DEVICES, else nvidia-smi; FTBENCH_GPU_IDS fakes them) set
`--resources gpu=N`, so Snakemake runs N one-GPU jobs at once and each job locks a GPU of its own. Resumable: a call
cut at its limit (`--limit-s`, or the machine's) loses only the jobs it was running (`--rerun-incomplete`); the next
call starts no finished job again: a target whose file the campaign's folder holds is not asked for, so a fresh
machine that carries the folder (it lies in the working tree) goes on where the last one stopped. Every call appends to OUT/campaign.json (start, end, jobs that ran) and rewrites
OUT/README.md from the records: host, GPUs and driver, packages, source digest(s), first start and last end, wall
time, GPU-hours, the jobs that failed and why. The records, step logs and profile summaries are copied into OUT, so
`merge_runs: [OUT]` builds a report from this campaign alone."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from measure_check import PARTS, fill  # noqa: E402

KEPT = ("metrics.json", "steps.csv", "memory.csv", "summary.json")
COLLECT_EVERY_S = 20.0  # how often a running call copies its jobs' finished records into its folder


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan(name: str, parts: dict) -> dict:
    """The campaign `name`: its configs and its targets expanded (variables, braces), in the order written."""
    camp = parts.get("campaigns", {}).get(name)
    if camp is None:
        raise KeyError(name)
    targets = [t for tmpl in camp["targets"] for t in fill(tmpl, parts["vars"])]
    return {**camp, "name": name, "targets": list(dict.fromkeys(targets))}


TARGET = re.compile(r"^results/(runs|profiles)/([^/]+)/([^/]+)/([^/]+)/([^/]+)/([^/]+)/bs(\d+)/")


def at_tiny(camp: dict, folder: Path) -> dict:
    """The campaign's cells at tiny scale on this machine (how the test suite runs a study's campaign end to end):
    the default config's tiny models and synthetic data, each study's matrix the campaign's own cells (a config file
    written in `folder`, which the campaign's folder keeps), every target's scale tiny."""
    targets = [TARGET.sub(lambda m: m.group(0).replace(f"/{m.group(4)}/", "/tiny/", 1), t) for t in camp["targets"]]
    cells: dict = {}
    profiles = []
    for t in targets:
        kind, study, model, _, dataset, variant, bs = TARGET.match(t).groups()
        cells.setdefault(study, {}).setdefault((model, dataset, variant), set()).add(int(bs))
        if kind == "profiles":
            profiles.append({"study": study, "model": model, "dataset": dataset, "variant": variant,
                             "batch_size": int(bs)})
    config = {"only_studies": sorted(cells), "profile": profiles, "token_stats": [], "materialize": [],
              "studies": {study: {"matrix": [{"models": [m], "datasets": [d], "variants": [v], "batch_sizes": sorted(b)}
                                             for (m, d, v), b in runs.items()]} for study, runs in cells.items()}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny-cells.yaml"
    path.write_text("# the campaign's cells at tiny scale (bench/campaign.py --tiny)\n" + yaml.safe_dump(config))
    return {**camp, "configs": [str(path.resolve())], "targets": targets, "tiny": True}


def only_variants(targets: list[str], variants: str) -> list[str]:
    """The targets of the variants named (comma-separated): a part of a campaign, e.g. a cell and its baseline."""
    keep = set(variants.split(","))
    return [t for t in targets if (m := TARGET.match(t)) and m.group(6) in keep]


def code_tree(ref: str | None, workdir: Path = ROOT) -> tuple[Path, str | None]:
    """The folder whose Snakefile, library, rules and configs the jobs run, and how the README names it (None: the
    working tree): the project itself, or for a git commit `ref` a checkout of it under the working directory's
    results/code/ (made once, kept; ignored by git, so a lent machine's tree sync leaves it alone; a clone sharing
    this project's objects, with a git directory of its own, so that the records name the commit). A campaign split over leases runs one commit's files in every call whatever
    the working tree became since, and a job never reads a tree being replaced under it."""
    if not ref:
        return ROOT, None
    if (Path(ref) / "Snakefile").is_file():  # a folder holding the files already (where the host has no history)
        return Path(ref).resolve(), f"the files in {Path(ref).resolve()}"
    try:
        sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"--code {ref}: not a commit of this project's git history ({e})") from None
    path = workdir / "results" / "code" / sha[:12]
    if not (path / "Snakefile").is_file():
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "clone", "--quiet", "--shared", "--no-checkout", str(ROOT), str(path)], check=True)
        subprocess.run(["git", "checkout", "--quiet", "--detach", sha], cwd=path, check=True)
    return path, f"commit {sha[:12]}"


def job_env(code: Path) -> dict:
    """The environment Snakemake runs in: the code folder's library first on PYTHONPATH, ahead of the working tree's
    (a lent host's PYTHONPATH names it) and of an installed copy, so that every job imports the library of the files
    its record's digest names (the job scripts put their own folder last on their path)."""
    from ftbench.harness.source import library_first

    return library_first(code / "src", dict(os.environ))


def config_path(name: str, code: Path) -> Path:
    """A campaign's config file: from the code folder where it is one of the files that shape a measurement (under
    config/: part of the source digest), else from the project (bench/: the campaign's windows and limits)."""
    from ftbench.harness.source import SHAPING

    return (code if Path(name).parts[0] in SHAPING else ROOT) / name


def config_files(camp: dict, code: Path = ROOT) -> list[Path]:
    """config/config.yaml and the campaign's config files, in Snakemake's merge order (later files win)."""
    return list(dict.fromkeys(config_path(c, code) for c in ["config/config.yaml", *camp["configs"]]))


def foreign(todo: list[str], workdir: Path = ROOT) -> list[str]:
    """Of the targets this call runs (`todo`: those the campaign's folder does not hold, `pending`), those whose file
    the working directory holds already, left by another run (a part, another campaign's call with other windows, a
    user's own run): this campaign did not make them. They run again (Snakemake's --forcerun): a campaign's records are its own calls'.
    (2026-11-27: study_b, run after study_d on one host, kept study_d's record of a cell both name, measured with
    study_d's windows.)"""
    return [t for t in todo if (workdir / t).exists()]


def command(camp: dict, gpus: int, cores: int, workdir: Path = ROOT, extra_configs=(), forcerun=(),
            first=(), code: Path = ROOT, fresh=()) -> list[str]:
    """The Snakemake call: every GPU of the host a `gpu` resource, jobs that fail leave the rest going, an interrupted
    job's output rerun, nothing finished started again (only a missing or older output reruns a job: a repeats pass's
    records keep their place); `forcerun` reruns the targets named (the repeats pass, with its `extra_configs`), and
    `fresh` the targets among the campaign's own that another run left in the working directory (foreign);
    `first` are started before the others (Snakemake's --prioritize: the longest jobs, so that the short ones fill
    the GPUs around them rather than one long job running alone at the end); `code`: the folder whose Snakefile
    runs (code_tree)."""
    snakemake = shlex.split(os.environ.get("SNAKEMAKE", f"{sys.executable} -m snakemake"))
    where = [] if workdir == ROOT and code == ROOT else ["-s", str(code / "Snakefile"), "-d", str(workdir)]
    # every config file named, the Snakefile's own too: it reads config/config.yaml from the working directory, which
    # is the project's, not the code folder's
    configs = [str(c) for c in [*config_files(camp, code), *extra_configs]]
    again = ["--forcerun", *forcerun, *fresh] if forcerun or fresh else []
    early = ["--prioritize", *first] if first else []
    targets = list(forcerun) or camp["targets"]
    return [*snakemake, *where, "--cores", str(cores), "--resources", f"gpu={max(gpus, 1)}", "--scheduler", "greedy",
            "--keep-going", "--rerun-incomplete", "--rerun-triggers", "mtime", "--replace-workflow-config", *again,
            *early, "--configfile", *configs, "--", *targets]


def merged_config(camp: dict, code: Path = ROOT) -> dict:
    """config/config.yaml and the campaign's config files, merged as Snakemake merges --configfile (from the code
    folder the jobs run, code_tree)."""
    from snakemake.utils import update_config

    config: dict = {}
    for c in config_files(camp, code):
        update_config(config, yaml.safe_load(c.read_text()) or {})
    return config


def needed_packages(knobs: dict) -> list[str]:
    """The importable packages a variant's knobs need beyond the base install (`ftbench.core.knobs.required_packages`)."""
    from ftbench.core.knobs import Variant, required_packages

    return required_packages(Variant.from_config("campaign", knobs))


def waiting(camp: dict, targets: list[str], code: Path = ROOT) -> dict[str, str]:
    """The targets held back on this host, target -> the package its variant needs and this host lacks. Their jobs
    would end in an `unsupported` record, which the campaign would keep as done and never run again; held back,
    they run in the call after the package is installed (Transformer Engine is built once per host)."""
    import importlib.util

    from ftbench.config.settings import study_variants

    config = merged_config(camp, code)
    held = {}
    for t in targets:
        parts = Path(t).parts  # results/{runs,profiles}/STUDY/MODEL/SCALE/DATASET/VARIANT/bsN/FILE
        knobs = study_variants(config, parts[2]).get(parts[-3]) or {}
        missing = [p for p in needed_packages(knobs) if importlib.util.find_spec(p) is None]
        if missing:
            held[t] = ", ".join(missing)
    return held


def longest_first(targets: list[str], gpus: int, sources: list[Path], prefer: str | None) -> list[str]:
    """The `gpus` longest of the targets by their jobs' own times in earlier leases (none where no lease ran any):
    the first wave, so that the shorter jobs fill the GPUs around them."""
    timed = [(s, t) for t in targets if (s := job_seconds(t, sources, prefer)[0]) is not None]
    return [t for _, t in sorted(timed, reverse=True)[:max(gpus, 1)]]


def kept_path(target: str, out: Path) -> Path:
    """Where a target's file lives in the campaign's folder (results/runs/X -> OUT/X, results/profiles/X ->
    OUT/profiles/X)."""
    rel = Path(target).relative_to("results")
    return out / (rel.relative_to("runs") if rel.parts[0] == "runs" else rel)


def pending(targets: list[str], out: Path) -> list[str]:
    """The targets the campaign's folder holds no file for yet: what a call (on this machine or a fresh one that
    carried the folder) still has to run."""
    return [t for t in targets if not kept_path(t, out).exists()]


def collect(targets: list[str], out: Path, workdir: Path = ROOT) -> list[Path]:
    """Copy what the targets left (records and their logs, profile summaries) into OUT, under the path they have
    below results/runs or results/profiles (profiles/...): the layout merge_runs reads."""
    kept = []
    for t in targets:
        src_dir = workdir / Path(t).parent
        if not src_dir.is_dir():
            continue
        for f in src_dir.iterdir():
            if f.name in KEPT and f.is_file():
                dst = kept_path(t, out).parent / f.name
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst)
                kept.append(dst)
    return kept


def made_since(targets: list[str], since: float, workdir: Path = ROOT) -> list[str]:
    """The targets whose file was written at or after `since` (a time.time()): what this call's jobs made, never a
    file an earlier call left in the working directory."""
    return [t for t in targets if (p := workdir / t).is_file() and p.stat().st_mtime >= since]


def wait_collecting(proc: subprocess.Popen, targets: list[str], out: Path, workdir: Path, since: float,
                    limit_s: float | None = None, every_s: float = COLLECT_EVERY_S, on_collect=None) -> int:
    """Wait for Snakemake, copying each job's record into OUT as soon as the job has written it (a record is written
    whole, last of its files), so that a call whose machine is lost mid-pass (given back between two device calls,
    or its budget spent) leaves every finished job in OUT for the next poll to pack: on 2026-11-27 a pass lost 8
    finished jobs so. `on_collect(new_targets)` runs after each copy. Raises TimeoutExpired after `limit_s`."""
    deadline = None if limit_s is None else time.monotonic() + limit_s
    kept: set[str] = set()
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, limit_s)
        try:
            return proc.wait(timeout=every_s if left is None else min(every_s, left))
        except subprocess.TimeoutExpired:
            pass
        new = [t for t in made_since(targets, since, workdir) if t not in kept]
        if new:
            collect(new, out, workdir)
            kept.update(new)
            if on_collect:
                on_collect(new)


def run_snakemake(cmd: list[str], code: Path, targets: list[str], out: Path, workdir: Path,
                  limit_s: float | None = None, on_collect=None) -> tuple[int, bool]:
    """Run one Snakemake call of the campaign (the jobs' library first, `job_env`), copying each target's record
    into OUT as its job ends (`wait_collecting`); at `limit_s` Snakemake is stopped (its running jobs are lost, the
    next call resumes). Returns its exit status and whether it was cut."""
    since = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env=job_env(code))
    try:
        return wait_collecting(proc, targets, out, workdir, since, limit_s, on_collect=on_collect), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(), True


def noisy(camp: dict, out: Path, bound: float) -> dict[str, float]:
    """The campaign's ok records whose noise band (NOISE_SIGMAS x the noise of the number a verdict reads: real
    tokens/s for packed rows, else the median step's) is wider than `bound`: target -> that noise. Read from the
    records alone (no report library: a GPU host need not carry polars)."""
    from ftbench.core.records import read_record
    from ftbench.judge.verdicts import NOISE_SIGMAS, step_noise

    found = {}
    for t in camp["targets"]:
        if not t.endswith("metrics.json"):
            continue
        f = out / Path(t).relative_to("results/runs")
        if not f.exists():
            continue
        rec = read_record(f)
        if rec["status"] != "ok":
            continue
        timing = rec.get("timing") or {}
        row = {**{f"timing.{k}": v for k, v in timing.items()},
               "extra.new_shapes_measured": (rec.get("extra") or {}).get("new_shapes_measured")}
        noise = timing.get("noise_cv_tokens") if (rec.get("variant") or {}).get("token_budget") else step_noise(row)
        if noise is not None and NOISE_SIGMAS * noise > bound:
            found[t] = noise
    return found


PROFILE_S = 90.0  # a profile job's own time, where no record says (README: ~1.5 min)
START_S = 150.0  # a lent machine's start and its carries before the first job (2026-11-27: 140 s to TE ready)
JOB_OVERHEAD_S = 15.0  # Snakemake's start of a job, beyond the training process's own wall time


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


def batch_of(target: str) -> int | None:
    """The batch size in a target's path (its bsN folder)."""
    part = next((p for p in Path(target).parts if p.startswith("bs") and p[2:].isdigit()), None)
    return int(part[2:]) if part else None


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


def repeat_noisy(camp: dict, state: dict, out: Path, workdir: Path, gpus: int, budget_s: float, bound: float,
                 rounds: int, code: Path = ROOT) -> None:
    """Repeats for the cells whose noise cannot carry a verdict: each round reruns them with twice the repeats of
    the round before (a config file written beside the records), until every one is under `bound`, `rounds` ran or
    `budget_s` is spent; each cell's noise before and after, and which ended it, goes to the state (and README)."""
    study = camp.get("study")
    from ftbench.config.settings import MeasureSettings

    measure = ((merged_config(camp, code)["studies"].get(study) or {}).get("training") or {}).get("measure") or {}
    base = measure.get("repeats", MeasureSettings.repeats)
    log = state.setdefault("repeats", {})
    start = time.monotonic()
    factor = 2
    for _ in range(rounds):
        todo = noisy(camp, out, bound)
        left = budget_s - (time.monotonic() - start)
        for t, cv in todo.items():
            log.setdefault(t, {"noise_before": cv})
        if not todo or left <= 0:
            break
        cfg = out / f"repeats-x{factor}.yaml"
        cfg.write_text(yaml.safe_dump({"studies": {study: {"training": {"measure": {"repeats": base * factor}}}}}))
        cmd = command(camp, gpus, os.cpu_count() or 1, workdir, extra_configs=[cfg], forcerun=list(todo), code=code)
        run_snakemake(cmd, code, list(todo), out, workdir, left)
        collect(list(todo), out, workdir)
        after = noisy(camp, out, -1.0)  # every record's noise, read once a round
        for t in todo:
            log[t].update(repeats=base * factor, noise_after=after.get(t))
        factor *= 2
    over = noisy(camp, out, bound)
    spent = time.monotonic() - start >= budget_s
    for t, entry in log.items():
        entry["ended"] = ("under the bound" if t not in over else
                          "the budget ended" if spent else "the rounds ended")


def only_batches(targets: list[str], batches: str) -> list[str]:
    """The targets at the batch sizes listed ("1,2,4,8": their paths' bsN folder)."""
    keep = {f"/bs{b.strip()}/" for b in batches.split(",") if b.strip()}
    return [t for t in targets if any(k in t for k in keep)]


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


def main(argv: list[str]) -> int:
    from ftbench.harness.gpus import machine_of, visible_gpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaign", nargs="?")
    ap.add_argument("--out", help="its folder (default measurements/<campaign>-<host>-<date>)")
    ap.add_argument("--dry-run", action="store_true", help="Snakemake's dry run: what this call would run")
    ap.add_argument("--limit-s", type=float, default=None, help="stop this call after this long (resume later)")
    ap.add_argument("--workdir", default=str(ROOT), help="Snakemake's working directory (default: the project)")
    ap.add_argument("--code", default=None, metavar="COMMIT",
                    help="run the jobs from this git commit's files (a checkout of it under results/code/), not the "
                         "working tree's: every call of a campaign split over leases runs one source digest; or a "
                         "folder holding its tree (`git archive COMMIT | tar -x -C FOLDER`), where the host has no "
                         "git history")
    ap.add_argument("--repeat-noisy", type=float, default=0, metavar="S",
                    help="then, for up to S seconds, rerun the cells whose 2 x noise CV is over --bound with more "
                         "repeats")
    ap.add_argument("--bound", type=float, default=None, help="noise band above which a cell is rerun (default: "
                                                              "the verdicts' inconclusive band, 0.10)")
    ap.add_argument("--rounds", type=int, default=2, help="at most this many repeats rounds (each doubles them)")
    ap.add_argument("--batches", default=None, metavar="N,M",
                    help="only the targets at these batch sizes (a study too long for one lease, split so that each "
                         "cell and its baseline at the same batch run on one host)")
    ap.add_argument("--tiny", action="store_true",
                    help="the campaign's cells at tiny scale on this machine (the default config's tiny models and "
                         "data): the study's campaign end to end in minutes, as the test suite runs it")
    ap.add_argument("--variants", default=None, metavar="A,B",
                    help="only the targets of these variants (a cell and its baseline)")
    ap.add_argument("--estimate", action="store_true",
                    help="print what the pending targets cost, from the jobs' own times in measurements/ (no run)")
    ap.add_argument("--gpus", type=int, default=None, help="with --estimate: the host's GPUs (default: this one's)")
    ap.add_argument("--prefer", default="H200", help="with --estimate: the GPU whose records to read first")
    ap.add_argument("--lease-min", type=float, default=30.0,
                    help="with --estimate: one lease's device minutes; a longer campaign is split by batch to fit")
    ap.add_argument("--readme", action="store_true",
                    help="only rewrite OUT/README.md from OUT/campaign.json and the records (after moving the folder)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    parts = yaml.safe_load(PARTS.read_text())
    if args.list or not args.campaign:
        for name, camp in parts.get("campaigns", {}).items():
            print(f"{name}: {camp.get('about', '')}")
        return 0
    try:
        camp = plan(args.campaign, parts)
    except KeyError:
        print(f"unknown campaign: {args.campaign} (python3 bench/campaign.py --list)", file=sys.stderr)
        return 2
    gpus = visible_gpus()
    workdir = Path(args.workdir).resolve()
    out = Path(args.out) if args.out else ROOT / "measurements" / (
        f"{args.campaign}-{platform.node()}-{datetime.date.today().isoformat()}")
    out = out if out.is_absolute() else ROOT / out
    if args.tiny:
        camp = at_tiny(camp, out)
    if args.variants:
        camp = {**camp, "targets": only_variants(camp["targets"], args.variants), "variants": args.variants}
    whole = camp  # the README counts every cell of the campaign, whatever batches this call runs
    if args.batches:
        camp = {**camp, "targets": only_batches(camp["targets"], args.batches)}
    todo = {**camp, "targets": pending(camp["targets"], out)}  # what the folder holds already never runs again
    sources = sorted(p for p in (ROOT / "measurements").glob("*") if p.is_dir() and p.resolve() != out.resolve())
    if args.readme:
        state = json.loads((out / "campaign.json").read_text())
        (out / "README.md").write_text(readme(whole, state, out))
        print(out / "README.md")
        return 0
    if args.estimate:
        n = args.gpus or len(gpus)
        est = estimate(todo["targets"], n, args.limit_s or 540.0, sources, args.prefer)
        print(f"{args.campaign}{f' --batches {args.batches}' if args.batches else ''}: {est['jobs']} jobs pending, "
              f"{est['gpu_s'] / 60:.0f} GPU-minutes; on {n} GPUs at least {est['wall_s'] / 60:.1f} minutes, "
              f"{est['calls']} calls of {est['limit_s']:g} s (whole jobs a call; plus each machine's start and the "
              f"data and model jobs)")
        if est["assumed"]:
            print(f"  no earlier record, counted at {est['assumed_s']:.0f} s: " + ", ".join(est["assumed"]))
        if est["too_long"]:
            print("  longer than a call: " + ", ".join(est["too_long"]))
        if est["wall_s"] + START_S > args.lease_min * 60:
            groups = split_by_batch(todo["targets"], n, args.lease_min * 60, sources, args.prefer)
            print(f"  more than one lease of {args.lease_min:g} minutes (with {START_S:.0f} s of start and carries); "
                  "split by batch, each cell beside its baseline on one machine: "
                  + ", then ".join(f"--batches {g['batches']} ({g['jobs']} jobs, >= {g['wall_s'] / 60:.1f} min"
                                   + ("" if g["fits"] else ", alone longer than a lease") + ")" for g in groups))
        for t, where in est["sources"].items():
            print(f"  {t}: {where}")
        return 0
    code, code_named = code_tree(args.code, workdir)
    held = waiting(camp, todo["targets"], code)
    if held:
        print(f"held back, a package missing on this host: {len(held)} target(s) ("
              + ", ".join(sorted(set(held.values()))) + ")", file=sys.stderr)
    todo["targets"] = [t for t in todo["targets"] if t not in held]
    stale = foreign(todo["targets"], workdir)
    if stale:
        print(f"run again: {len(stale)} target(s) whose file another run left in the working directory", file=sys.stderr)
    cmd = command(todo, len(gpus), os.cpu_count() or 1, workdir,
                  first=longest_first(todo["targets"], len(gpus), sources, args.prefer), code=code, fresh=stale)
    if args.dry_run:
        return subprocess.run([*cmd[:cmd.index("--")], "-n", *cmd[cmd.index("--"):]], cwd=ROOT,
                              env=job_env(code)).returncode
    host = host_facts()
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "campaign.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"campaign": args.campaign, "calls": []}
    uuids = [g.get("uuid") for g in host.get("gpus") or []]
    here = machine_of(host.get("hostname"), uuids)
    for b, there in split_batches(camp["targets"], out, state["calls"], here).items():
        print(f"batch {b}: its other records ran on {', '.join(there)}, this call's on {here}: a cell finished here "
              "is not comparable with a baseline kept from there (move that batch's records aside to run it whole "
              "here)", file=sys.stderr)
    state["host"] = host
    state.setdefault("machines", {})[here] = host  # each machine's facts
    call = {"start": now(), "gpus": len(gpus), "command": shlex.join(cmd), "hostname": host.get("hostname"),
            "gpu_uuids": uuids, "batches": args.batches,
            "held": held, "code": code_named, "run_again": stale}
    state["calls"].append(call)
    state_path.write_text(json.dumps(state, indent=2))
    t0 = time.monotonic()
    call["pending"] = len(todo["targets"])
    rc = 0

    def save() -> None:  # the state and the README, also while the call runs: the folder says what it holds
        state_path.write_text(json.dumps(state, indent=2))
        (out / "README.md").write_text(readme(whole, state, out))

    def kept_so_far(new: list[str]) -> None:
        call["kept_while_running"] = call.get("kept_while_running", 0) + len(new)
        save()

    if todo["targets"]:
        rc, cut = run_snakemake(cmd, code, todo["targets"], out, workdir, args.limit_s, on_collect=kept_so_far)
        if cut:
            call["cut"] = f"after {args.limit_s:g} s (--limit-s)"
    call.update(end=now(), wall_s=round(time.monotonic() - t0, 1), exit=rc)
    collect(todo["targets"], out, workdir)
    if args.repeat_noisy > 0:
        from ftbench.judge.verdicts import INCONCLUSIVE_BAND

        bound = INCONCLUSIVE_BAND if args.bound is None else args.bound
        repeat_noisy(camp, state, out, workdir, len(gpus), args.repeat_noisy, bound, args.rounds, code)
    save()
    print(f"campaign {args.campaign}: exit {rc}; {out / 'README.md'}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
