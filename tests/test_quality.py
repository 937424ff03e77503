"""The quality study's pieces: a GGUF model source, real text from the standard library, the verdicts."""

import json

import numpy as np
import polars as pl
import pytest
import torch

from ftbench import quality
from ftbench.data import held_out_module, python_docs, python_docs_split
from ftbench.models import materialize_gguf

H, L, F, V, NH, KV = 16, 2, 32, 40, 2, 1


def write_tiny_gguf(path):
    """A two-layer Llama in GGUF (F32 tensors, a byte-level BPE of 40 tokens), and the tensors written."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(H // NH)
    w.add_vocab_size(V)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(97, 123)] + ["Ġ", ".", ","]
    tokens += ["th", "he", "in", "er", "an", "re", "on", "at"][:V - len(tokens)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(["t h", "h e", "i n", "e r", "a n", "r e", "o n", "a t"][:len(tokens) - 32])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    rng, written = np.random.default_rng(0), {}
    shapes = {"token_embd.weight": (V, H), "output_norm.weight": (H,), "output.weight": (V, H)}
    for i in range(L):
        shapes.update({f"blk.{i}.attn_norm.weight": (H,), f"blk.{i}.attn_q.weight": (H, H),
                       f"blk.{i}.attn_k.weight": (KV * H // NH, H), f"blk.{i}.attn_v.weight": (KV * H // NH, H),
                       f"blk.{i}.attn_output.weight": (H, H), f"blk.{i}.ffn_norm.weight": (H,),
                       f"blk.{i}.ffn_gate.weight": (F, H), f"blk.{i}.ffn_up.weight": (F, H),
                       f"blk.{i}.ffn_down.weight": (H, F)})
    for name, shape in shapes.items():
        written[name] = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        w.add_tensor(name, written[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def unpermute(w, heads):
    """llama.cpp's q/k row order back to Hugging Face's (the inverse of its converter's permute)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_a_gguf_file_loads_as_the_tensors_written_and_its_record_names_it(tmp_path):
    written = write_tiny_gguf(tmp_path / "tiny.gguf")
    manifest = materialize_gguf({"path": str(tmp_path / "tiny.gguf")}, tmp_path / "model")
    from safetensors.torch import load_file

    sd = load_file(str(tmp_path / "model/checkpoint/model.safetensors"))
    names = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
             "output_norm.weight": "model.norm.weight"}
    for i in range(L):
        for g, h in (("attn_norm", "input_layernorm"), ("attn_v", "self_attn.v_proj"), ("attn_output",
                     "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.gate_proj"),
                     ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
            names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{h}.weight"
    for g, h in names.items():
        assert torch.equal(sd[h], torch.from_numpy(written[g])), h
    for i in range(L):
        assert torch.equal(sd[f"model.layers.{i}.self_attn.q_proj.weight"],
                           torch.from_numpy(unpermute(written[f"blk.{i}.attn_q.weight"], NH)))
        assert torch.equal(sd[f"model.layers.{i}.self_attn.k_proj.weight"],
                           torch.from_numpy(unpermute(written[f"blk.{i}.attn_k.weight"], KV)))
    facts = manifest["gguf"]
    assert facts["quantization"] == "F32" and len(facts["sha256"]) == 64 and facts["gguf_architecture"] == "llama"
    assert manifest["pretrained"] and manifest["family"] == "causal_lm" and manifest["scale"] == "full"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(manifest["path"])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"  # the file's own ids, not the loader's


def test_a_package_that_ships_no_such_file_is_named():
    with pytest.raises(FileNotFoundError, match="ships no"):
        materialize_gguf({"package": "pytest", "file": "nothing.gguf"}, "/tmp/none")


def test_python_docs_are_real_text_held_out_by_whole_module():
    rows = python_docs("instruction")
    assert len(rows) > 1500 and all(40 <= len(r["output"]) <= 600 for r in rows)
    assert any(r["module"] == "shlex" and r["input"] == "def quote(s):" for r in rows)
    ds = python_docs_split({"kind": "instruction", "num_samples": 50, "eval_samples": 10}, 0).to_list()
    train, held = ds[:50], ds[50:]
    assert all(held_out_module(r["module"]) for r in held) and not any(held_out_module(r["module"]) for r in train)
    assert {r["module"] for r in train}.isdisjoint({r["module"] for r in held})
    text = python_docs("wikipedia")
    assert text and all(200 <= len(r["text"]) <= 4000 for r in text)


def run(variant, pts, status="ok", gpu="H100 SXM5"):
    return {"model": "m", "dataset": "d", "gpu": gpu, "variant": variant, "status": status, "reason": None,
            "loss.held_out": json.dumps({"points": [{"step": i, "tokens": t, "loss": x} for i, (t, x) in
                                                    enumerate(pts)]}) if pts else None}


BASE = [("lora", [(0, 3.0), (100, 2.0), (200, 1.60)]), ("lora-s1", [(0, 3.0), (100, 2.0), (200, 1.61)]),
        ("lora-s2", [(0, 3.0), (100, 2.0), (200, 1.59), (210, 1.58)])]


def verdicts(extra, seeds=("lora-s1", "lora-s2")):
    df = pl.DataFrame([run(v, p) for v, p in BASE] + extra, infer_schema_length=None)
    return {r["variant"]: r for r in quality.quality_rows(df, "lora", list(seeds))}


def test_a_technique_beyond_the_seeds_noise_costs_quality_and_one_within_keeps_it():
    out = verdicts([run("fp8", [(0, 3.0), (100, 2.1), (200, 1.70)]), run("fast", [(0, 3.0), (100, 2.0), (200, 1.601)])])
    assert out["fp8"]["quality"] == "costs quality" and "+0.100 nats at the same tokens" in out["fp8"]["why"]
    assert out["fast"]["quality"] == "keeps quality"
    assert out["fp8"]["tokens to quality"] is None  # it never reaches the baseline's loss
    # the baseline read at the fewest tokens any seed trained (200); tokens to quality between points
    assert out["lora"]["compared at tokens"] == 200
    slow = verdicts([run("slow", [(0, 3.0), (200, 1.7), (400, 1.5)])])["slow"]
    assert slow["tokens to quality"] == pytest.approx(200 + 200 * (1.7 - 1.6) / (1.7 - 1.5), rel=1e-3)


def test_a_run_without_held_out_losses_reads_quality_not_measured_never_keeps():
    out = verdicts([run("speed-only", None), run("failed", None, status="oom")])
    assert out["speed-only"]["quality"] == "quality not measured"
    assert out["failed"]["quality"] == "quality not measured" and "oom" in out["failed"]["why"]
    assert quality.verdict(None, {"mean": 1.6, "std": 0.01, "n": 3})[0] == "quality not measured"


def test_a_run_a_few_tokens_short_is_read_where_it_ended_and_one_far_short_is_not_measured():
    """Packed rows hold a few label tokens fewer than padded ones: a curve ending within 2 % of the baseline's tokens
    is read at its end, the seeds read there too; one ending further off is not read at all."""
    out = verdicts([run("packed", [(0, 3.0), (100, 2.0), (198, 1.70)]), run("short", [(0, 3.0), (150, 1.9)])])
    seeds_at_198 = [2.0 + 0.98 * (x - 2.0) for x in (1.60, 1.61, 1.59)]
    assert out["packed"]["compared at tokens"] == 198
    assert out["packed"]["baseline mean"] == pytest.approx(sum(seeds_at_198) / 3)
    assert out["packed"]["quality"] == "costs quality" and "read at 198 tokens, where this run ended" in out["packed"]["why"]
    assert out["short"]["quality"] == "quality not measured" and out["short"]["compared at tokens"] == 200


def test_fewer_than_three_seeds_is_inconclusive():
    out = verdicts([run("fp8", [(0, 3.0), (200, 1.9)])], seeds=("lora-s1",))
    assert out["fp8"]["quality"] == "inconclusive" and "at least 3 seeds" in out["fp8"]["why"]


def test_time_to_quality_is_a_projection_from_the_speed_at_qwen3_8b():
    speed = pl.DataFrame([{"status": "ok", "model": "qwen3-8b", "scale": "full", "device_type": "cuda", "gpu": "H100",
                           "dataset": "d", "batch_size": 2, "variant": v, "throughput.tokens_per_s": s}
                          for v, s in (("lora", 10000.0), ("fast", 11000.0))])
    df = pl.DataFrame([run(v, p) for v, p in BASE] + [run("fast", [(0, 3.0), (200, 1.7), (400, 1.5)])],
                      infer_schema_length=None)
    r = {x["variant"]: x for x in quality.quality_rows(df, "lora", ["lora-s1", "lora-s2"], speed=speed)}["fast"]
    # 10 % faster, but the tokens to the seeds' mean loss (1.6 at 200 tokens: 300) are 1.5x: slower to quality
    assert r["tokens to quality (x baseline)"] == pytest.approx(1.5, rel=1e-3)
    assert r["time to quality (x baseline, projection)"] == pytest.approx(1.5 * 10000 / 11000, rel=1e-3)
    claims = quality.claims_rows([r], [{"claim": "c", "variant": "fast"}, {"claim": "d", "variant": "none"}])
    assert [c["verdict"] for c in claims] == ["differs", "not measured"]


def family_df(extra):
    return pl.DataFrame([run(v, p) for v, p in BASE] + extra, infer_schema_length=None)


KNOBS = {"lora": {"peft": "lora"}, "lora-s1": {"peft": "lora", "seed": 1}, "lora-s2": {"peft": "lora", "seed": 2},
         "packed": {"peft": "lora", "packing": True}, "packed-s1": {"peft": "lora", "packing": True, "seed": 1},
         "packed-s2": {"peft": "lora", "packing": True, "seed": 2},
         "packed-fast": {"peft": "lora", "packing": True, "kernel": "x"}}


def test_a_technique_under_several_seeds_is_read_by_their_mean_against_the_standard_error_of_the_difference():
    """Three seeds of packed rows spread wider than the baseline's (sd 0.03 against 0.01): their mean, +0.02 nats,
    is within 2 standard errors (sqrt(0.01^2/3 + 0.03^2/3) = 0.018), though one run of them alone, judged by the
    baseline's spread, would cost quality."""
    packed = [run(n, [(0, 3.0), (100, 2.0), (200, x)]) for n, x in
              (("packed", 1.59), ("packed-s1", 1.62), ("packed-s2", 1.65))]
    short = run("packed-s3", [(0, 3.0), (100, 2.0), (150, 1.9)])  # ends 25 % short: not read, not of the mean
    knobs = {**KNOBS, "packed-s3": {"peft": "lora", "packing": True, "seed": 3}}
    rows = {r["variant"]: r for r in quality.quality_rows(family_df(packed + [short]), "lora", ["lora-s1", "lora-s2"],
                                                          knobs)}
    assert rows["packed-s3"]["quality"] == "quality not measured" and "25.0% short" in rows["packed-s3"]["why"]
    for n in ("packed", "packed-s1", "packed-s2"):
        assert rows[n]["quality"] == "keeps quality" and rows[n]["its seeds"] == 3
        assert rows[n]["delta (nats)"] == pytest.approx(0.02) and "its 3 seeds, sd 0.0300" in rows[n]["why"]
    alone = {r["variant"]: r for r in quality.quality_rows(family_df(packed[2:]), "lora", ["lora-s1", "lora-s2"])}
    assert alone["packed-s2"]["quality"] == "costs quality" and alone["packed-s2"]["its seeds"] == 1


def test_one_run_built_on_a_seeded_technique_has_that_techniques_spread():
    """A rung built on packed rows, run once, is judged with the packed seeds' spread (sd 0.03): +0.05 nats is
    within 2 standard errors there (sqrt(0.01^2/3 + 0.03^2) = 0.0316); with the baseline's own, it costs quality."""
    packed = [run(n, [(0, 3.0), (100, 2.0), (200, x)]) for n, x in
              (("packed", 1.59), ("packed-s1", 1.62), ("packed-s2", 1.65))]
    fast = run("packed-fast", [(0, 3.0), (100, 2.0), (200, 1.65)])
    lineage = {"packed-fast": ["packed-fast", "packed", "lora"], "packed": ["packed", "lora"]}
    rows = {r["variant"]: r for r in quality.quality_rows(family_df(packed + [fast]), "lora", ["lora-s1", "lora-s2"],
                                                          KNOBS, lineage=lineage)}
    assert rows["packed-fast"]["quality"] == "keeps quality" and "spread of packed's 3 seeds" in rows["packed-fast"]["why"]
    rows = {r["variant"]: r for r in quality.quality_rows(family_df(packed + [fast]), "lora", ["lora-s1", "lora-s2"],
                                                          KNOBS)}
    assert rows["packed-fast"]["quality"] == "costs quality"


def test_a_variant_of_the_baselines_knobs_under_another_seed_is_one_of_its_seeds():
    fams = quality.seed_families(["lora", "lora-s1", "lora-s3", "packed", "packed-s1"], "lora", ["lora-s1"],
                                 {**KNOBS, "lora-s3": {"peft": "lora", "seed": 3}})
    assert fams["lora"] == fams["lora-s1"] == fams["lora-s3"] == ("baseline",)
    assert fams["packed"] == fams["packed-s1"] != ("baseline",)
    from ftbench.techniques import lineage
    pool = {"a": {}, "b": {"base": "a"}, "c": {"base": "b", "adds": []}}
    assert lineage("c", pool) == ["c", "b", "a"] and lineage("a", pool) == ["a"]
