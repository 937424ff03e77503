import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.run.profiling import profile_page  # noqa: E402

profile_page(snakemake.input.summary, snakemake.output[0])
