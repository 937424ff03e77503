"""The quality study's pieces: a GGUF model source, real text from the standard library, the verdicts."""

import json

import numpy as np
import polars as pl
import pytest
import torch

from ftbench.judge import quality, quality_page, stats
from ftbench.data import heldout
from ftbench.data.datasets import held_out_module, python_docs, python_docs_split
from ftbench.build.models import materialize_gguf
from conftest import ROOT

ROOT_CONFIG = ROOT / "config/config.yaml"

H, L, F, V, NH, KV = 16, 2, 32, 40, 2, 1


def write_tiny_gguf(path, undequantizable: bool = False):
    """A two-layer Llama in GGUF (F32 tensors, a byte-level BPE of 40 tokens), and the tensors written; with
    `undequantizable`, one tensor stored as Q8_1, a type gguf-py cannot dequantize."""
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
        if undequantizable and name == "blk.0.ffn_down.weight":
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
            w.add_tensor(name, np.zeros((shape[0], shape[1] // block * size), dtype=np.uint8),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_1)
            continue
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


def run(variant, pts, status="ok", gpu="H100 SXM5", served=None, scored="the answer"):
    """A record row with a held-out curve of (tokens, loss) points (and `served` losses beside, where given)."""
    curve = [{"step": 8 * i, "tokens": t, "loss": x} for i, (t, x) in enumerate(pts or [])]  # scored every 8 steps
    for p, y in zip(curve, served or []):
        p["served"] = y
    return {"model": "m", "dataset": "d", "gpu": gpu, "variant": variant, "status": status, "reason": None,
            "loss.held_out": json.dumps({"points": curve, "scored": scored}) if pts else None}


SEEDS = (42, 1, 2, 3, 4)
BASE_END = (1.600, 1.610, 1.590, 1.605, 1.595)  # the baseline's five seeds at 200 tokens: mean 1.600


def name(v, seed):
    return v if seed == 42 else f"{v}-s{seed}"


def family(v, ends, knobs=None, served=None):
    """A technique under the five seeds (its seed-42 run named `v`, the others `v-sN`), each ending at `ends`."""
    rows, flat = [], {}
    for i, (seed, end) in enumerate(zip(SEEDS, ends)):
        rows.append(run(name(v, seed), [(0, 3.0), (100, 2.0), (200, end)],
                        served=None if served is None else [3.0, 2.0, served[i]]))
        flat[name(v, seed)] = {**(knobs or {"peft": "lora", "t": v}), "seed": seed}
    return rows, flat


def verdicts(*families, lineage=None, settings=None):
    rows, knobs = family("lora", BASE_END, {"peft": "lora"})
    for f in families:
        rows, knobs = rows + f[0], {**knobs, **f[1]}
    df = pl.DataFrame(rows, infer_schema_length=None)
    return {r["variant"]: r for r in quality.quality_rows(df, "lora", [], knobs, lineage=lineage, settings=settings)}


def shifted(diffs):
    return [b + d for b, d in zip(BASE_END, diffs)]


def test_the_paired_verdict_at_the_margins_edges_keeps_costs_or_is_inconclusive():
    """Margin 0.25 % of the baseline's 1.600: 0.004 nats. A technique whose paired differences' 90 % interval lies
    under it keeps quality, one wholly over it costs quality, one straddling it is inconclusive, though all three
    would read alike by their means against an unpaired spread."""
    out = verdicts(family("keep", shifted([0.001, 0.0015, 0.0005, 0.001, 0.001])),
                   family("cost", shifted([0.010, 0.011, 0.009, 0.010, 0.010])),
                   family("edge", shifted([0.004, -0.002, 0.010, 0.001, 0.007])),
                   family("better", shifted([-0.02, -0.03, -0.025, -0.02, -0.021])))
    keep, cost, edge = out["keep"], out["cost"], out["edge"]
    assert keep["margin (nats)"] == pytest.approx(0.004) and keep["paired seeds"] == 5
    assert keep["quality"] == "keeps quality" and keep["interval high"] < 0.004
    assert keep["delta (nats)"] == pytest.approx(0.001)
    # t(0.95, 4) = 2.132: the interval's half-width is 2.132 sd / sqrt(5)
    import statistics
    sd = statistics.stdev([0.010, 0.011, 0.009, 0.010, 0.010])
    assert cost["interval low"] == pytest.approx(0.010 - 2.1318 * sd / 5 ** 0.5, rel=1e-3)
    assert cost["quality"] == "costs quality" and "+0.0100 nats" in cost["why"]
    assert edge["quality"] == "inconclusive" and edge["interval low"] < 0.004 < edge["interval high"]
    assert out["better"]["quality"] == "keeps quality"  # a fall keeps quality
    assert out["keep-s3"]["quality"] == "keeps quality"  # every seed's row carries its technique's verdict
    # a tighter margin turns the same differences into a cost
    tight = verdicts(family("keep", shifted([0.001, 0.0015, 0.0005, 0.001, 0.001])),
                     settings={"margin": {"relative": 0.0001, "source": "test"}})
    assert tight["keep"]["quality"] == "costs quality"


def test_fewer_paired_seeds_than_three_is_inconclusive_and_no_curve_is_not_measured():
    rows, knobs = family("two", shifted([0.0, 0.0, 0.0, 0.0, 0.0]))
    out = verdicts((rows[:2], {k: knobs[k] for k in ("two", "two-s1")}),
                   ([run("speed-only", None), run("failed", None, status="oom")],
                    {"speed-only": {"peft": "lora", "t": "x"}, "failed": {"peft": "lora", "t": "y"}}))
    assert out["two"]["quality"] == "inconclusive" and "at least 3 seeds" in out["two"]["why"]
    assert out["speed-only"]["quality"] == "quality not measured"
    assert out["failed"]["quality"] == "quality not measured" and "oom" in out["failed"]["why"]


def test_a_run_far_short_is_left_out_of_its_pairs_and_a_few_tokens_short_are_read_where_they_end():
    rows, knobs = family("packed", shifted([0.0] * 5))
    rows[0] = run("packed", [(0, 3.0), (100, 2.0), (198, 1.60)])  # 1 % short: every pair read at 198 tokens
    rows[1] = run("packed-s1", [(0, 3.0), (150, 1.9)])  # 25 % short: not read
    out = verdicts((rows, knobs))
    assert out["packed"]["compared at tokens"] == 198 and out["packed"]["paired seeds"] == 4
    assert out["packed-s1"]["quality"] == "quality not measured" and "short" in out["packed-s1"]["why"]


def stepped(variant, per_step, end_loss, steps):
    """A record row whose curve is scored at `steps` (optimizer steps), `per_step` label tokens a step, its loss
    falling from 3.0 to `end_loss` at the last."""
    last = steps[-1]
    curve = [{"step": k, "tokens": k * per_step, "loss": end_loss + (3.0 - end_loss) * (1 - k / last) ** 2}
             for k in steps]
    return {"model": "m", "dataset": "d", "gpu": "H100 SXM5", "variant": variant, "status": "ok", "reason": None,
            "loss.held_out": json.dumps({"points": curve, "scored": "the answer"})}


def test_a_run_a_step_short_is_read_where_the_baselines_last_steps_were_each_scored():
    """Mixed rows train 2-3 % fewer label tokens in 32 steps than the padded baseline: more than SHORT_BY short, so
    against curves scored every 8 steps they are not read (the baseline would be read across its last stretch).
    Where every baseline seed also scored each of its last 4 steps (training.held_out_last_steps), such a run is
    read, between the baseline's points a step apart; one 20 % short still is not."""
    every = [0, 8, 16, 24, 32]
    tail = [0, 8, 16, 24, 29, 30, 31, 32]
    for base_steps, read in ((every, False), (tail, True)):
        rows = [stepped(name("lora", sd), 4000, end, base_steps) for sd, end in zip(SEEDS, BASE_END)]
        rows += [stepped(name("mix", sd), 3880, end + 0.001, tail) for sd, end in zip(SEEDS, BASE_END)]
        rows += [stepped(name("far", sd), 3200, end, tail) for sd, end in zip(SEEDS, BASE_END)]
        knobs = {name(v, sd): {"peft": "lora", "t": v, "seed": sd} for v in ("lora", "mix", "far") for sd in SEEDS}
        out = {r["variant"]: r for r in quality.quality_rows(pl.DataFrame(rows, infer_schema_length=None), "lora", [],
                                                             knobs)}
        assert (out["mix"]["quality"] != "quality not measured") is read, base_steps
        assert out["far"]["quality"] == "quality not measured" and "short" in out["far"]["why"]
    assert out["mix"]["paired seeds"] == 5 and out["mix"]["compared at tokens"] == 32 * 3880
    assert stats.dense_from(json.loads(rows[0]["loss.held_out"])["points"]) == 29 * 4000


def test_a_short_seed_is_read_with_its_family_only_where_the_others_were_scored_each_step_there():
    """One seed of a family ends 3 % short, within the baseline's last steps scored one by one. Where its family's
    other seeds were scored only every 8 steps, reading them at its tokens would draw a straight line across their
    last stretch (above the falling, flattening curve): that seed is left out and the rest are read where they end.
    Where they too scored each of their last steps, all five are read at the short seed's tokens."""
    every, tail = [0, 8, 16, 24, 32], [0, 8, 16, 24, 29, 30, 31, 32]
    rows = [stepped(name("lora", sd), 4000, end, tail) for sd, end in zip(SEEDS, BASE_END)]
    for v, others in (("old", every), ("dense", tail)):
        rows += [stepped(name(v, sd), 3880 if sd == SEEDS[1] else 4000, end + 0.001,
                         tail if sd == SEEDS[1] else others) for sd, end in zip(SEEDS, BASE_END)]
    knobs = {name(v, sd): {"peft": "lora", "t": v, "seed": sd} for v in ("lora", "old", "dense") for sd in SEEDS}
    out = {r["variant"]: r for r in quality.quality_rows(pl.DataFrame(rows, infer_schema_length=None), "lora", [],
                                                         knobs)}
    assert out["old"]["paired seeds"] == 4 and out["old"]["compared at tokens"] == 32 * 4000
    assert out[name("old", SEEDS[1])]["quality"] == "quality not measured"
    assert out["dense"]["paired seeds"] == 5 and out["dense"]["compared at tokens"] == 32 * 3880
    assert 0 < out["dense"]["delta (nats)"] < 0.0015
    stretch = [{"step": 24, "tokens": 96000}, {"step": 32, "tokens": 128000}]
    assert not stats.readable(stretch, 124160, 0.02) and stats.readable(stretch, 96000, 0.02)


def test_the_held_out_curve_scores_every_few_steps_and_each_of_the_last_ones():
    curve = heldout.HeldOutCurve(8, last=(4, 32))
    assert [k for k in range(1, 33) if curve.due(k)] == [8, 16, 24, 29, 30, 31, 32]
    assert [k for k in range(1, 33) if heldout.HeldOutCurve(8).due(k)] == [8, 16, 24, 32]


def test_an_fp8_technique_is_judged_as_served_on_the_bf16_base_and_shown_as_trained():
    """Trained through its own FP8 GEMMs it is +0.010 (costs quality); its adapters on the bf16 base +0.001 (keeps):
    the row's verdict is the served one, the trained one beside it. A bf16 technique's served curve is its own."""
    fp8 = family("fp8", shifted([0.010, 0.011, 0.009, 0.010, 0.010]), {"peft": "lora", "precision": "fp8"},
                 served=shifted([0.001, 0.0015, 0.0005, 0.001, 0.001]))
    unserved = family("nf4", shifted([0.010] * 5), {"peft": "lora", "precision": "nf4"})
    out = verdicts(fp8, unserved)
    assert out["fp8"]["quality"] == "keeps quality" and out["fp8"]["quality (as trained)"] == "costs quality"
    assert out["fp8"]["delta as trained"] == pytest.approx(0.010) and out["fp8"]["delta (nats)"] == pytest.approx(0.001)
    assert "served on the bf16 base" in out["fp8"]["why"]
    # an NF4 run that scored no served curve is not judged as served
    assert out["nf4"]["quality"] == "quality not measured" and out["nf4"]["quality (as trained)"] == "costs quality"
    assert out["lora"]["quality"] == out["lora"]["quality (as trained)"]


def test_a_technique_that_changes_no_numbers_inherits_its_rungs_verdict_only_where_bit_identical():
    """`pinned` (one seed) stands on `cost`: its curve bit-identical on seed 42, it takes cost's verdict; `jitter`,
    one seed not bit-identical, stays inconclusive and says it needs its own seeds."""
    cost = family("cost", shifted([0.010, 0.011, 0.009, 0.010, 0.010]))
    same = run("pinned", [(0, 3.0), (100, 2.0), (200, BASE_END[0] + 0.010)])
    off = run("jitter", [(0, 3.0), (100, 2.0), (200, BASE_END[0] + 0.0101)])
    lineage = {"pinned": ["pinned", "cost", "lora"], "jitter": ["jitter", "cost", "lora"],
               "cost": ["cost", "lora"]}
    out = verdicts(cost, ([same, off], {"pinned": {"peft": "lora", "t": "cost", "pin_memory": True},
                                        "jitter": {"peft": "lora", "t": "cost", "sync_free": True}}),
                   lineage=lineage)
    assert out["pinned"]["quality"] == "costs quality" and "bit-identical to cost" in out["pinned"]["why"]
    assert out["pinned"]["stands on"] == "cost"
    assert out["jitter"]["quality"] == "inconclusive" and "needs its own seeds" in out["jitter"]["why"]
    assert out["cost"]["delta from it"] == pytest.approx(0.010)  # cost stands on the baseline: its own step


def test_time_to_quality_is_a_projection_from_the_speed_at_qwen3_8b_on_one_gpu_kind():
    speed = pl.DataFrame([{"status": "ok", "model": "qwen3-8b", "scale": "full", "device_type": "cuda", "gpu": g,
                           "dataset": "d", "batch_size": 2, "variant": v, "throughput.tokens_per_s": s}
                          for v, s, g in (("lora", 10000.0, "H100"), ("lora-s1", 12000.0, "H200"),
                                          ("slow", 11000.0, "H100"))])
    rows, knobs = family("lora", BASE_END, {"peft": "lora"})
    slow = [run(name("slow", s), [(0, 3.0), (200, 1.7), (400, 1.5)]) for s in SEEDS]
    knobs.update({name("slow", s): {"peft": "lora", "t": "slow", "seed": s} for s in SEEDS})
    df = pl.DataFrame(rows + slow, infer_schema_length=None)
    r = {x["variant"]: x for x in quality.quality_rows(df, "lora", [], knobs, speed=speed)}["slow"]
    # the baseline's mean, 1.6 at 200 tokens, reached at 300: 1.5x the tokens; the H100 baseline's speed, not H200's
    assert r["tokens to quality (x baseline)"] == pytest.approx(1.5, rel=1e-3)
    assert r["time to quality (x baseline, projection)"] == pytest.approx(1.5 * 10000 / 11000, rel=1e-3)
    claims = quality.claims_rows([r], [{"claim": "c", "variant": "slow"}, {"claim": "d", "variant": "none"}])
    assert [c["verdict"] for c in claims] == ["differs", "not measured"]


def test_runs_scored_on_every_token_are_not_mixed_with_runs_scoring_the_text_alone():
    old = [run(n, [(0, 3.0), (200, 2.5)], scored=None) for n in ("lora", "old-only")]
    rows, knobs = family("lora", BASE_END, {"peft": "lora"})
    df = pl.DataFrame(rows + old, infer_schema_length=None)
    out = quality.quality_rows(df, "lora", [], {**knobs, "old-only": {"peft": "lora", "t": "o"}})
    assert {r["scored"] for r in out} == {"the answer"} and "old-only" not in {r["variant"] for r in out}


def test_t_quantiles_match_the_tables():
    for p, df, t in ((0.95, 1, 6.314), (0.95, 4, 2.132), (0.975, 4, 2.776), (0.95, 30, 1.697)):
        assert stats.t_quantile(p, df) == pytest.approx(t, abs=1e-3)


KNOBS = {"lora": {"peft": "lora"}, "lora-s1": {"peft": "lora", "seed": 1}, "lora-s2": {"peft": "lora", "seed": 2},
         "packed": {"peft": "lora", "packing": True}, "packed-s1": {"peft": "lora", "packing": True, "seed": 1},
         "packed-s2": {"peft": "lora", "packing": True, "seed": 2},
         "packed-fast": {"peft": "lora", "packing": True, "kernel": "x"}}


def test_a_variant_of_the_baselines_knobs_under_another_seed_is_one_of_its_seeds():
    fams = quality.seed_families(["lora", "lora-s1", "lora-s3", "packed", "packed-s1"], "lora", ["lora-s1"],
                                 {**KNOBS, "lora-s3": {"peft": "lora", "seed": 3}})
    assert fams["lora"] == fams["lora-s1"] == fams["lora-s3"] == ("baseline",)
    assert fams["packed"] == fams["packed-s1"] != ("baseline",)
    from ftbench.config.techniques import lineage
    pool = {"a": {}, "b": {"base": "a"}, "c": {"base": "b", "adds": []}}
    assert lineage("c", pool) == ["c", "b", "a"] and lineage("a", pool) == ["a"]


def char_tokenizer():
    """A character-level tokenizer with a ChatML template (as SmolLM2's), offsets and all."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("".join(chr(c) for c in range(32, 127)) + "\n"))
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=" "))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=" ", pad_token=" ")
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    return fast


def test_the_held_out_split_scores_the_answer_not_the_prompt_or_the_template():
    """An instruction is scored on its answer and the end of its turn; a plain text on its own words (body and
    title), never the chat template's role markers between them; the token ids are the trainer's own tokenization."""
    from ftbench.data.heldout import scored_labels

    tok = char_tokenizer()
    chat = [{"role": "user", "content": "Write it."}, {"role": "assistant", "content": "Done."}]
    out = scored_labels(tok, chat, "instruction")
    assert out["input_ids"] == tok.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
    scored = "".join(tok.decode([t]) for t, y in zip(out["input_ids"], out["labels"]) if y != -100)
    assert scored == "Done.<|end|>\n"
    text = scored_labels(tok, chat, "wikipedia")
    assert "".join(tok.decode([t]) for t, y in zip(text["input_ids"], text["labels"]) if y != -100) == "Write it.Done."


def test_an_fp8_trained_adapter_is_scored_on_the_bf16_base(tiny_qwen):
    """A tiny Qwen3 trained a few steps with its frozen projections in FP8 (weights cast once, the CPU's scaled GEMM)
    and LoRA: the served twin (the bf16 base, the same adapter names) takes the trained adapters bit for bit and
    scores what the bf16 model with those adapters scores, which differs from the FP8 path's loss."""
    import copy

    from transformers import AutoModelForCausalLM

    from ftbench.config.settings import Variant
    from ftbench.build.fp8 import DECODER_PATTERN, convert_static
    from ftbench.data.heldout import ServedTwin
    from ftbench.run.runners.served import served_variant
    from ftbench.build.variants import apply_lora

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.bfloat16)
    fp8_model = copy.deepcopy(base)
    convert_static(fp8_model, pattern=DECODER_PATTERN)
    v = Variant("fp8", precision="fp8", fp8_backend="torchao", fp8_recipe="static", token_budget=64,
                padding_free=True, attention="varlen")
    lora = {"r": 4, "alpha": 8, "target_modules": "all-linear"}
    trained = apply_lora(fp8_model, v, lora)
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, trained.config.vocab_size, (2, 32))
    for _ in range(3):
        trained(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    served = served_variant(v)
    assert (served.precision, served.token_budget, served.attention) == ("bf16", 64, "varlen")
    twin = ServedTwin(lambda: apply_lora(copy.deepcopy(base), served, lora))(trained)
    pairs = {n: p for n, p in twin.named_parameters() if "lora_" in n}
    assert pairs and all(torch.equal(pairs[n], p) for n, p in trained.named_parameters() if p.requires_grad)
    with torch.no_grad():
        merged = apply_lora(copy.deepcopy(base), served, lora)
        merged.load_state_dict({n: p for n, p in trained.state_dict().items() if "lora_" in n}, strict=False)
        assert twin(input_ids=ids, labels=ids).loss == merged(input_ids=ids, labels=ids).loss
        assert twin(input_ids=ids, labels=ids).loss != trained(input_ids=ids, labels=ids).loss
    with pytest.raises(RuntimeError, match="lacks"):
        ServedTwin(lambda: copy.deepcopy(base))(trained)


def test_the_quality_seeds_run_every_technique_that_changes_the_numbers():
    """quality.seeds [1, 2]: lora and a compiled rung run as NAME, NAME-s1, NAME-s2; a rung adding only pinned memory
    to one in the same matrix runs once (judged by its bit-identity), one whose base is absent runs every seed."""
    from ftbench.config.settings import expand_seeds

    config = {"seed": 42, "variants": {"lora": {"peft": "lora"}, "comp": {"base": "lora", "compile": "default"},
                                       "comp-pinned": {"base": "comp", "adds": ["pinned"]},
                                       "lone-pinned": {"base": "comp", "adds": ["pinned"]}},
              "studies": {"quality": {"quality": {"baseline": "lora", "seeds": [1, 2]},
                                      "matrix": [{"variants": ["lora", "comp", "comp-pinned"]},
                                                 {"variants": ["lone-pinned"]}]}}}
    added = expand_seeds(config)
    blocks = config["studies"]["quality"]["matrix"]
    assert blocks[0]["variants"] == ["lora", "lora-s1", "lora-s2", "comp", "comp-s1", "comp-s2", "comp-pinned"]
    assert blocks[1]["variants"] == ["lone-pinned", "lone-pinned-s1", "lone-pinned-s2"]
    assert config["studies"]["quality"]["variants"]["comp-s2"] == {"base": "comp", "seed": 2} and "comp-s1" in added


def test_a_longer_arm_reads_tokens_to_quality_past_the_baselines_tokens():
    """`slow` never reaches the baseline's 1.600 within 200 tokens; its longer arm (1.5x the steps) reaches it at
    250 (1.25x); `never`'s longer arm does not: "not within 1.5x". The arms themselves are never judged at the same
    tokens."""
    slow = family("slow", shifted([0.05] * 5))
    never = family("never", shifted([0.05] * 5))
    arm = ([run(name("slow-long", s), [(0, 3.0), (200, 1.7), (300, 1.5)]) for s in SEEDS],
           {name("slow-long", s): {"peft": "lora", "t": "slow", "steps_scale": 1.5, "seed": s} for s in SEEDS})
    flat = ([run(name("never-long", s), [(0, 3.0), (300, 1.65)]) for s in SEEDS],
            {name("never-long", s): {"peft": "lora", "t": "never", "steps_scale": 1.5, "seed": s} for s in SEEDS})
    out = verdicts(slow, never, arm, flat)
    assert out["slow"]["longer arm: tokens to quality (x baseline)"].startswith("1.25x (5 seeds")
    assert out["never"]["longer arm: tokens to quality (x baseline)"].startswith("not within 1.5x")
    assert out["slow-long"]["quality"] == "longer arm" and out["lora"]["longer arm: tokens to quality (x baseline)"] is None
    assert out["slow"]["longer arm: time to quality (x baseline, projection)"] is None  # no speed: no projection
    # with speeds at Qwen3-8B's shapes (one GPU kind): 1.25x the tokens at 1.6x the speed, 0.78x the time
    speed = pl.DataFrame([{"status": "ok", "model": "qwen3-8b", "scale": "full", "device_type": "cuda", "gpu": "H100",
                           "dataset": "d", "batch_size": 2, "variant": v, "throughput.tokens_per_s": s}
                          for v, s in (("lora", 10000.0), ("slow", 16000.0), ("never", 20000.0))])
    rows, knobs = family("lora", BASE_END, {"peft": "lora"})
    for f in (slow, never, arm, flat):
        rows, knobs = rows + f[0], {**knobs, **f[1]}
    fast = {r["variant"]: r for r in quality.quality_rows(pl.DataFrame(rows, infer_schema_length=None), "lora", [],
                                                          knobs, speed=speed)}
    assert fast["slow"]["speed (x baseline)"] == pytest.approx(1.6)
    assert fast["slow"]["longer arm: time to quality (x baseline, projection)"] == pytest.approx(1.25 / 1.6, rel=1e-3)
    assert fast["never"]["longer arm: time to quality (x baseline, projection)"] is None  # never reached: no time


def test_a_longer_arm_trains_more_steps_on_the_same_schedule_shape():
    from ftbench.config.settings import RunSpec, load_yaml, train_settings

    config = load_yaml(ROOT_CONFIG)
    config["studies"]["quality"]["variants"]["lora-long"] = {"base": "lora", "adds": ["longer-1.5x"]}
    spec = RunSpec("quality", "smollm2-135m", "full", "python_docstrings", "lora-long", 4)
    plain = train_settings(config, RunSpec("quality", "smollm2-135m", "full", "python_docstrings", "lora", 4))
    long = train_settings(config, spec)
    assert (long.measure.warmup_steps, long.measure.steps) == (3, 6)  # 2 and 4, times 1.5
    assert long.max_steps == round(1.5 * plain.max_steps)


def test_speed_against_quality_names_the_fastest_that_keeps_quality_as_served_and_the_fastest_overall():
    speed = pl.DataFrame([{"status": "ok", "model": "qwen3-8b", "scale": "full", "device_type": "cuda", "gpu": "H100",
                           "dataset": "d", "batch_size": b, "variant": v, "throughput.tokens_per_s": s}
                          for v, s, b in (("lora", 4000.0, 2), ("keep", 15000.0, 2), ("fp8", 22000.0, 1))])
    fp8 = family("fp8", shifted([0.010, 0.011, 0.009, 0.010, 0.010]), {"peft": "lora", "precision": "fp8"},
                 served=shifted([0.010, 0.011, 0.009, 0.010, 0.010]))
    rows, knobs = family("lora", BASE_END, {"peft": "lora"})
    for f in (family("keep", shifted([0.001, 0.0015, 0.0005, 0.001, 0.001])), fp8):
        rows, knobs = rows + f[0], {**knobs, **f[1]}
    out = quality.quality_rows(pl.DataFrame(rows, infer_schema_length=None), "lora", [], knobs, speed=speed)
    names = {"lora": "LoRA, bf16", "keep": "LoRA: keeps it", "fp8": "LoRA: FP8 dynamic"}
    frame = quality_page.speed_quality_frame(out, names, {"keep": "Unsloth"})
    assert set(frame["variant"]) == {"lora", "keep", "fp8"}  # a point a technique (its seeds are one)
    by = {r["variant"]: r for r in frame.iter_rows(named=True)}
    assert by["keep"]["peer"] == "Unsloth" and by["fp8"]["peer"] == "ftbench"
    # judged on another GPU kind too, as trained only: still one point a technique, the one judged as served
    twice = quality_page.speed_quality_frame(out + [{**r, "gpu": "other", "delta (nats)": None} for r in out], names)
    assert len(twice) == len(frame) and set(twice["gpu"]) == set(frame["gpu"])
    # the frontier of those that keep quality: the faster one that keeps it, and the baseline (better, slower)
    assert by["keep"]["frontier"] and by["lora"]["frontier"] and not by["fp8"]["frontier"]
    line = quality_page.speed_quality_line(frame)
    assert line.startswith("Fastest that keeps quality (as served, on every dataset): LoRA: keeps it at "
                           "15,000")
    assert "fastest overall: LoRA: FP8 dynamic at 22,000 (costs quality)" in line
    key = quality_page.speed_quality_key(frame)  # a speed measured at another batch than most says so
    assert "LoRA: keeps it (15,000);" in key and "LoRA: FP8 dynamic (22,000 at batch 1)" in key
    chart = quality_page.svg(quality_page.speed_quality_chart(frame))
    assert "<svg" in chart and "LoRA: keeps it" in chart and "Speed against quality" in chart
    # another GPU kind judged against a stand-in (the baseline did not run there): the stand-in is no point of its
    # own, and a technique judged against the baseline itself elsewhere keeps that point
    apart = [{**r, "gpu": "other", "judged against": "keep (the baseline, lora, did not run here)",
              "seed of the baseline": r["variant"].startswith("keep")}
             for r in out if not r["variant"].startswith("lora")]
    mixed = quality_page.speed_quality_frame(out + apart, names)
    assert len(mixed) == len(frame) and set(mixed["gpu"]) == set(frame["gpu"])
    alone = quality_page.speed_quality_frame(apart, names)
    assert set(alone["variant"]) == {"fp8"} and alone["against"].to_list() == ["keep"]


def test_the_line_under_the_figure_names_the_fastest_that_keeps_quality_on_each_dataset_alone():
    """Where no rung keeps quality on every dataset, the line says which one keeps it on each dataset alone, so a
    reader who fine-tunes on instructions only sees the rung for them; with one dataset it says nothing more."""
    keeps = quality_page.KEEPS
    rows = [("lora", "LoRA", 2800.0, keeps, keeps, True), ("bf16", "bf16 rung", 14600.0, keeps, "inconclusive", False),
            ("tail", "FP8, bf16 tail", 19300.0, keeps, "costs quality", False),
            ("fp8", "FP8", 20500.0, "inconclusive", "costs quality", False)]
    frame = pl.DataFrame([{"variant": v, "name": n, "dataset": d, "tokens/s at Qwen3-8B": s, "verdict": q,
                           "baseline": b} for v, n, s, q1, q2, b in rows for d, q in (("instr", q1), ("text", q2))])
    line = quality_page.speed_quality_line(frame)
    assert line.startswith("No technique beyond the baseline")
    assert line.endswith("Fastest that keeps quality on one dataset alone: instr: FP8, bf16 tail at 19,300; text: "
                         "none beyond the baseline.")
    assert "alone" not in quality_page.speed_quality_line(frame.filter(pl.col("dataset") == "instr"))
    # a rung that keeps quality on one dataset and has no verdict on the other (its runs unread there) does not keep
    # it on every dataset: it is named for the one alone
    unread = frame.vstack(pl.DataFrame([{"variant": "mix", "name": "FP8, mixed rows", "dataset": "text",
                                         "tokens/s at Qwen3-8B": 19800.0, "verdict": keeps, "baseline": False}]))
    line = quality_page.speed_quality_line(unread)
    assert line.startswith("No technique beyond the baseline") and "text: FP8, mixed rows at 19,800." in line


def test_the_pages_verdict_table_shows_each_views_mean_and_interval_in_a_cell_beside_the_margin():
    """The quality page's table (a screen wide): the technique's name and code, each view's verdict beside its mean
    difference and 90 % interval in one cell, the margin and the seeds paired; one seed gives no interval."""
    fp8 = family("fp8", shifted([0.010, 0.011, 0.009, 0.010, 0.010]), {"peft": "lora", "precision": "fp8"},
                 served=shifted([0.001, 0.002, 0.000, 0.001, 0.001]))
    rows, knobs = family("lora", BASE_END, {"peft": "lora"})
    out = quality.quality_rows(pl.DataFrame(rows + fp8[0], infer_schema_length=None), "lora", [],
                               {**knobs, **fp8[1]})
    table = quality_page.page_table(quality_page.verdict_table([r for r in out if r["variant"] == r["technique"]]),
                                    {"fp8": "LoRA: FP8"})
    assert table.columns[:2] == ["name", "variant"] and "margin (nats)" in table.columns
    assert {"delta (nats)", "interval low", "why"}.isdisjoint(table.columns)  # those are in verdicts.csv
    row = next(r for r in table.iter_rows(named=True) if r["variant"] == "fp8")
    full = next(r for r in out if r["variant"] == "fp8")
    assert row["name"] == "LoRA: FP8" and row["quality"] == full["quality"]
    assert row["served: mean [90 % interval]"] == (f"{full['delta (nats)']:+.4f} [{full['interval low']:+.4f}, "
                                                   f"{full['interval high']:+.4f}]")
    assert row["as trained: mean [90 % interval]"].startswith(f"{full['delta as trained']:+.4f} [")
    assert quality_page.interval_text(0.0123, None, None, 1) == "+0.0123"
    assert quality_page.interval_text(0.0123, 0.01, 0.02, 1) == "+0.0123"  # one seed: no interval
    assert quality_page.interval_text(None, None, None, 0) == ""
    # tokens and time to quality: within the baseline's tokens, else on the longer arm (said); the baseline is the zero
    arm = pl.DataFrame([{"variant": "slow", "judged against": "lora", "tokens to quality (x baseline)": None,
                         "longer arm: tokens to quality (x baseline)": "1.25x (5 seeds, a 1.5x arm)",
                         "time to quality (x baseline, projection)": None,
                         "longer arm: time to quality (x baseline, projection)": 0.78125},
                        {"variant": "lora", "judged against": "lora", "tokens to quality (x baseline)": 0.96,
                         "longer arm: tokens to quality (x baseline)": None,
                         "time to quality (x baseline, projection)": 0.96,
                         "longer arm: time to quality (x baseline, projection)": None}])
    slow, base = quality_page.page_table(arm).to_dicts()
    assert slow["tokens to quality (x baseline)"] == "on its longer arm: 1.25x (5 seeds, a 1.5x arm)"
    assert slow["time to quality (x baseline, projection)"] == "0.78x (longer arm)"
    assert base["time to quality (x baseline, projection)"] == "0.96x"
    assert base["served: mean [90 % interval]"] == "(the baseline)"


def test_a_bf16_tails_speed_is_the_mix_of_its_two_phases_records():
    """A bf16 tail (knob fp8_until f) has no speed record of its own: its speed is made from the FP8-throughout
    twin's and the bf16-from-the-first-step twin's at the same shapes, 1 / (f / fp8 + (1 - f) / bf16), and the row
    says so; without both phases it has none, and a record of its own is never replaced."""
    top = {"peft": "lora", "precision": "fp8", "fp8_recipe": "static"}
    variants = {"fp8": top, "tail": {**top, "fp8_until": 0.9}, "tail0": {**top, "fp8_until": 0.0},
                "tail-s1": {**top, "fp8_until": 0.9, "seed": 1}}
    row = {"status": "ok", "model": "qwen3-8b", "scale": "full", "device_type": "cuda", "gpu": "H100", "dataset": "d",
           "batch_size": 2}
    speed = pl.DataFrame([{**row, "variant": v, "throughput.tokens_per_s": s}
                          for v, s in (("fp8", 20000.0), ("tail0", 14000.0))])
    fast = quality.with_tails(quality.speed_at_shapes(speed), variants)
    mixed = 1 / (0.9 / 20000 + 0.1 / 14000)
    assert fast["tail"]["throughput.tokens_per_s"] == pytest.approx(mixed) and 19000 < mixed < 20000
    assert fast["tail-s1"]["throughput.tokens_per_s"] == pytest.approx(mixed)  # a seed runs at its technique's speed
    assert fast["tail"]["mix"].startswith(" (a mix: 90% of the steps at fp8's speed")
    assert "tail" not in quality.with_tails(quality.speed_at_shapes(speed.filter(pl.col("variant") == "fp8")),
                                            variants)
    own = pl.concat([speed, pl.DataFrame([{**row, "variant": "tail", "throughput.tokens_per_s": 19000.0}])])
    assert quality.with_tails(quality.speed_at_shapes(own), variants)["tail"]["throughput.tokens_per_s"] == 19000.0


def test_the_served_twin_asks_its_fused_head_for_what_trls_trainer_reads():
    """SFTTrainer adds its fused LM head with log-probabilities, entropy and top-1 and reads them in compute_loss; the
    served twin's head must compute the same fields, or a run that keeps TRL's metrics fails where the twin is scored
    (every QLoRA run on the H200, 2026-12-07: 'NoneType' object has no attribute 'detach')."""
    import ast
    import inspect
    import re

    from trl.trainer import sft_trainer

    from ftbench.run.runners.served import TRL_FUSED_OUTPUTS

    source = inspect.getsource(sft_trainer.SFTTrainer.__init__)
    asked = re.search(r"add_fused_lm_head\(.*?outputs=(\([^)]*\))", source, re.S)
    assert asked and ast.literal_eval(asked.group(1)) == TRL_FUSED_OUTPUTS


def test_a_report_reads_every_seed_the_records_carry_not_only_its_configs():
    """The shipped records hold five seeds a technique (config/quality_gpu.yaml); the default config runs three:
    its report judges a family by all five (NAME-sK of a variant it knows: NAME's knobs under seed K)."""
    variants = {"lora": {"peft": "lora"}, "lora-s1": {"peft": "lora", "seed": 1}}
    out = quality.recorded_seeds(["lora", "lora-s1", "lora-s3", "other-s2", "lora-sx"], variants)
    assert out["lora-s3"] == {"peft": "lora", "seed": 3} and "other-s2" not in out and "lora-sx" not in out
    assert quality.knob_key("lora-s3", out) == quality.knob_key("lora", out)  # one family
    assert variants == {"lora": {"peft": "lora"}, "lora-s1": {"peft": "lora", "seed": 1}}  # the caller's untouched


def test_a_gpu_kind_without_the_baseline_is_judged_against_its_stand_in_and_only_for_its_rows():
    """On a GPU kind where the baseline did not run, config's `stand_in` (a rung of packed rows that ran beside the
    techniques under the same seeds) takes its place: a technique of its rows is judged against it, and says so; one
    of other rows (padded QLoRA) is not judged, since the layout alone moves the loss; without a stand-in the kind is
    not judged at all."""
    packed = {"peft": "lora", "padding_free": True, "token_budget": 4096}
    rows, knobs = family("rung", BASE_END, packed)
    for f in (family("fp8", shifted([0.010, 0.011, 0.009, 0.010, 0.010]), {**packed, "precision": "fp8"},
                     served=shifted([0.001, 0.0015, 0.0005, 0.001, 0.001])),
              family("qlora", shifted([0.02] * 5), {"peft": "lora", "precision": "nf4"})):
        rows, knobs = rows + f[0], {**knobs, **f[1]}
    df = pl.DataFrame(rows, infer_schema_length=None)
    assert quality.quality_rows(df, "lora", [], knobs) == []
    out = {r["variant"]: r for r in quality.quality_rows(df, "lora", [], knobs, settings={"stand_in": "rung"})}
    assert out["fp8"]["quality"] == "keeps quality" and out["fp8"]["quality (as trained)"] == "costs quality"
    assert out["fp8"]["judged against"] == "rung (the baseline, lora, did not run here)"
    assert out["rung"]["seed of the baseline"] and out["rung-s4"]["seed of the baseline"]
    assert out["qlora"]["quality"] == out["qlora"]["quality (as trained)"] == "quality not measured"
    assert "lays out its rows otherwise" in out["qlora"]["why"] and out["qlora"]["tokens to quality"] is None
    # where the baseline ran, it is what every technique is judged against
    both = verdicts(family("fp8", shifted([0.010] * 5), {"peft": "lora", "precision": "fp8"}),
                    settings={"stand_in": "rung"})
    assert both["fp8"]["judged against"] == "lora"
