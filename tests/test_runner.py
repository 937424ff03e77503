"""The causal-LM runner on a tiny real model: ok, unsupported and error records, logs."""

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from conftest import LORA
from ftbench.config.settings import MeasureSettings, RunSpec, TrainSettings, Variant
from ftbench.run.execute import RunContext, execute


def run(tmp_path, manifest, data, variant, batch_size=2, max_steps=5, **host):
    ddef, train, eval_ = data
    measure = MeasureSettings(warmup_steps=2, steps=max_steps - 2)
    ctx = RunContext(RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", variant.name, batch_size), variant,
                     TrainSettings(measure=measure, lora=LORA, memory_log_every=2, **host),
                     manifest, ddef, str(train), str(eval_), str(tmp_path), "cafe")
    rec = execute(ctx, tmp_path / "metrics.json", tmp_path / "steps.csv", tmp_path / "memory.csv")
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == rec["status"]
    return rec


def test_lora_run_is_measured(tmp_path, tiny_qwen, instruction_data):
    rec = run(tmp_path, tiny_qwen, instruction_data, Variant("lora"))
    assert rec["status"] == "ok", rec["reason"]
    t = rec["timing"]
    assert t["steps_measured"] == 3 and t["step_time_s"] > 0 and t["first_step_s"] > 0 and t["model_load_s"] > 0
    assert rec["throughput"]["tokens_per_s"] > 0 and rec["throughput"]["samples_per_hour"] > 0
    assert math.isfinite(rec["loss"]["eval"]) and math.isfinite(rec["loss"]["last"])
    assert rec["model"]["adapted_modules"]["names"] == sorted(LORA["target_modules"])
    assert 0 < rec["model"]["trainable_parameters"] < rec["model"]["parameters"]
    f = rec["flops"]
    assert 0 < f["model_per_step"] < f["hardware_per_step"]  # padding is executed, not counted as model FLOPs
    assert f["mfu"] is None and f["hfu"] is None and f["peak_tflops"] is None  # no peak for a CPU
    assert rec["precision"] == {"requested": "bf16", "frozen_weights": "bf16", "trainable_weights": "fp32",
                                "gemm": "bf16", "fp8_layers": None}
    assert rec["extra"]["host_changes"] is None and rec["compile"]["backend"] is None
    assert rec["measure"]["timer"] == "host_clock" and len(rec["measure"]["windows"]) == 1
    assert rec["timing"]["cv_within"] is not None and rec["timing"]["noise_cv"] is not None
    assert rec["extra"]["gradient_checkpointing_active"] is False  # TRL would turn it on by default
    assert rec["provenance"]["config_hash"] == "cafe" and rec["provenance"]["weights_source"] == "random"
    steps = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert len(steps) == 5 and all(float(r["step_time_s"]) > 0 for r in steps)
    assert all(int(r["samples"]) == 2 for r in steps)
    memlog = list(csv.DictReader(open(tmp_path / "memory.csv")))
    assert [int(r["step"]) for r in memlog] == [2, 4, 5]
    assert {"epoch", "elapsed_s", "progress", "allocated_gib", "reserved_gib", "peak_allocated_gib"} <= set(memlog[0])


def test_qlora_and_gradient_checkpointing_run_on_cpu(tmp_path, tiny_qwen, instruction_data):
    q = run(tmp_path / "q", tiny_qwen, instruction_data, Variant("qlora", precision="nf4"), max_steps=3)
    assert q["status"] == "ok", q["reason"]
    gc = run(tmp_path / "gc", tiny_qwen, instruction_data, Variant("lora-gc", gradient_checkpointing=True),
             max_steps=3)
    assert gc["status"] == "ok", gc["reason"]
    assert gc["extra"]["gradient_checkpointing_active"] is True
    assert q["extra"]["gradient_checkpointing_active"] is False


def test_cpu_precision_computes_in_fp32_and_the_record_says_so(tmp_path, tiny_qwen, instruction_data):
    """training.cpu_precision: on a host with no CUDA GPU bf16 computes in fp32 and nf4 dequantizes to fp32;
    the record keeps the request (variant and precision.requested) and names the substitution."""
    lora = run(tmp_path / "l", tiny_qwen, instruction_data, Variant("lora"), max_steps=3, cpu_precision="fp32")
    assert lora["status"] == "ok", lora["reason"]
    assert lora["precision"]["requested"] == lora["variant"]["precision"] == "bf16"
    assert lora["precision"]["frozen_weights"] == lora["precision"]["gemm"] == "fp32"
    assert lora["extra"]["host_changes"] == ["precision bf16 -> fp32 (training.cpu_precision: no CUDA GPU)"]
    q = run(tmp_path / "q", tiny_qwen, instruction_data, Variant("qlora", precision="nf4"), max_steps=3,
            cpu_precision="fp32")
    assert q["status"] == "ok", q["reason"]
    assert q["precision"]["gemm"] == "fp32"  # (tiny: the fp32 embeddings outnumber the 4-bit weights)
    assert q["extra"]["host_changes"][0].startswith("nf4 compute bf16 -> fp32")
    assert q["variant"]["nf4_compute"] == "bf16"  # the record's variant is the one asked for


def test_cpu_compile_backend_captures_graphs_without_inductor(tmp_path, tiny_qwen, instruction_data):
    """training.cpu_compile_backend: a compiled variant on a host with no CUDA GPU runs through aot_eager
    (graphs captured and counted, no code generated); the record names the backend and the change."""
    rec = run(tmp_path, tiny_qwen, instruction_data, Variant("compile", compile="default"), max_steps=3,
              cpu_compile_backend="aot_eager")
    assert rec["status"] == "ok", rec["reason"]
    assert rec["compile"]["backend"] == "aot_eager" and rec["compile"]["unique_graphs"] >= 1
    assert rec["compile"]["cudagraph_skips"] == 0  # counted (Inductor's CUDA graphs: none asked for here)
    assert rec["compile"]["fx_cache_hits"] == 0 and rec["compile"]["autograd_cache_hits"] == 0  # counted; none here
    assert rec["extra"]["host_changes"] == ["compile backend inductor -> aot_eager "
                                            "(training.cpu_compile_backend: no CUDA GPU)"]
    assert rec["variant"]["compile_backend"] == "inductor"


def test_the_trainer_compiles_the_whole_model_only_for_model_scope():
    """TrainingArguments turns torch_compile on whenever a mode or backend is given: a layers-scope variant
    passes neither (its blocks are compiled in place), or the trainer would compile the whole model on top."""
    from transformers import TrainingArguments

    from ftbench.run.runners.causal_lm import trainer_compile_args

    layers = trainer_compile_args(Variant("l", compile="default", compile_scope="layers"))
    assert layers == {} and not TrainingArguments(output_dir=".", use_cpu=True, **layers).torch_compile
    whole = trainer_compile_args(Variant("m", compile="max-autotune"))
    assert whole == {"torch_compile": True, "torch_compile_backend": "inductor", "torch_compile_mode": "max-autotune"}
    assert trainer_compile_args(Variant("a", compile="default", compile_backend="aot_eager"))["torch_compile_mode"] is None


@pytest.mark.parametrize("variant, words", [
    (Variant("unsloth-qlora", framework="unsloth", precision="nf4"), "CUDA"),
    # the causal-LM runner's FP8 path is torchao's: Transformer Engine is refused, never trained in bf16 and
    # scored against the FP8 peak; torchao's needs a GPU of compute capability 8.9 or newer
    (Variant("fp8", precision="fp8", fp8_backend="te", fp8_recipe="static"), "fp8_backend='te'"),
    (Variant("fp8-ao", precision="fp8", fp8_backend="torchao", padding_free=True), "compute capability 8.9"),
    (Variant("pinned", pin_memory=True), "CUDA"),
])
def test_variants_a_cpu_cannot_run_are_unsupported(tmp_path, tiny_qwen, instruction_data, variant, words):
    rec = run(tmp_path, tiny_qwen, instruction_data, variant)
    assert rec["status"] == "unsupported" and words in rec["reason"]
    assert rec["timing"]["step_time_s"] is None


def test_a_broken_model_is_an_error_record_not_a_crash(tmp_path, tiny_qwen, instruction_data):
    rec = run(tmp_path, dict(tiny_qwen, path=str(tmp_path / "missing")), instruction_data, Variant("lora"))
    assert rec["status"] == "error" and rec["reason"]
    assert (tmp_path / "steps.csv").exists() and (tmp_path / "memory.csv").exists()


def test_padding_free_batches_count_each_packed_sequence():
    import torch

    from ftbench.run.runners.causal_lm import batch_sequences

    ids = torch.zeros(1, 9, dtype=torch.long)
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert batch_sequences(ids, None, pos) == ([3, 2, 4], [3, 2, 4])
    padded = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert batch_sequences(padded, mask, torch.arange(5).repeat(2, 1)) == ([5, 5], [3, 5])
    # a row padded to a multiple (FP8): the trailing pad tokens (position 0 each) are computed, not samples
    row = torch.tensor([[5, 6, 7, 8, 9, 9, 9, 9]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 0]])
    assert batch_sequences(row, None, pos, pad_id=9) == ([3, 2, 1, 1, 1], [3, 2])
    assert batch_sequences(row, None, pos) == ([3, 2, 1, 1, 1], [3, 2, 1, 1, 1])  # unpadded runs: every restart


def test_a_padding_free_row_padded_to_a_multiple_counts_only_its_samples(tmp_path, tiny_qwen, instruction_data):
    """The FP8 rung pads the packed row to a multiple of 16 (here: bucketed, 64, which a CPU runs): the pad
    tokens are computed (padded tokens) but are neither samples nor real tokens."""
    import csv

    rec = run(tmp_path, tiny_qwen, instruction_data,
              Variant("pf-varlen-padded", padding_free=True, attention="varlen", shape_policy="bucketed"))
    assert rec["status"] == "ok", rec["reason"]
    rows = list(csv.DictReader((tmp_path / "steps.csv").open()))
    assert rows and all(int(r["samples"]) == 2 for r in rows)
    assert all(int(r["padded_tokens"]) % 64 == 0 and int(r["padded_tokens"]) > int(r["tokens"]) for r in rows)


def test_causal_lm_shape_policy_and_attention_backend_knobs():
    import torch

    from ftbench.harness.meter import Unsupported
    from ftbench.run.runners.causal_lm import pad_multiple
    from ftbench.build.variants import attention_backend, check_supported

    s = TrainSettings(bucket_multiple=64, fixed_length=2048)
    assert pad_multiple(Variant("lora"), s) is None  # dynamic padding
    assert pad_multiple(Variant("b", shape_policy="bucketed"), s) == 64
    assert pad_multiple(Variant("f", shape_policy="fixed"), s) == 2048
    fp8 = dict(precision="fp8", fp8_backend="torchao")
    assert pad_multiple(Variant("p8", padding_free=True, **fp8), s) == 16  # the FP8 GEMMs' shape rule
    assert pad_multiple(Variant("b8", shape_policy="bucketed", **fp8), TrainSettings(bucket_multiple=24)) == 48
    # the knob restricts scaled_dot_product_attention to one backend for the run, and only for the run
    q = torch.randn(1, 2, 8, 16)
    with attention_backend(Variant("m", sdpa_backend="math")):
        assert not torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.backends.cuda.flash_sdp_enabled()
    with pytest.raises(Unsupported, match="efficient attention backend needs a CUDA GPU"):
        check_supported(Variant("e", sdpa_backend="efficient"), torch.device("cpu"))


@pytest.mark.parametrize("precision, weights, gemm", [("bf16", "bf16", "bf16"), ("fp32", "fp32", "fp32")])
def test_diffusion_trains_in_the_precision_it_records(tmp_path, precision, weights, gemm):
    """A bf16 diffusion variant trains in bf16 (weights and autocast), never silently in fp32."""
    from ftbench.config.architectures import load_architecture
    from ftbench.data.datasets import prepare_dataset
    from ftbench.build.models import materialize_model

    from conftest import ROOT

    manifest = materialize_model(load_architecture(ROOT / "config/architectures/stable-diffusion-v1-5.yaml", "tiny"),
                                 "random", tmp_path / "sd", 0)
    ddef = {"kind": "image_caption", "source": "synthetic", "num_samples": 6, "eval_samples": 1}
    prepare_dataset(ddef, 42, tmp_path / "train.parquet", tmp_path / "eval.parquet")
    ctx = RunContext(RunSpec("diffusion", "stable-diffusion-v1-5", "tiny", "naruto", precision, 1),
                     Variant(precision, precision=precision),
                     TrainSettings(measure=MeasureSettings(warmup_steps=1, steps=2), resolution=32,
                                   lora={"r": 4, "alpha": 4, "target_modules": ["to_k", "to_q", "to_v", "to_out.0"]}),
                     manifest, ddef, str(tmp_path / "train.parquet"), str(tmp_path / "eval.parquet"), str(tmp_path),
                     "cafe")
    rec = execute(ctx, tmp_path / "metrics.json", tmp_path / "steps.csv", tmp_path / "memory.csv")
    assert rec["status"] == "ok", rec["reason"]
    assert rec["precision"]["frozen_weights"] == weights and rec["precision"]["gemm"] == gemm
    assert rec["precision"]["trainable_weights"] == "fp32"  # the recipe keeps LoRA weights in fp32


def test_padding_free_batches_compute_the_same_loss_as_padded_ones(tiny_qwen):
    """The ladder's padding-free rung: TRL's collator concatenates a batch into one row whose position ids
    restart at each sequence; with the runner's block-diagonal causal mask the loss over the same tokens
    equals the padded batch's."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from ftbench.run.runners.causal_lm import document_mask

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    vocab = model.config.vocab_size
    features = [{"input_ids": torch.randint(5, vocab, (n,)).tolist()} for n in (7, 12, 4)]
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(features)
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(features)
    assert packed["input_ids"].shape == (1, 23) and "attention_mask" not in packed
    pos = packed["position_ids"]
    with torch.no_grad():
        a = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], labels=padded["labels"]).loss
        b = model(input_ids=packed["input_ids"], position_ids=pos, attention_mask=document_mask(pos),
                  labels=packed["labels"]).loss
        # position ids alone do not keep the sequences apart in transformers' SDPA: why the runner adds the mask
        c = model(input_ids=packed["input_ids"], position_ids=pos, labels=packed["labels"]).loss
    assert torch.allclose(a, b, rtol=1e-5), (a, b)
    assert not torch.allclose(a, c, rtol=1e-4)


def test_padding_free_variant_trains_and_counts_real_tokens(tmp_path, tiny_qwen, instruction_data):
    rec = run(tmp_path, tiny_qwen, instruction_data, Variant("lora-padding-free", padding_free=True))
    assert rec["status"] == "ok", rec["reason"]
    steps = list(csv.DictReader(open(tmp_path / "steps.csv")))
    # one row of concatenated sequences: nothing padded, every token real, two samples a step
    assert all(r["tokens"] == r["padded_tokens"] and r["shape"].startswith("1x") for r in steps)
    assert all(int(r["samples"]) == 2 for r in steps)
    assert rec["loss"]["first_steps"] == 5 and math.isfinite(rec["loss"]["mean_first_steps"])


def test_liger_is_unsupported_without_a_gpu(tmp_path, tiny_qwen, instruction_data):
    rec = run(tmp_path, tiny_qwen, instruction_data, Variant("lora-liger", liger=True))
    assert rec["status"] == "unsupported" and "Liger" in rec["reason"]


def test_padding_free_keeps_the_sequence_length_limit(tmp_path, tiny_qwen, instruction_data):
    ddef, train, eval_ = instruction_data
    variant = Variant("lora-padding-free", padding_free=True)
    settings = TrainSettings(measure=MeasureSettings(warmup_steps=1, steps=2), lora=LORA, max_seq_length=16)
    ctx = RunContext(RunSpec("llm", "qwen3-8b", "tiny", "japanese_alpaca", variant.name, 2), variant, settings,
                     tiny_qwen, ddef, str(train), str(eval_), str(tmp_path), "cafe")
    rec = execute(ctx, tmp_path / "metrics.json", tmp_path / "steps.csv", tmp_path / "memory.csv")
    assert rec["status"] == "ok", rec["reason"]
    steps = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert all(int(r["tokens"]) <= 2 * 16 for r in steps) and any(int(r["tokens"]) == 32 for r in steps)


def test_regional_compile_shares_one_graph_across_layers(tmp_path):
    """compile_scope: layers compiles each repeated block in place (LLaVA: CLIP encoder and Mistral decoder
    layers); the decoder layers share one graph and compute what the eager ones do."""
    import torch
    from transformers import LlavaNextForConditionalGeneration

    from conftest import ROOT
    from ftbench.config.architectures import load_architecture
    from ftbench.harness.trackers import compiled_graphs
    from ftbench.build.models import materialize_model
    from ftbench.build.variants import compile_model, repeated_blocks

    manifest = materialize_model(load_architecture(ROOT / "config/architectures/llava-v1.6-mistral-7b.yaml", "tiny"),
                                 "random", tmp_path, 0)
    model = LlavaNextForConditionalGeneration.from_pretrained(manifest["path"]).float()
    blocks = repeated_blocks(model)
    layers = model.model.language_model.layers
    assert {type(b).__name__ for b in blocks} == {"CLIPEncoderLayer", "MistralDecoderLayer"} and len(layers) > 1
    ids = torch.randint(5, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    eager = model.model.language_model(input_ids=ids, use_cache=False).last_hidden_state
    assert compile_model(model, Variant("x")) is model  # no compile: the model itself
    before = compiled_graphs()
    assert compile_model(model, Variant("x", compile="default", compile_scope="layers")) is model
    assert all(b._compiled_call_impl is not None for b in blocks)
    compiled = model.model.language_model(input_ids=ids, use_cache=False).last_hidden_state
    assert compiled_graphs() - before == 1  # one graph for all decoder layers
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    # the modes whose graphs run as CUDA graphs (a loop marks each step's start for them): Inductor's, not a backend's
    from ftbench.build.variants import cuda_graphs

    assert [cuda_graphs(Variant("x", compile=m)) for m in (None, "default", "reduce-overhead", "max-autotune")] == [
        False, False, True, True]
    assert not cuda_graphs(Variant("x", compile="max-autotune", compile_backend="aot_eager"))


def test_causal_lm_compiles_its_decoder_layers_regionally(tmp_path, tiny_qwen, instruction_data, monkeypatch):
    """compile_scope: layers: the Trainer does not compile the whole model; the decoder layers are compiled
    in place and share their graphs (a handful, not one per layer), and the run trains. (Inductor's CPU code
    generation takes minutes here: the layers compile with TorchDynamo + AOTAutograd and eager kernels.)"""
    import torch

    compile_in_place = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **_: compile_in_place(self, backend="aot_eager"))
    # bucketed lengths (multiples of 64): two shapes at most, so the CPU compiles little
    rec = run(tmp_path, tiny_qwen, instruction_data, Variant("lora-regional", compile="default", compile_scope="layers",
                                                             shape_policy="bucketed"), max_steps=4)
    assert rec["status"] == "ok", rec["reason"]
    c = rec["compile"]
    assert c["unique_graphs"] and c["compile_s"] > 0
    assert c["unique_graphs"] < 2 * 4  # forward graphs per shape seen, not per layer (the tiny model has 2)
    assert math.isfinite(rec["loss"]["eval"])


def test_cpu_parallel_jobs_compute_on_the_threads_the_snakefile_sets(monkeypatch):
    import torch

    from ftbench.run.execute import host_sharing as cpu_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("FTBENCH_CPU_THREADS", "1")
        assert cpu_threads(torch.device("cpu")) == ["1 CPU thread(s), jobs side by side (cpu_parallel_jobs: no CUDA GPU)"]
        assert torch.get_num_threads() == 1
        assert cpu_threads(torch.device("cuda")) == []  # a GPU job is never changed
        monkeypatch.delenv("FTBENCH_CPU_THREADS")
        assert cpu_threads(torch.device("cpu")) == []
        monkeypatch.setenv("FTBENCH_GPU_SHARED", "4")  # a tiny job on a shared GPU (tiny_jobs_per_gpu) says so
        assert cpu_threads(torch.device("cuda")) == ["GPU shared with up to 3 other job(s): its speed is not a "
                                                     "measurement (tiny_jobs_per_gpu: tiny scale, or training.share_gpu "
                                                     "(runs whose losses alone matter))"]
    finally:
        torch.set_num_threads(before)


def _packed_batch(vocab, lengths=(7, 12, 4)):
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.manual_seed(0)
    features = [{"input_ids": torch.randint(5, vocab, (n,)).tolist()} for n in lengths]
    return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(features)


def test_varlen_attention_computes_the_masked_loss_without_a_mask(tiny_qwen):
    """attention: varlen: the packed row's sequences attend on their own from the cumulative lengths (no
    T x T mask); loss and gradients equal the block-diagonal mask's."""
    import torch
    from transformers import AutoModelForCausalLM

    from ftbench.build.attention import NAME, sequence_bounds, step_kwargs, use_varlen
    from ftbench.run.runners.causal_lm import document_mask

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen["path"], dtype=torch.float32, attn_implementation="sdpa")
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped-query attention covered
    packed = _packed_batch(model.config.vocab_size)
    pos = packed["position_ids"]
    assert sequence_bounds(pos).tolist() == [0, 7, 19, 23]
    masked = model(input_ids=packed["input_ids"], position_ids=pos, attention_mask=document_mask(pos),
                   labels=packed["labels"]).loss
    masked.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    use_varlen(model)
    assert model.config._attn_implementation == NAME
    varlen = model(input_ids=packed["input_ids"], position_ids=pos, labels=packed["labels"],
                   **step_kwargs(pos, 512)).loss
    varlen.backward()
    torch.testing.assert_close(varlen, masked, rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    with pytest.raises(RuntimeError, match="cu_seq_lens_q"):  # never silently attends across sequences
        model(input_ids=packed["input_ids"], position_ids=pos)


def test_varlen_attention_passes_what_the_flash_kernel_expects(monkeypatch):
    """The CUDA path's call of torch.nn.attention.varlen.varlen_attn (run here against a reference with the
    same signature): packed layout, causal window, grouped-query heads, scale, the constant length bound."""
    import torch

    from ftbench.build import attention

    calls = []

    def reference(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False, **_):
        calls.append((max_q, window_size, enable_gqa))
        assert q.shape[0] == k.shape[0] == int(cu_q[-1]) and cu_q is cu_k
        return attention._per_sequence(q, k, v, cu_q, scale)

    monkeypatch.setattr(attention, "varlen_attn", reference)
    monkeypatch.setattr(attention, "_PARAMS", {"scale", "window_size", "enable_gqa"})
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 4, 10, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]])
    kw = attention.step_kwargs(pos, 2048)
    want = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], is_causal=True, scale=0.3, enable_gqa=True)
        for a, b in ((0, 3), (3, 8), (8, 10))], dim=2).transpose(1, 2)
    out, _ = attention.varlen_attention(None, q, k, v, None, scaling=0.3, **kw)  # the CPU path
    torch.testing.assert_close(out, want)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    out, _ = attention.varlen_attention(None, q, k, v, None, scaling=0.3, **kw)
    torch.testing.assert_close(out, want)
    assert calls == [(2048, (-1, 0), True)]


def test_lmm_causal_attention_drops_the_padding_mask_with_the_same_loss(tmp_path):
    """attention: causal (Study A): right-padded rows under the causal mask alone give the masked loss, and
    a left-padded batch is refused rather than trained wrong."""
    import torch
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    from conftest import ROOT
    from ftbench.config.architectures import load_architecture
    from ftbench.build.models import materialize_model
    from ftbench.run.runners.lmm import Collator, model_inputs

    manifest = materialize_model(load_architecture(ROOT / "config/architectures/llava-v1.6-mistral-7b.yaml", "tiny"),
                                 "random", tmp_path, 0)
    model = LlavaNextForConditionalGeneration.from_pretrained(manifest["path"]).float().eval()
    from PIL import Image

    images = [Image.new("RGB", (40 + 30 * i, 50), (40 * i, 90, 200)) for i in range(2)]
    batch = Collator(AutoProcessor.from_pretrained(manifest["path"]), "bucketed", 1280, 64)(
        [{"image": im, "labels": i} for i, im in enumerate(images)])
    mask = batch["attention_mask"]
    assert (mask == 0).any() and (mask.sum(1) != mask.shape[1]).all()  # both rows padded on the right
    causal = model_inputs(batch, Variant("x", attention="causal"))
    assert "attention_mask" not in causal and model_inputs(batch, Variant("x")) is batch
    with torch.no_grad():
        a, b = model(**batch, use_cache=False).loss, model(**causal, use_cache=False).loss
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    left = {**batch, "attention_mask": batch["attention_mask"].flip(1)}
    with pytest.raises(RuntimeError, match="right padding"):
        model_inputs(left, Variant("x", attention="causal"))


def test_attention_knob_is_honoured_only_where_its_runner_acts_on_it():
    from ftbench.core.knobs import knob_problems

    assert knob_problems("causal_lm", Variant("x", padding_free=True, attention="varlen")) == []
    assert "without padding_free" in knob_problems("causal_lm", Variant("x", attention="varlen"))[0]
    assert "honours ['mask', 'varlen']" in knob_problems("causal_lm", Variant("x", attention="causal"))[0]
    assert knob_problems("lmm", Variant("x", attention="causal")) == []
    assert "honours ['causal', 'mask']" in knob_problems("lmm", Variant("x", attention="varlen"))[0]
    assert "does not act on attention" in knob_problems("diffusion", Variant("x", attention="causal"))[0]
    fp8 = dict(precision="fp8", fp8_backend="torchao")
    assert knob_problems("causal_lm", Variant("x", padding_free=True, attention="varlen", **fp8)) == []
    assert knob_problems("causal_lm", Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="current")) == []
    assert "Transformer Engine's recipes" in knob_problems(
        "causal_lm", Variant("x", precision="fp8", fp8_backend="te", fp8_recipe="rowwise"))[0]
    assert "without fp8_backend" in knob_problems("causal_lm", Variant("x", precision="fp8"))[0]
    # torchao's FP8 layers train under data parallel and FSDP2 (measured: h100x4-2026-11-26-c); Unsloth's never
    assert knob_problems("causal_lm", Variant("x", gpus=2, parallel="ddp", **fp8)) == []
    assert "PEFT only" in knob_problems("causal_lm", Variant("x", framework="unsloth", **fp8))[0]


def test_the_garbage_collectors_pauses_are_timed_per_step_and_freezing_leaves_nothing_frozen():
    import gc

    from ftbench.harness.meter import Meter

    meter = Meter(torch.device("cpu"), MeasureSettings(warmup_steps=1, steps=2, repeats=1), gc_freeze=True)
    garbage = [[i] for i in range(10**5)]  # objects alive before training starts: frozen by start()
    with meter:
        meter.start()
        # frozen objects freed since (another thread's, the pytest run's) leave the permanent generation: the count
        # only falls from what start() froze, and the objects alive before it stay frozen
        assert meter.gc.frozen_objects >= len(garbage)
        assert len(garbage) <= gc.get_freeze_count() <= meter.gc.frozen_objects
        meter.step(1)
        gc.collect()  # a full collection inside the second step
        meter.step(1)
        meter.step(1)
    assert gc.get_freeze_count() == 0  # unfrozen when the meter closes
    rows = meter.rows
    assert [r["gc_full"] for r in rows] == [0, 1, 0]
    assert rows[1]["gc_pause_s"] > 0 and rows[1]["gc_pause_s"] >= rows[2]["gc_pause_s"]
    assert meter.gc.largest_s >= rows[1]["gc_pause_s"] / 2


def test_gpt_oss_trains_with_grouped_experts_no_step_sync_and_a_frozen_gc(tmp_path, instruction_data):
    """qlora-gc-pf-grouped-async as a CPU can run it (pinned memory needs a CUDA GPU): the grouped experts, the
    loader's host-side varlen bounds, no per-step metrics, fused AdamW's arithmetic, the model's objects frozen."""
    from ftbench.config.architectures import load_architecture
    from ftbench.build.models import materialize_model

    arch = load_architecture(Path(__file__).parents[1] / "config/architectures/gpt-oss-120b.yaml", "tiny")
    manifest = materialize_model(arch, "random", tmp_path / "model", 42)
    v = Variant("qlora-gc-pf-grouped-async", precision="nf4", gradient_checkpointing=True, padding_free=True,
                attention="varlen", kbit_upcast=False, experts="grouped", trainer_metrics=False, sync_free=True,
                optim="adamw_torch_fused", gc_freeze=True)
    rec = run(tmp_path, manifest, instruction_data, v, batch_size=4, max_steps=4)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["extra"]["experts"].startswith("grouped")
    assert rec["extra"]["step_bounds"] == "the loader's collator, host tensors"
    g = rec["extra"]["python_gc"]
    assert g["frozen_objects"] > 10**4 and g["pause_ms_per_step"] >= 0 and g["full_collections"] >= 0
    steps = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert all(float(r["gc_pause_s"]) >= 0 for r in steps)
    # ... and with LoRA on every expert too (expert_lora): the trainable parameters grow by exactly those
    expert = run(tmp_path / "expert-lora", manifest, instruction_data,
                 dataclasses.replace(v, name="qlora-gc-pf-grouped-async-expert-lora", expert_lora=True),
                 batch_size=4, max_steps=3)
    assert expert["status"] == "ok", expert["reason"]
    added = expert["extra"]["expert_lora"]["parameters"]
    assert added > 0 and expert["model"]["trainable_parameters"] == rec["model"]["trainable_parameters"] + added


def test_without_trainer_metrics_the_model_is_walked_once_for_the_same_training(tmp_path, tiny_qwen,
                                                                              instruction_data, monkeypatch):
    """The Trainer walks every module and parameter each step for its FLOP total (num_parameters) and its gradient
    clipping (model.parameters()); trainer_metrics: false lists them once, and trains the same: on a CPU both take
    the model's own loss, so the per-step losses (gradients clipped at max_grad_norm) are identical."""
    from transformers import PreTrainedModel

    calls = []
    count = PreTrainedModel.num_parameters

    def counted(self, only_trainable=False, exclude_embeddings=False):
        calls.append(exclude_embeddings)
        return count(self, only_trainable, exclude_embeddings)

    monkeypatch.setattr(PreTrainedModel, "num_parameters", counted)
    losses = {}
    for metrics, walks in ((True, 5), (False, 1)):
        calls.clear()
        torch.manual_seed(0)  # LoRA's initial weights come from the global generator (one process, two runs)
        rec = run(tmp_path / str(metrics), tiny_qwen, instruction_data, Variant("lora", trainer_metrics=metrics))
        assert rec["status"] == "ok", rec["reason"]
        assert calls.count(True) == walks
        losses[metrics] = [float(r["loss"]) for r in csv.DictReader(open(tmp_path / str(metrics) / "steps.csv"))]
    assert len(losses[True]) == 5 and losses[True] == losses[False]


def test_unsloth_adapts_a_mixture_of_experts_attention_only_unless_the_variant_asks_for_expert_lora():
    """The study's Unsloth adapted gpt-oss's attention only; Unsloth 2026.10.9 maps the MLP names onto every expert
    (536.8 M trainable parameters). unsloth-qlora leaves the MLP names out on a mixture of experts, expert_lora keeps
    them; a dense model keeps all seven."""
    from types import SimpleNamespace

    from ftbench.core.knobs import knob_problems
    from ftbench.run.runners.causal_lm import unsloth_targets

    seven = {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    moe, dense = SimpleNamespace(num_local_experts=128), SimpleNamespace(hidden_size=8)
    plain = Variant("unsloth-qlora", precision="nf4", framework="unsloth")
    experts = Variant("unsloth-qlora-expert-lora", precision="nf4", framework="unsloth", expert_lora=True)
    assert unsloth_targets(plain, seven, moe) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert unsloth_targets(experts, seven, moe) == seven["target_modules"]
    assert unsloth_targets(plain, seven, dense) == seven["target_modules"]
    assert knob_problems("causal_lm", experts) == []
    assert "grouped" in knob_problems("causal_lm", Variant("q", precision="nf4", expert_lora=True))[0]
