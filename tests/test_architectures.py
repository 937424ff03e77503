"""The shipped architectures match the published configs, and every scale builds."""

import pytest
import torch

from conftest import ROOT
from ftbench.config.architectures import load_architecture
from ftbench.harness.flops import causal_lm_shape

ARCH = ROOT / "config/architectures"


@pytest.mark.parametrize("name, expected", [
    ("qwen3-8b", {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
                  "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}),
    ("qwen3-32b", {"hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                   "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 151936}),
    ("gpt-oss-120b", {"hidden_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
                      "num_hidden_layers": 36, "head_dim": 64, "vocab_size": 201088, "sliding_window": 128}),
])
def test_full_scale_is_the_published_config(name, expected):
    cfg = load_architecture(ARCH / f"{name}.yaml", "full")["config"]
    assert {k: cfg[k] for k in expected} == expected


@pytest.mark.parametrize("name, billions", [("qwen3-8b", 8.19), ("qwen3-32b", 32.76), ("gpt-oss-120b", 116.8)])
def test_full_scale_parameter_count_on_meta_device(name, billions):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(load_architecture(ARCH / f"{name}.yaml", "full")["config"])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in model.parameters()) / 1e9
    assert n == pytest.approx(billions, rel=0.01)


def test_gpt_oss_alternates_sliding_and_full_attention():
    cfg = load_architecture(ARCH / "gpt-oss-120b.yaml", "proxy")["config"]
    assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    assert cfg["hidden_size"] == 2880  # proxy keeps the real widths


def test_llava_full_matches_published_and_tiny_keeps_image_geometry():
    full = load_architecture(ARCH / "llava-v1.6-mistral-7b.yaml", "full")["config"]
    tiny = load_architecture(ARCH / "llava-v1.6-mistral-7b.yaml", "tiny")["config"]
    assert full["text_config"]["intermediate_size"] == 14336 and full["vision_config"]["num_hidden_layers"] == 24
    assert tiny["vision_config"]["image_size"] == 336 and tiny["vision_config"]["patch_size"] == 14
    assert tiny["image_grid_pinpoints"] == full["image_grid_pinpoints"]


def test_sd15_components():
    comps = load_architecture(ARCH / "stable-diffusion-v1-5.yaml", "full")["components"]
    assert comps["unet"]["config"]["block_out_channels"] == [320, 640, 1280, 1280]
    assert comps["vae"]["config"]["scaling_factor"] == 0.18215
    assert comps["text_encoder"]["config"]["max_position_embeddings"] == 77


def test_matmul_params_of_qwen3_8b():
    shape = causal_lm_shape(load_architecture(ARCH / "qwen3-8b.yaml", "full")["config"])
    # 36 layers x (attention 2*4096*4096 + 2*4096*1024 + MLP 3*4096*12288) + LM head 4096*151936
    assert shape["matmul_params_per_token"] == 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 4096 * 151936


def test_unknown_scale_is_refused():
    with pytest.raises(ValueError, match="scale"):
        load_architecture(ARCH / "qwen3-8b.yaml", "huge")
