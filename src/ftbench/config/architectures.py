"""Model architectures shipped with the code, resolved at a scale (tiny / proxy / full)."""

from __future__ import annotations

import copy

from ftbench.config.settings import load_yaml

SCALES = ("tiny", "proxy", "full")


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_architecture(path, scale: str) -> dict:
    """The architecture file with its scale overrides applied (full = as published)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; one of {SCALES}")
    arch = load_yaml(path)
    if scale != "full" and scale not in (arch.get("scales") or {}):  # never the full model in its place
        why = (arch.get("scales_absent") or {}).get(scale) or f"no scales.{scale} in the file"
        raise ValueError(f"{path}: no {scale} scale: {why}")
    overrides = arch["scales"][scale] if scale != "full" else {}
    if arch["family"] == "diffusion":
        arch["components"] = {
            name: dict(comp, config=deep_merge(comp["config"], overrides.get(name, {})))
            for name, comp in arch["components"].items()
        }
    else:
        arch["config"] = deep_merge(arch["config"], overrides)
        if arch["config"].get("model_type") == "gpt_oss":
            n = arch["config"]["num_hidden_layers"]
            arch["config"]["layer_types"] = [
                "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)
            ]
    arch["scale"] = scale
    arch["file"] = str(path)
    return arch
