"""Materialized checkpoints load through the ordinary from_pretrained path."""

import json

import pytest
import torch
from PIL import Image

from conftest import ROOT
from ftbench.config.architectures import load_architecture
from ftbench.build.models import materialize_model

ARCH = ROOT / "config/architectures"


def test_causal_lm_checkpoint_loads_and_runs(tiny_qwen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"])
    tok = AutoTokenizer.from_pretrained(tiny_qwen["path"])
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}], return_tensors="pt",
                                  add_generation_prompt=True, return_dict=True)["input_ids"]
    assert model(ids).logits.shape[-1] == model.config.vocab_size
    assert len(tok) <= model.config.vocab_size
    assert tiny_qwen["parameters"] == sum(p.numel() for p in model.parameters())
    from pathlib import Path

    manifest = json.loads((Path(tiny_qwen["path"]).parent / "model.json").read_text())
    assert manifest["weights_source"] == "random" and manifest["scale"] == "tiny"


def test_moe_model_is_built_in_process_with_experts_split(tmp_path):
    from ftbench.build.experts import SplitExperts
    from ftbench.build.stages import build_model

    m = materialize_model(load_architecture(ARCH / "gpt-oss-120b.yaml", "tiny"), "random", tmp_path, 0)
    assert m["build"] == "in_process" and not list(tmp_path.rglob("*.safetensors"))
    model, _ = build_model(m, 0, "cpu", torch.float32)
    assert model.config.num_local_experts == 8 and isinstance(model.model.layers[0].mlp.experts, SplitExperts)
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, model.config.vocab_size)


def test_llava_processor_gives_the_published_image_token_counts(tmp_path):
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    m = materialize_model(load_architecture(ARCH / "llava-v1.6-mistral-7b.yaml", "tiny"), "random", tmp_path, 0)
    proc = AutoProcessor.from_pretrained(m["path"])
    image_id = proc.tokenizer.convert_tokens_to_ids("<image>")
    counts = {}
    for size in [(500, 500), (336, 336)]:
        ids = proc(images=Image.new("RGB", size), text="<image>\nDescribe", return_tensors="pt")["input_ids"]
        counts[size] = int((ids == image_id).sum())
    assert counts == {(500, 500): 2928, (336, 336): 1176}
    model = LlavaNextForConditionalGeneration.from_pretrained(m["path"])
    assert model.config.image_token_index == image_id


def test_sd15_checkpoint_loads_as_a_diffusers_pipeline_folder(tmp_path):
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import AutoTokenizer, CLIPTextModel

    m = materialize_model(load_architecture(ARCH / "stable-diffusion-v1-5.yaml", "tiny"), "random", tmp_path, 0)
    unet = UNet2DConditionModel.from_pretrained(m["path"], subfolder="unet")
    vae = AutoencoderKL.from_pretrained(m["path"], subfolder="vae")
    text = CLIPTextModel.from_pretrained(m["path"], subfolder="text_encoder")
    tok = AutoTokenizer.from_pretrained(m["path"], subfolder="tokenizer")
    sched = DDPMScheduler.from_pretrained(m["path"], subfolder="scheduler")
    assert sched.config.num_train_timesteps == 1000 and tok.model_max_length == 77
    latents = vae.encode(torch.randn(1, 3, 64, 64)).latent_dist.sample()
    emb = text(tok(["a drawing"], return_tensors="pt")["input_ids"])[0]
    out = unet(latents, torch.tensor([10]), encoder_hidden_states=emb).sample
    assert out.shape == latents.shape


def test_hub_source_is_a_pointer_and_only_full_scale(tmp_path):
    arch = load_architecture(ARCH / "qwen3-8b.yaml", "full")
    m = materialize_model(arch, "Qwen/Qwen3-8B", tmp_path, 0)
    assert m["path"] == "Qwen/Qwen3-8B" and not (tmp_path / "checkpoint").exists()
    with pytest.raises(ValueError, match="full scale"):
        materialize_model(load_architecture(ARCH / "qwen3-8b.yaml", "tiny"), "Qwen/Qwen3-8B", tmp_path, 0)
