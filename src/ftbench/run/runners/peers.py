"""The peers a causal-LM run can go through instead of ftbench's own path: Unsloth (its 4-bit checkpoint, its
attention routes) and NVIDIA NeMo AutoModel (its model and adapter), and the record of the peer's settings."""

from __future__ import annotations

import importlib.metadata
import os

import torch

from ftbench.build import parallel

MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
NEMO_TARGETS = "*_proj"  # NeMo AutoModel's LoRA benchmark recipes' pattern: every projection of the decoder


def unsloth_checkpoint_routes() -> list:
    """Where a model built in process may be written for Unsloth, in order: the job's temporary folder on disk
    (harness.job_dir, else a fresh temporary folder), then host memory (/dev/shm, where the host has it: a lent
    GPU host has twice as much memory as disk room for gpt-oss-120b's ~63 GiB checkpoint)."""
    import tempfile

    from ftbench.harness.meter import host_memory_dir, job_dir

    routes = [(tempfile.mkdtemp(prefix="unsloth-4bit-", dir=job_dir()), "disk")]
    shm = host_memory_dir("unsloth-4bit-")  # removed by the supervisor when the job ends, whatever happens
    if shm is not None:
        routes.append((str(shm), "host memory (/dev/shm)"))
    return routes


def unsloth_targets(variant, lora: dict, model_config) -> list | None:
    """The modules Unsloth adapts. On a mixture-of-experts model its current release maps the MLP names onto every
    expert's projections (gpt-oss-120b: 536.8 M trainable parameters, out of memory on an H100 at step 2,
    measurements/h100-2026-11-25-h), where the study's Unsloth adapted attention only; so the MLP names go unless
    the variant asks for expert LoRA (knob expert_lora)."""
    targets = lora.get("target_modules")
    moe = getattr(model_config, "num_local_experts", None) or getattr(model_config, "num_experts", None)
    if targets is None or variant.expert_lora or not moe:
        return targets
    return [t for t in targets if t not in MLP_PROJECTIONS]


def nemo_peft_name(name: str, default: bool = True) -> str:
    """The PEFT name of a NeMo AutoModel LoRA parameter (`model.layers.0.self_attn.q_proj.lora_A.weight` ->
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`; without `default`, the name PEFT
    saves it under)."""
    if default:
        for m in ("lora_A", "lora_B"):
            name = name.replace(f".{m}.", f".{m}.default.")
    return "base_model.model." + name


def nemo_model(ctx, lora: dict):
    """NeMo AutoModel's LoRA as its own benchmark recipes set it (examples/llm_benchmark/*_peft_benchmark.yaml): the
    model from NeMoAutoModelForCausalLM.from_pretrained (force_hf: transformers' class, NeMo's Liger and SDPA patches
    applied as it applies them), LoRA from its PeftConfig on every projection with its Triton kernels and without its
    memory-efficient path (the recipe: the throughput benchmark is not activation-memory bound); r, alpha and dropout
    the run's. Each LoRA A then drawn as PEFT's rungs draw theirs (the same start, so the losses compare)."""
    from nemo_automodel import NeMoAutoModelForCausalLM  # (on CUDA only: variants.check_supported)
    from nemo_automodel.components._peft.lora import PeftConfig
    from transformers import AutoTokenizer

    path = ctx.manifest["path"]
    config = PeftConfig(target_modules=[NEMO_TARGETS], dim=lora.get("r", 8), alpha=lora.get("alpha", 16),
                        dropout=lora.get("dropout", 0.0), use_triton=True, use_memory_efficient_lora=False)
    model = NeMoAutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, force_hf=True,
                                                     peft_config=config)
    # an fp32 checkpoint (a GGUF file dequantized) leaves tensors in fp32 that NeMo's varlen FlashAttention refuses
    # ("only fp16 and bf16"): every one goes to bf16, as on a bf16 checkpoint, and the record counts them
    cast = [p for p in model.parameters() if p.dtype == torch.float32]
    for p in cast:
        p.data = p.data.to(torch.bfloat16)
    layer = model.model.layers[0]
    build = {"method": "checkpoint (NeMo AutoModel's NeMoAutoModelForCausalLM.from_pretrained, force_hf)",
             "fp32_tensors_cast_to_bf16": len(cast),
             "nemo_lora": {"target_modules": config.target_modules, "dim": config.dim, "alpha": config.alpha,
                           "use_triton": config.use_triton,
                           "use_memory_efficient_lora": config.use_memory_efficient_lora,
                           "module": type(layer.self_attn.q_proj).__name__},
             "nemo_kernels": {"attention": getattr(model.config, "_attn_implementation", None),
                              "rms_norm": forward_of(layer.input_layernorm), "mlp": forward_of(layer.mlp),
                              "model": forward_of(model)},  # (Liger's fused linear cross-entropy replaces it)
             "adapters_seeded": parallel.seed_adapters(model, ctx.settings.seed, nemo_peft_name)}
    return model, AutoTokenizer.from_pretrained(path), {"build": build}


def forward_of(module) -> str:
    """Where a module's forward comes from (Liger's instance patch keeps the class and binds its own forward)."""
    f = getattr(module.forward, "__func__", module.forward)
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', type(f).__name__)}"


def save_nemo_adapter(model, lora: dict, folder) -> None:
    """A NeMo AutoModel adapter in PEFT's format (its LoRA scales by alpha / dim, as PEFT's by alpha / r), so that
    `generate` loads it as it loads the others."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    tensors = {nemo_peft_name(n, default=False): p.detach().cpu().contiguous() for n, p in trained}
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in trained})
    LoraConfig(r=lora.get("r", 8), lora_alpha=lora.get("alpha", 16), lora_dropout=lora.get("dropout", 0.0),
               target_modules=targets).save_pretrained(folder)
    save_file(tensors, f"{folder}/adapter_model.safetensors")


def import_unsloth(variant):
    """Unsloth, imported before transformers and TRL are used (it patches them on import), with its own compiled
    modules off where the variant says so (knob unsloth_compile; Unsloth reads UNSLOTH_COMPILE_DISABLE on import)."""
    if not variant.unsloth_compile:
        os.environ["UNSLOTH_COMPILE_DISABLE"] = "1"
    import unsloth

    return unsloth


def unsloth_flash_impl() -> dict | None:
    """The flash attention implementation Unsloth activated while it trained (its UNSLOTH_FLASH_ATTENTION_IMPL, by
    default FA3 or FA4 on a Hopper GPU where installed), and why; None from a release without that choice."""
    try:
        from unsloth.utils.flash_impl import FLASH_IMPL_STATE
    except ImportError:
        return None
    out = {"active": FLASH_IMPL_STATE.get("active"), "reason": FLASH_IMPL_STATE.get("reason")}
    try:  # the backend Unsloth's dispatch picks for packed rows (flash_varlen, xformers or sdpa) and SDPA's flags
        from unsloth.utils.attention_dispatch import select_attention_backend

        out["packed_backend"] = select_attention_backend(use_varlen=True)
        out["sdpa_enabled"] = [name for name, on in (
            ("flash", torch.backends.cuda.flash_sdp_enabled()), ("cudnn", torch.backends.cuda.cudnn_sdp_enabled()),
            ("efficient", torch.backends.cuda.mem_efficient_sdp_enabled())) if on]
    except Exception:  # (an Unsloth without that module)
        pass
    return out


def unsloth_attention(v, flash: dict | None) -> str:
    """The attention an Unsloth run trained with, as its record states it: the flash implementation Unsloth
    activated, else its packed route's backend under the SDPA backends the variant allowed."""
    flash = flash or {}
    if flash.get("active"):
        return flash["active"]
    route = flash.get("packed_backend")
    allowed = f"SDPA limited to {v.sdpa_backend}" if v.sdpa_backend else "SDPA's own choice among " + (
        ", ".join(flash.get("sdpa_enabled") or []) or "its backends")
    return f"Unsloth's {route} route ({allowed})" if route else f"Unsloth's own dispatch ({allowed})"


PEER_SYSTEMS = {"unsloth": ("Unsloth", "unsloth"), "liger": ("Liger Kernel", "liger_kernel"),
                "nemo": ("NVIDIA NeMo AutoModel", "nemo_automodel")}


# why a NeMo AutoModel run on packed rows takes the project's variable-length attention
NEMO_VARLEN_WHY = ("NeMo's route for packed sequences is transformers' flash_attention_2, which needs the flash-attn "
                   "package; PyPI has it only as source to compile against CUDA, so its FlashAttention-2 kernels run "
                   "here through torch's variable-length flash attention (ftbench.build.attention)")


def peer_record(v, record, args, batch_size) -> dict | None:
    """Another system's run (Unsloth, Liger Kernel's patch) with the settings it ran with, as they stand in the
    record: the system and its version, precision, checkpointing and how, the attention that ran (Unsloth's flash
    implementation and why, else the kernel), compilation, the rows (packed to a budget or padded batches), the
    trainer's per-step metrics, the optimizer and the batch. The frontier compares a peer only where its record
    names them (ftbench.judge.compare.peer_table); None for one of the project's own rungs."""
    kind = v.framework if v.framework in ("unsloth", "nemo") else "liger" if v.liger else None
    if kind is None:
        return None
    system, package = PEER_SYSTEMS[kind]
    extra = record["extra"]
    build = (record.get("model") or {}).get("build") or {}
    settings = {
        "precision": v.precision,
        "gradient_checkpointing": ("unsloth (its offloaded checkpointing)" if kind == "unsloth" else "torch")
        if v.gradient_checkpointing else "off",
        "attention": unsloth_attention(v, extra.get("unsloth_flash_impl")) if kind == "unsloth" else (
            extra.get("attention_kernel") or v.sdpa_backend or (build.get("nemo_kernels") or {}).get("attention")
            or "transformers' default"),
        "attention_why": (extra.get("unsloth_flash_impl") or {}).get("reason") if kind == "unsloth" else (
            NEMO_VARLEN_WHY if kind == "nemo" and v.attention == "varlen" else None),
        "compile": ("unsloth's own" if v.unsloth_compile else "off") if kind == "unsloth" else (
            f"torch.compile {v.compile} ({v.compile_scope})" if v.compile else "off"),
        "rows": f"packed rows of {v.token_budget} tokens" if v.token_budget else (
            "padding-free rows" if v.padding_free else "padded batches"),
        "trainer_metrics": v.trainer_metrics, "optim": args.optim if isinstance(args.optim, str) else str(args.optim),
        "batch": batch_size}
    if kind == "nemo":  # what NeMo AutoModel built: its LoRA settings and module, the kernels its patches left
        lo, ke = build.get("nemo_lora") or {}, build.get("nemo_kernels") or {}
        settings["lora"] = (f"NeMo's {lo.get('module')} on {', '.join(lo.get('target_modules') or [])}, dim "
                            f"{lo.get('dim')}, alpha {lo.get('alpha')}, Triton kernels {lo.get('use_triton')}, "
                            f"memory-efficient path {lo.get('use_memory_efficient_lora')}")
        settings["kernels"] = (f"built with {ke.get('attention')} attention, {ke.get('rms_norm')} norms, "
                               f"{ke.get('mlp')} MLPs" + (f", the loss in {ke['model']}" if ke.get("model") else ""))
    try:
        version = importlib.metadata.version(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"system": system, "version": version, "settings": settings}
