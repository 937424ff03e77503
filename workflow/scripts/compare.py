import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

import polars as pl  # noqa: E402

from ftbench.judge.compare import comparison_page, read_quality  # noqa: E402
from ftbench.config.settings import load_yaml  # noqa: E402

published = load_yaml(snakemake.input.published[0]) if snakemake.input.published else {}
html = comparison_page(pl.read_parquet(snakemake.input.runs), f"{snakemake.params.title}: comparisons",
                       snakemake.params.comparisons, published, snakemake.params.variants,
                       replaced=pl.read_parquet(snakemake.input.replaced),
                       quality=read_quality(snakemake.input.quality), pool=snakemake.params.pool)
with open(snakemake.output[0], "w") as f:
    f.write(html)
