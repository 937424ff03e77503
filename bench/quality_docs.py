"""docs/quality.md's table of verdicts, from the shipped quality records (measurements/*/quality/): a row a technique
(a family of seeds) per GPU kind and dataset, its paired verdict as served and as trained, the mean difference from
the baseline with its interval and the margin, regenerated between the page's markers. Prose elsewhere (README,
docs/frontier.md, config comments) quotes no quality figure of its own: it points here, and tests/test_readme.py keeps
this table current (`--check`) and the prose free of hand-typed figures.

    python3 bench/quality_docs.py            # rewrite the table in place
    python3 bench/quality_docs.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PAGE = ROOT / "docs" / "quality.md"
START, END = "<!-- verdicts: bench/quality_docs.py -->", "<!-- /verdicts -->"
CONFIGS = ("config/config.yaml", "config/quality_gpu.yaml")  # the study as its GPU lease ran it


def study_config() -> dict:
    """config/config.yaml with the GPU study's file over it (Snakemake's --configfile merge), its seeds expanded."""
    from snakemake.utils import update_config

    from ftbench.config.settings import expand_seeds, load_yaml

    config = load_yaml(ROOT / CONFIGS[0])
    update_config(config, load_yaml(ROOT / CONFIGS[1]))
    expand_seeds(config)
    return config


def rows(config: dict) -> list[dict]:
    import polars as pl

    from ftbench.judge import quality
    from ftbench.judge.analysis import read_runs
    from ftbench.config.settings import study_lineage, study_variants

    folders = sorted(p for p in (ROOT / "measurements").glob("*/quality") if p.is_dir())
    tables = [t for t in (read_runs(f) for f in folders) if len(t)]
    if not tables:
        return []
    df = pl.concat(tables, how="diagonal_relaxed").filter(pl.col("study") == "quality")
    settings = config["studies"]["quality"]["quality"]
    return quality.quality_rows(df, settings["baseline"], settings.get("seeds") or [],
                                study_variants(config, "quality"), None, study_lineage(config, "quality"), settings,
                                config["seed"])


def fmt(x, spec="+.4f") -> str:
    return "" if x is None else format(x, spec)


def table(found: list[dict], pool: dict) -> str:
    """One table a (GPU, dataset, scoring): a technique a row (its seed-42 run's name), served then as trained;
    `pool`: the study's variants as config writes them (what each adds to its base, in words)."""
    if not found:
        return "No quality record is shipped yet."
    from ftbench.config.techniques import adds_words
    from ftbench.judge.quality_page import interval_text

    heads = {}
    for r in found:  # a technique's row: its head run's (the others carry the same verdicts)
        if r["variant"] == r["technique"]:
            heads.setdefault((r["gpu"], r["dataset"], r["scored"]), {})[r["technique"]] = r
    out = []
    for (gpu, dataset, scored), techniques in heads.items():
        margin = next((r["margin (nats)"] for r in techniques.values() if r["margin (nats)"] is not None), None)
        against = next(iter(techniques.values()))["judged against"]
        out += [f"**{gpu}, {dataset}** (scored on {scored}; against {against}; margin {fmt(margin, '.4f')} nats):", "",
                "| variant | stands on + adds | seeds paired | served: verdict | mean [90 % interval] | as trained: verdict "
                "| mean [90 % interval] |", "|---|---|---:|---|---|---|---|"]
        for name, r in techniques.items():
            words = ("the baseline" if r["judged against"] == name else "the stand-in for the baseline") \
                if r["seed of the baseline"] else adds_words(name, pool) if name in pool else ""
            served = interval_text(r["delta (nats)"], r["interval low"], r["interval high"], r["paired seeds"])
            trained = interval_text(r["delta as trained"], r["as trained low"], r["as trained high"],
                                    r["paired seeds"])
            if r["seed of the baseline"]:
                out.append(f"| `{name}` | {words} | {r['seeds']} seeds | (the baseline) | | (the baseline) | |")
                continue
            out.append(f"| `{name}` | {words} | {r['paired seeds']} | {r['quality']} | {served} | "
                       f"{r['quality (as trained)']} | {trained} |")
        out.append("")
    return "\n".join(out).rstrip()


def render(text: str) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    from ftbench.config.pool import variant_pool

    config = study_config()
    return f"{head}{START}\n{table(rows(config), variant_pool(config, 'quality'))}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = PAGE.read_text()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print(f"{PAGE.relative_to(ROOT)}: its verdict table is stale; run python3 bench/quality_docs.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
