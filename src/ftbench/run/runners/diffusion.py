"""Stable Diffusion LoRA runner: the recipe of diffusers' train_text_to_image_lora.py, loop in view.

Frozen VAE, text encoder and UNet in fp16; LoRA (gaussian init) on the UNet's to_q/to_k/to_v/to_out.0
with its parameters in fp32; VAE-encoded latents, noise, random timesteps, epsilon-prediction MSE;
fp16 autocast with a gradient scaler (bf16: bf16 weights and autocast, no scaler; fp32: neither); gradient
clipping; gradient accumulation. Images are decoded,
resized, centre-cropped and flipped on the CPU in the data loader, as the recipe does — unless the
variant trains from cached latents.
"""

from __future__ import annotations

import io
import statistics

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ftbench.harness.trackers import TimedBatches
from ftbench.build.variants import DTYPE_NAMES, compile_kwargs, compute_dtype, cuda_graphs, parameter_counts, precision_ran


class CaptionImages(torch.utils.data.Dataset):
    """Image/caption pairs, decoded and augmented per item on the CPU (the recipe's train_transforms)."""

    def __init__(self, path, tokenizer, resolution: int, seed: int):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        self.images = [row["bytes"] for row in table.column("image").to_pylist()]
        self.captions = table.column("text").to_pylist()
        self.tokenizer, self.resolution, self.seed = tokenizer, resolution, seed

    def __len__(self):
        return len(self.images)

    def sizes(self) -> dict:
        """What the loader decodes: the source JPEGs' sizes (header only) and the training resolution."""
        sizes = sorted({Image.open(io.BytesIO(b)).size for b in self.images})
        return {"source_px": [list(x) for x in sizes[:4]], "source_bytes_mean": sum(map(len, self.images)) / len(self),
                "resolution_px": self.resolution}

    def __getitem__(self, i):
        img = Image.open(io.BytesIO(self.images[i])).convert("RGB")
        r = self.resolution
        scale = r / min(img.size)
        img = img.resize((max(r, round(img.width * scale)), max(r, round(img.height * scale))), Image.BILINEAR)
        left, top = (img.width - r) // 2, (img.height - r) // 2
        img = img.crop((left, top, left + r, top + r))
        if np.random.default_rng((self.seed, i, torch.initial_seed() % 2**32)).random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        pixels = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)
        ids = self.tokenizer(self.captions[i], max_length=self.tokenizer.model_max_length, padding="max_length",
                             truncation=True, return_tensors="pt")["input_ids"][0]
        return {"pixel_values": pixels, "input_ids": ids}


class CachedLatents(torch.utils.data.Dataset):
    """Latents and text embeddings encoded once (rule cache_latents): the loader only indexes tensors."""

    def __init__(self, path):
        cache = torch.load(path)
        self.latents, self.embeddings = cache["latents"], cache["encoder_hidden_states"]

    def __len__(self):
        return len(self.latents)

    def __getitem__(self, i):
        return {"latents": self.latents[i], "encoder_hidden_states": self.embeddings[i]}


def load_components(path, device, dtype):
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import AutoTokenizer, CLIPTextModel

    tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer")
    text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder").to(device, dtype)
    vae = AutoencoderKL.from_pretrained(path, subfolder="vae").to(device, dtype)
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet").to(device, dtype)
    scheduler = DDPMScheduler.from_pretrained(path, subfolder="scheduler")
    for m in (text_encoder, vae, unet):
        m.requires_grad_(False)
    return tokenizer, text_encoder, vae, unet, scheduler


def add_lora(unet, lora: dict):
    """The recipe's LoRA: gaussian init on the attention projections, trainable parameters in fp32."""
    from peft import LoraConfig

    unet.add_adapter(LoraConfig(r=lora.get("r", 4), lora_alpha=lora.get("alpha", 4), init_lora_weights="gaussian",
                                target_modules=lora.get("target_modules", ["to_k", "to_q", "to_v", "to_out.0"])))
    params = [p for p in unet.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    return params


@torch.no_grad()
def encode_cache(path, data_path, resolution: int, seed: int, device) -> dict:
    """Latents (scaled) and text embeddings of every training sample, for cached-latents training."""
    tokenizer, text_encoder, vae, _, _ = load_components(path, device, torch.float16 if device.type == "cuda"
                                                         else torch.float32)
    ds = CaptionImages(data_path, tokenizer, resolution, seed)
    latents, embeddings = [], []
    for i in range(len(ds)):
        item = ds[i]
        px = item["pixel_values"][None].to(device, vae.dtype)
        latents.append((vae.encode(px).latent_dist.sample() * vae.config.scaling_factor)[0].cpu())
        embeddings.append(text_encoder(item["input_ids"][None].to(device))[0][0].cpu())
    return {"latents": torch.stack(latents), "encoder_hidden_states": torch.stack(embeddings)}


def train(ctx, record, device, meter):
    """Load, add LoRA, loop (data, encode, noise, predict, loss, backward, clip, step); fill the record."""
    s, v = ctx.settings, ctx.variant
    dtype = compute_dtype(v)
    with meter.load():
        tokenizer, text_encoder, vae, unet, scheduler = load_components(ctx.manifest["path"], device, dtype)
        params = add_lora(unet, s.lora)
        if v.gradient_checkpointing:
            unet.enable_gradient_checkpointing()
        layout = torch.channels_last if v.channels_last else torch.contiguous_format
        if v.channels_last:
            unet.to(memory_format=layout)
            vae.to(memory_format=layout)
    total, trainable = parameter_counts(unet)
    record["model"].update(parameters=total, trainable_parameters=trainable,
                           adapted_modules={"count": sum(1 for n, m in unet.named_modules() if hasattr(m, "lora_A")),
                                            "names": sorted(s.lora.get("target_modules", []))})
    record["precision"].update(precision_ran(unet, DTYPE_NAMES[dtype]))
    # fused AdamW takes the scaler's inf check as a tensor: stepping without the host sync
    optimizer = torch.optim.AdamW(params, lr=s.learning_rate, fused=v.clip_grad_sync_free or None)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    model = torch.compile(unet, **compile_kwargs(v)) if v.compile else unet

    g = torch.Generator().manual_seed(s.seed)
    if v.cached_latents:
        ds = CachedLatents(ctx.cache_path)
    else:
        ds = CaptionImages(ctx.train_path, tokenizer, s.resolution, s.seed)
    loader = torch.utils.data.DataLoader(ds, batch_size=ctx.spec.batch_size, shuffle=True, generator=g,
                                         num_workers=v.dataloader_workers, pin_memory=v.pin_memory, drop_last=True,
                                         persistent_workers=v.dataloader_workers > 0)
    batches = TimedBatches(loader)
    accum = s.gradient_accumulation_steps
    # With CUDA graphs a first backward would hand each LoRA weight the graph's own output buffer as its .grad,
    # and the next micro-step's replay overwrites it (the published reduce-overhead failure). Gradients that
    # exist beforehand are accumulated into in place, so they stay ours.
    graphs = cuda_graphs(v)
    if graphs:
        for p in params:
            p.grad = torch.zeros_like(p)
    meter.start()
    while not meter.done and meter.steps_taken < s.max_steps:
        data_wait, losses = 0.0, []
        for _ in range(accum):
            batch, wait = batches.next()
            data_wait += wait
            batch = {k: t.to(device, non_blocking=v.pin_memory) for k, t in batch.items()}
            with torch.no_grad():
                if v.cached_latents:
                    latents, cond = batch["latents"].to(dtype), batch["encoder_hidden_states"].to(dtype)
                else:
                    pixels = batch["pixel_values"].to(dtype, memory_format=layout)
                    latents = vae.encode(pixels).latent_dist.sample()
                    latents = latents * vae.config.scaling_factor
                    cond = text_encoder(batch["input_ids"])[0]
            noise = torch.randn_like(latents)
            t = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],), device=device)
            noisy = scheduler.add_noise(latents, noise, t).contiguous(memory_format=layout)
            if graphs:
                # CUDA graphs reuse their output buffers; mark each micro-step so accumulation reads fresh ones
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                pred = model(noisy, t, cond).sample
            loss = F.mse_loss(pred.float(), noise.float(), reduction="mean")
            scaler.scale(loss / accum).backward()
            losses.append(loss.detach())
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm, foreach=True)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=not graphs)
        meter.step(ctx.spec.batch_size * accum, loss=torch.stack(losses).mean(), data_wait_s=data_wait)
    meter.finish()
    median = statistics.median(r["step_time_s"] for r in meter.measured) if meter.measured else None
    record["extra"].update(gradient_accumulation_steps=accum, micro_step_time_s=median / accum if median else None,
                           train_samples=len(ds), memory_format="channels_last" if v.channels_last else "NCHW",
                           images=None if v.cached_latents else ds.sizes())
