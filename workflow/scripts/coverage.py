import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

from ftbench.judge.analysis import aggregate, html_page, read_runs  # noqa: E402
from ftbench.judge.compare import headline, read_quality  # noqa: E402
from ftbench.config.settings import load_yaml  # noqa: E402
from ftbench.judge.coverage import coverage_html, coverage_rows, front_html, merged_records, provenance_line  # noqa: E402
from ftbench.judge.coverage import shipped_records  # noqa: E402

published = {Path(p).name: load_yaml(p) for p in snakemake.input.published}  # the rule's inputs, by file name
tables = [{**t, "published": published[Path(t["published"]).name]} for t in snakemake.params.tables]
runs = merged_records(snakemake.input.runs, snakemake.input.extra)
table = coverage_rows(runs, tables, across_code=snakemake.params.across_code)
table.write_csv(snakemake.output.csv)
shipped, fastest = None, None
if snakemake.input.shipped:  # what ships in measurements/, judged on its own (config shipped_runs)
    frames = {f: read_runs(f) for f in snakemake.input.shipped}  # each folder read once, for both uses below
    theirs, campaigns, only = shipped_records(snakemake.input.shipped, tables, frames)
    shipped = (coverage_rows(theirs, tables, across_code=snakemake.params.across_code, only=only),
               " ".join(filter(None, [campaigns, provenance_line(theirs, snakemake.params.across_code, dates=True)])))
    if snakemake.params.frontier:  # the fastest LoRA measured and its peers at their best (Study B's frontier)
        llm, replaced = aggregate([], list(frames.values()), study="llm", with_replaced=True)
        fastest = headline(llm, replaced, quality=read_quality(snakemake.input.quality), **snakemake.params.frontier)
records = pl.concat([runs, theirs], how="diagonal_relaxed") if shipped else runs  # the legend's knobs
mine = provenance_line(runs, snakemake.params.across_code)
fragment = coverage_html(table, mine, shipped, fastest, records, snakemake.params.pool)
# the report's front page: each study's verdicts as a grid; this page: every cell
Path(snakemake.output.front).write_text(front_html(table, mine, shipped, snakemake.params.pages, records,
                                                   snakemake.params.pool))
Path(snakemake.output.html).write_text(html_page("ftbench: what the records reproduce", [fragment]))
