"""Pinned lock files beside the env files: the whole pip closure each `envs/<name>.yaml` resolves to, one
`name==version` line a package, written to `envs/<name>.lock.txt`.

    python envs/lock.py [NAME ...]      # all envs by default; needs the package index (pip resolves, installs nothing)

pip resolves each env's pip list with `--dry-run --ignore-installed --report` for this interpreter and
platform (CPython 3.11, Linux x86-64 when made for the repository). A local version label (torch's `+cpu`)
is dropped, so the same line installs the CUDA build on a GPU host. Use a lock file as
`pip install -r envs/train.lock.txt`; `snakemake --sdm conda` builds from the `.yaml` files, whose pins
tests/test_envs.py checks against the lock files."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ENVS = Path(__file__).resolve().parent


def pip_requirements(env_file: Path) -> list[str]:
    """The env file's pip list (conda's own `python` and `pip` entries aside)."""
    deps = yaml.safe_load(env_file.read_text())["dependencies"]
    return [r for d in deps if isinstance(d, dict) for r in d.get("pip", [])]


def read_lock(lock_file: Path) -> dict[str, str]:
    out = {}
    for line in lock_file.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            out[canonical(name)] = version.strip()
    return out


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


class Unresolvable(Exception):
    pass


def resolve(requirements: list[str]) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                              "--report", str(report), *requirements], capture_output=True, text=True)
        if run.returncode:
            errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR: ")]
            raise Unresolvable(errors[-1][len("ERROR: "):] if errors else run.stderr.strip()[-300:])
        installs = json.loads(report.read_text())["install"]
    return sorted((i["metadata"]["name"], i["metadata"]["version"].split("+")[0]) for i in installs)


def main(names: list[str]) -> None:
    for env_file in sorted(ENVS.glob("*.yaml")):
        if names and env_file.stem not in names:
            continue
        lock = env_file.with_suffix(".lock.txt")
        where = f"CPython {platform.python_version()} on {platform.system()} {platform.machine()}"
        try:
            pins = resolve(pip_requirements(env_file))
        except Unresolvable as e:  # said in the lock file itself, so nobody takes its absence for a lock
            lock.write_text(f"# {env_file.name}: not resolvable by envs/lock.py for {where} from the package index "
                            f"reachable here:\n# {e}\n")
            print(f"{lock.name}: not resolvable here: {e}")
            continue
        lock.write_text(f"# {env_file.name} resolved by envs/lock.py for {where}\n"
                        + "".join(f"{n}=={v}\n" for n, v in pins))
        print(f"{lock.name}: {len(pins)} packages")


if __name__ == "__main__":
    main(sys.argv[1:])
