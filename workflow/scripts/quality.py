import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

from ftbench.judge import quality, quality_page  # noqa: E402
from ftbench.judge.analysis import aggregate, html_page, legend_block, read_runs  # noqa: E402
from ftbench.config.techniques import display_names, peer  # noqa: E402

p = snakemake.params
shipped = [read_runs(f) for f in snakemake.input.shipped]  # each measurements/ folder read once
df = aggregate(snakemake.input.metrics, shipped, study=p.study)  # this study's records, ours and shipped
speed = pl.concat([s for s in shipped if len(s)], how="diagonal_relaxed") if any(len(s) for s in shipped) else None
variants = quality.recorded_seeds(df["variant"].unique().to_list() if len(df) else [], p.variants)
rows = quality.quality_rows(df, p.settings["baseline"], p.settings.get("seeds") or [], variants, speed, p.lineage,
                            p.settings, p.seed)
claims = quality.claims_rows(rows, p.settings.get("claims") or [], p.variants)
frame = quality_page.curves_frame(quality.latest_scoring(df))  # one scoring a GPU and dataset
chart = quality_page.svg(quality_page.curves_chart(frame)) if len(frame) else "<p>No held-out curve was measured.</p>"
answers = [json.loads(Path(a).read_text()) for a in snakemake.input.answers]
errors = [json.loads(Path(e).read_text()) for e in snakemake.input.fp8_errors]
origin = quality_page.origin_line(df)
shown = [r["variant"] for r in rows]
named = {"names": display_names(shown, records=p.variants, lineages=p.lineage),
         "peers": {n: peer(k) for n, k in p.variants.items()}}
base = p.settings["baseline"]
curves = quality_page.svg(quality_page.baseline_curves_chart(frame, base, named["names"].get(base, base))) \
    if len(frame) else None
# the report's front page: the answers at a glance; the quality page: every table
Path(snakemake.output.front).write_text(
    quality_page.front_fragment(rows, claims, chart, answers, origin, errors, full=False, front_curves=curves,
                                **named))
heads = [r["variant"] for r in rows if r.get("technique", r["variant"]) == r["variant"]]  # the verdict table's rows
legend = legend_block([("", pl.DataFrame({"variant": heads}), "")], p.pool, df)
page = quality_page.front_fragment(rows, claims, chart, answers, origin, errors, legend=legend, **named)
Path(snakemake.output.html).write_text(html_page(p.title, [f"<div>{page}</div>"]))
quality_page.verdict_table(rows).write_csv(snakemake.output.csv)
for r in rows:
    print(r["gpu"], r["variant"], r["quality"], r["why"])
