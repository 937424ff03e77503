"""A finished measurement's statistics (ftbench.harness.meter.Meter measures; this fills the record from its steps and
windows): step-time median, quantiles and noise, outliers and why, throughput, memory, device usage, energy,
FLOPs (MFU/HFU) and compile accounting."""

from __future__ import annotations

import statistics

import torch

from ftbench.harness.flops import mfu
from ftbench.harness.trackers import GIB, compiled_graphs, memory_now
from ftbench.core.records import cv, tokens_cv


def _memory(meter, record: dict) -> None:
    """The run's peaks: the allocator's, the host's resident set, the device's (NVML) and the process's own."""
    mem = memory_now(meter.device)
    for key in ("peak_allocated_gib", "peak_reserved_gib", "host_peak_rss_gib"):
        record["memory"][key] = mem[key]
    record["memory"]["device_peak_used_gib"] = meter.sampler.peak_used_gib()
    if meter.device.type == "cuda":  # the caching allocator at its limit frees its cache and retries: slow steps
        record["memory"]["alloc_retries"] = torch.cuda.memory_stats(meter.device).get("num_alloc_retries")
    if meter.sampler.process_peak_bytes is not None:
        record["memory"]["process_peak_used_gib"] = meter.sampler.process_peak_bytes / GIB


def summarize(meter, record: dict, peak_tflops: float | None, peak_precision: str | None) -> None:
    """Fill the record's measure, timing, outliers, throughput, memory, usage, energy, FLOPs and compile from a
    finished Meter's steps and windows."""
    m, rows, windows = meter.measure, meter.measured, meter.windows
    record["measure"].update(timer="cuda_events" if meter.cuda else "host_clock", warmup_steps=m.warmup_steps,
                             min_steps=m.steps, min_seconds=m.min_seconds, repeats=m.repeats,
                             truncated=any(w["truncated"] for w in windows) or (
                                 len(windows) < m.repeats and not meter.rule.stopped_early),
                             windows=[{k: v for k, v in w.items() if k != "host_span"} for w in windows])
    if meter.rule.calibrated:  # several ranks: windows that ended before min_seconds, counted as warm-up
        record["extra"]["measure_calibration"] = {"windows_as_warmup": meter.rule.calibrated,
                                                  "why": "shorter than min_seconds on a rank"}
    if meter.rule.stopped_early:  # fewer windows than `repeats`: their noise was already at most the target
        record["extra"]["measure_stop"] = meter.rule.stopped_early
    t = record["timing"]
    t.update({k: v for k, v in meter.timing.items() if k in t})
    if meter.rows:
        t["first_step_s"] = meter.rows[0]["step_time_s"]
        t["train_s"] = meter.rows[-1]["t_end_s"]
    _memory(meter, record)
    _compile(meter, record)
    losses = [r["loss"] for r in meter.rows if r.get("loss") is not None]
    if losses:  # the first steps see the same samples in every variant of a study (same seed and batch)
        n = min(len(losses), m.warmup_steps + m.steps)
        record["loss"].update(first=losses[0], last=losses[-1], first_steps=n,
                              mean_first_steps=statistics.fmean(losses[:n]))
    if not rows:
        return
    times = [r["step_time_s"] for r in rows]
    window_s = sum(times)
    median = statistics.median(times)
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [times[0]] * 9
    across = cv([w["samples_per_s"] for w in windows])
    within = cv(times)
    t.update(step_time_s=median, step_time_p10_s=q[0], step_time_p90_s=q[-1],
             step_time_mean_s=statistics.fmean(times), cv_within=within, cv_across_repeats=across,
             cv_median_across_repeats=cv([w["median_step_s"] for w in windows]),
             noise_cv=across if across is not None else (within / len(times) ** 0.5 if within is not None
                                                         else None),
             noise_cv_tokens=tokens_cv(windows), steps_measured=len(rows), window_s=window_s,
             host_window_s=sum(w["host_s"] for w in windows),
             host_cpu_step_s=statistics.median(r["host_cpu_s"] for r in rows) if "host_cpu_s" in rows[0] else None)
    t["first_step_overhead_s"] = max(t["first_step_s"] - median, 0.0)
    record["outliers"].update(outliers(meter.rows, m.outlier_factor, median, window_s))
    record["extra"].update(window_shapes(meter.rows))
    samples = sum(r["samples"] for r in rows)
    thr = record["throughput"]
    thr.update(samples_per_s=samples / window_s, samples_per_hour=3600 * samples / window_s,
               samples_per_hour_median_step=3600 * statistics.median(r["samples"] for r in rows) / median)
    tokens = [r.get("tokens") for r in rows]
    if None not in tokens:
        thr.update(tokens_per_s=sum(tokens) / window_s, tokens_per_sample=sum(tokens) / samples)
    padded = [r.get("padded_tokens") for r in rows]
    if None not in padded:
        thr["padded_tokens_per_s"] = sum(padded) / window_s
    record["extra"]["python_gc"] = python_gc(meter, rows, window_s)
    waits = [r.get("data_wait_s") for r in rows]
    if None not in waits:
        record["data"]["wait_share"] = sum(waits) / window_s
    record["device_usage"].update(meter.sampler.summary([w["host_span"] for w in windows]))
    energies = [w["energy_j"] for w in windows]
    if windows and None not in energies:
        e = sum(energies)
        record["energy"].update(source="nvml_total_energy_counter", window_j=e, per_step_j=e / len(rows),
                                per_sample_j=e / samples,
                                per_token_j=e / sum(tokens) if None not in tokens and sum(tokens) else None)
    model = [r.get("flops_model") for r in rows]
    hardware = [r.get("flops_hardware") for r in rows]
    f = record["flops"]
    f.update(peak_tflops=peak_tflops, peak_precision=peak_precision)
    if None not in model:
        f.update(model_per_step=statistics.fmean(model), model_tflops=sum(model) / window_s / 1e12,
                 mfu=mfu(sum(model) / window_s, peak_tflops))
    if None not in hardware:
        f.update(hardware_per_step=statistics.fmean(hardware), hardware_tflops=sum(hardware) / window_s / 1e12,
                 hfu=mfu(sum(hardware) / window_s, peak_tflops))  # the same ratio, of executed FLOPs


def python_gc(meter, rows: list[dict], window_s: float) -> dict:
    """Python's garbage collector in the measured steps: its pauses of the training thread per step (host time,
    which stalls the GPU where the host has not queued ahead), the full collections, the largest pause of the
    run, and whether the objects alive after load were frozen (variant knob gc_freeze)."""
    pauses = [r.get("gc_pause_s") or 0.0 for r in rows]
    return {"frozen_objects": meter.gc.frozen_objects, "pause_ms_per_step": 1e3 * statistics.fmean(pauses),
            "pause_share_of_window": sum(pauses) / window_s if window_s else None,
            "full_collections": sum(r.get("gc_full") or 0 for r in rows),
            "largest_pause_ms_run": 1e3 * meter.gc.largest_s}


def outliers(steps: list[dict], factor: float, median: float, window_s: float) -> dict:
    """Steps slower than `outlier_factor` medians, with why where known: graphs compiled during the step
    (a recompile) or a batch shape no earlier step had."""
    seen, prev_graphs, out = set(), None, []
    for r in steps:
        reasons = []
        graphs = r.get("compiled_graphs")
        if graphs is not None and prev_graphs is not None and graphs > prev_graphs:
            reasons.append(f"recompile ({graphs - prev_graphs} graph{'s' if graphs - prev_graphs > 1 else ''})")
        shape = r.get("shape")
        if shape is not None and shape not in seen and seen:
            reasons.append(f"new shape {shape}")
        if shape is not None:
            seen.add(shape)
        prev_graphs = graphs if graphs is not None else prev_graphs
        if r["phase"] == "measure" and r["step_time_s"] > factor * median:
            out.append({"step": r["step"], "time_s": r["step_time_s"], "x_median": r["step_time_s"] / median,
                        "reasons": reasons or ["unknown"]})
    spent = sum(o["time_s"] for o in out)
    # dominated: the outliers move throughput by more than a tenth against the median-step figure
    return {"factor": factor, "count": len(out), "time_s": spent, "time_share": spent / window_s,
            "dominated": spent / window_s > 0.1 if out else False, "steps": out[:20]}


def window_shapes(steps: list[dict]) -> dict:
    """How many batch shapes the measured windows saw, and how many of them no earlier step had (each a recompile
    for a compiled model with static shapes): what a step time under AnyRes averages over. Empty where the runner
    logs no shape."""
    before = {r["shape"] for r in steps if r.get("phase") != "measure" and r.get("shape") is not None}
    measured = [r["shape"] for r in steps if r.get("phase") == "measure" and r.get("shape") is not None]
    if not measured:
        return {}
    return {"shapes_measured": len(set(measured)), "new_shapes_measured": len(set(measured) - before)}


def _compile(meter, record: dict) -> None:
    """TorchDynamo/Inductor's own accounting of compile time, and graph counts (compiled variants)."""
    if not meter.count_graphs or not meter.rows:
        return
    from torch._dynamo.utils import calculate_time_spent, counters

    now, graphs_now = calculate_time_spent(), compiled_graphs() - meter.graphs_before
    spent, graphs = meter.trained_compile or (now, graphs_now)
    first = meter.rows[0].get("compiled_graphs") or 0
    record["compile"].update(compile_s=spent.get("total_wall_time"), frame_compile_s=spent.get(
        "entire_frame_compile"), backward_compile_s=spent.get("entire_backward_compile"), unique_graphs=graphs,
        graphs_first_step=first, recompiles=graphs - first, graph_breaks=sum(counters["graph_break"].values()),
        # graphs Inductor would have captured in CUDA graphs (mode reduce-overhead) and did not: its log says why
        cudagraph_skips=counters["inductor"]["cudagraph_skips"],
        # Inductor's FX-graph and AOTAutograd caches: a warm run's hits (FTBENCH_COMPILE_CACHE=warm), a cold one's
        # misses
        fx_cache_hits=counters["inductor"]["fxgraph_cache_hit"],
        fx_cache_misses=counters["inductor"]["fxgraph_cache_miss"],
        autograd_cache_hits=counters["aot_autograd"]["autograd_cache_hit"],
        autograd_cache_misses=counters["aot_autograd"]["autograd_cache_miss"],
        eval_graphs=graphs_now - graphs,
        eval_compile_s=(now.get("total_wall_time") or 0) - (spent.get("total_wall_time") or 0))
