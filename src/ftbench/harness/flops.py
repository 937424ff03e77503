"""FLOP formulas and peak throughput per GPU, for MFU and HFU.

Training FLOPs per sequence of T tokens, counting a multiply-add as 2 FLOPs (the PaLM convention):

    forward                  2 * N * T  +  4 * L * T^2 * d_attn
    backward, activations    2 * N * T  +  8 * L * T^2 * d_attn
    backward, weights        2 * N_trainable * T           (frozen weights get no weight gradient)
    recompute (checkpointing) one more forward

N is the matmul parameters a token passes through (attention and MLP projections of every layer,
only the routed experts of a mixture-of-experts layer, and the LM head), L the layers, d_attn the
width of the attention (heads x head_dim). Embedding lookups and norms are not counted.

Two figures from it (NeMo's convention for LoRA: frozen weights get no weight-gradient FLOPs):
- model FLOPs (MFU): the real tokens only (each sequence at its unpadded length), no recompute —
  what the training needs, whatever the implementation does;
- hardware FLOPs (HFU): what the GPU executed — padded lengths, plus the recomputed forward of
  gradient checkpointing.
Both are divided by the dense peak of the precision the GEMMs ran in (bf16 and fp16 share one peak;
fp8 has its own; fp32/TF32 has none in the table, so no MFU is given rather than a wrong one).
"""

from __future__ import annotations

# Dense (no sparsity) tensor-core peaks in TFLOP/s, per GPU name fragment, for bf16/fp16 and fp8.
# Vendors' tables often print the 2:4-sparsity figure; the published Study B table does (H100 SXM5
# "1978.9" bf16): these are half of those.
PEAK_TFLOPS = {
    "H200": {"bf16": 989.4, "fp8": 1978.9},
    "H100 SXM": {"bf16": 989.4, "fp8": 1978.9},
    "H100 80GB HBM3": {"bf16": 989.4, "fp8": 1978.9},
    "H100 PCIe": {"bf16": 756.0, "fp8": 1513.0},
    "H100 NVL": {"bf16": 835.0, "fp8": 1670.0},
    "RTX PRO 6000 Blackwell Max-Q": {"bf16": 438.9, "fp8": 877.9},
    "RTX PRO 6000 Blackwell": {"bf16": 503.8, "fp8": 1007.6},
    "A100": {"bf16": 312.0, "fp8": None},
    "L40S": {"bf16": 362.1, "fp8": 733.0},
}


def peak_tflops(device_name: str | None, precision: str = "bf16") -> float | None:
    """The peak for a device, matching the longest name fragment; None for CPUs and unknown GPUs."""
    if not device_name:
        return None
    key = peak_precision(precision)
    if key is None:
        return None
    hits = [frag for frag in PEAK_TFLOPS if frag.lower() in device_name.lower()]
    if not hits:
        return None
    return PEAK_TFLOPS[max(hits, key=len)][key]


def causal_lm_shape(cfg) -> dict:
    """Matmul parameters per token and attention width of a decoder-only transformer config."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    h, layers = get("hidden_size"), get("num_hidden_layers")
    heads, kv = get("num_attention_heads"), get("num_key_value_heads") or get("num_attention_heads")
    hd = get("head_dim") or h // heads
    attn = h * heads * hd * 2 + h * kv * hd * 2  # q, o + k, v
    inter = get("intermediate_size")
    experts, top_k = get("num_local_experts"), get("num_experts_per_tok")
    if experts:
        mlp = top_k * 3 * h * inter + h * experts  # routed experts (gate, up, down) + router
    else:
        mlp = 3 * h * inter
    return {"matmul_params_per_token": layers * (attn + mlp) + h * get("vocab_size"),
            "layers": layers, "attention_width": heads * hd}


def train_flops(seq_lens, matmul_params: int, trainable_params: int, layers: int, attention_width: int,
                gradient_checkpointing: bool = False) -> float:
    """FLOPs of one training step over sequences of the given (padded) lengths (formula above)."""
    total = 0.0
    for t in seq_lens:
        fwd = 2 * matmul_params * t + 4 * layers * t * t * attention_width
        bwd = 2 * matmul_params * t + 8 * layers * t * t * attention_width + 2 * trainable_params * t
        total += fwd * (2 if gradient_checkpointing else 1) + bwd
    return total


def step_flops(real_lens, padded_lens, shape: dict, trainable_params: int, checkpointing: bool) -> dict:
    """One step's model FLOPs (real lengths, no recompute) and hardware FLOPs (padded lengths, recompute)."""
    args = (shape["matmul_params_per_token"], trainable_params, shape["layers"], shape["attention_width"])
    return {"flops_model": train_flops(real_lens, *args), "flops_hardware": train_flops(padded_lens, *args, checkpointing)}


def peak_precision(gemm: str | None) -> str | None:
    """The peak a GEMM dtype is scored against: bf16 and fp16 share the dense 16-bit peak; fp8 its own."""
    return {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8"}.get(gemm or "")


def mfu(flops_per_s: float | None, peak: float | None) -> float | None:
    if not flops_per_s or not peak:
        return None
    return flops_per_s / (peak * 1e12)
