"""Variant knobs turned into model changes: small functions a runner composes, plus the support check."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util

import torch

from ftbench.core.knobs import FP8_MODULES, Variant
from ftbench.harness.meter import Unsupported
from ftbench.core.records import host_change


def check_supported(variant: Variant, device: torch.device, manifest: dict | None = None) -> None:
    """Raise Unsupported with the reason when this machine cannot run the variant, or (Unsloth) this model, as its
    manifest describes it, cannot be given to it."""
    if variant.framework == "unsloth" and (manifest or {}).get("build") == "in_process" and variant.precision != "nf4":
        # a model built in process reaches Unsloth as a 4-bit checkpoint (ftbench.build.stages.write_4bit_checkpoint)
        raise Unsupported("this model is built in process and reaches Unsloth as a 4-bit checkpoint only; a 16-bit "
                          f"Unsloth variant ({variant.precision}) would need the whole model written in 16 bits")
    cuda = device.type == "cuda"
    if variant.framework == "unsloth":
        if not cuda:
            raise Unsupported("Unsloth needs a CUDA GPU; this machine has none")
        if importlib.util.find_spec("unsloth") is None:
            raise Unsupported("Unsloth is not installed (pip install '.[gpu]')")
    if variant.framework == "nemo":
        if not cuda:
            raise Unsupported("NeMo AutoModel builds its model on a CUDA device (its from_pretrained places it on "
                              "torch.cuda.current_device()); this machine has none")
        if importlib.util.find_spec("nemo_automodel") is None:
            raise Unsupported("NeMo AutoModel is not installed: it runs in its own environment, envs/nemo.yaml (its "
                              "release pins transformers 5.18.0)")
    if variant.precision == "fp8":
        if not cuda:
            raise Unsupported("FP8 needs a CUDA GPU of compute capability 8.9 or newer; this machine has none")
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            raise Unsupported(f"FP8 needs compute capability 8.9 or newer; this GPU has {cap[0]}.{cap[1]}")
        module = FP8_MODULES.get(variant.fp8_backend)
        if module is None:
            raise Unsupported(f"FP8 backend {variant.fp8_backend!r} is not one of te, torchao")
        if importlib.util.find_spec(module) is None:
            raise Unsupported(f"FP8 backend {variant.fp8_backend}: {module} is not installed")
    if variant.precision == "nf4" and importlib.util.find_spec("bitsandbytes") is None:
        raise Unsupported("NF4 needs bitsandbytes, which is not installed")
    if variant.sdpa_backend in ("cudnn", "efficient") and not cuda:
        raise Unsupported(f"the {variant.sdpa_backend} attention backend needs a CUDA GPU; this machine has none")
    if variant.lm_head and cuda and importlib.util.find_spec("liger_kernel") is None:
        raise Unsupported(f"lm_head={variant.lm_head!r} runs Liger Kernel's cross-entropy kernel on a GPU; liger-kernel "
                          "is not installed (pip install '.[gpu]')")
    if variant.liger:
        if not cuda:
            raise Unsupported("Liger Kernel is Triton code for CUDA GPUs; this machine has none")
        if importlib.util.find_spec("liger_kernel") is None:
            raise Unsupported("Liger Kernel is not installed (pip install '.[gpu]')")
    if variant.parallel == "fsdp2" and not cuda:
        raise Unsupported("FSDP2 trains through the trainer's accelerate, which applies FSDP to GPU ranks only (torch's "
                          "FSDP2 itself runs on CPU ranks: the suite builds, gathers and saves a sharded model with "
                          "two gloo ranks); data parallel (ddp) runs on CPU ranks")
    if variant.activation_offloading and not cuda:
        raise Unsupported("activation offloading moves saved activations from a GPU to pinned host memory; this "
                          "machine has no CUDA GPU")
    if variant.pin_memory and not cuda:
        raise Unsupported("pin_memory pins host memory for copies to a CUDA GPU; this machine has none")
    if variant.lora_b_one_read:
        if not cuda:
            raise Unsupported("lora_b_one_read runs a Triton kernel on a CUDA GPU (LoRA B's backward in one read of "
                              "its output gradient); this machine has none")
        if importlib.util.find_spec("triton") is None:
            raise Unsupported("lora_b_one_read runs a Triton kernel; triton is not installed")
    if variant.flash_impl:
        from ftbench.build.attention import flash_impl_problem

        problem = flash_impl_problem(variant.flash_impl, device)
        if problem:
            raise Unsupported(problem)


def attention_backend(variant: Variant):
    """The context that restricts scaled_dot_product_attention to the variant's backend (PyTorch's choice
    when the variant names none). On Hopper PyTorch picks cuDNN attention, which builds a plan for every
    new sequence length; `flash` avoids that cost where sequence lengths vary."""
    if variant.sdpa_backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[variant.sdpa_backend])


def cuda_graphs(variant: Variant) -> bool:
    """Whether the variant's compiled graphs run as CUDA graphs: Inductor's modes reduce-overhead and max-autotune
    capture them (a training loop marks each step's start for them); max-autotune also tunes each GEMM's kernel
    among cuBLAS and Triton templates, whose epilogues take the pointwise ops after it."""
    return variant.compile_backend == "inductor" and variant.compile in ("reduce-overhead", "max-autotune")


def compile_model(model, variant: Variant):
    """The callable a loop steps through: the model itself (no compile), one torch.compile of the whole
    model, or the model with each repeated block compiled in place (`compile_scope: layers`, regional
    compilation): the blocks of one class share one graph (parameters are graph inputs), so compile time is
    one layer's, and the code between blocks (LLaVA's image-feature packing, which breaks graphs) runs eager."""
    if not variant.compile:
        return model
    if variant.compile_scope == "model":
        return torch.compile(model, **compile_kwargs(variant))
    for block in repeated_blocks(model):
        block.compile(**compile_kwargs(variant))
    return model


def repeated_blocks(model) -> list[torch.nn.Module]:
    """The model's repeated transformer blocks: modules of a class that occurs more than once and whose name
    ends in DecoderLayer or EncoderLayer (Mistral's, CLIP's)."""
    blocks = [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "EncoderLayer"))]
    counts = {}
    for m in blocks:
        counts[type(m)] = counts.get(type(m), 0) + 1
    return [m for m in blocks if counts[type(m)] > 1]


def host_variant(variant: Variant, settings, device: torch.device) -> tuple[Variant, list[str]]:
    """The variant as this host runs it, and what changed (empty: as asked). With no CUDA GPU,
    `training.cpu_precision` computes bf16/fp16 in that dtype and dequantizes nf4 to it (a CPU without
    AVX512-BF16 or AMX multiplies bf16 ~50x slower than fp32), and `training.cpu_compile_backend` swaps
    Inductor for that backend (Inductor's C++ code generation took 50-120 s per tiny job on 2 cores)."""
    if device.type == "cuda":
        return variant, []
    changes, knobs = [], {}
    cpu = settings.cpu_precision
    if cpu and variant.precision in ("bf16", "fp16") and variant.precision != cpu:
        knobs["precision"] = cpu
        changes.append(host_change(f"precision {variant.precision} -> {cpu}", "training.cpu_precision"))
    elif cpu and variant.precision == "nf4" and variant.nf4_compute != cpu:
        knobs["nf4_compute"] = cpu
        changes.append(host_change(f"nf4 compute {variant.nf4_compute} -> {cpu}", "training.cpu_precision"))
    backend = settings.cpu_compile_backend
    if backend and variant.compile and variant.compile_backend != backend:
        knobs["compile_backend"] = backend
        changes.append(host_change(f"compile backend {variant.compile_backend} -> {backend}",
                                   "training.cpu_compile_backend"))
    return dataclasses.replace(variant, **knobs), changes


# the ops whose outputs selective checkpointing keeps: the GEMMs and attention kernels (the costly FLOPs); everything
# between them (norms, activations, rotary, casts) is recomputed in the backward
SAVED_OPS = ("mm", "addmm", "bmm", "_scaled_mm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
             "_varlen_attn")


def _keep_gemms(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    name = getattr(op, "__name__", str(op)).split(".")[0]
    return CheckpointPolicy.MUST_SAVE if name in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_keep_gemms)


def checkpoint_kwargs(variant: Variant) -> dict:
    """torch.utils.checkpoint's arguments for the variant (non-reentrant; selective: the GEMM and attention outputs
    kept, the rest recomputed)."""
    kwargs = {"use_reentrant": False}
    if variant.checkpoint_policy == "selective":
        kwargs["context_fn"] = selective_context
    return kwargs


def compile_kwargs(variant: Variant) -> dict:
    """torch.compile's arguments for the variant: Inductor takes the mode (with coordinate_descent_tuning, the mode's
    own options and that one: torch.compile takes a mode or options, not both); other backends take none."""
    if variant.compile_backend != "inductor":
        return {"backend": variant.compile_backend}
    if not variant.coordinate_descent_tuning:
        return {"mode": variant.compile}
    import torch._inductor

    return {"options": {**torch._inductor.list_mode_options(variant.compile), "coordinate_descent_tuning": True}}


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compute_dtype(variant: Variant) -> torch.dtype:
    """The dtype the variant's GEMMs run in and its unquantized weights load in (fp8: bf16, the dtype of the
    layers not converted and of autocast)."""
    return DTYPES[variant.nf4_compute] if variant.precision == "nf4" else DTYPES.get(variant.precision, torch.bfloat16)


def quantization_config(variant: Variant, quant_storage=None):
    """The published QLoRA setting: NF4, double quantization, bf16 compute (`nf4_compute`). `quant_storage`: the
    dtype the packed 4-bit bytes are viewed as (bitsandbytes' uint8 where None; FSDP2 shards them as bf16, the
    documented FSDP+QLoRA route, so that they share the all-gather of the layer's other bf16 weights)."""
    if variant.precision != "nf4":
        return None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=compute_dtype(variant),
                              **({"bnb_4bit_quant_storage": quant_storage} if quant_storage is not None else {}))


def load_pretrained(model_cls, path, variant: Variant, device):
    """`model_cls.from_pretrained` with the variant's dtype and quantization, on `device` (a quantized model is
    placed by its device map, a plain one moved after loading)."""
    quant = quantization_config(variant)
    model = model_cls.from_pretrained(path, dtype=compute_dtype(variant), quantization_config=quant,
                                      device_map={"": device} if quant is not None else None)
    return model if quant is not None else model.to(device)


def lora_config(lora: dict, task_type: str | None = "CAUSAL_LM"):
    from peft import LoraConfig

    return LoraConfig(r=lora.get("r", 8), lora_alpha=lora.get("alpha", 16), lora_dropout=lora.get("dropout", 0.0),
                      bias="none", target_modules=lora.get("target_modules", "all-linear"), task_type=task_type,
                      init_lora_weights=lora.get("init", True))


def apply_lora(model, variant: Variant, lora: dict, task_type: str | None = "CAUSAL_LM"):
    """PEFT LoRA on the configured targets; a k-bit model is prepared for training first."""
    if variant.peft != "lora":
        return model
    from peft import get_peft_model, prepare_model_for_kbit_training

    if variant.precision == "nf4":
        if variant.kbit_upcast:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=variant.gradient_checkpointing)
        else:  # PEFT's preparation without its fp32 copies of what is not quantized
            model.requires_grad_(False)
            if variant.gradient_checkpointing:
                model.enable_input_require_grads()
        unpackable_for_cpu(model)
    return get_peft_model(model, lora_config(lora, task_type))


def unpackable_for_cpu(model) -> int:
    """On a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit weight for its inference kernel the first time the
    layer runs without gradients (evaluation), which needs a multiple of 32 rows and whole quantization blocks per
    row. Layers that cannot be repacked keep the plain dequantizing path (the same arithmetic); returns how many."""
    n = 0
    for module in model.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if getattr(module, "support_avx512bf16_for_cpu", False) and state is not None and (
                state.shape[0] % 32 or state.shape[1] % state.blocksize):
            module.support_avx512bf16_for_cpu = False
            n += 1
    return n


def has_adapter(module) -> bool:
    """A module LoRA adapted: PEFT's (a non-empty dict of adapters `lora_A`) or another system's (one `lora_A`
    module, as NeMo AutoModel's LinearLoRA holds it)."""
    a = getattr(module, "lora_A", None)
    return a is not None and (not isinstance(a, torch.nn.ModuleDict) or len(a) > 0)


def adapted_modules(model) -> dict:
    """Which module names LoRA actually adapted (e.g. only attention in the published gpt-oss run)."""
    names = [n for n, m in model.named_modules() if has_adapter(m)]
    leaves = sorted({n.rsplit(".", 1)[-1] for n in names})
    return {"count": len(names), "names": leaves}


def parameter_counts(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "uint8",
               torch.float8_e4m3fn: "fp8"}


def precision_ran(model, gemm: str, fp8_layers: int | None = None) -> dict:
    """What the weights are stored in (by parameter count: frozen and trainable apart; bitsandbytes' 4-bit
    parameters read as nf4, the stand-ins of weights kept only in FP8 as fp8) and what the GEMMs run in: `gemm` (the autocast or compute dtype the runner set),
    fp8 where layers were converted."""
    from collections import Counter

    frozen, trainable = Counter(), Counter()
    for p in model.parameters():
        kind = ("nf4" if type(p).__name__ == "Params4bit" else "fp8" if getattr(p, "fp8_only", False)
                else DTYPE_NAMES.get(p.dtype, str(p.dtype)))
        (trainable if p.requires_grad else frozen)[kind] += p.numel()
    top = (lambda c: c.most_common(1)[0][0] if c else None)
    return {"frozen_weights": top(frozen), "trainable_weights": top(trainable),
            "gemm": "fp8" if fp8_layers else gemm, "fp8_layers": fp8_layers or None}
