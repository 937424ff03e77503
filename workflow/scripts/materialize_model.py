import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

from ftbench.architectures import load_architecture  # noqa: E402
from ftbench.harness import pick_device  # noqa: E402
from ftbench.models import materialize_model  # noqa: E402

arch = load_architecture(snakemake.params.architecture, snakemake.wildcards.scale)
manifest = materialize_model(arch, snakemake.params.model["source"], Path(snakemake.output[0]).parent,
                             snakemake.params.seed, device=str(pick_device()))
print(manifest)
