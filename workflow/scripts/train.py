import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.execute import context_from_params, execute  # noqa: E402

ctx = context_from_params(snakemake.params.run, snakemake.input.model, snakemake.input.train, snakemake.input.eval,
                          snakemake.params.base_dir, cache_path=snakemake.input.get("cache"),
                          adapter_dir=snakemake.output.adapter)
record = execute(ctx, snakemake.output.metrics, snakemake.output.steps, snakemake.output.memory)
print(record["status"], record["reason"] or "")
