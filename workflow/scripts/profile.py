import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.profiling import profile_run  # noqa: E402
from ftbench.runners import context_from_config  # noqa: E402

ctx = context_from_config(snakemake.config, dict(snakemake.wildcards), snakemake.input.model, snakemake.input.train,
                          snakemake.input.eval, snakemake.params.base_dir,
                          cache_path=snakemake.input.get("cache"))
profile_run(ctx, snakemake.output.trace, snakemake.output.summary)
