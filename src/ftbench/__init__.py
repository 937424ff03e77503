"""ftbench: measure what fine-tuning efficiency techniques buy on a given GPU."""

import os

__version__ = "0.1.0"

# Offline first: no library phones home from a benchmark job (huggingface_hub's telemetry, which TRL's
# trainers start, and the conventions other libraries read). Hub access itself is switched off by the
# Snakefile when no source of the config names the hub (ftbench.config.settings.offline_env).
for _var in ("HF_HUB_DISABLE_TELEMETRY", "DO_NOT_TRACK", "DISABLE_TELEMETRY", "HF_HUB_DISABLE_IMPLICIT_TOKEN"):
    os.environ.setdefault(_var, "1")
