import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.execute import context_from_params  # noqa: E402
from ftbench.profiling import profile_run  # noqa: E402

ctx = context_from_params(snakemake.params.run, snakemake.input.model, snakemake.input.train, snakemake.input.eval,
                          snakemake.params.base_dir, cache_path=snakemake.input.get("cache"))
profile_run(ctx, snakemake.output.trace, snakemake.output.summary)
