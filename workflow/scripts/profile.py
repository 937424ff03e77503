import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.run.supervise import supervise  # noqa: E402

i, o = snakemake.input, snakemake.output
summary = supervise("profile", snakemake.params.run,
                    {"model": i.model, "train": i.train, "eval": i.eval, "cache": i.get("cache"),
                     "base_dir": snakemake.params.base_dir, "trace": o.trace, "summary": o.summary}, snakemake.log[0])
print(summary["status"], summary["reason"] or "")
