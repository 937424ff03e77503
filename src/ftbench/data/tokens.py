"""Token-length statistics per dataset and tokenizer; image tokens per sample for LLaVA-style models."""

from __future__ import annotations

import numpy as np

from ftbench.data.datasets import read_split, sft_messages

FIXED_IMAGE_SIZE = (336, 336)


def length_stats(lengths, max_length: int) -> dict:
    x = np.asarray(lengths)
    cut = np.minimum(x, max_length)
    return {"n": int(x.size), "mean": float(x.mean()), "median": float(np.median(x)), "p95": float(np.percentile(x, 95)),
            "max": int(x.max()), "mean_truncated": float(cut.mean()), "median_truncated": float(np.median(cut)),
            "p95_truncated": float(np.percentile(cut, 95)), "share_truncated": float((x > max_length).mean())}


def text_token_lengths(tokenizer, ds, kind: str) -> list[int]:
    chats = [tokenizer.apply_chat_template(sft_messages(ex, kind), tokenize=False) for ex in ds]
    return [len(ids) for ids in tokenizer(chats, add_special_tokens=False)["input_ids"]]


def image_token_counts(processor, ds, prompt: str, fixed: bool) -> list[int]:
    """Image tokens per sample as the processor expands them (AnyRes, or every image resized to 336x336)."""
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.image_token)
    text = f"{processor.tokenizer.image_token}\n{prompt}"
    counts = []
    for ex in ds:
        img = ex["image"].convert("RGB")
        if fixed:
            img = img.resize(FIXED_IMAGE_SIZE)
        ids = processor(images=img, text=text, return_tensors="np")["input_ids"]
        counts.append(int((ids == image_id).sum()))
    return counts


def token_stats(model_path: str, family: str, data_path, kind: str, max_length: int, prompt: str = "Describe") -> dict:
    """Lengths before and after truncation; for image data and an LMM, image tokens AnyRes vs fixed."""
    ds = read_split(data_path)
    out = {"dataset_kind": kind, "max_length": max_length, "samples": len(ds)}
    if kind in ("instruction", "wikipedia"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path if family != "diffusion" else f"{model_path}/tokenizer")
        out["text_tokens"] = length_stats(text_token_lengths(tok, ds, kind), max_length)
    elif family == "lmm":
        from transformers import AutoProcessor

        proc = AutoProcessor.from_pretrained(model_path)
        anyres = image_token_counts(proc, ds, prompt, fixed=False)
        fixed = image_token_counts(proc, ds, prompt, fixed=True)
        # image tokens are never truncated: the processor expands all of them
        out["image_tokens_anyres"] = length_stats(anyres, max(anyres))
        out["image_tokens_fixed"] = length_stats(fixed, max(fixed))
        out["image_sizes"] = sorted({f"{ex['image'].width}x{ex['image'].height}" for ex in ds})
        out["per_sample"] = {"anyres": anyres, "fixed": fixed}
    else:
        raise ValueError(f"no token statistics for dataset kind {kind!r} with a {family} model")
    return out


def load_stats(paths) -> list[dict]:
    import json

    return [json.loads(open(p).read()) for p in paths]


def token_rows(stats: list[dict]) -> list[dict]:
    """Long-form rows (dataset, measure, statistic, value) for the token figure."""
    rows = []
    for s in stats:
        for measure in ("text_tokens", "image_tokens_anyres", "image_tokens_fixed"):
            if measure in s:
                for stat in ("mean", "median", "p95", "mean_truncated"):
                    rows.append({"dataset": s["dataset"], "model": s["model"], "measure": measure,
                                 "statistic": stat, "value": s[measure][stat]})
    return rows
