import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.run.supervise import supervise  # noqa: E402

# materialization runs in a child process: a crash leaves a manifest that says so (its training jobs then
# record an error naming it) and the matrix goes on
params = {"model": snakemake.params.model, "architecture": snakemake.params.architecture,
          "scale": snakemake.wildcards.scale, "seed": snakemake.params.seed,
          "build_limit_gib": snakemake.params.build_limit_gib}
print(supervise("materialize", params, {"manifest": snakemake.output[0]}, snakemake.log[0], gpus=1))
