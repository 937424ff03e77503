import json
import sys
import traceback

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.run.execute import read_manifest  # noqa: E402
from ftbench.data.tokens import token_stats  # noqa: E402

manifest = read_manifest(snakemake.input.model)
ident = dict(dataset=snakemake.wildcards.dataset, model=snakemake.wildcards.model, scale=manifest["scale"],
             tokenizer=manifest["tokenizer"], data_source=snakemake.params.dataset["source"])
try:
    stats = token_stats(manifest["path"], manifest["family"], snakemake.input.data, snakemake.params.dataset["kind"],
                        snakemake.params.max_length)
except Exception as e:  # noqa: BLE001 — a statistic that cannot be computed is a row saying why, not a missing report
    traceback.print_exc()
    stats = {"error": f"{type(e).__name__}: {e}"[:500], "max_length": snakemake.params.max_length}
stats.update(ident)
with open(snakemake.output[0], "w") as f:
    json.dump(stats, f, indent=2)
