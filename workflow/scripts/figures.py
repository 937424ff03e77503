import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

import polars as pl  # noqa: E402

from ftbench.judge.analysis import peak_memory  # noqa: E402
from ftbench.judge.figures import metric_vs_batch, save_svg  # noqa: E402

df = pl.read_parquet(snakemake.input.runs)
# device memory where a GPU ran, the host's peak RSS on a CPU (each machine has its own row of panels)
df = df.with_columns(peak_memory_gib=peak_memory())
for output, column, title, y in (
    (snakemake.output.step_time, "timing.step_time_s", "Steady-state step time (median)", "seconds per step"),
    (snakemake.output.memory, "peak_memory_gib", "Peak memory (reserved on a GPU, host RSS on a CPU)", "GiB"),
    (snakemake.output.throughput, "throughput.samples_per_hour", "Samples per hour", "samples / hour"),
    (snakemake.output.first_step, "timing.first_step_s", "First step (includes compilation)", "seconds"),
):
    save_svg(metric_vs_batch(df, column, title, y), output)
