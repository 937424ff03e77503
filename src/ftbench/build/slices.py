"""A model's skeleton on the meta device and its checkpoint read in slices: the rows of each tensor a rank holds,
read from the safetensors files without the whole tensor in memory."""

from __future__ import annotations

import glob
from pathlib import Path

from ftbench.build.stages import manifest_config, skeleton


class CheckpointSlices:
    """A safetensors checkpoint read a slice at a time: only the rows a rank holds leave the disk."""

    def __init__(self, path):
        from safetensors import safe_open

        files = sorted(glob.glob(str(Path(path) / "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"{path}: no *.safetensors files to read the model's shards from")
        self.handles = [safe_open(f, framework="pt", device="cpu") for f in files]
        self.where = {k: h for h in self.handles for k in h.keys()}
        # a model with tied embeddings (SmolLM2: tie_word_embeddings) saves the embedding once; its LM head reads it
        self.alias = {name.replace("model.embed_tokens.", "lm_head."): name for name in self.where
                      if name.startswith("model.embed_tokens.")
                      and name.replace("model.embed_tokens.", "lm_head.") not in self.where}

    def _key(self, name: str) -> str:
        name = self.alias.get(name, name)
        if name not in self.where:
            raise KeyError(f"the checkpoint has no tensor {name!r}")
        return name

    def rows(self, name: str, start: int, end: int):
        name = self._key(name)
        part = self.where[name].get_slice(name)
        return part[start:end] if part.get_shape() else part[:]

    def tensor(self, name: str):
        """One whole tensor (a one-process build reads each parameter so, one at a time)."""
        name = self._key(name)
        return self.where[name].get_tensor(name)


def skeleton_of(manifest: dict, seed: int) -> tuple:
    """(the meta-device skeleton, its config, whether it is built in process) of a manifest: an in-process model's
    architecture (checked against the run's seed), else its checkpoint folder's config."""
    from transformers import AutoConfig

    in_process = manifest.get("build") == "in_process"
    if in_process:
        arch, config = manifest_config(manifest, seed)
    else:
        arch, config = {"file": manifest["path"]}, AutoConfig.from_pretrained(manifest["path"])
    return skeleton(arch, config), config, in_process
