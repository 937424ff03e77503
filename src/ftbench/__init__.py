"""ftbench: measure what fine-tuning efficiency techniques buy on a given GPU."""

__version__ = "0.1.0"
