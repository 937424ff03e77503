"""An adapter saved from several ranks, reloaded by PEFT on one GPU (issue 45): the run's model built whole on one
device from the same seeded draws (ftbench.build.stages), the adapter read by `PeftModel.from_pretrained`, its tensors
compared with the saved file, and one batch's loss with and without the adapter. Prints one JSON line and writes it
to <run dir>/adapter/reload.json. Usage: python3 bench/adapter_check.py RUN_DIR (…/lora-fsdp2/bs4)"""
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from ftbench.build.stages import build_model

run = Path(sys.argv[1])
record = json.loads((run / "metrics.json").read_text())
model, scale = record["run"]["model"], record["run"]["scale"]
manifest = json.loads(Path(f"results/models/{model}/{scale}/model.json").read_text())
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
t0 = time.perf_counter()
if manifest.get("build") == "in_process":
    base, _ = build_model(manifest, manifest["seed"], device)
else:  # a checkpoint the materialize job wrote
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(manifest["path"], dtype=torch.bfloat16).to(device)
built = time.perf_counter() - t0
ids = torch.randint(0, base.config.vocab_size, (1, 256), generator=torch.Generator().manual_seed(0)).to(device)
with torch.no_grad():
    loss_base = base(input_ids=ids, labels=ids).loss.item()
from peft import PeftModel  # noqa: E402

t0 = time.perf_counter()
model_ = PeftModel.from_pretrained(base, str(run / "adapter"))
loaded = time.perf_counter() - t0
saved = load_file(str(run / "adapter" / "adapter_model.safetensors"))
mine = {n: p for n, p in model_.named_parameters() if ".lora_" in n}
equal = 0
for key, tensor in saved.items():  # PEFT's file names drop the adapter's name ("default")
    match = [p for n, p in mine.items() if n.replace(".default", "").endswith(key.removeprefix("base_model.model."))]
    equal += len(match) == 1 and torch.equal(match[0].detach().cpu().to(tensor.dtype), tensor)
with torch.no_grad():
    loss_adapted = model_(input_ids=ids, labels=ids).loss.item()
b_nonzero = sum(1 for k, t in saved.items() if "lora_B" in k and t.abs().sum() > 0)
out = {"run": str(run), "status": record["status"], "world_size": record["parallel"]["world_size"],
       "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
       "saved_tensors": len(saved), "loaded_lora_parameters": len(mine), "equal_to_file": equal,
       "lora_B_nonzero": b_nonzero, "loss_base": loss_base, "loss_with_adapter": loss_adapted,
       "build_s": built, "load_adapter_s": loaded, "adapter_save": record["extra"].get("adapter_save")}
print(json.dumps(out))
(run / "adapter" / "reload.json").write_text(json.dumps(out, indent=2))
sys.exit(0 if equal == len(saved) == len(mine) and b_nonzero else 1)
