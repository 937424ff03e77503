import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.judge.analysis import aggregate, display_table, to_html  # noqa: E402

df, replaced = aggregate(snakemake.input.metrics, snakemake.input.extra, study=snakemake.wildcards.study,
                         profiles=snakemake.input.profiles, with_replaced=True)
df.write_parquet(snakemake.output.parquet)
replaced.write_parquet(snakemake.output.replaced)
df.write_csv(snakemake.output.csv)
with open(snakemake.output.html, "w") as f:
    f.write(to_html(display_table(df), snakemake.params.title, note=f"{df.height} runs; weights and data sources "
                    "in the last columns: losses of random weights mean nothing, speed and memory do.",
                    pool=snakemake.params.pool, records=df))
