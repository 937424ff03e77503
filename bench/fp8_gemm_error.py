"""The error of each FP8 form's GEMMs against an fp32 reference, at Qwen3-8B's projection shapes and the quality
study's real model's (SmolLM2-135M), so a reader sees whether the small model's short reductions (hidden 576, MLP
1,536) understate what fast accumulation and the casts cost at Qwen3-8B's (4,096 / 12,288).

Each shape is one frozen projection as the frontier runs it: the forward GEMM y = x W^T (reduction over the input
features) and the input's gradient dx = dy W (reduction over the output features). The operands are drawn once per
shape: x with a few outlier channels (activations' heavy tails: 1 % of channels 20x larger), W ~ N(0, 0.02), dy ~
N(0, 1e-3); the weight is the bf16 value the model holds, and the reference is the fp32 product of those bf16
values. Forms, as ftbench.build.fp8 computes them (the frozen weight cast once, tensorwise e4m3; activations e4m3 and
gradients e5m2): bf16 (the baseline's GEMM), FP8 tensorwise exact, tensorwise with fast accumulation (torchao's
dynamic recipe runs its forward so), row-wise activation scales exact, row-wise with fast accumulation. The LM head
(4,096 x 151,936) is the FP8 head's shape (lm_head: fp8).

Error: ||C - C_ref||_F / ||C_ref||_F (relative Frobenius), and the largest |C - C_ref| over the largest |C_ref|.

    python3 bench/fp8_gemm_error.py [--out FILE.json] [--tokens M]   (a CUDA GPU of compute capability 8.9+; ~20 s)

With `--real MODEL_DIR EVAL_PARQUET` the operands are real: each decoder projection's input x and output gradient dy
captured from the real model (a materialized checkpoint, e.g. results/models/smollm2-135m/full/checkpoint) running
the held-out text (the quality study's eval split, its scored labels' loss backpropagated), with that projection's
own bf16 weight; the forms then include the quality recipes' (weights per channel, E4M3 gradients).

On a CPU (no FP8 tensor cores: fast accumulation is ignored there) `--tokens 64 --small` checks the script runs.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from ftbench.build.fp8 import E4M3, E5M2, column_scales, fp8_gemm, frozen_fp8

# (model, projection, input features K, output features N)
SHAPES = [("Qwen3-8B", "q_proj / o_proj", 4096, 4096), ("Qwen3-8B", "k_proj / v_proj", 4096, 1024),
          ("Qwen3-8B", "gate_proj / up_proj", 4096, 12288), ("Qwen3-8B", "down_proj", 12288, 4096),
          ("Qwen3-8B", "lm_head (fp8 head)", 4096, 151936),
          ("SmolLM2-135M", "q_proj / o_proj", 576, 576), ("SmolLM2-135M", "k_proj / v_proj", 576, 192),
          ("SmolLM2-135M", "gate_proj / up_proj", 576, 1536), ("SmolLM2-135M", "down_proj", 1536, 576),
          ("SmolLM2-135M", "lm_head (fp8 head)", 576, 49152)]
FORMS = [("bf16", None, False), ("fp8 tensorwise, exact", "tensorwise", False),
         ("fp8 tensorwise, fast accumulation", "tensorwise", True), ("fp8 row-wise, exact", "rowwise", False),
         ("fp8 row-wise, fast accumulation", "rowwise", True)]


def operands(m: int, k: int, n: int, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, device=device, generator=g)
    outliers = torch.rand(k, device=device, generator=g) < 0.01
    x[:, outliers] *= 20
    w = (torch.randn(n, k, device=device, generator=g) * 0.02).to(torch.bfloat16)
    dy = torch.randn(m, n, device=device, generator=g) * 1e-3
    return x.to(torch.bfloat16), w, dy.to(torch.bfloat16)


def real_operands(model_dir: str, eval_path: str, tokens: int, device) -> dict:
    """{projection name: (x, w, dy)} of layer 0, the middle layer and the last, captured from the real model on the
    held-out text: each projection's input and output gradient over up to `tokens` tokens, and its bf16 weight."""
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftbench.data.datasets import sft_messages

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)
    n = model.config.num_hidden_layers
    layers = sorted({0, n // 2, n - 1})
    kind = "instruction" if "instruction" in pq.read_schema(eval_path).names else "wikipedia"
    texts = [tok.apply_chat_template(sft_messages(r, kind), tokenize=False)
             for r in pq.read_table(eval_path).to_pylist()]
    ids = tok("".join(texts), return_tensors="pt", add_special_tokens=False)["input_ids"][:, :tokens].to(device)
    seen, hooks = {}, []
    for i in layers:
        for name, mod in model.model.layers[i].named_modules():
            if isinstance(mod, torch.nn.Linear):
                key = f"layer {i} {name.split('.')[-1]}"
                hooks.append(mod.register_forward_hook(
                    lambda m, inp, out, key=key: seen.setdefault(key, {}).update(x=inp[0].detach(), w=m.weight)))
                hooks.append(mod.register_full_backward_hook(
                    lambda m, gin, gout, key=key: seen.setdefault(key, {}).update(dy=gout[0].detach())))
    for p in model.parameters():
        p.requires_grad_(True)
    model(input_ids=ids, labels=ids).loss.backward()
    for h in hooks:
        h.remove()
    flat = {k: (v["x"].reshape(-1, v["x"].shape[-1]), v["w"].detach(), v["dy"].reshape(-1, v["dy"].shape[-1]))
            for k, v in seen.items()}
    rows = min(x.shape[0] for x, _, _ in flat.values())
    align = rows - rows % 16  # the FP8 GEMM's shape rule
    return {k: (x[:align], w, dy[:align]) for k, (x, w, dy) in flat.items()}


def errors(c: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = c.float() - ref
    return (d.norm() / ref.norm()).item(), (d.abs().max() / ref.abs().max()).item()


# the quality recipes' forms (ftbench.build.fp8.frozen_fp8_channels): weights a scale a channel, activations a scale a
# token, gradients in E4M3 or E5M2, exact accumulation
CHANNEL_FORMS = [("fp8 weights per channel, E4M3 gradients, exact", E4M3),
                 ("fp8 weights per channel, E5M2 gradients, exact", E5M2)]


def measure(m: int, k: int, n: int, device, given=None) -> list[dict]:
    x, w, dy = given if given is not None else operands(m, k, n, device)
    y_ref, dx_ref = x.float() @ w.float().t(), dy.float() @ w.float()
    w_fp8, w_inv, w_t = frozen_fp8(w, transpose=True)
    out = []
    forms = FORMS + ([(name, "channel", dtype) for name, dtype in CHANNEL_FORMS] if given is not None else [])
    for form, scaling, fast in forms:
        if scaling is None:
            y, dx = x @ w.t(), dy @ w
        elif scaling == "channel":
            from ftbench.build.fp8 import frozen_fp8_channels

            w8, col_out, w8_t, col_in = frozen_fp8_channels(w)
            y = fp8_gemm(x, E4M3, w8.t(), col_out)
            dx = fp8_gemm(dy, fast, w8_t.t(), col_in)  # (here `fast` carries the gradients' dtype)
        else:
            rows = scaling == "rowwise"
            y = fp8_gemm(x, E4M3, w_fp8.t(), column_scales(w_inv, n) if rows else w_inv, fast)
            dx = fp8_gemm(dy, E5M2, w_t.t(), column_scales(w_inv, k) if rows else w_inv, fast)
        for gemm, c, ref, reduction in (("forward y = x W^T", y, y_ref, k), ("input gradient dx = dy W", dx, dx_ref, n)):
            rel, top = errors(c, ref)
            out.append({"form": form, "gemm": gemm, "reduction": reduction, "rel_fro_error": rel,
                        "max_error_over_max": top})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--small", action="store_true", help="the small model's shapes only (a CPU check)")
    ap.add_argument("--real", nargs=2, metavar=("MODEL_DIR", "EVAL_PARQUET"),
                    help="real operands captured from this model on this held-out split")
    a = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        print("FP8 GEMMs need compute capability 8.9+", file=sys.stderr)
        return 2
    rows = []
    if a.real:
        for proj, (x, w, dy) in real_operands(*a.real, a.tokens, device).items():
            for r in measure(x.shape[0], w.shape[1], w.shape[0], device, (x, w, dy)):
                rows.append({"model": "SmolLM2-135M, real activations", "projection": proj, "tokens": x.shape[0],
                             "in_features": w.shape[1], "out_features": w.shape[0], **r})
                print(f"{proj:22s} {r['gemm']:26s} K={r['reduction']:6d} {r['form']:48s} "
                      f"rel {r['rel_fro_error']:.2e}  max {r['max_error_over_max']:.2e}", flush=True)
    for model, proj, k, n in SHAPES if not a.real else []:
        if a.small and model != "SmolLM2-135M":
            continue
        m = min(a.tokens, 2048) if "lm_head" in proj else a.tokens
        for r in measure(m, k, n, device):
            rows.append({"model": model, "projection": proj, "tokens": m, "in_features": k, "out_features": n, **r})
            print(f"{model:13s} {proj:22s} {r['gemm']:26s} K={r['reduction']:6d} {r['form']:36s} "
                  f"rel {r['rel_fro_error']:.2e}  max {r['max_error_over_max']:.2e}", flush=True)
    method = __doc__.split("\n\n")[4 if a.real else 1].replace("\n", " ")
    facts = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
             "method": method, "rows": rows}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(facts, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
