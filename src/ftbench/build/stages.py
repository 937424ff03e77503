"""Random-weight causal LMs built in the process that uses them, never written whole.

A full-scale random checkpoint can be larger than the disk or the host memory it is written to (Qwen3-32B in
bf16 is 65.5 GB, gpt-oss-120b ~234 GB). Here the model is constructed on the meta device, then each parameter
is drawn on the target device from a generator seeded by the run's seed and the parameter's name, one module
after another in the model's order (a layer at a time); a 4-bit model quantizes each linear layer's weight as it
is drawn (bitsandbytes NF4 through transformers' own quantizer), so no bf16 copy of the model ever exists.

The materialize job draws the same way before it writes a checkpoint (small scales), so a model built here and
the checkpoint written there hold the same tensors on the same device type (tests/test_build.py). Values depend
on the seed, the parameter's name and the device type's generator (CPU or CUDA), not on the variant.
"""

from __future__ import annotations

import gc
import hashlib
import json
import re
import time
from pathlib import Path

import torch
from torch import nn

from ftbench.harness.meter import Unsupported
from ftbench.harness.trackers import host_peak_rss_gib
from ftbench.build.experts import split_experts

GIB = 2**30
GENERATOR = "torch.Generator per parameter on the build device, seeded with sha256('<seed>/<parameter name>')"
# how a model built in process reaches Unsloth, whose FastLanguageModel.from_pretrained loads from a path only: the
# same seeded weights drawn in NF4 and written as a bitsandbytes 4-bit checkpoint (write_4bit_checkpoint), the
# format of Unsloth's own "-bnb-4bit" checkpoints, in the first place with room for it
UNSLOTH_ROUTE = ("built in process in NF4 (the seeded weights of ftbench.build.stages), written as a bitsandbytes 4-bit "
                 "checkpoint in the first place with room (the job's folder on disk, then host memory: "
                 "checkpoint_routes), read by Unsloth's FastLanguageModel.from_pretrained")


def parameter_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def architecture_digest(arch: dict) -> str:
    return hashlib.sha256(json.dumps(arch, sort_keys=True, default=str).encode()).hexdigest()[:16]


def hf_config(arch: dict, pad_token_id=None, eos_token_id=None):
    """transformers' config object for an architecture file's `config` (a problem names the file)."""
    from transformers import AutoConfig

    cfg = dict(arch["config"])
    where = arch.get("file", arch.get("hub_id", "architecture"))
    try:
        model_type = cfg.pop("model_type")
        return AutoConfig.for_model(model_type, **cfg, pad_token_id=pad_token_id, eos_token_id=eos_token_id)
    except (KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{where}: not a buildable architecture: {type(e).__name__}: {e}") from e


def skeleton(arch: dict, config):
    """The model with every parameter on the meta device (buffers real, on the host: rotary tables), gpt-oss
    experts split per expert."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    where = arch.get("file", arch.get("hub_id", "architecture"))
    try:
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    except Exception as e:  # a config transformers refuses: name the file it came from
        raise ValueError(f"{where}: transformers cannot build it: {type(e).__name__}: {e}") from e
    if getattr(config, "model_type", None) == "gpt_oss":
        split_experts(model)
    return model


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


NF4_BYTES = 0.5 + 4 / 64  # 4 bits a weight, a 4-byte absmax per block of 64 (before double quantization)


class TooLarge(Unsupported):
    """A model whose parameters alone exceed the memory it would be built in: refused before building."""


def parameter_bytes(model, dtype=torch.bfloat16) -> int:
    """What a skeleton's parameters take once drawn: `dtype`'s size each, NF4 where a layer is bitsandbytes 4-bit."""
    size = torch.empty((), dtype=dtype).element_size()
    return int(sum(_weights(p) * (NF4_BYTES if type(p).__name__ == "Params4bit" else size) for p in model.parameters()))


def _weights(p) -> int:
    """How many weights a parameter holds: a quantized Params4bit's storage packs two in a byte, its quant state
    keeps the shape it stands for."""
    state = getattr(p, "quant_state", None)
    return int(torch.Size(state.shape).numel()) if state is not None and state.shape is not None else p.numel()


def available_bytes(device) -> int | None:
    """Free memory where a build draws: the GPU's (cudaMemGetInfo), or the host's MemAvailable (None: not Linux)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def check_fits(model, device, what: str, dtype=torch.bfloat16, need: int | None = None) -> None:
    """Refuse (TooLarge, both numbers) a build whose parameters cannot fit `device`'s free memory; `model` is the
    skeleton on the meta device, so the estimate costs nothing (`need`: the bytes it takes, where not `dtype`'s
    size a parameter: an FP8 base)."""
    need, have = need if need is not None else parameter_bytes(model, dtype), available_bytes(device)
    if have is not None and need > have:
        where = "GPU" if torch.device(device).type == "cuda" else "host"
        raise TooLarge(f"{what}: refused before building: its {count_parameters(model):,} parameters take "
                       f"{need / GIB:.1f} GiB, and the {where} has {have / GIB:.1f} GiB available")


def _value(name: str, module, shape, std: float, seed: int, device) -> torch.Tensor:
    """A parameter's initial value: ones for a norm's weight, zeros for a bias, else N(0, std) drawn from the
    parameter's own generator (transformers' initializer for these models, made reproducible per name)."""
    if "Norm" in type(module).__name__:
        return torch.ones(shape, dtype=torch.bfloat16, device=device)
    if name.endswith("bias"):
        return torch.zeros(shape, dtype=torch.bfloat16, device=device)
    g = torch.Generator(device=device).manual_seed(parameter_seed(seed, name))
    return torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, std, generator=g)


def _landing(name: str, module, shape, std: float, seed: int, device, read=None) -> torch.Tensor:
    """A parameter's bf16 value on `device` as it lands: read (`read`: a name -> its tensor, a checkpoint's), else its
    seeded draw (`_value`)."""
    if read is not None:
        return read(name).to(device=device, dtype=torch.bfloat16)
    return _value(name, module, shape, std, seed, device)


def quantize_4bit(p, value, module, device):
    """`value` (a bf16 draw) quantized on `device` as the meta Params4bit `p` of `module` asks (block size, NF4,
    double quantization, storage dtype); the module keeps the quant state too, where bitsandbytes finds it again
    when FSDP2 has swapped the parameter for its own."""
    from bitsandbytes.nn import Params4bit

    q = Params4bit(value, requires_grad=False, blocksize=p.blocksize, quant_type=p.quant_type,
                   compress_statistics=p.compress_statistics, quant_storage=p.quant_storage, module=module)
    return q._quantize(device)


def draw_4bit(module, seed: int, device, std: float, prefix: str = "", name_of=lambda name: name, read=None) -> int:
    """Draw and quantize on `device` only the bitsandbytes 4-bit weights under `module` that are still on the meta
    device (each whole, from the generator `draw_parameters` seeds per name: `name_of` maps a parameter's name under
    `prefix` to the plain model's, e.g. out of PEFT's wrapping), leaving every other parameter where it is: the
    sharded 4-bit build quantizes each layer's weights whole, as one process does, just before FSDP2 splits their
    packed bytes. Returns how many were quantized."""
    n = 0
    for mname, sub in module.named_modules(prefix=prefix):
        for pname, p in list(sub._parameters.items()):
            if p is None or not p.is_meta or type(p).__name__ != "Params4bit":
                continue
            value = _landing(name_of(f"{mname}.{pname}"), sub, p.shape, std, seed, torch.device(device), read)
            sub._parameters[pname] = quantize_4bit(p, value, sub, device)
            del value
            n += 1
    return n


def prepare_4bit(model, quantization_config, device):
    """transformers' bitsandbytes quantizer on a meta skeleton: its linear layers become 4-bit ones (no weights
    yet). Returns the quantizer, whose postprocess_model runs once the weights are drawn."""
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
    quantizer.preprocess_model(model, device_map={"": torch.device(device)})
    model.hf_quantizer = quantizer
    return quantizer


def draw_parameters(model, seed: int, device, dtype=torch.bfloat16, read=None, keep_weights: bool = True) -> dict:
    """Give every meta parameter its value on `device`, module by module: drawn from its seeded generator or, with
    `read` (a parameter's name -> its tensor: a checkpoint's), read. Each weight is made what its layer asks for as
    soon as it lands, one at a time: a bitsandbytes 4-bit layer's quantized; a layer converted to FP8 on the meta
    device (anything with `land`, ftbench.build.fp8.StaticFP8Linear) casts it, and keeps the bf16 value only with
    `keep_weights`. A parameter two modules share (tied embeddings) lands once. Returns counts for the record."""
    std = getattr(model.config, "initializer_range", 0.02)
    device = torch.device(device)
    landed = {}  # id(meta parameter) -> (that parameter, kept alive so its id stays its own; what it became)
    counts = {"parameters_drawn": 0, "parameters_read": 0, "quantized_4bit": 0, "fp8_cast": 0}
    for mname, module in model.named_modules():
        for pname, p in list(module._parameters.items()):
            if p is not None and id(p) in landed:
                module._parameters[pname] = landed[id(p)][1]
                continue
            if p is None or not p.is_meta:
                continue
            name = f"{mname}.{pname}" if mname else pname
            value = _landing(name, module, p.shape, std, seed, device, read)
            counts["parameters_read" if read is not None else "parameters_drawn"] += 1
            if type(p).__name__ == "Params4bit":
                module._parameters[pname] = quantize_4bit(p, value, module, device)
                counts["quantized_4bit"] += 1
            elif pname == "weight" and hasattr(module, "land"):
                module.land(value.to(dtype), keep_weights)
                counts["fp8_cast"] += 1
            else:
                module._parameters[pname] = nn.Parameter(value.to(dtype), requires_grad=p.requires_grad)
            landed[id(p)] = (p, module._parameters[pname])
            del value
    for module in model.modules():
        for bname, buf in list(module._buffers.items()):
            if buf is not None and not buf.is_meta:
                module._buffers[bname] = buf.to(device)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    return counts


def check_manifest(manifest: dict, seed: int) -> dict:
    """The architecture an in-process manifest carries, after checking it against the run's seed and its digest."""
    arch, where = manifest.get("architecture_config"), manifest.get("architecture_file", "the manifest")
    if not isinstance(arch, dict) or not isinstance(arch.get("config"), dict) or "model_type" not in arch["config"]:
        raise ValueError(f"{where}: no architecture to build (the manifest's architecture_config lacks "
                         "config.model_type)")
    if architecture_digest(arch) != manifest.get("architecture_sha256"):
        raise ValueError(f"{where}: the architecture in {manifest.get('path')}/../model.json changed after the "
                         "materialize job wrote it (digest mismatch); rerun materialize_model")
    if manifest.get("seed") != seed:
        raise ValueError(f"seed mismatch: the model manifest ({where}) was made for seed {manifest.get('seed')}, "
                         f"this run asks for seed {seed}; rerun materialize_model")
    return arch


def disk_bytes(path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


CHECKPOINT_MARGIN = 1.05
CHECKPOINT_SHARD = "5GB"


def write_4bit_checkpoint(manifest: dict, seed: int, device, routes, quantization_config) -> dict:
    """The in-process model drawn in NF4 on `device` and written as a bitsandbytes 4-bit checkpoint with its
    tokenizer (a path Unsloth's from_pretrained reads) to the first of `routes` ((folder, what it is) pairs, e.g.
    the job's folder on disk, then host memory) with room for it; each route's measured room is recorded, and
    where none has room it is refused before writing, naming each. The model is freed before returning. Returns
    the facts for the record (`model.build`), `checkpoint_path` the folder written."""
    import shutil

    from transformers import AutoTokenizer

    if getattr(quantization_config, "load_in_4bit", False) is not True:
        raise ValueError("a 4-bit checkpoint needs a bitsandbytes 4-bit quantization config (an nf4 variant)")
    model, facts = build_model(manifest, seed, device, quantization_config.bnb_4bit_compute_dtype,
                               quantization_config)
    need = parameter_bytes(model, quantization_config.bnb_4bit_compute_dtype)
    tried, out = [], None
    for folder, kind in routes:
        Path(folder).mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(folder).free
        fits = need * CHECKPOINT_MARGIN <= free  # safetensors' headers, the tokenizer, the estimate's own error
        tried.append({"path": str(folder), "kind": kind, "free_gib": round(free / GIB, 1), "fits": fits})
        if fits:
            out = folder
            break
    if out is None:
        del model
        raise TooLarge(f"the 4-bit checkpoint would take {need / GIB:.1f} GiB and "
                       + "; ".join(f"{t['path']} ({t['kind']}) has {t['free_gib']:.1f} GiB free" for t in tried)
                       + ": refused before writing")
    t0 = time.perf_counter()
    # shards of at most 5 GB: safetensors holds a whole shard in host memory while writing it (transformers'
    # default, 50 GB, beside a checkpoint in /dev/shm would need twice the host memory)
    model.save_pretrained(out, max_shard_size=CHECKPOINT_SHARD)
    AutoTokenizer.from_pretrained(manifest["path"]).save_pretrained(out)
    del model
    gc.collect()  # the model's reference cycles, before the device's memory is handed back
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return {**facts, "method": "in_process, then a 4-bit checkpoint", "route": UNSLOTH_ROUTE,
            "checkpoint_routes": tried, "checkpoint_path": str(out), "checkpoint_need_bytes": need,
            "checkpoint_write_s": time.perf_counter() - t0, "checkpoint_disk_bytes": disk_bytes(out)}


def manifest_config(manifest: dict, seed: int) -> tuple[dict, object]:
    """(architecture, transformers config) of an in-process manifest, checked against the run's seed, with its
    special tokens."""
    arch = check_manifest(manifest, seed)
    tok = manifest.get("special_tokens", {})
    return arch, hf_config(arch, tok.get("pad_token_id"), tok.get("eos_token_id"))


def name_special_tokens(model, manifest: dict) -> None:
    """The manifest's pad and eos tokens in the model's generation config."""
    tok = manifest.get("special_tokens", {})
    for key in ("pad_token_id", "eos_token_id"):
        if tok.get(key) is not None:
            setattr(model.generation_config, key, tok[key])


def build_memory(device) -> dict:
    """The build's peaks for the record: host RSS, and allocated GPU memory on a GPU."""
    cuda = torch.device(device).type == "cuda"
    return {"host_peak_rss_gib": host_peak_rss_gib(),
            "gpu_peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB if cuda else None}


def build_model(manifest: dict, seed: int, device, dtype=torch.bfloat16, quantization_config=None):
    """The model an in-process manifest describes, drawn on `device` (4-bit where `quantization_config` is a
    bitsandbytes one, quantized layer by layer through transformers' quantizer). Returns (model, build facts)."""
    t0 = time.perf_counter()
    arch, config = manifest_config(manifest, seed)
    model = skeleton(arch, config)
    quantizer = prepare_4bit(model, quantization_config, device) if quantization_config is not None else None
    check_fits(model, device, f"{manifest.get('architecture_file') or 'the model'} at scale {manifest.get('scale')}",
               dtype)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    counts = draw_parameters(model, seed, device, dtype)
    if quantizer is not None:
        quantizer.postprocess_model(model)
    name_special_tokens(model, manifest)
    facts = {"method": "in_process", "build_s": time.perf_counter() - t0, "generator": GENERATOR, "seed": seed,
             "device": str(device), **counts,
             "experts": "split per expert (gate_up_projs.N, down_projs.N)" if config.model_type == "gpt_oss" else None,
             **build_memory(device),
             "disk_bytes": manifest.get("disk_bytes"), "checkpoint_bf16_gib": manifest.get("checkpoint_bf16_gib")}
    model.eval()
    return model, facts


def _layer_groups(names) -> dict[str, list[str]]:
    """Parameter names grouped by their first layer number folded: {"model.layers.{}.mlp.router.weight": [...]}."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(re.sub(r"\.\d+\.", ".{}.", name, count=1), []).append(name)
    return groups


def _layer_pattern(names) -> list[str]:
    """Parameter names with their layer numbers folded, as transformers' load report writes them:
    model.layers.{0...35}.mlp.router.linear.weight."""
    out = []
    for key, group in _layer_groups(names).items():
        ids = sorted({int(m.group(1)) for n in group if (m := re.search(r"\.(\d+)\.", n))})
        if not ids:
            out.append(key)
            continue
        span = f"{ids[0]}...{ids[-1]}" if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)) else \
            ",".join(map(str, ids))
        out.append(key.replace("{}", "{" + span + "}", 1))
    return sorted(out)


def restore_renamed(model, checkpoint_dir) -> dict:
    """After a reader (Unsloth) has loaded `checkpoint_dir` into its own model classes: its parameters that the
    checkpoint holds under another name get the checkpoint's tensor, where the names differ by one inserted module
    (Unsloth 2026.10.9's gpt-oss router is a module holding `linear`: `mlp.router.linear.weight` against the
    checkpoint's `mlp.router.weight`, which the reader left at its fresh initialisation). Parameters the checkpoint
    holds under no such name stay as the reader made them and are named in the result. Returns the facts for the
    record: `renamed` ({reader's name: checkpoint's name}, layers folded) and `not_in_checkpoint`."""
    from safetensors import safe_open

    folder = Path(checkpoint_dir)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        where = json.loads(index.read_text())["weight_map"]
    else:
        with safe_open(folder / "model.safetensors", "pt") as f:
            where = dict.fromkeys(f.keys(), "model.safetensors")
    params = dict(model.named_parameters())
    aliases, missing = {}, []  # reader's name -> the checkpoint's, for the parameters the checkpoint misses
    for name in params:
        if name in where:
            continue
        parts = name.split(".")
        shorter = (".".join(parts[:i] + parts[i + 1:]) for i in range(len(parts) - 1))
        alias = next((a for a in shorter if a in where), None)
        if alias is None:
            missing.append(name)
        else:
            aliases[name] = alias
    by_file: dict[str, list] = {}
    for name, alias in aliases.items():
        by_file.setdefault(where[alias], []).append((name, alias))
    renamed = {}
    for file, pairs in sorted(by_file.items()):  # each shard opened once
        with safe_open(folder / file, "pt", device="cpu") as f:
            for name, alias in pairs:
                value, param = f.get_tensor(alias), params[name]
                if value.shape != param.shape:
                    missing.append(name)
                    continue
                with torch.no_grad():
                    param.copy_(value.to(device=param.device, dtype=param.dtype))
                renamed[name] = alias
    folded = {_layer_pattern(group)[0]: _layer_pattern([renamed[n] for n in group])[0]
              for group in _layer_groups(renamed).values()}
    return {"renamed": folded, "not_in_checkpoint": _layer_pattern(missing)}
