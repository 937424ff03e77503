"""measurements/README.md's table of folders, a row a lent-GPU lease: date, machine, commit (the one its README names
as the code, else its records' own), what it measured (its README's title) and its headline figure (its fastest ok
record that had its GPU to itself: real tokens/s where the run counted tokens, else samples per hour; runs that shared
the GPU are counted, their speed never quoted), regenerated between the README's folder markers.

    python3 bench/measurements_table.py            # rewrite the table in place
    python3 bench/measurements_table.py --check    # exit 1 when it is stale (tests/test_readme.py runs this)
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "measurements" / "README.md"
START, END = "<!-- folders: bench/measurements_table.py -->", "<!-- /folders -->"


def machine(folder: str) -> str:
    if folder.startswith("cpu-"):
        return "CPU"
    m = re.match(r"(h100|h200)(?:x(\d))?-", folder)
    return f"{m.group(2) or 1} x {m.group(1).upper()}" if m else "?"


def what(folder: Path) -> str:
    readme = folder / "README.md"
    if not readme.is_file():
        return ""
    title = readme.read_text().splitlines()[0].lstrip("# ").strip()
    return title.split("): ", 1)[1] if "): " in title else title.split(": ", 1)[-1]


def headline(records: list[dict]) -> str:
    from ftbench.core.records import shared_gpu

    ok = [r for r in records if r.get("status") == "ok"]
    alone = [r for r in ok if not shared_gpu(r)]  # a run that shared its GPU: its losses, never its speed
    if ok and not alone:
        return f"{len(ok)} runs sharing the GPU: their losses, not their speed"
    ok = alone
    tokens = [r for r in ok if (r.get("throughput") or {}).get("tokens_per_s")]
    if tokens:
        r = max(tokens, key=lambda r: r["throughput"]["tokens_per_s"])
        return (f"{r['run']['variant']} ({r['run']['model']}, {r['run']['dataset']}, bs{r['run']['batch_size']}): "
                f"{r['throughput']['tokens_per_s']:,.0f} real tokens/s")
    per_hour = [r for r in ok if (r.get("throughput") or {}).get("samples_per_hour")]
    if per_hour:
        r = max(per_hour, key=lambda r: r["throughput"]["samples_per_hour"])
        return (f"{r['run']['variant']} ({r['run']['model']}, bs{r['run']['batch_size']}): "
                f"{r['throughput']['samples_per_hour']:,.0f} samples/h")
    return f"{len(records)} records, none ok" if records else "no records (profiles or checks)"


def stated(folder: Path) -> str | None:
    """The commit a lease's README names as the code that ran ("**Code**: the files of commit **abc1234**"): the
    records name their .git's HEAD, which is not that commit where the tree was carried beside an older .git (their
    source digest then says which files ran)."""
    readme = folder / "README.md"
    said = r"^\*\*Code\*\*: the (?:files|working tree) of commit \*\*([0-9a-f]{7,40})\*\*"
    found = readme.is_file() and re.search(said, readme.read_text(), re.M)
    return found.group(1)[:7] if found else None


def rows() -> list[str]:
    out = ["| folder | date | machine | commit | what it measured | headline (its fastest ok record) |",
           "| --- | --- | --- | --- | --- | --- |"]
    folders = sorted((f for f in (ROOT / "measurements").iterdir() if f.is_dir()),
                     key=lambda f: (re.search(r"\d{4}-\d\d-\d\d(-[a-z])?", f.name).group(0), f.name))
    for f in folders:
        records = [json.loads(p.read_text()) for p in sorted(f.rglob("metrics.json"))]
        commits = collections.Counter(((r.get("provenance") or {}).get("git_commit") or "")[:7] for r in records)
        commit = stated(f) or ", ".join(c for c, _ in commits.most_common(2) if c) or "-"
        date = re.search(r"\d{4}-\d\d-\d\d", f.name).group(0)
        text = what(f).replace("|", "/")
        out.append(f"| `{f.name}` | {date} | {machine(f.name)} | {commit} | {text} | {headline(records)} |")
    return out


def table_text(readme: str) -> str:
    head, rest = readme.split(START, 1)
    return head + START + "\n" + "\n".join(rows()) + "\n" + END + rest.split(END, 1)[1]


if __name__ == "__main__":
    current = README.read_text()
    new = table_text(current)
    if "--check" in sys.argv:
        sys.exit(0 if new == current else "measurements/README.md is stale: python3 bench/measurements_table.py")
    README.write_text(new)
