import sys

sys.stderr = sys.stdout = open(snakemake.log[0], "w")

import torch  # noqa: E402

from ftbench.harness.meter import pick_device  # noqa: E402
from ftbench.run.execute import read_manifest  # noqa: E402
from ftbench.run.runners.diffusion import encode_cache  # noqa: E402

cache = encode_cache(read_manifest(snakemake.input.model)["path"], snakemake.input.train, snakemake.params.resolution,
                     snakemake.params.seed, pick_device())
torch.save(cache, snakemake.output[0])
