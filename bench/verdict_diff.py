"""Each published cell's verdict from two sets of records side by side: the leases merged before, and a campaign
(one commit, one host) after; the cells whose verdict changed are marked. For docs/studies.md's before/after table.

    python3 bench/verdict_diff.py --before 'measurements/*' --after measurements/h200x4-DATE [--study A]
                                  [--before-across-code] [--changed-only]

`--before` and `--after` take folders of records or patterns (config `merge_runs`' notation); a folder named in
`--after` is left out of `--before`. Verdicts are computed as the front page computes them (ftbench.judge.coverage): a
ratio divides runs of one code unless `--before-across-code` merges the leases' codes on purpose, as the front page
of `merge_across_code: true` did."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def coverage_tables(config_path: Path = ROOT / "config" / "config.yaml") -> list[dict]:
    """Every study's published tables with their published values read, as the pipeline's coverage rule reads them
    (ftbench.config.sources.coverage_tables)."""
    from ftbench.config import settings as ftc

    return [{**t, "published": ftc.load_yaml(ROOT / "config" / "published" / t["published"])}
            for t in ftc.coverage_tables(ftc.load_yaml(config_path))]


def sources(patterns: list[str], leave_out=()) -> list[str]:
    from ftbench.config.settings import expand_sources

    out, skip = [], {Path(p).resolve() for p in leave_out}
    for pattern in patterns:
        for found in expand_sources(pattern):
            if Path(found).resolve() not in skip and found not in out:
                out.append(found)
    return out


def verdicts(folders: list[str], across_code: bool, tables: list[dict]):
    from ftbench.judge.coverage import coverage_rows, merged_records

    return coverage_rows(merged_records([], folders), tables, across_code=across_code)


def diff(before, after, study: str | None = None) -> list[dict]:
    """One row per published cell: before's and after's figure and verdict, and whether the verdict changed."""
    key = ["study", "variant", "batch", "metric", "published"]

    def cells(table):
        rows = table.to_dicts()
        return {tuple(r.get(k) for k in key): r for r in rows if study is None or r["study"] == study}

    b, a = cells(before), cells(after)
    out = []
    for k in list(dict.fromkeys([*b, *a])):
        rb, ra = b.get(k, {}), a.get(k, {})
        out.append({"study": k[0], "cell": f"{k[1]}" + (f" bs{k[2]}" if k[2] is not None else ""), "metric": k[3],
                    "published": k[4], "before": rb.get("ours"), "before verdict": rb.get("verdict"),
                    "after": ra.get("ours"), "after verdict": ra.get("verdict"),
                    "changed": rb.get("verdict") != ra.get("verdict")})
    return out


def markdown(rows: list[dict]) -> str:
    cols = ["study", "cell", "published", "before", "before verdict", "after", "after verdict", "changed"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for r in rows:
        lines.append("| " + " | ".join("**yes**" if c == "changed" and r[c] else "" if c == "changed" else
                                       str(r[c] if r[c] is not None else "-") for c in cols) + " |")
    changed = sum(r["changed"] for r in rows)
    return "\n".join(lines) + f"\n\n{changed} of {len(rows)} cells changed their verdict.\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", nargs="+", required=True)
    ap.add_argument("--after", nargs="+", required=True)
    ap.add_argument("--study", default=None, help="A, B, C or D (default: all)")
    ap.add_argument("--before-across-code", action="store_true")
    ap.add_argument("--changed-only", action="store_true")
    args = ap.parse_args(argv)
    after = sources(args.after)
    before = sources(args.before, leave_out=after)
    if not after or not before:
        print(f"nothing to compare: before {len(before)} folders, after {len(after)}", file=sys.stderr)
        return 2
    tables = coverage_tables()
    rows = diff(verdicts(before, args.before_across_code, tables), verdicts(after, False, tables), args.study)
    print(markdown([r for r in rows if r["changed"] or not args.changed_only]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
