"""Model materialization: random-weight checkpoints in the hub's format, or a pointer to a hub id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ftbench.data.datasets import text_corpus
from ftbench.data.tokenizer import build_tokenizer

TOKENIZER_VOCAB = 3072  # below every scale's vocab_size, so token ids always fit the embedding


def _n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _causal_lm(arch, out, tok, device, wanted=None, limit_gib=24.0):
    """A random causal LM from one meta-device skeleton (ftbench.build.stages): counted, then either drawn parameter by
    parameter from the seed and written whole (the same values a training job's in-process build draws on this
    device type), or, built in process, only what the training job needs to build it: the tokenizer, transformers'
    config and the resolved architecture in the manifest, never the weights."""
    from ftbench.build.stages import architecture_digest, check_fits, count_parameters, draw_parameters, hf_config, skeleton

    config = hf_config(arch, tok.pad_token_id, tok.eos_token_id)
    model = skeleton(arch, config)  # on the meta device: checks the architecture, costs no memory
    n = count_parameters(model)
    facts = {"parameters": n, "checkpoint_bf16_gib": n * 2 / 2**30}
    if build_method(arch, wanted, limit_gib, facts["checkpoint_bf16_gib"]) == "in_process":
        Path(out).mkdir(parents=True, exist_ok=True)
        config.save_pretrained(out)
        tok.save_pretrained(out)
        return {**facts, "build": "in_process", "architecture_config": arch,
                "architecture_sha256": architecture_digest(arch),
                "special_tokens": {"pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}}
    check_fits(model, device, _what(arch))
    draw_parameters(model, arch["seed"], device)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {**facts, "build": "checkpoint"}


def build_method(arch: dict, wanted: str | None, limit_gib: float, bf16_gib: float) -> str:
    """checkpoint | in_process for a random causal LM of `bf16_gib` in bf16 (`wanted` auto or None: in process
    above the limit, and always for gpt-oss, whose split experts no hub-format checkpoint holds)."""
    gpt_oss = arch["config"].get("model_type") == "gpt_oss"
    if wanted == "checkpoint" and gpt_oss:
        raise ValueError("gpt-oss is built in process (its experts split per expert, as Study B trained it): "
                         "build: checkpoint cannot hold that structure")
    if wanted in ("checkpoint", "in_process"):
        return wanted
    return "in_process" if gpt_oss or bf16_gib > limit_gib else "checkpoint"


def _lmm(arch, out, tok, device):
    from transformers import (LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextImageProcessor,
                              LlavaNextProcessor)

    cfg = dict(arch["config"])
    cfg.pop("model_type")
    cfg["image_token_index"] = tok.convert_tokens_to_ids("<image>")
    cfg["text_config"] = dict(cfg["text_config"], pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    config = LlavaNextConfig(**cfg)
    _refuse_if_too_large(lambda: LlavaNextForConditionalGeneration._from_config(config, dtype=torch.bfloat16),
                         arch, device)
    with torch.device(device):
        model = LlavaNextForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    vcfg = arch["config"]["vision_config"]
    processor = LlavaNextProcessor(
        image_processor=LlavaNextImageProcessor(**arch["image_processor"]),
        tokenizer=tok,
        patch_size=vcfg["patch_size"],
        vision_feature_select_strategy=arch["config"]["vision_feature_select_strategy"],
        num_additional_image_tokens=1,  # the CLS token of the CLIP tower
        chat_template=tok.chat_template,
    )
    processor.save_pretrained(out)
    return {"parameters": _n_params(model), "image_token_index": cfg["image_token_index"]}


def _diffusion(arch, out, tok, device):
    import diffusers
    from transformers import CLIPTextConfig, CLIPTextModel

    comps = arch["components"]
    tcfg = dict(comps["text_encoder"]["config"])
    tcfg.pop("model_type", None)
    text_config = CLIPTextConfig(**tcfg, pad_token_id=tok.pad_token_id, bos_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
    _refuse_if_too_large(lambda: torch.nn.ModuleList(
        [getattr(diffusers, comps[n]["class"])(**comps[n]["config"]) for n in ("unet", "vae")]
        + [CLIPTextModel(text_config)]), arch, device, torch.float32)
    counts = {}
    with torch.device(device):
        for name in ("unet", "vae"):
            module = getattr(diffusers, comps[name]["class"])(**comps[name]["config"])
            module.save_pretrained(Path(out) / name)
            counts[name] = _n_params(module)
        text = CLIPTextModel(text_config)
    text.save_pretrained(Path(out) / "text_encoder")
    counts["text_encoder"] = _n_params(text)
    getattr(diffusers, comps["scheduler"]["class"])(**comps["scheduler"]["config"]).save_pretrained(
        Path(out) / "scheduler")
    tok.save_pretrained(Path(out) / "tokenizer")
    index = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": diffusers.__version__,
             "requires_safety_checker": False, "safety_checker": [None, None], "feature_extractor": [None, None]}
    for name, lib in (("unet", "diffusers"), ("vae", "diffusers"), ("scheduler", "diffusers"),
                      ("text_encoder", "transformers"), ("tokenizer", "transformers")):
        cls = type(tok).__name__ if name == "tokenizer" else (
            "CLIPTextModel" if name == "text_encoder" else comps[name]["class"])
        index[name] = [lib, cls]
    (Path(out) / "model_index.json").write_text(json.dumps(index, indent=2))
    return {"parameters": sum(counts.values()), "component_parameters": counts}


def _what(arch: dict) -> str:
    return f"{arch.get('file') or arch['hub_id']} at scale {arch['scale']}"


def _refuse_if_too_large(construct, arch: dict, device, dtype=torch.bfloat16) -> None:
    """construct() on the meta device (no memory), then ftbench.build.stages.check_fits: a model too large for the memory
    it would be materialized in is refused with both numbers before a byte is drawn."""
    from ftbench.build.stages import check_fits

    with torch.device("meta"):
        model = construct()
    check_fits(model, device, _what(arch), dtype)


BUILDERS = {"lmm": _lmm, "diffusion": _diffusion}  # causal LMs: _causal_lm (it may build in process)


def local_checkpoint_manifest(path, family: str, out_dir) -> dict:
    """The manifest of a local checkpoint: trained as it is, at its own size, named by its folder."""
    path = Path(path).expanduser().resolve()
    cfg = path / ("model_index.json" if family == "diffusion" else "config.json")
    info = json.loads(cfg.read_text())
    name = info.get("_class_name") or " ".join(info.get("architectures") or []) or info.get("model_type")
    manifest = {"family": family, "architecture": f"{name} (local checkpoint {path})", "scale": "full",
                "weights_source": str(path), "path": str(path), "tokenizer": str(path), "seed": None}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "model.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def gguf_path(spec: dict) -> Path:
    """The GGUF file a model's `gguf:` names: a `path`, or a `file` an installed `package` ships
    (ftbench.config.inputs.gguf_file; config's check refused a missing one before any job)."""
    from ftbench.config.inputs import gguf_file

    try:
        return gguf_file(spec)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"gguf: {e}") from e


def gguf_fault(path, error: Exception) -> str:
    """Why a GGUF file does not load, naming the file: not GGUF by its first bytes; cut short (its tensors run past
    its last byte); a tensor type transformers cannot dequantize; else the loader's own words."""
    from ftbench.config.inputs import gguf_magic

    path = Path(path)
    size = path.stat().st_size
    magic = gguf_magic(path)
    said = f"{type(error).__name__}: {str(error)[:300]}"
    if magic != b"GGUF":
        return f"{path}: not a GGUF file (it begins {magic!r}, not b'GGUF')"
    if "reshape" in str(error) or isinstance(error, (EOFError, OSError)) or "mmap" in str(error):
        return f"{path}: cut short: its tensors run past its last byte, {size:,} ({said})"
    if "quant" in str(error).lower() or "not supported" in str(error).lower():
        return f"{path}: a tensor type it cannot dequantize: {', '.join(undequantizable(path)) or '?'} ({said})"
    return f"{path}: does not load ({said})"


def undequantizable(path) -> list[str]:
    """The tensor types a GGUF file stores that gguf-py cannot dequantize (each tried on one zero block)."""
    import gguf
    import numpy as np

    bad = []
    for t in sorted({t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}, key=lambda t: t.name):
        size = gguf.GGML_QUANT_SIZES[t][1]
        try:
            gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), t)
        except NotImplementedError:
            bad.append(t.name)
    return bad


def gguf_facts(path, spec: dict) -> dict:
    """What a GGUF checkpoint is, for the record: its package and version (where a package ships it), the file's
    sha256 and size, the tensor types it stores (the quantization the weights were rounded to) and its metadata's
    architecture, name and special tokens."""
    import hashlib
    import importlib.metadata
    from collections import Counter

    import gguf

    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256")
    reader = gguf.GGUFReader(str(path))

    def field(key):
        f = reader.fields.get(key)
        return f.contents() if f is not None else None

    types = Counter(t.tensor_type.name for t in reader.tensors)
    facts = {"file": Path(path).name, "path": str(path), "sha256": sha.hexdigest(), "bytes": Path(path).stat().st_size,
             "tensor_types": dict(sorted(types.items())), "quantization": types.most_common(1)[0][0],
             "gguf_architecture": field("general.architecture"), "gguf_name": field("general.name"),
             "eos_token_id": field("tokenizer.ggml.eos_token_id"),
             "pad_token_id": field("tokenizer.ggml.padding_token_id"), "gguf_version": importlib.metadata.version("gguf")}
    if spec.get("package"):
        facts.update(package=spec["package"], package_version=importlib.metadata.version(spec["package"]))
    return facts


def materialize_gguf(spec: dict, out_dir) -> dict:
    """A GGUF checkpoint (a real pretrained model, its weights as the file rounded them) dequantized in process by
    transformers' GGUF loader and written as an fp32 Hugging Face checkpoint (the dequantized values kept exactly),
    which every runner loads through the ordinary from_pretrained. The tokenizer's end-of-sequence and padding
    tokens are set from the file's own metadata (transformers' GGUF conversion names another eos), and the record
    says so. Returns the manifest's fields."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(spec)
    facts = gguf_facts(path, spec)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    fixed = {}
    for role in ("eos", "pad"):
        tid = facts[f"{role}_token_id"] if facts[f"{role}_token_id"] is not None else facts["eos_token_id"]
        if tid is not None and getattr(tok, f"{role}_token_id") != tid:
            fixed[role] = {"was": getattr(tok, f"{role}_token"), "now": tok.convert_ids_to_tokens(int(tid))}
            setattr(tok, f"{role}_token", fixed[role]["now"])
    # the weights are plain fp32 tensors now; transformers still marks the model as GGUF-quantized and refuses to
    # save it: the mark goes (the record keeps the quantization the file stored)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    ckpt = Path(out_dir) / "checkpoint"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    return {"family": "causal_lm", "architecture": f"{type(model).__name__} from GGUF {path.name}", "scale": "full",
            "weights_source": f"gguf: {facts.get('package') or path} {facts.get('package_version') or ''}".strip(),
            "pretrained": True, "path": str(ckpt), "tokenizer": f"the GGUF file's ({path.name})",
            "parameters": _n_params(model), "gguf": facts, "tokens_fixed": fixed or None,
            "materialize_s": time.perf_counter() - t0, "seed": None,
            "weights_note": f"a real pretrained model; its weights are the {facts['quantization']} rounding of the "
                            "published ones, dequantized to fp32"}


def materialize_model(arch: dict, source: str, out_dir, seed: int, device: str = "cpu", build: str | None = None,
                      build_limit_gib: float = 24.0) -> dict:
    """Write a loadable checkpoint (random weights) or, for a hub source, a manifest pointing at it.

    Returns the manifest, which is also written to `out_dir/model.json`; runners load `manifest["path"]`
    through the ordinary `from_pretrained`, whichever it is.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"family": arch["family"], "architecture": arch["hub_id"], "scale": arch["scale"],
                "weights_source": source, "seed": seed}
    if source == "random":
        from ftbench.build.stages import disk_bytes

        ckpt = out / "checkpoint"
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        max_len = 77 if arch["family"] == "diffusion" else 32768
        tok = build_tokenizer(text_corpus(), TOKENIZER_VOCAB, max_len)
        arch = dict(arch, seed=seed)
        if arch["family"] == "causal_lm":
            manifest.update(_causal_lm(arch, ckpt, tok, device, build, build_limit_gib))
        elif build == "in_process":
            raise ValueError(f"build: in_process is for causal LMs; {arch['hub_id']} is a {arch['family']} model")
        else:
            manifest.update(BUILDERS[arch["family"]](arch, ckpt, tok, device))
        manifest.update(path=str(ckpt), tokenizer="offline byte-level BPE", materialize_s=time.perf_counter() - t0,
                        disk_bytes=disk_bytes(ckpt), build_device=str(device), architecture_file=arch.get("file"))
    else:
        if arch["scale"] != "full":
            raise ValueError(f"hub weights ({source}) exist only at full scale, config asks for {arch['scale']}")
        manifest.update(path=source, tokenizer=source)
    (out / "model.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def materialize(params: dict, manifest_path) -> dict:
    """The materialize_model job (run by its supervisor's child): a local checkpoint's manifest, or a model
    materialized from its architecture file, into the folder of `manifest_path`."""
    from ftbench.config.architectures import load_architecture
    from ftbench.config.settings import checkpoint_family
    from ftbench.harness.meter import pick_device

    out = Path(manifest_path).parent
    if params["model"]["source"] == "gguf":  # a real pretrained model from a GGUF file, dequantized here
        try:
            manifest = materialize_gguf(params["model"]["gguf"], out)
        except Exception as e:  # noqa: BLE001 — a file that does not load is a result its training jobs record
            path = gguf_path(params["model"]["gguf"])
            manifest = {"status": "error", "reason": gguf_fault(path, e), "family": "causal_lm", "gguf_file": str(path)}
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.json").write_text(json.dumps(manifest, indent=2))
        return manifest
    if not params["architecture"]:  # a local checkpoint folder: its own config, its own size
        source = Path(params["model"]["source"]).expanduser()
        return local_checkpoint_manifest(source, checkpoint_family(source), out)
    from ftbench.build.stages import TooLarge

    arch = load_architecture(params["architecture"], params["scale"])
    try:
        return materialize_model(arch, params["model"]["source"], out, params["seed"], device=str(pick_device()),
                                 build=params["model"].get("build"),
                                 build_limit_gib=params.get("build_limit_gib", 24.0))
    except TooLarge as e:  # a result, as the training jobs on it will say: not a crash after minutes of drawing
        manifest = {"status": "unsupported", "reason": str(e), "family": arch["family"], "scale": arch["scale"],
                    "architecture_file": arch["file"]}
        (out / "model.json").write_text(json.dumps(manifest, indent=2))
        return manifest
