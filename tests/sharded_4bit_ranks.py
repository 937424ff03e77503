"""Run by tests/test_sharded.py under torchrun (two gloo ranks on a CPU): QLoRA under FSDP2. A tiny Qwen3 built
sharded in 4-bit (bf16 quant storage), its packed weights and quant states gathered, its logits and LoRA gradients
on fixed tokens, an optimizer step, and the adapter saved from the ranks; rank 0 writes what it saw.

argv: <in_process manifest json> <out dir> <variant name> <gradient checkpointing 0|1>"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ftbench.build import parallel
from ftbench.config.settings import Variant

manifest, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
parallel.ensure_process_group("cpu")
rank = dist.get_rank()
variant = Variant(sys.argv[3], peft="lora", precision="nf4", gpus=2, parallel="fsdp2",
                  gradient_checkpointing=sys.argv[4] == "1")
lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
model, facts, trainer_args, _ = parallel.build_sharded(manifest, 42, torch.device("cpu"), variant, lora)
full = parallel.gather(model, adapters_only=False)
states = {n: {"absmax": m.quant_state.absmax.clone(), "shape": list(m.quant_state.shape)}
          for n, m in model.named_modules() if getattr(m, "quant_state", None) is not None}
ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
model.train()
with torch.no_grad():
    logits = model(input_ids=ids).logits.float()
# B of every LoRA is zero at the start: set it to a seeded value so that the gradients reach A too
with torch.no_grad():
    for name, p in model.named_parameters():
        if ".lora_B." in name:
            local = parallel._local(p)
            start, end = parallel.local_rows(p)
            g = torch.Generator().manual_seed(len(name))
            local.copy_(torch.randn(tuple(p.shape), generator=g)[start:end] * 0.01)
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
         for n, p in model.named_parameters() if p.requires_grad}
dtypes = sorted({(str(p.dtype), str(p.grad.dtype)) for p in model.parameters() if p.requires_grad})
torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=True).step()  # as the trainer
trained = parallel.gather(model)
save = parallel.save_adapter(model, out / "adapter" if rank == 0 else None)
if rank == 0:
    torch.save({"full": full, "states": states, "logits": logits, "grads": grads, "loss": loss.item(),
                "dtypes": dtypes, "trained": trained}, out / "sharded.pt")
    (out / "result.json").write_text(json.dumps({"facts": facts, "save": save, "trainer_args": trainer_args},
                                                default=str))
dist.barrier()
dist.destroy_process_group()
