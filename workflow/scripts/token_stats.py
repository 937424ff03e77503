import json
import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.execute import read_manifest  # noqa: E402
from ftbench.tokens import token_stats  # noqa: E402

manifest = read_manifest(snakemake.input.model)
stats = token_stats(manifest["path"], manifest["family"], snakemake.input.data, snakemake.params.dataset["kind"],
                    snakemake.params.max_length)
stats.update(dataset=snakemake.wildcards.dataset, model=snakemake.wildcards.model, scale=manifest["scale"],
             tokenizer=manifest["tokenizer"], data_source=snakemake.params.dataset["source"])
with open(snakemake.output[0], "w") as f:
    json.dump(stats, f, indent=2)
