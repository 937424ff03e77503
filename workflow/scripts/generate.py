import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from ftbench import generate  # noqa: E402
from ftbench.config import Variant, variant_knobs  # noqa: E402
from ftbench.harness import pick_device  # noqa: E402
from ftbench.execute import read_manifest  # noqa: E402

w = snakemake.wildcards
gen = {k: v for k, v in snakemake.params.generation.items() if k not in ("prompts", "runs")}
result = generate.before_after(read_manifest(snakemake.input.model),
                               Variant.from_config(w.variant, variant_knobs(snakemake.config, w.study, w.variant)),
                               snakemake.input.adapter, snakemake.params.generation["prompts"], gen,
                               snakemake.params.seed, pick_device())
generate.write(result, snakemake.output.json, snakemake.output.html,
               f"Answers before and after fine-tuning: {w.model} / {w.dataset} / {w.variant} / batch {w.batch_size}")
