"""Several GPUs in one job, built the way torchtitan builds: on the meta device first, then one function applies the
parallelism to the model, then each rank materializes only what it holds on its own device.

- `parallelize(model, strategy, device)` is the one place a strategy touches a model: FSDP2 shards every decoder
  layer and then the root (`fully_shard`, parameters, gradients and optimizer state split over the ranks); data
  parallel leaves the model whole and asks the trainer for DDP. It returns the trainer's settings for the strategy.
- `build_sharded(...)` builds a causal LM for FSDP2: the skeleton on the meta device (no weights anywhere), FP8
  layers and LoRA applied there, then `parallelize`, then `materialize`: `to_empty` on the rank's device and each
  parameter's local rows filled. An in-process model draws each parameter from the generator `ftbench.build.stages` seeds
  with the run's seed and the parameter's name (on the rank's device, one parameter at a time, keeping the rows the
  rank holds), so the sharded model holds exactly the one-process build's weights; a checkpoint is read slice by
  slice (safetensors), each rank reading only its rows. No rank ever holds the whole model, on the host or the GPU.
  QLoRA (precision nf4): bitsandbytes 4-bit layers with bf16 quant storage, the documented FSDP+QLoRA route; each
  layer's weights are drawn (or read from the checkpoint folder) whole and quantized on the rank's GPU just before
  `fully_shard` splits their packed bytes (one layer whole at a time), with LoRA in bf16 as TRL casts a quantized
  model's adapters.
- `build_fp8_base(...)`: one process, a frozen base kept only in FP8, each projection cast as it lands.
- One GPU's build is ftbench.build.route's stages, the last of them `parallelize`.
- `seed_adapters(model, seed)` gives LoRA's A matrices PEFT's initial distribution from a generator seeded per
  name (B zero), so an adapter starts the same on one GPU and sharded over several.
- `gather` / `save_adapter`: the full LoRA state gathered (every rank takes part; rank 0 keeps it on the
  host) and written by PEFT's `save_pretrained` on rank 0 alone, loadable by PEFT on one GPU.

On CPU ranks (gloo) FSDP2 runs too (torch supports it); the test suite builds, gathers and saves with two of them.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from ftbench.build.stages import (GIB, GENERATOR, _value, build_memory, name_special_tokens, parameter_seed)
from ftbench.harness.ranks import distributed as _dist, world_size
from ftbench.build.fp8_base import stand_ins
from ftbench.build.slices import CheckpointSlices, skeleton_of

STRATEGIES = ("ddp", "fsdp2")


def ensure_process_group(device) -> None:
    """The process group torchrun's ranks share (NCCL on GPUs, gloo on CPUs), started before the model is built
    (the trainer finds it up and keeps it)."""
    import torch.distributed as dist

    if dist.is_initialized() or world_size() < 2:
        return
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")


def device_mesh(device):
    """The one-dimensional mesh of every rank (FSDP2's data-parallel shard dimension)."""
    from torch.distributed.device_mesh import init_device_mesh

    dist = _dist()
    if dist is None:
        raise RuntimeError("FSDP2 needs the ranks' process group (launch the job with torchrun: variant knob gpus)")
    return init_device_mesh(torch.device(device).type, (dist.get_world_size(),))


def parallelize(model, strategy: str | None, device, reshard_after_forward: bool = True,
                bucket_mb: int | None = None, before_shard=None) -> dict:
    """Apply `strategy` to `model` in place and return the trainer's settings for it. fsdp2: every decoder layer,
    then the root (embeddings, final norm, LM head), sharded over all ranks, bf16 parameters kept as they are and
    gradients reduced in fp32 (LoRA's trainable weights are fp32); the trainer is told FSDP2 so that accelerate
    leaves the sharded model as it is (it wraps only what is not an FSDP module). ddp: the model stays whole and
    the trainer wraps it in DistributedDataParallel (no search for unused parameters: LoRA leaves none; no broadcast
    of buffers before each forward: the rotary tables are the same on every rank; `bucket_mb`: its gradient buckets,
    DDP's 25 MB where None). `before_shard(module)`, for FSDP2, runs on each layer and then the root just before
    it is sharded (the 4-bit build quantizes a layer's weights there: one layer whole at a time on a rank)."""
    if strategy is None:
        return {}
    if strategy == "ddp":
        ignored = stand_ins(model)  # no values to broadcast: each rank cast the same weights to FP8 itself
        if ignored:
            from torch.nn.parallel import DistributedDataParallel

            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ignored)
        return {"ddp_find_unused_parameters": False, "ddp_broadcast_buffers": False,
                **({"ddp_bucket_cap_mb": bucket_mb} if bucket_mb else {})}
    if strategy != "fsdp2":
        raise ValueError(f"parallel={strategy!r}: not one of {STRATEGIES}")
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    from ftbench.build.variants import repeated_blocks

    layers = repeated_blocks(model)  # sharded one by one: each layer's gather overlaps the layer before
    if not isinstance(model, FSDPModule):
        mesh = device_mesh(device)
        policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)
        for layer in [*layers, model]:
            if before_shard is not None:
                before_shard(layer)
            fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    names = sorted({type(m).__name__ for m in layers})
    return {"fsdp": True, "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": names,
                                          "reshard_after_forward": reshard_after_forward}}


class BalancedRanks(torch.utils.data.Sampler):
    """A training sampler for several ranks that deals each step's rows so that the ranks' work is even (variant
    knob `balance_ranks`). A step of N ranks at batch B takes N x B rows of a seeded permutation (the same on every
    rank: seed and epoch) and accelerate hands batch k to rank k mod N; this sampler orders each such group so that
    its N batches hold about the same attention cost (`costs`, one per row: longest-processing-time first, each
    row to the batch with the least cost that has room). The step's rows are the same set, so the gradient the
    ranks average is the same; only which rank computes which row changes. Ranks wait for the slowest each step:
    rows of 4,096 tokens whose attention costs differ make one rank the slow one, step after step."""

    def __init__(self, costs, batch_size: int, ranks: int, seed: int):
        self.costs, self.batch, self.ranks, self.seed, self.epoch = list(costs), batch_size, ranks, seed, 0

    def set_epoch(self, epoch: int) -> None:  # accelerate calls this at each epoch's start
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.costs)

    def drawn(self) -> list[int]:
        """The epoch's seeded permutation, as every rank draws it (the order without balancing)."""
        return torch.randperm(len(self.costs), generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()

    def order(self) -> list[int]:
        perm = self.drawn()
        size = self.batch * self.ranks
        out = []
        for start in range(0, len(perm), size):
            group = perm[start:start + size]
            if len(group) < size:  # the last, partial group: as drawn
                out += group
                continue
            bins = [[] for _ in range(self.ranks)]
            load = [0] * self.ranks
            for i in sorted(group, key=lambda i: -self.costs[i]):
                r = min((r for r in range(self.ranks) if len(bins[r]) < self.batch), key=lambda r: load[r])
                bins[r].append(i)
                load[r] += self.costs[i]
            out += [i for b in bins for i in b]
        return out

    def __iter__(self):
        return iter(self.order())

    def imbalance(self, order: list[int] | None = None) -> float | None:
        """The mean over full groups of (the largest rank's cost - the mean rank's) / the mean rank's: what the
        slowest rank adds in attention work, for `order` (this sampler's by default)."""
        order = self.order() if order is None else order
        size, spreads = self.batch * self.ranks, []
        for start in range(0, len(order) - size + 1, size):
            group = order[start:start + size]
            loads = [sum(self.costs[i] for i in group[r * self.batch:(r + 1) * self.batch]) for r in range(self.ranks)]
            mean = sum(loads) / len(loads)
            if mean:
                spreads.append((max(loads) - mean) / mean)
        return sum(spreads) / len(spreads) if spreads else None

    def summary(self) -> dict:
        """The attention-cost spread across ranks with this order and with the plain seeded order."""
        return {"rows": len(self.costs), "ranks": self.ranks, "batch": self.batch,
                "cost": "sum of sequence lengths squared", "slowest_rank_excess_plain": self.imbalance(self.drawn()),
                "slowest_rank_excess_balanced": self.imbalance()}


def base_name(name: str) -> str:
    """A parameter's name in the plain model (the checkpoint's and the seeded draw's), from its name under PEFT."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def is_adapter(name: str) -> bool:
    return ".lora_" in name


def local_rows(p) -> tuple[int, int]:
    """The rows [start, end) of a parameter's dimension 0 that this rank holds (FSDP2's Shard(0): torch.chunk's
    split, the last ranks possibly empty); the whole tensor for a plain one."""
    from torch.distributed.tensor import DTensor

    n = p.shape[0] if p.dim() else 1
    if not isinstance(p, DTensor):
        return 0, n
    mesh = p.device_mesh
    size, me = mesh.size(), mesh.get_local_rank()
    chunk = math.ceil(n / size) if n else 0
    return min(me * chunk, n), min((me + 1) * chunk, n)


def _local(p):
    from torch.distributed.tensor import DTensor

    return p.to_local() if isinstance(p, DTensor) else p


def _owners(model) -> dict:
    """Each parameter's name with the module that holds it (the seeded draw asks a norm's weight for ones)."""
    out = {}
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            out.setdefault(f"{mname}.{pname}" if mname else pname, module)
    return out


def adapter_bound(p) -> float:
    """PEFT's initial LoRA A (Kaiming uniform with a = sqrt(5)): uniform in +-1/sqrt(fan_in)."""
    return 1 / math.sqrt(p.shape[1])


def seed_adapters(model, seed: int, name_of=None) -> int:
    """Every LoRA A drawn uniformly in PEFT's bound from a generator seeded with the run's seed and the parameter's
    name (on the parameter's device type), every LoRA B zero: the model's output is unchanged until it trains, and
    a sharded adapter starts where the one-process adapter starts. `name_of`: another system's parameter name ->
    PEFT's, so that its adapters start where PEFT's do. Returns the adapter matrices set."""
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not is_adapter(name):
                continue
            local, (start, end) = _local(p), local_rows(p)
            if ".lora_B." in name:
                local.zero_()
            else:
                key = name_of(name) if name_of else name
                g = torch.Generator(device=local.device).manual_seed(parameter_seed(seed, key))
                bound = adapter_bound(p)
                full = torch.empty(tuple(p.shape), dtype=torch.float32, device=local.device).uniform_(
                    -bound, bound, generator=g)
                local.copy_(full[start:end])
            n += 1
    return n


def materialize(model, device, seed: int, std: float, checkpoint=None) -> dict:
    """Give a sharded meta model its storage on `device` (`to_empty`) and fill the rows this rank holds: each
    parameter from its seeded draw (the whole tensor drawn on the device, its rows kept, then freed) or, with
    `checkpoint` (a folder of safetensors), read as the rank's slice of that tensor. Buffers the skeleton made real
    (rotary tables) keep their values. Returns counts for the record."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    # what was real before sharding (4-bit weights quantized whole, then split) keeps the rows it was given
    kept = {n: _local(p).detach().clone() for n, p in model.named_parameters() if not _local(p).is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in buffers:
                b.copy_(buffers[n])
        source = CheckpointSlices(checkpoint) if checkpoint is not None else None
        owners, drawn, read, local_bytes = _owners(model), 0, 0, 0
        for name, p in model.named_parameters():
            if name in kept:
                _local(p).copy_(kept.pop(name))
                local_bytes += _local(p).numel() * _local(p).element_size()
                continue
            if is_adapter(name):
                continue
            local, (start, end) = _local(p), local_rows(p)
            base = base_name(name)
            if source is not None:
                value = source.rows(base, start, end)
                read += 1
            else:
                value = _value(base, owners[name], tuple(p.shape), std, seed, device)[start:end]
                drawn += 1
            if tuple(value.shape) != tuple(local.shape):
                raise RuntimeError(f"{name}: rows {start}-{end} of {tuple(p.shape)} give {tuple(value.shape)}, "
                                   f"the rank holds {tuple(local.shape)}")
            local.copy_(value)
            local_bytes += local.numel() * local.element_size()
            del value
    return {"parameters_drawn": drawn, "parameters_read": read, "local_gib": local_bytes / GIB}


def adapters_as_trl_casts(model) -> int:
    """Every trainable parameter in bf16, before sharding: TRL's SFTTrainer casts a quantized model's trainable
    parameters to bf16 (`param.data = ...`) when it is built, which on one GPU is QLoRA's LoRA dtype; done after
    FSDP2 has sharded them it left FSDP2's recorded dtype (fp32) behind, and the optimizer's first step met bf16
    gradients beside fp32 state (2026-11-26, two H100s). Returns how many were cast."""
    n = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.bfloat16:
            p.data = p.data.to(torch.bfloat16)
            n += 1
    return n


def _no_cpu_repack(model) -> int:
    """bitsandbytes repacks a 4-bit weight in place for its CPU inference kernel (weight.data replaced): under FSDP2
    the weight is the ranks' gathered copy, rebuilt at each gather, so every 4-bit layer keeps the plain
    dequantizing path (the same arithmetic). Returns how many layers were told."""
    n = 0
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
            n += 1
    return n


def build_sharded(manifest: dict, seed: int, device, variant, lora: dict) -> tuple:
    """The causal LM of `manifest` (in process: seeded draws; else its checkpoint folder), with the variant's FP8
    layers and LoRA, sharded with FSDP2 over the ranks and materialized rank by rank on `device`. Returns (model,
    build facts, the trainer's settings, FP8 conversion summary or None)."""
    from ftbench.build import fp8
    from ftbench.build.stages import draw_4bit, prepare_4bit
    from ftbench.build.variants import apply_lora, quantization_config

    t0 = time.perf_counter()
    model, config, in_process = skeleton_of(manifest, seed)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    fp8_info, four_bit, std = None, {}, getattr(config, "initializer_range", 0.02)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if variant.precision == "fp8":  # the frozen projections in FP8, on the meta device
        fp8_info = fp8.convert_decoder(model, variant.fp8_recipe)
    quant = quantization_config(variant, quant_storage=torch.bfloat16)
    if quant is not None:  # QLoRA under FSDP2: the layers 4-bit on the meta device, their weights drawn (or read
        prepare_4bit(model, quant, device).postprocess_model(model)  # from the checkpoint) below; marked as TRL reads
    model = apply_lora(model, variant, lora)
    before_shard = None
    if quant is not None:
        four_bit = {"cpu_repack_off": _no_cpu_repack(model), "adapters_bf16": adapters_as_trl_casts(model),
                    "quant_storage": "bfloat16", "quantized_4bit": 0, "quantized_at_once_max": 0, "quantize_s": 0.0}
        where = {id(m): n for n, m in model.named_modules()}
        read = None if in_process else CheckpointSlices(manifest["path"]).tensor

        def quantize_layer(module):  # each layer's 4-bit weights drawn (or read) whole and quantized just before
            t4 = time.perf_counter()  # FSDP2 splits their packed bytes: one layer whole at a time on a rank
            n = draw_4bit(module, seed, device, std, where[id(module)], base_name, read)
            four_bit["quantized_4bit"] += n
            four_bit["quantized_at_once_max"] = max(four_bit["quantized_at_once_max"], n)
            four_bit["quantize_s"] += time.perf_counter() - t4
        before_shard = quantize_layer
    trainer_args = parallelize(model, "fsdp2", device, before_shard=before_shard)
    counts = materialize(model, device, seed, std,
                         checkpoint=None if in_process else manifest["path"])
    counts.update(four_bit)
    counts["adapters_seeded"] = seed_adapters(model, seed)
    if in_process:
        name_special_tokens(model, manifest)
    dist = _dist()
    facts = {"method": ("in_process, sharded (FSDP2 over the ranks: each drew only its rows)" if in_process
                        else "checkpoint, sharded (FSDP2 over the ranks: each read only its rows)"),
             "build_s": time.perf_counter() - t0, "generator": GENERATOR if in_process else None, "seed": seed,
             "device": str(device), "world_size": dist.get_world_size() if dist else 1, **counts,
             **build_memory(device), "disk_bytes": manifest.get("disk_bytes"), "checkpoint_bf16_gib": manifest.get("checkpoint_bf16_gib")}
    model.eval()
    return model, facts, trainer_args, fp8_info


def gather(model, adapters_only: bool = True) -> dict:
    """The full value of every LoRA parameter (or, `adapters_only=False`, of every parameter), gathered from the
    ranks' shards onto the host: every rank must call it, and each gets the whole tensors."""
    from torch.distributed.tensor import DTensor

    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True)
            for name, p in model.named_parameters() if not adapters_only or (p.requires_grad and is_adapter(name))}


def save_adapter(model, out_dir=None) -> dict:
    """The adapter of a (possibly sharded) PEFT model saved in PEFT's format in `out_dir`: its LoRA state gathered
    from the ranks (every rank calls this, also those with no `out_dir`: a rank that skipped the gather met rank 0's
    all-gathers with its next collective, 2026-11-26, four H100s), then written by rank 0 alone: the tensors under the names PEFT's own
    `get_peft_model_state_dict` gives them (adapter_model.safetensors) and the adapter's config (adapter_config.json),
    what `PeftModel.from_pretrained` reads on one GPU. A failure to write is caught, all ranks still meet at the
    barrier, and it is raised on rank 0 after it.
    Returns the facts for the record: gather and save seconds, the tensors and bytes written."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    dist = _dist()
    t0 = time.perf_counter()
    state = gather(model)
    gathered = time.perf_counter()
    rank = dist.get_rank() if dist else 0
    error = None
    if rank == 0 and out_dir is not None:
        try:
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            peft_state = get_peft_model_state_dict(model, state_dict=state, adapter_name="default")
            save_file({k: v.contiguous() for k, v in peft_state.items()}, str(out / "adapter_model.safetensors"),
                      metadata={"format": "pt"})
            model.peft_config["default"].save_pretrained(str(out))
        except Exception as e:  # noqa: BLE001  (raised below, once every rank has left the barrier)
            error = e
    if dist is not None:
        dist.barrier()
    if error is not None:
        raise RuntimeError(f"rank 0 could not write the gathered adapter: {type(error).__name__}: {error}") from error
    facts = {"gather_s": gathered - t0, "save_s": time.perf_counter() - gathered, "tensors": len(state),
             "bytes": sum(t.numel() * t.element_size() for t in state.values()), "written_by_rank": 0,
             "world_size": dist.get_world_size() if dist else 1}
    if rank == 0 and out_dir is not None:
        (Path(out_dir) / "gathered.json").write_text(json.dumps(facts, indent=2))
    return facts
