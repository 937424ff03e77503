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
from campaign_readme import host_facts, kept_path, pending, readme  # noqa: E402
from campaign_estimate import (JOB_OVERHEAD_S, PROFILE_S, START_S, batch_of, estimate, longest_first,  # noqa: E402,F401
                               only_batches, split_batches, split_by_batch)

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


def parser() -> argparse.ArgumentParser:
    """The command line of a campaign call."""
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
    return ap


def print_estimate(args, name: str, todo: dict, sources: list[Path], gpus: list) -> int:
    """--estimate: what the pending targets cost, from the jobs' own times in measurements/ (no run)."""
    n = args.gpus or len(gpus)
    est = estimate(todo["targets"], n, args.limit_s or 540.0, sources, args.prefer)
    print(f"{name}{f' --batches {args.batches}' if args.batches else ''}: {est['jobs']} jobs pending, "
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


def main(argv: list[str]) -> int:
    from ftbench.harness.gpus import visible_gpus

    args = parser().parse_args(argv)
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
        return print_estimate(args, args.campaign, todo, sources, gpus)
    return run_call(args, camp, whole, todo, out, workdir, gpus, sources)


def run_call(args, camp: dict, whole: dict, todo: dict, out: Path, workdir: Path, gpus: list,
             sources: list[Path]) -> int:
    """One call of a campaign: its jobs through Snakemake (held back where a package is missing), the records kept
    in OUT as they land, OUT/campaign.json and OUT/README.md written while it runs, then noisy cells again."""
    from ftbench.harness.gpus import machine_of

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
