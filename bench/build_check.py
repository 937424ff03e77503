"""Build a random model at full scale in this process (ftbench.build.stages; nothing written but the tokenizer and config)
and take a few LoRA training steps on random tokens: prints build time, peak host and GPU memory, disk used, and
each step's time and peak memory. A check of the build and of what fits, before the pipeline's measured runs.

    python bench/build_check.py gpt-oss-120b --precision nf4 --batch 16 --tokens 2048 --steps 3
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch

from ftbench.config.architectures import load_architecture
from ftbench.build.stages import build_model
from ftbench.config.settings import Variant
from ftbench.build.models import materialize_model
from ftbench.build.variants import apply_lora, quantization_config

GIB = 2**30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="an architecture under config/architectures/ (without .yaml)")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--precision", default="nf4", choices=["nf4", "bf16"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per row")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    arch = load_architecture(Path(__file__).resolve().parents[1] / "config/architectures" / f"{a.model}.yaml", a.scale)
    out = {"model": a.model, "scale": a.scale, "precision": a.precision, "device": str(device)}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        manifest = materialize_model(arch, "random", tmp, a.seed, build="in_process")
        out["materialize_s"] = time.perf_counter() - t0
        out["disk_bytes"] = manifest["disk_bytes"]
        variant = Variant(name="check", precision=a.precision, gradient_checkpointing=True)
        model, facts = build_model(manifest, a.seed, device, torch.bfloat16, quantization_config(variant))
    out["build"] = facts
    model = apply_lora(model, variant, {"r": 8, "alpha": 16, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]})
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    g = torch.Generator().manual_seed(a.seed)
    steps = []
    for _ in range(a.steps):
        ids = torch.randint(0, 3000, (a.batch, a.tokens), generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            steps.append({"s": time.perf_counter() - t, "loss": loss.item()})
        except torch.OutOfMemoryError as e:
            steps.append({"oom": str(e).splitlines()[0][:200]})
            break
    out["steps"] = steps
    if device.type == "cuda":
        out["gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        out["gpu_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    out["host_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
