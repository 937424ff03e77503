import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.run.supervise import supervise  # noqa: E402

# the training runs in a child process: a crash, a hang past the time limit or a host-memory blow-up is a record
i, o = snakemake.input, snakemake.output
record = supervise("train", snakemake.params.run,
                   {"model": i.model, "train": i.train, "eval": i.eval, "cache": i.get("cache"),
                    "base_dir": snakemake.params.base_dir, "metrics": o.metrics, "steps": o.steps, "memory": o.memory,
                    "adapter": o.adapter}, snakemake.log[0])
print(record["status"], record["reason"] or "")
