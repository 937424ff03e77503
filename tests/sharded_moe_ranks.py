"""Run by tests/test_sharded.py under torchrun (two gloo ranks on a CPU): a tiny gpt-oss (mixture of experts, attention
sinks) built sharded with FSDP2 from the meta device, one forward and backward under bf16 autocast (as the trainer
runs it), its LoRA gradients present, the whole model gathered; rank 0 writes what it saw as JSON.

argv: <in_process manifest json> <out json>"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ftbench.build import parallel
from ftbench.config.settings import Variant

manifest, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
parallel.ensure_process_group("cpu")
variant = Variant("lora-gc-fsdp2", peft="lora", precision="bf16", gpus=2, parallel="fsdp2", gradient_checkpointing=True)
lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
model, facts, _, _ = parallel.build_sharded(manifest, 42, torch.device("cpu"), variant, lora)
model.train()
ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(dist.get_rank()))
with torch.autocast("cpu", dtype=torch.bfloat16):
    loss = model(input_ids=ids, labels=ids).loss
loss.backward()
grads = sum(p.grad is not None for n, p in model.named_parameters() if p.requires_grad)
full = parallel.gather(model, adapters_only=False)
if dist.get_rank() == 0:
    out.write_text(json.dumps({"loss": loss.item(), "lora_grads": grads, "parameters": len(full),
                               "experts": sum(".experts." in n for n in full), "facts": facts}, default=str))
dist.barrier()
dist.destroy_process_group()
