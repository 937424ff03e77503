"""Building a model: loading and materializing it, its variant's stages (quantize or FP8, fuse, LoRA, attention, the LM head, compile) and sharding it."""
