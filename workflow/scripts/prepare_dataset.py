import json
import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.data.datasets import prepare_dataset  # noqa: E402

summary = prepare_dataset(dict(snakemake.params.dataset, name=snakemake.wildcards.dataset), snakemake.params.seed, snakemake.output.train,
                          snakemake.output.eval)
with open(snakemake.output.summary, "w") as f:
    json.dump(summary, f, indent=2)
