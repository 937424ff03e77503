"""LLaVA-NeXT LoRA runner (Study A): beans images with the prompt "Describe" and the label as target.

Shape policies: `dynamic` keeps AnyRes (token counts follow each image's size and aspect ratio) and pads
text per batch; `fixed` resizes every image to 336x336 and pads every sequence to `fixed_length`, so all
shapes are constant; `bucketed` keeps AnyRes but pads sequences up to a multiple of `bucket_multiple`, so
the compiler sees a bounded set of shapes. FP8 variants pad text to a multiple of 16 as well (the FP8 GEMM
shape rule on the language model's token dimension; see `ftbench.build.fp8`).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from ftbench.build import fp8
from ftbench.data.datasets import BEAN_LABELS, read_split
from ftbench.harness.flops import causal_lm_shape, step_flops
from ftbench.harness.trackers import TimedBatches
from ftbench.data.tokens import FIXED_IMAGE_SIZE
from ftbench.build.variants import (DTYPE_NAMES, adapted_modules, apply_lora, compile_model, compute_dtype, load_pretrained,
                        parameter_counts, precision_ran)

PROMPT = "Describe"
LM_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


class Collator:
    """Processor call per batch: prompt + label, labels masked to the answer tokens only."""

    def __init__(self, processor, policy: str, fixed_length: int, pad_multiple: int = 1):
        self.processor, self.policy = processor, policy
        self.fixed_length, self.pad_multiple = fixed_length, pad_multiple
        tok = processor.tokenizer
        self.image_token, self.eos = tok.image_token, tok.eos_token

    def __call__(self, examples):
        tok = self.processor.tokenizer
        images = [ex["image"].convert("RGB") for ex in examples]
        if self.policy == "fixed":
            images = [im.resize(FIXED_IMAGE_SIZE) for im in images]
        answers = [BEAN_LABELS[ex["labels"]] + self.eos for ex in examples]
        texts = [f"{self.image_token}\n{PROMPT}\n{a}" for a in answers]
        pad = {"padding": "max_length", "max_length": self.fixed_length} if self.policy == "fixed" else {
            "padding": "longest"}
        enc = self.processor(images=images, text=texts, return_tensors="pt", **pad)
        if self.policy != "fixed":
            length = enc["input_ids"].shape[1]
            extra = (-length) % self.pad_multiple
            if extra:
                enc["input_ids"] = torch.nn.functional.pad(enc["input_ids"], (0, extra), value=tok.pad_token_id)
                enc["attention_mask"] = torch.nn.functional.pad(enc["attention_mask"], (0, extra), value=0)
        labels = torch.full_like(enc["input_ids"], -100)
        ends = enc["attention_mask"].sum(1)  # right padding: the answer ends each row's real tokens
        for i, a in enumerate(answers):
            k = len(tok(a, add_special_tokens=False)["input_ids"])
            labels[i, ends[i] - k:ends[i]] = enc["input_ids"][i, ends[i] - k:ends[i]]
        enc["labels"] = labels
        return dict(enc)


def load_model(ctx, device):
    """LLaVA-NeXT with the variant applied: quantization, FP8 conversion (before LoRA), LoRA, checkpointing."""
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    v, s = ctx.variant, ctx.settings
    processor = AutoProcessor.from_pretrained(ctx.manifest["path"])
    model = load_pretrained(LlavaNextForConditionalGeneration, ctx.manifest["path"], v, device)
    info = {}
    if v.precision == "fp8":
        convert = fp8.convert_te if v.fp8_backend == "te" else fp8.convert_torchao
        info = convert(model, include_vision=v.fp8_vision)
    if v.gradient_checkpointing and v.precision != "nf4":  # apply_lora's k-bit preparation enables it for nf4
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if v.precision == "fp8" and v.fp8_backend == "te":
            # the recompute in the backward must run the FP8 layers as the forward did (outside te.autocast it
            # would run them in bf16 and save different tensors): Transformer Engine's own checkpoint does that
            model._set_gradient_checkpointing(True, fp8.te_checkpoint_function())
        model.enable_input_require_grads()
    model = apply_lora(model, v, {"target_modules": LM_TARGETS, **s.lora}, task_type=None)
    return model, processor, info


def pad_multiple(variant, settings) -> int:
    """Sequence lengths are padded up to a multiple of this (1: no extra padding)."""
    if variant.shape_policy == "bucketed":
        return settings.bucket_multiple
    return fp8.ALIGN if variant.precision == "fp8" else 1


def fp8_context(variant):
    if variant.precision == "fp8" and variant.fp8_backend == "te":
        return fp8.te_autocast(variant.fp8_recipe)  # one recipe for the run: delayed scaling keeps amax history
    return nullcontext


def train(ctx, record, device, meter):
    """Load, wrap, loop (data, forward, backward, step) for warm-up + measured windows, evaluate."""
    s, v = ctx.settings, ctx.variant
    with meter.load():
        model, processor, fp8_info = load_model(ctx, device)
    total, trainable = parameter_counts(model)
    record["model"].update(parameters=total, trainable_parameters=trainable, adapted_modules=adapted_modules(model))
    record["extra"]["fp8"] = fp8_info or None
    dtype = compute_dtype(v)
    record["precision"].update(precision_ran(model, DTYPE_NAMES[dtype], (fp8_info or {}).get("converted")))
    shape = causal_lm_shape(model.config.text_config.to_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.learning_rate)
    step_fn = compile_model(model, v)
    collate = Collator(processor, v.shape_policy, s.fixed_length, pad_multiple(v, s))
    g = torch.Generator().manual_seed(s.seed)
    train_ds = read_split(ctx.train_path)
    loader = torch.utils.data.DataLoader(train_ds, batch_size=ctx.spec.batch_size, shuffle=True, generator=g,
                                         collate_fn=collate, num_workers=v.dataloader_workers, drop_last=True,
                                         pin_memory=v.pin_memory, persistent_workers=v.dataloader_workers > 0)
    image_id = processor.tokenizer.convert_tokens_to_ids(processor.tokenizer.image_token)
    autocast = autocast_for(device, dtype)
    fp8_ctx = fp8_context(v)
    batches, image_tokens = TimedBatches(loader), []
    model.train()
    meter.start()
    while not meter.done and meter.steps_taken < s.max_steps:
        batch, wait = batches.next()
        image_tokens += (batch["input_ids"] == image_id).sum(1).tolist()
        real = batch["attention_mask"].sum(1).tolist()  # the loader's CPU tensors: no device sync
        b, t = batch["input_ids"].shape
        batch = {k: x.to(device, non_blocking=v.pin_memory) for k, x in model_inputs(batch, v).items()}
        batch["pixel_values"] = batch["pixel_values"].to(dtype)
        with autocast, fp8_ctx():
            loss = step_fn(**batch, use_cache=False).loss  # no KV cache in training (and no per-layer guards)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.step(b, tokens=sum(real), padded_tokens=b * t, loss=loss.detach(), data_wait_s=wait,
                   shape=f"{b}x{t}", **step_flops(real, [t] * b, shape, trainable, v.gradient_checkpointing))
    meter.finish()
    record["extra"].update(image_tokens_per_sample=sum(image_tokens) / len(image_tokens),
                           shape_policy=v.shape_policy, pad_multiple=pad_multiple(v, s),
                           gradient_checkpointing_active=v.gradient_checkpointing)
    with meter.eval():
        # the eager module: evaluating through the compiled one recompiles for no_grad (90 s at full scale);
        # with compile_scope layers the blocks stay compiled (a no_grad graph per block class: seconds)
        record["loss"]["eval"] = evaluate(model, read_split(ctx.eval_path), collate, ctx.spec.batch_size, device,
                                          dtype, fp8_ctx, v)


def model_inputs(batch: dict, variant) -> dict:
    """What the model is called with: the batch, without its padding mask for `attention: causal`. The
    collator pads on the right, so under the causal mask no real token sees a pad (each pad comes after every
    real token of its row) and pads carry no labels: the loss is the masked one's, and SDPA may take its flash
    kernel (is_causal, no mask) instead of a masked kernel over padded rows (tests/test_runner.py)."""
    if variant.attention != "causal":
        return batch
    mask = batch["attention_mask"]
    if bool((mask[:, 1:] > mask[:, :-1]).any()):
        raise RuntimeError("attention 'causal' needs right padding; this batch has padding before real tokens")
    return {k: x for k, x in batch.items() if k != "attention_mask"}


def autocast_for(device, dtype):
    """Autocast to the compute dtype (off for fp32: the weights are already in it)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


@torch.no_grad()
def evaluate(model, ds, collate, batch_size, device, dtype, fp8_ctx, variant) -> float:
    """Mean loss over the held-out split."""
    autocast, losses = autocast_for(device, dtype), []
    for i in range(0, len(ds), batch_size):
        batch = collate([ds[j] for j in range(i, min(i + batch_size, len(ds)))])
        batch = {k: x.to(device) for k, x in model_inputs(batch, variant).items()}
        batch["pixel_values"] = batch["pixel_values"].to(dtype)
        with autocast, fp8_ctx():
            losses.append(model(**batch, use_cache=False).loss.float())
    return float(torch.stack(losses).mean()) if losses else None
