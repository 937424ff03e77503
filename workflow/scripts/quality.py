import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

from ftbench import quality  # noqa: E402
from ftbench.analysis import aggregate, html_page, read_runs  # noqa: E402

p = snakemake.params
shipped = [read_runs(f) for f in snakemake.input.shipped]  # each measurements/ folder read once
df = aggregate(snakemake.input.metrics, shipped, study=p.study)  # this study's records, ours and shipped
speed = pl.concat([s for s in shipped if len(s)], how="diagonal_relaxed") if any(len(s) for s in shipped) else None
rows = quality.quality_rows(df, p.settings["baseline"], p.settings.get("seeds") or [], p.variants, speed, p.lineage,
                            p.settings, p.seed)
claims = quality.claims_rows(rows, p.settings.get("claims") or [], p.variants)
frame = quality.curves_frame(df)
chart = quality.svg(quality.curves_chart(frame)) if len(frame) else "<p>No held-out curve was measured.</p>"
answers = [json.loads(Path(a).read_text()) for a in snakemake.input.answers]
errors = [json.loads(Path(e).read_text()) for e in snakemake.input.fp8_errors]
origin = quality.origin_line(df)
# the report's front page: the answers at a glance; the quality page: every table
Path(snakemake.output.front).write_text(quality.front_fragment(rows, claims, chart, answers, origin, errors, full=False))
page = quality.front_fragment(rows, claims, chart, answers, origin, errors)
Path(snakemake.output.html).write_text(html_page(p.title, [f"<div>{page}</div>"]))
quality.verdict_table(rows).write_csv(snakemake.output.csv)
for r in rows:
    print(r["gpu"], r["variant"], r["quality"], r["why"])
