import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

import polars as pl  # noqa: E402

from ftbench.figures import metric_vs_batch, save_svg  # noqa: E402

df = pl.read_parquet(snakemake.input.runs)
memory = "memory.peak_reserved_gib" if df["memory.peak_reserved_gib"].is_not_null().any() else "memory.host_peak_rss_gib"
for output, column, title, y in (
    (snakemake.output.step_time, "timing.step_time_s", "Steady-state step time (median)", "seconds per step"),
    (snakemake.output.memory, memory, f"Peak memory ({memory.split('.')[1]})", "GiB"),
    (snakemake.output.throughput, "throughput.samples_per_hour", "Samples per hour", "samples / hour"),
):
    save_svg(metric_vs_batch(df, column, title, y), output)
