import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

from pathlib import Path  # noqa: E402

from ftbench.architectures import load_architecture  # noqa: E402
from ftbench.config import checkpoint_family  # noqa: E402
from ftbench.harness import pick_device  # noqa: E402
from ftbench.models import local_checkpoint_manifest, materialize_model  # noqa: E402

out = Path(snakemake.output[0]).parent
if not snakemake.params.architecture:  # a local checkpoint folder: its own config, its own size
    source = Path(snakemake.params.model["source"]).expanduser()
    manifest = local_checkpoint_manifest(source, checkpoint_family(source), out)
else:
    arch = load_architecture(snakemake.params.architecture, snakemake.wildcards.scale)
    manifest = materialize_model(arch, snakemake.params.model["source"], out, snakemake.params.seed,
                                 device=str(pick_device()))
print(manifest)
