"""Variants as a ladder of techniques: each names the rung it stands on and what it adds, resolved to the knobs a
runner reads; every technique said in words."""

import copy
import dataclasses

import jsonschema
import pytest
import yaml

from conftest import ROOT
from ftbench.config import settings as ftc
from ftbench.core.knobs import DEFAULTS, Variant
from ftbench.config.techniques import TECHNIQUES, adds_words, legend, resolve, resolve_all, words

DEFAULT = yaml.safe_load((ROOT / "config/config.yaml").read_text())
from ftbench.config.settings import config_schema  # noqa: E402

SCHEMA = config_schema(ROOT / "config/schema/config.schema.yaml")  # the file with the knob table's block


def test_every_technique_sets_known_knobs_to_values_the_schema_accepts():
    props = SCHEMA["$defs"]["variants"]["additionalProperties"]["properties"]
    fields = {f.name for f in dataclasses.fields(Variant)}
    for t in TECHNIQUES.values():
        assert t.title and t.knobs and set(t.knobs) <= fields, t.name
        for k, v in t.knobs.items():
            jsonschema.validate(v, props[k])
            assert DEFAULTS[k] != v, f"{t.name} sets {k} to its default"


def test_a_rung_is_its_base_plus_what_it_adds_and_its_own_knobs_win():
    pool = {"lora": {"peft": "lora", "precision": "bf16"},
            "lora-tb": {"base": "lora", "adds": ["padding-free", "varlen", "compile-layers", "rows-4k"]},
            "lora-tb-cg": {"base": "lora-tb", "adds": ["cuda-graphs"]},
            "lora-tb-cg-8k": {"base": "lora-tb-cg", "token_budget": 8192}}
    assert resolve("lora-tb-cg", pool) == {"peft": "lora", "precision": "bf16", "padding_free": True,
                                           "attention": "varlen", "compile": "reduce-overhead",
                                           "compile_scope": "layers", "token_budget": 4096}
    assert resolve("lora-tb-cg-8k", pool)["token_budget"] == 8192
    assert adds_words("lora-tb-cg", pool) == "lora-tb + compiled layers in CUDA graphs"
    assert adds_words("lora-tb-cg-8k", pool) == "lora-tb-cg + rows of exactly 8,192 tokens"
    # a knob set back to its default undoes the one technique the base had, not every technique sharing that knob
    pool["lora-tb-eager"] = {"base": "lora-tb", "compile": None}
    pool["lora-tb-c"] = {"base": "lora", "compile": "default"}
    pool["lora-tb-c-eager"] = {"base": "lora-tb-c", "compile": None}
    assert adds_words("lora-tb-eager", pool) == "lora-tb + without torch.compile"
    eager = words("lora-tb-eager", pool)  # its compile scope left from lora-tb compiles nothing: not "per-layer"
    assert "compile" not in eager and "padding-free rows" in eager
    assert adds_words("lora-tb-c-eager", pool) == "lora-tb-c + without torch.compile"
    said = words("lora-tb-cg", pool)
    assert said.startswith("LoRA + ") and "compiled layers in CUDA graphs" in said and "padding-free rows" in said
    assert "rows of exactly 4,096 tokens" in said and "per-sequence attention" in said


def test_a_base_or_technique_that_does_not_resolve_is_a_config_error_naming_the_variant():
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"]["x"] = {"base": "no-such-rung"}
    with pytest.raises(ftc.ConfigError, match="variants.x: base 'no-such-rung'"):
        ftc.check_config(cfg, ROOT)
    cfg["variants"]["x"] = {"base": "lora", "adds": ["warp-speed"]}
    with pytest.raises(ftc.ConfigError, match="variants.x: adds 'warp-speed'"):
        ftc.check_config(cfg, ROOT)
    cfg["variants"]["x"] = {"base": "y"}
    cfg["variants"]["y"] = {"base": "x"}
    with pytest.raises(ftc.ConfigError, match="leads back to itself"):
        ftc.check_config(cfg, ROOT)


def test_the_config_ladder_resolves_every_variant_and_the_top_rung_reads_as_one_step():
    flat = resolve_all(DEFAULT["variants"])
    top = "lora-tb-cg-lean-async-pinned-fp8-static-fa4-lce8-wt-fa-acc-rw-ep-1r-ba"
    assert flat[top]["fp8_fast_accum"] == "all" and flat[top]["lora_b_one_read"] and flat[top]["token_budget"] == 4096
    assert adds_words(top, DEFAULT["variants"]) == (
        "lora-tb-cg-lean-async-pinned-fp8-static-fa4-lce8-wt-fa-acc-rw-ep-1r + fast accumulation in every FP8 GEMM")
    for name in DEFAULT["variants"]:  # every variant in words, none left to a knob's name
        assert words(name, DEFAULT["variants"]).startswith(("LoRA", "full fine-tune")), name


def test_a_legend_says_a_variant_no_longer_in_config_from_its_record():
    rows = legend(["lora", "gone"], DEFAULT["variants"],
                  [{"variant": "gone", "variant.precision": "fp8", "variant.fp8_backend": "torchao",
                    "variant.gradient_checkpointing": True, "variant.dataloader_workers": 4}])
    by = {r["variant"]: r for r in rows}
    assert by["lora"]["techniques, in words"] == "LoRA"
    assert by["gone"]["techniques, in words"] == (
        "LoRA + FP8 GEMMs on the frozen base (torchao, dynamic scales) + gradient checkpointing + 4 data-loader workers")
    assert legend(["unknown"])[0]["techniques, in words"] == "not in this config and no record of it"


def test_the_docs_page_of_techniques_is_generated_from_the_list_and_current():
    from ftbench.config.techniques import techniques_page

    assert (ROOT / "docs/techniques.md").read_text() == techniques_page(DEFAULT["variants"]), (
        "docs/techniques.md is stale: python -m ftbench.config.techniques > docs/techniques.md")


def test_display_names_are_short_words_that_tell_every_variant_of_a_page_apart():
    """Issue 80: a variant's name in words, made from its techniques' short words: what it is, then up to three
    techniques (a peer first, then what a rung adds to the rung it stands on), then how many more; GPUs and other
    valued knobs said; on one page no two variants read alike."""
    from ftbench.config.techniques import display_name, display_names, peer

    assert all(t.short for t in TECHNIQUES.values())  # every technique has its short words
    assert display_name({"peft": "lora"}) == "LoRA, bf16"
    assert display_name({"peft": "lora", "precision": "nf4"}) == "QLoRA"
    assert display_name(resolve("unsloth-lora-tb", DEFAULT["variants"])).startswith("LoRA: Unsloth, ")
    assert peer(resolve("unsloth-lora-tb", DEFAULT["variants"])) == "Unsloth"
    assert peer(resolve("lora-tb", DEFAULT["variants"])) is None
    pool = DEFAULT["variants"]
    names = display_names(list(pool), pool)
    assert len(set(names.values())) == len(names)  # the whole config on one page: none alike
    assert names["lora-fsdp2"] != names["lora-fsdp4"] and names["lora-fsdp4"].endswith("4 GPUs")
    top = "lora-tb-cg-lean-async-pinned-fp8-static-fa4-lce8-wt-fa-acc-rw-ep-1r-ba"
    assert names[top].startswith("LoRA: LoRA B in one read, ") and " more" in names[top]  # what the rung adds
    assert max(len(n) for n in names.values()) < 110
    # two variants alike in their first words lead with what tells them apart
    two = {"a": {"base": "lora-tb-cg", "adds": ["pinned", "sync-free", "no-metrics"]},
           "b": {"base": "lora-tb-cg", "adds": ["pinned", "sync-free", "no-metrics", "fused-adamw"]}}
    said = display_names(["a", "b"], {**pool, **two})
    assert said["a"] != said["b"] and "fused AdamW" in said["b"]
    assert display_names(["nowhere"], pool) == {"nowhere": "nowhere"}  # known nowhere: its code
