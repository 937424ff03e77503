"""Run by tests/test_sharded.py under torchrun (two gloo ranks on a CPU): build a tiny Qwen3 sharded with FSDP2 from
the meta device, gather it, train it a step, save its adapter from the ranks; rank 0 writes what it saw as JSON.

argv: <in_process manifest json> <checkpoint manifest json> <out dir>"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ftbench.build import parallel
from ftbench.config.settings import Variant

in_process, checkpoint, out = json.loads(Path(sys.argv[1]).read_text()), json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3])
parallel.ensure_process_group("cpu")
rank = dist.get_rank()
variant = Variant("lora-fsdp2", peft="lora", precision="bf16", gpus=2, parallel="fsdp2")
lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
result = {}
for name, manifest in (("in_process", in_process), ("checkpoint", checkpoint)):
    model, facts, trainer_args, _ = parallel.build_sharded(manifest, 42, torch.device("cpu"), variant, lora)
    full = parallel.gather(model, adapters_only=False)
    local = {n: tuple(parallel._local(p).shape) for n, p in model.named_parameters()}
    if rank == 0:
        torch.save(full, out / f"{name}.pt")
    result[name] = {"facts": facts, "trainer_args": trainer_args, "local_shapes": {n: list(s) for n, s in local.items()},
                    "global_shapes": {n: list(t.shape) for n, t in full.items()},
                    "types": sorted({type(m).__name__ for m in model.modules() if type(m).__name__.startswith("FSDP")})}
# a step of training on the sharded in-process model: LoRA's B leaves zero, then the adapter is saved from both ranks
model, _, _, _ = parallel.build_sharded(in_process, 42, torch.device("cpu"), variant, lora)
model.train()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(rank))
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
opt.step()
trained = parallel.gather(model)
save = parallel.save_adapter(model, out / "adapter" if rank == 0 else None)  # as the jobs call it
if rank == 0:
    torch.save(trained, out / "trained.pt")
    result["save"] = save
    result["loss"] = loss.item()
    (out / "result.json").write_text(json.dumps(result, default=str))
dist.barrier()
dist.destroy_process_group()
