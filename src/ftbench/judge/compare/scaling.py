"""Several GPUs against one, and one run on each GPU kind side by side."""
from __future__ import annotations

import polars as pl

from ftbench.judge.analysis import code_of, peak_memory
from ftbench.judge.compare.common import NOISE_NOTE, _verdict


def speedup_over(r: dict, suffix: str = "_1") -> tuple[float | None, str, float | None, float | None]:
    """A multi-GPU row's speed-up over its one-GPU twin (joined with `suffix`): on real tokens/s where both runs
    counted tokens (packed rows hold a varying number of samples, so samples/s carries the packing's noise), else on
    samples/s; with the metric's name and each run's noise CV."""
    a, b = r.get("throughput.tokens_per_s"), r.get(f"throughput.tokens_per_s{suffix}")
    na, nb = r.get("timing.noise_cv_tokens"), r.get(f"timing.noise_cv_tokens{suffix}")
    if a and b and na is not None and nb is not None:
        return a / b, "real tokens/s", na, nb
    a, b = r.get("throughput.samples_per_s"), r.get(f"throughput.samples_per_s{suffix}")
    return (a / b if a and b else None), "samples/s", r.get("timing.noise_cv"), r.get(f"timing.noise_cv{suffix}")


def best_single(r: dict, singles: list[dict]) -> tuple[dict | None, str]:
    """The fastest one-GPU run of the same model and data on the same GPU kind, at any batch and in any variant (what
    a user with one GPU would run instead), on real tokens/s where the multi-GPU run counted them, else samples/s;
    with the metric's key."""
    key = "throughput.tokens_per_s" if r.get("throughput.tokens_per_s") else "throughput.samples_per_s"
    same = [x for x in singles if (x["model"], x["dataset"], x["gpu"], x.get("scale")) == (
        r["model"], r["dataset"], r["gpu"], r.get("scale")) and x.get(key)]
    return max(same, key=lambda x: x[key], default=None), key


def best_single_columns(r: dict, singles: list[dict], n: int) -> dict:
    """A multi-GPU row against the best one GPU (`best_single`): named, and the speed-up with its noise verdict."""
    best, key = best_single(r, singles)
    if best is None or not r.get(key):
        return {"best one GPU, any batch": None, "x best one GPU": None}
    noise = "timing.noise_cv_tokens" if key == "throughput.tokens_per_s" else "timing.noise_cv"
    unit = "real tokens/s" if key == "throughput.tokens_per_s" else "samples/s"
    ratio = _verdict(r[key] / best[key], r.get(noise), best.get(noise))
    return {"best one GPU, any batch": f"{best['variant']} at batch {best['batch_size']}: {best[key]:,.1f} {unit}",
            "x best one GPU": f"{ratio} on {n} GPUs"}


def scaling(df: pl.DataFrame, published: dict, pairs=(), **_) -> list:
    """Several GPUs against one: each multi-GPU variant beside the one-GPU variant it scales (`pairs`: [multi,
    single]), same model, dataset, GPU kind and per-GPU batch size. Scaling efficiency = total throughput over
    N x the one-GPU throughput (real tokens/s where both runs counted them, else samples/s); the speedup carries its
    noise verdict; the per-rank step against the one-GPU step bounds what communication and the wrapper add to a
    step; peak memory is the largest rank's."""
    rows = []
    singles = [r for r in df.iter_rows(named=True) if r["status"] == "ok" and (r.get("parallel.world_size") or 1) == 1]
    for multi, single in pairs:
        a = df.filter(pl.col("variant") == multi)
        b = df.filter((pl.col("variant") == single) & (pl.col("status") == "ok"))
        for r in a.join(b, on=["model", "dataset", "gpu", "batch_size"], how="left", suffix="_1").iter_rows(named=True):
            ok, n = r["status"] == "ok", r["parallel.world_size"] or 1
            # never a ratio across two versions of the code, silently or not
            other_code = r.get("variant_1") is not None and code_of(r) != code_of(r, "_1")
            divided = ok and not other_code
            speedup, metric, noise, noise_1 = speedup_over(r) if divided else (None, None, None, None)
            step, step_1 = r.get("timing.step_time_s"), r.get("timing.step_time_s_1")
            clock = r.get("parallel.sm_clock_mean_mhz") or r.get("device_usage.sm_clock_mean_mhz")
            clock_1 = r.get("device_usage.sm_clock_mean_mhz_1")
            rows.append({"model": r["model"], "dataset": r["dataset"], "gpu": r["gpu"], "variant": multi,
                         "strategy": r["parallel.strategy"], "GPUs": n, "batch per GPU": r["batch_size"],
                         "status": r["status"], "samples/s (all GPUs)": r["throughput.samples_per_s"] if ok else None,
                         "real tokens/s (all GPUs)": r.get("throughput.tokens_per_s") if ok else None,
                         "real tokens/s a GPU": r["throughput.tokens_per_s"] / n if ok and r.get(
                             "throughput.tokens_per_s") else None,
                         "MFU %": 100 * r["flops.mfu"] if ok and r.get("flops.mfu") is not None else None,
                         "one GPU": single, "one-GPU real tokens/s": r.get("throughput.tokens_per_s_1"),
                         "speedup on": metric, "speedup": _verdict(speedup, noise, noise_1),
                         "scaling efficiency": speedup / n if speedup else None,
                         "rank step vs one GPU": step / step_1 if divided and step and step_1 else None,
                         "SM clock vs one GPU": clock / clock_1 if divided and clock and clock_1 else None,
                         "peak GiB (largest rank)": r["parallel.peak_allocated_gib_max"] if ok else None,
                         "one-GPU peak GiB": r.get("memory.peak_allocated_gib_1"),
                         "one-GPU MFU %": 100 * r["flops.mfu_1"] if r.get("flops.mfu_1") is not None else None,
                         "time to first step s": r.get("extra.time_to_first_step_s") if ok else None,
                         "host peak RSS GiB (largest rank)": r.get("parallel.host_peak_rss_gib_max") if ok else None,
                         **(best_single_columns(r, singles, n) if ok else {}),
                         "reason": r["reason"] if not ok else (
                             f"the one-GPU run is of other code (files {(code_of(r, '_1') or '?')[:10]}, "
                             f"this run {(code_of(r) or '?')[:10]}): not divided" if other_code else None)})
    note = ("'x best one GPU': the N GPUs' throughput over the fastest one-GPU run of the same model and data on the "
            "same GPU kind, at any batch and in any variant (what one GPU does at its best; the same-batch speed-up "
            "beside it says what the scaling itself costs). "
            "Scaling efficiency = throughput over all N GPUs / (N x the same variant's on one GPU at the same per-GPU "
            "batch), on real tokens/s where both runs counted tokens, else samples/s. 1.0 is perfect data "
            "parallelism; \"rank step vs one GPU\" is a rank's median step over the lone GPU's: what gradient "
            "communication, the wrapper's hooks, waiting for the slowest rank and (FSDP) gathering parameters add to "
            "a step, an upper bound on the communication compute does not hide. \"SM clock vs one GPU\" is the "
            "ranks' mean SM clock over the lone GPU's (NVML, over the windows): H100s run at their power limit, and "
            "cards of one host held 1,776-1,838 MHz on the same work (h100x4-2026-11-26-e, -f), a 2-3 % difference "
            "that moves a speed-up as much as what it measures. MFU: model FLOPs of real tokens over all the GPUs' "
            "peak in the precision that ran (FP8's for an FP8 base). Time to first step: from the job's start to its "
            "first training step (build, wrapping, the first compile). On a CPU the ranks share the same cores, so "
            "efficiency there says nothing about GPUs. " + NOISE_NOTE)
    if not rows:
        return [note, ("Scaling", pl.DataFrame({"result": ["no multi-GPU run"]}), "scaling")]
    return [note, ("Scaling", pl.DataFrame(rows, infer_schema_length=None), "scaling")]


def gpu_kinds(df: pl.DataFrame, published: dict, reference: str | None = None, **_) -> list:
    """The same run (model, scale, dataset, variant, batch size) on each GPU kind present, side by side:
    samples/hour, peak memory and status per GPU, and each GPU against the reference GPU (`reference`, else the
    GPU with the most runs) with its noise verdict. A run that fails on one GPU (out of memory) and trains on the
    other is a result of its own. Runs on a CPU are left out."""
    gpus = df.filter(pl.col("gpu") != "cpu")
    counts = gpus.group_by("gpu").len().sort(["len", "gpu"], descending=[True, False])["gpu"].to_list()
    note = ("The same run on each GPU kind whose records are present (runs from other machines merge in through "
            "config `merge_runs`): samples per hour over every measured step, peak reserved memory, and the ratio to "
            "the reference GPU. 'steps measured' shows each record's window: records of schema 1 (one window of 7-8 "
            "steps with a host synchronisation per step) weigh less than the harness's 3 windows of >= 30 steps. "
            + NOISE_NOTE)
    if len(counts) < 2:
        where = f"runs on one GPU kind ({counts[0]})" if counts else "no run on a GPU"
        return [note, ("GPU kinds", pl.DataFrame({"result": [f"{where}: nothing to set side by side (merge records "
                                                                  "of another GPU kind with `merge_runs`)"]}),
                       "gpu_kinds")]
    ref = reference if reference in counts else counts[0]
    others = [g for g in counts if g != ref]
    keys = ["model", "scale", "dataset", "variant", "batch_size"]
    rows, lead = [], []
    for group in gpus.with_columns(memory_gib=peak_memory()).partition_by(keys, maintain_order=True):
        by = {r["gpu"]: r for r in group.iter_rows(named=True)}
        if ref not in by or not any(g in by for g in others):
            continue
        first = next(iter(by.values()))
        row = {k: first[k] for k in keys}
        for g in [ref] + others:
            r = by.get(g)
            ok = r is not None and r["status"] == "ok"
            row[f"{g}: samples/h"] = r["throughput.samples_per_hour"] if ok else None
            row[f"{g}: peak GiB"] = r["memory_gib"] if r is not None else None
            row[f"{g}: status"] = r["status"] if r is not None else "not run"
            row[f"{g}: steps measured"] = r["timing.steps_measured"] if r is not None else None
        base = by[ref]
        for g in others:
            r = by.get(g)
            ratio = None
            if r is not None and r["status"] == "ok" and base["status"] == "ok" and base["throughput.samples_per_hour"]:
                ratio = _verdict(r["throughput.samples_per_hour"] / base["throughput.samples_per_hour"],
                                 r["timing.noise_cv"], base["timing.noise_cv"])
            elif r is not None and r["status"] == "ok":
                ratio = f"trains on {g} only ({ref}: {base['status']})"
                lead.append(f"{row['variant']} at batch {row['batch_size']} ({row['model']}, {row['dataset']}) trains "
                            f"on {g} ({r['memory_gib']:.1f} GiB peak) and ends `{base['status']}` on {ref}.")
            row[f"{g} vs {ref}"] = ratio
        rows.append(row)
    if not rows:
        return [note, ("GPU kinds", pl.DataFrame({"result": ["no run measured on two GPU kinds"]}), "gpu_kinds")]
    table = pl.DataFrame(rows, infer_schema_length=None).sort("model", "dataset", "variant", "batch_size")
    from ftbench.judge.figures import gpu_bars, svg_string

    bars = pl.DataFrame([{"run": f"{r['variant']} bs{r['batch_size']} · {r['dataset']} · {r['model']} ({r['scale']})",
                          "gpu": g, "samples/h": r[f"{g}: samples/h"], "status": r[f"{g}: status"]}
                         for r in table.iter_rows(named=True) for g in [ref] + others], infer_schema_length=None)
    return [f"GPU kinds present: {', '.join([ref] + others)} (reference {ref}). " + " ".join(lead), note,
            svg_string(gpu_bars(bars)), ("GPU kinds side by side", table, "gpu_kinds")]

