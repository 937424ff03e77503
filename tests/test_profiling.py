"""Trace summary: busy/idle shares, data-loading share, idle gaps, on a trace with known intervals."""

import pytest

from ftbench.judge.analysis import kernel_time
from ftbench.harness.kernels import attention_backend, is_fp8_work
from ftbench.run.profiling import summarize_trace


def test_busy_idle_and_gaps_from_a_known_trace():
    events = [
        {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000},
        {"ph": "X", "name": "ProfilerStep#2", "cat": "user_annotation", "ts": 1000, "dur": 1000},
        {"ph": "X", "name": "ProfilerStep#2", "cat": "gpu_user_annotation", "ts": 1010, "dur": 990},  # not a step
        {"ph": "X", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "cat": "cpu_op",
         "ts": 0, "dur": 200},
        # step 1: kernels cover 200..600 and 700..1000 (overlap counted once): busy 700 of 1000
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 200, "dur": 300},
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 400, "dur": 200},
        {"ph": "X", "name": "add", "cat": "kernel", "ts": 700, "dur": 300},
        # step 2: fully busy
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 1000, "dur": 1000},
    ]
    s = summarize_trace(events, top_ops=[{"name": "gemm"}])
    assert s["device"] == "cuda" and s["steps"] == 2
    assert s["per_step"][0]["busy_share"] == pytest.approx(0.7)
    assert s["per_step"][0]["idle_gaps"] == 2  # 0..200 and 600..700
    assert s["per_step"][0]["largest_gap_ms"] == pytest.approx(0.2)
    assert s["per_step"][0]["data_loading_share"] == pytest.approx(0.2)
    assert s["busy_share"] == pytest.approx(0.85) and s["idle_share"] == pytest.approx(0.15)
    assert s["cpu_bound"] is False  # 85% busy: not CPU-bound by the 80% rule
    assert s["top_operators"] == [{"name": "gemm"}]
    assert [st["kernels"] for st in s["per_step"]] == [3, 1]


def test_a_profile_counts_the_fp8_casts_and_scaling_apart_from_the_gemms_they_feed():
    kernels = [("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn", 500),  # an FP8 GEMM: a GEMM
               ("void transformer_engine::detail::cast_transpose_kernel<float8_e4m3>", 200),
               ("void transformer_engine::delayed_scaling_recipe::kernel::amax_and_scale_update", 100),
               ("triton_red_fused_abs_amax_max_0", 50), ("void at::native::vectorized_elementwise_kernel", 100),
               ("void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>(float*, unsigned char*, float*)", 50)]
    events = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000}]
    t = 0
    for name, dur in kernels:
        events.append({"ph": "X", "name": name, "cat": "kernel", "ts": t, "dur": dur})
        t += dur
    s = summarize_trace(events, top_ops=[])
    assert s["gemm_share"] == pytest.approx(0.5) and s["fp8_work_share"] == pytest.approx(0.35)
    assert s["dequant_4bit_share"] == pytest.approx(0.05)  # bitsandbytes' NF4 dequantization is not FP8 work
    # torchao under Inductor: the casts fused into the kernels around _scaled_mm, the amax into a reduction
    for name in ("triton_poi_fused__scaled_mm__to_copy_add_clamp_clone_mul_reciprocal_silu_7",
                 "triton_red_fused_abs_add_max_mul_silu_silu_backward_view_6"):
        assert is_fp8_work(name)
    assert not is_fp8_work("triton_poi_fused__unsafe_view_add_mul_view_23")


def test_long_idle_gaps_are_named_by_the_innermost_host_operator_running_through_them():
    ms = 1000  # trace times are microseconds
    events = [
        {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100 * ms},
        {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 0, "dur": 10 * ms},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1 * ms, "dur": 2 * ms},
        # 10..70 ms: the device idles while the host builds an attention plan (nested host operators)
        {"ph": "X", "name": "autograd::engine::evaluate_function: AttnBackward0", "cat": "cpu_op",
         "ts": 9 * ms, "dur": 62 * ms},
        {"ph": "X", "name": "aten::_cudnn_attention_backward", "cat": "cpu_op", "ts": 10 * ms, "dur": 60 * ms},
        {"ph": "X", "name": "aten::empty", "cat": "cpu_op", "ts": 11 * ms, "dur": 1 * ms},  # too short to explain it
        {"ph": "X", "name": "attn_bwd", "cat": "kernel", "ts": 70 * ms, "dur": 15 * ms},
        # 85..100 ms: idle with no host operator recorded (Python between operators)
    ]
    s = summarize_trace(events, top_ops=[])
    step = s["per_step"][0]
    assert step["largest_gap_ms"] == pytest.approx(60)
    assert step["largest_gap_host_op"] == "aten::_cudnn_attention_backward"
    # where it lies in the step, and the host operators around it
    assert step["largest_gap_at_ms"] == pytest.approx(10)
    assert step["largest_gap_after_host_op"] == "aten::mm"
    assert step["largest_gap_next_host_op"] == "aten::_cudnn_attention_backward"
    assert s["idle_causes"] == [{"host_op": "aten::_cudnn_attention_backward", "idle_ms": pytest.approx(60)},
                                {"host_op": "(no host operator)", "idle_ms": pytest.approx(15)}]
    assert s["cpu_bound"] is True


def test_profiles_measured_elsewhere_become_pages_of_the_report(tmp_path):
    """A merge_runs folder's profiles/ (measurements/*/profiles) reach the report: one page each, GPU named,
    even for a model this config does not have."""
    import shutil

    from conftest import ROOT, snakemake

    shutil.copytree(ROOT / "measurements/h100-2026-11-23-c", tmp_path / "m/h100-c")
    target = "results/merged_profiles/h100-c/llm/qwen3-8b/full/wikipedia_ja/lora-pf-liger/bs2/summary.html"
    cfg = ("--configfile", str(ROOT / "config/config.yaml"))
    dry = snakemake("-n", "--cores", "1", *cfg, "-d", str(tmp_path), "--config", 'merge_runs=["m/h100-c"]', cwd=tmp_path)
    assert dry.returncode == 0 and target in dry.stdout, dry.stdout[-2000:] + dry.stderr[-2000:]
    run = snakemake("--cores", "1", *cfg, "-d", str(tmp_path), "--config", 'merge_runs=["m/h100-c"]', "--", target,
                    cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    page = (tmp_path / target).read_text()
    assert "NVIDIA H100 80GB HBM3" in page and "lora-pf-liger" in page and "LigerRopeFunction" in page
    # readable tables: named columns, shares in percent (not 0-1 fractions under snake_case keys)
    assert "GPU busy %" in page and "share %" in page and "busy_share" not in page


def test_a_config_can_profile_fewer_steps():
    """`training.profile_active_steps` (bench/study_b_full.yaml: 1) shortens the profiler's active window; the
    default keeps SCHEDULE's."""
    from conftest import ROOT
    from ftbench.config.settings import RunSpec, load_yaml, train_settings
    from ftbench.run.profiling import SCHEDULE, schedule

    assert schedule(None) == SCHEDULE and schedule(1) == {**SCHEDULE, "active": 1}
    cfg = load_yaml(ROOT / "config/config.yaml")
    spec = RunSpec("llm", "gpt-oss-120b", "tiny", "wikipedia_ja", "qlora-gc-pf", 16)
    assert train_settings(cfg, spec).profile_active_steps is None
    full = load_yaml(ROOT / "bench/study_b_full.yaml")
    cfg["studies"]["llm"]["training"] = {**cfg["studies"]["llm"]["training"], **full["studies"]["llm"]["training"]}
    assert train_settings(cfg, spec).profile_active_steps == 1


def test_top_operators_sum_kernel_time_on_a_gpu_and_self_time_on_a_host():
    """With kernels in the trace: kernels by summed device time, shares of all device time. Without: host operators
    by self time, nested ones subtracted from their caller thread by thread."""
    from ftbench.run.profiling import top_operators

    gpu = [{"name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 500},
           {"name": "gemm", "cat": "kernel", "ts": 10, "dur": 300},
           {"name": "gemm", "cat": "kernel", "ts": 400, "dur": 300},
           {"name": "copy", "cat": "gpu_memcpy", "ts": 800, "dur": 200},
           {"name": "ProfilerStep#1", "cat": "gpu_user_annotation", "ts": 0, "dur": 5000}]  # not device work
    assert top_operators(gpu) == [{"name": "gemm", "self_time_ms": 0.6, "share": 0.75, "calls": 2},
                                  {"name": "copy", "self_time_ms": 0.2, "share": 0.25, "calls": 1}]
    host = [{"name": "aten::linear", "cat": "cpu_op", "ts": 0, "dur": 100, "tid": 1},
            {"name": "aten::addmm", "cat": "cpu_op", "ts": 10, "dur": 60, "tid": 1},
            {"name": "aten::empty", "cat": "cpu_op", "ts": 20, "dur": 10, "tid": 1},
            {"name": "aten::empty", "cat": "cpu_op", "ts": 75, "dur": 5, "tid": 1},
            {"name": "aten::addmm", "cat": "cpu_op", "ts": 15, "dur": 40, "tid": 2},  # another thread: not nested
            {"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 100, "tid": 1}]
    rows = {r["name"]: (r["self_time_ms"] * 1e3, r["calls"]) for r in top_operators(host)}
    assert rows == {"aten::addmm": (pytest.approx(90), 2), "aten::linear": (pytest.approx(35), 1),
                    "aten::empty": (pytest.approx(15), 2)}
    assert top_operators(host, top=1)[0]["share"] == pytest.approx(90 / 140)


def test_a_profile_is_summarized_from_the_profilers_results_in_memory(tmp_path):
    """The trace summary comes from the profiler's events as it closes its window (no trace parsed back), and
    agrees with the trace it exports: the same steps, the same operator names."""
    import gzip
    import json

    import torch

    from ftbench.run.profiling import make_profiler, trace_events

    summary = tmp_path / "summary.trace.json"
    prof = make_profiler(torch.device("cpu"), str(tmp_path / "trace.json.gz"), str(summary),
                         plan={"wait": 0, "warmup": 1, "active": 2})
    layer = torch.nn.Linear(32, 32)
    with prof:
        for _ in range(3):
            layer(torch.randn(4, 32)).sum().backward()
            prof.step()
    s = json.loads(summary.read_text())
    assert s["device"] == "cpu" and s["steps"] == 2 and 0 < s["busy_share"] <= 1
    names = {r["name"] for r in s["top_operators"]}
    assert "aten::addmm" in names or "aten::linear" in names, names
    exported = json.load(gzip.open(tmp_path / "trace.json.gz", "rt"))["traceEvents"]
    steps = {e["name"] for e in exported if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep")}
    assert {e["name"] for e in trace_events(prof) if e["cat"] == "user_annotation"} >= steps and len(steps) == 2


def test_sync_watch_counts_sync_warnings_by_site_over_the_watched_steps(monkeypatch):
    """FTBENCH_SYNC_DEBUG=1: the sync-debug warnings of the measured steps, counted at their Python sites (others
    ignored); off on a CPU and without the variable."""
    import types
    import warnings

    from ftbench.run.profiling import SYNC_DEBUG_ENV, SYNC_WARNING, SyncWatch

    cpu, cuda = types.SimpleNamespace(type="cpu"), types.SimpleNamespace(type="cuda")
    monkeypatch.setenv(SYNC_DEBUG_ENV, "1")
    assert SyncWatch(cpu).summary(10) is None
    monkeypatch.delenv(SYNC_DEBUG_ENV)
    assert not SyncWatch(cuda).enabled
    monkeypatch.setenv(SYNC_DEBUG_ENV, "1")
    watch = SyncWatch(cuda)
    assert watch.enabled
    watch.armed_at_step = 2  # (arm() sets PyTorch's sync debug mode, which needs CUDA)

    def warn(msg, filename, lineno):
        return warnings.WarningMessage(UserWarning(msg), UserWarning, filename, lineno)

    watch._caught = ([warn(f"called a {SYNC_WARNING}", "/x/trainer.py", 1847)] * 10
                     + [warn(SYNC_WARNING, "/y/harness.py", 346)] * 2 + [warn("something else", "/z/a.py", 1)])
    got = watch.summary(12)
    assert got["from_step"] == 2 and got["steps"] == 10
    assert got["sites"] == [{"site": "x/trainer.py:1847", "count": 10, "per_step": 1.0},
                            {"site": "y/harness.py:346", "count": 2, "per_step": 0.2}]


def test_a_profile_counts_its_kernel_time_per_step_and_attention_by_implementation():
    # kernel names as the lent H100's traces gave them (h100-2026-11-26): bf16 ran cuDNN's SDPA, FP8 through
    # Transformer Engine PyTorch's memory-efficient attention
    cudnn = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"
    memeff = "fmha_cutlassB_bf16_aligned_128x128_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel)"
    assert attention_backend(cudnn) == "cuDNN SDPA"  # its name says flash too: cuDNN is tried first
    assert attention_backend(memeff) == "memory-efficient (CUTLASS fmha)"
    assert attention_backend("flash_fwd_kernel<Flash_fwd_kernel_traits>") == "flash attention"
    assert attention_backend("nvjet_sm90_tst_192x192_64x4_1x1_h_bz_coopB_TNN") is None
    events = [{"ph": "X", "name": f"ProfilerStep#{i}", "cat": "user_annotation", "ts": 1000 * i, "dur": 1000}
              for i in (1, 2)]
    for ts, name, dur in ((1000, "nvjet_sm90_tst", 400), (1400, cudnn, 300), (2000, memeff, 100),
                          (2100, "vectorized_elementwise_kernel", 200)):
        events.append({"ph": "X", "name": name, "cat": "kernel", "ts": ts, "dur": dur})
    s = summarize_trace(events, top_ops=[])
    assert s["kernel_ms_per_step"] == pytest.approx(0.5)  # 1,000 us of kernels over 2 steps
    assert s["attention_shares"] == {"cuDNN SDPA": pytest.approx(0.3),
                                     "memory-efficient (CUTLASS fmha)": pytest.approx(0.1)}
    row = kernel_time({**s, "top_operators": []})
    assert row == {"profile.kernel_ms_per_step": pytest.approx(0.5), "profile.attention_share": pytest.approx(0.4),
                   "profile.attention_backend": "cuDNN SDPA", "profile.attention_exact": True}


def test_a_summary_written_before_kernel_time_was_counted_gives_it_from_its_top_operators():
    old = {"device": "cuda", "steps": 3, "top_operators": [
        {"name": "nvjet_sm90_tst_192x192", "self_time_ms": 1480.1, "share": 0.1266},
        {"name": "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention)", "self_time_ms": 600.0,
         "share": 0.0513}, {"name": "fmha_cutlassB_bf16_aligned_128x128_k128_sm80", "self_time_ms": 300.0,
                            "share": 0.0257}]}
    row = kernel_time(old)
    assert row["profile.kernel_ms_per_step"] == pytest.approx(1480.1 / 0.1266 / 3)
    assert row["profile.attention_share"] == pytest.approx(0.077)  # a lower bound: only the top kernels are listed
    assert row["profile.attention_backend"] == "memory-efficient (CUTLASS fmha)"
    assert row["profile.attention_exact"] is False
    assert kernel_time({"device": "cpu", "top_operators": [{"name": "aten::mm", "self_time_ms": 1, "share": 1}]})[
        "profile.kernel_ms_per_step"] is None


def test_collectives_count_apart_and_only_their_unhidden_time_is_exposed():
    """A rank's step: an all-reduce half under a GEMM (hidden) and half alone, then one alone at the step's end."""
    events = [{"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0, "dur": 1000},
              {"ph": "X", "name": "gemm", "cat": "kernel", "ts": 0, "dur": 600},
              {"ph": "X", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
               "cat": "kernel", "ts": 500, "dur": 200},  # 500..600 under the GEMM, 600..700 alone
              {"ph": "X", "name": "add", "cat": "kernel", "ts": 700, "dur": 200},
              {"ph": "X", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cat": "kernel", "ts": 900, "dur": 100}]
    s = summarize_trace(events, top_ops=[])
    step = s["per_step"][0]
    assert step["communication_ms"] == pytest.approx(0.3)
    assert step["communication_exposed_ms"] == pytest.approx(0.2)
    assert s["communication_share"] == pytest.approx(0.3) and s["communication_exposed_share"] == pytest.approx(0.2)
    # a one-GPU trace has no collectives: no share, rather than a zero that reads as measured
    one = summarize_trace([e for e in events if "nccl" not in e["name"]], top_ops=[])
    assert one["communication_share"] is None and one["per_step"][0]["communication_ms"] == 0
