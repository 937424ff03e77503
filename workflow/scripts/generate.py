import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench.config.settings import variant_knobs  # noqa: E402
from ftbench.run.supervise import supervise  # noqa: E402

# generation runs in a child process: a crash or a hang past its time limit leaves answers that say so
w = snakemake.wildcards
params = {"manifest": snakemake.input.model, "adapter": snakemake.input.adapter, "variant_name": w.variant,
          "variant": variant_knobs(snakemake.config, w.study, w.variant), "generation": snakemake.params.generation,
          "seed": snakemake.params.seed, "eval": snakemake.input.eval, "kind": snakemake.params.kind, "scale": w.scale, "time_limit_s": snakemake.params.generation.get("time_limit_s"),
          "title": f"Answers before and after fine-tuning: {w.model} / {w.dataset} / {w.variant} / batch {w.batch_size}"}
result = supervise("generate", params, {"json": snakemake.output.json, "html": snakemake.output.html}, snakemake.log[0],
                   gpus=1)
print(result.get("status", "ok"), result.get("reason") or "")
