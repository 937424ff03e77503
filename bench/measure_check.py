"""Run parts of the device plan (bench/parts.yaml) on a lent GPU, one log per part under OUTDIR.

    python3 bench/measure_check.py [OUTDIR [PART ...]]      (bash bench/measure_check.sh does the same)
    python3 bench/measure_check.py --list                   (the parts, and what each asks Snakemake for)

A part is data: its config files and targets (see parts.yaml); this only expands and runs them. Records stay under
results/; `bash bench/collect.sh OUT` packs them to bring back."""
from __future__ import annotations

import datetime
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

PARTS = Path(__file__).with_name("parts.yaml")
# one GPU job at a time needs no ILP solver (pulp need not travel to a lent GPU); a 2-GPU host schedules two
HOSTS = {"one": ["--cores", "16", "--resources", "gpu=1", "--scheduler", "greedy"],
         "two": ["--cores", "32", "--resources", "gpu=2", "--scheduler", "greedy"],
         "four": ["--cores", "64", "--resources", "gpu=4", "--scheduler", "greedy"],
         "eight": ["--cores", "128", "--resources", "gpu=8", "--scheduler", "greedy"]}


def braces(text: str) -> list[str]:
    """bash's brace expansion: "a/{x,y}/b{1,2}" -> a/x/b1, a/x/b2, a/y/b1, a/y/b2."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", text)
    if not m:
        return [text]
    return [out for alt in m.group(1).split(",") for out in braces(text[:m.start()] + alt + text[m.end():])]


def fill(template: str, values: dict) -> list[str]:
    """A target template with its {name} fields filled (variables, a pattern's fields), then its braces expanded."""
    return braces(re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0),
                         template))


def resolve(name: str, plan: dict) -> tuple[dict, list[dict]]:
    """The part called `name` and its field combinations (one per target set), from the parts or the patterns."""
    if name in plan["parts"]:
        return plan["parts"][name], [{}]
    for pattern, part in plan.get("patterns", {}).items():
        regex = re.escape(pattern)
        for field, rx in (("variants", r"(?P<variants>.+)"), ("variant", r"(?P<variant>.+)"),
                          ("batches", r"(?P<batches>[0-9]+(?:,[0-9]+)*)")):
            regex = regex.replace(re.escape("{" + field + "}"), rx)
        m = re.fullmatch(regex, name)
        if m:
            f = m.groupdict()
            variants = (f.get("variants") or f.get("variant") or "").split(",")
            batches = (f.get("batches") or "").split(",")
            return part, [{"variant": v, "batch": b} for v, b in itertools.product(variants, batches)]
    raise KeyError(name)


def runs(name: str, plan: dict) -> list[dict]:
    """What a part runs, in order: each a dict with `configs`, `targets`, `each`, `env` and the host, or a `command`."""
    part, combos = resolve(name, plan)
    if "command" in part:
        return [{"command": part["command"]}]
    out = []
    for step in [part] + list(part.get("and", [])):
        configs = step["configs"]
        configs = plan["configs"][configs] if isinstance(configs, str) else configs
        targets = [t for combo in combos for tmpl in step["targets"] for t in fill(tmpl, {**plan["vars"], **combo})]
        out.append({"configs": configs, "targets": list(dict.fromkeys(targets)),
                    "each": step.get("each", part.get("each", False)),  # an `and` step may set its own
                    "env": part.get("env", {}), "host": part.get("host", "one")})
    for cmd in part.get("then", []):
        out.append({"command": fill(cmd, plan["vars"])[0]})
    return out


def commands(run: dict) -> list[list[str] | str]:
    if "command" in run:
        return [run["command"]]
    snakemake = shlex.split(os.environ.get("SNAKEMAKE", f"{sys.executable} -m snakemake"))
    base = snakemake + HOSTS[run["host"]] + ["--keep-going", "--configfile", *run["configs"], "--"]
    groups = [[t] for t in run["targets"]] if run["each"] else [run["targets"]]
    return [base + g for g in groups]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main(argv: list[str]) -> int:
    plan = yaml.safe_load(PARTS.read_text())
    if argv[:1] == ["--list"]:
        for name in list(plan["parts"]) + list(plan.get("patterns", {})):
            part = plan["parts"].get(name) or plan["patterns"][name]
            print(f"{name}: {part.get('about', '')}")
        return 0
    if argv and argv[0].startswith("-"):  # an option it does not know is not an output folder
        print(__doc__, file=sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    out = Path(argv[0] if argv else "results/measure_check")
    names = argv[1:] or plan["default"]
    out.mkdir(parents=True, exist_ok=True)
    try:
        todo = [(name, runs(name, plan)) for name in names]
    except KeyError as e:
        print(f"unknown part: {e.args[0]} (python3 bench/measure_check.py --list)", file=sys.stderr)
        return 2
    worst = 0
    for name, steps in todo:
        print(f"== {name} {now()}", flush=True)
        rc = 0
        with open(out / f"{name.replace(',', '_')}.log", "w") as log:
            for run in steps:
                env = {**os.environ, **run.get("env", {})}
                for cmd in commands(run):
                    log.write(f"$ {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n")
                    log.flush()
                    rc = subprocess.run(cmd, shell=isinstance(cmd, str), env=env, stdout=log,
                                        stderr=subprocess.STDOUT).returncode or rc
        print(f"   exit {rc} {now()}", flush=True)
        worst = worst or rc
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
