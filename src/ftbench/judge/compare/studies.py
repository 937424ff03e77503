"""The published studies' own tables, computed from our runs: Study B's samples per hour and its headline cells, Unsloth
against PEFT, Study C's loader workers, Study A's precisions, and the decision guide."""
from __future__ import annotations

import polars as pl

from ftbench.judge.analysis import full_scale, median_step_samples_per_hour, peak_memory
from ftbench.harness.kernels import GPU_BOUND_SHARE
from ftbench.judge.compare.common import NOISE_NOTE, _verdict, verdict


def samples_per_hour_vs_published(df: pl.DataFrame, published: dict, **_) -> list:
    ours = (df.filter(pl.col("status") == "ok")
            .select("model", "dataset", "gpu", "variant", "batch_size", "scale", "weights_source",
                    pl.col("throughput.samples_per_hour").round(0).alias("samples/hour"),
                    median_step_samples_per_hour().round(0).alias("samples/hour at the median step"),
                    pl.col("timing.noise_cv").alias("noise (CV)"),
                    pl.col("outliers.dominated").alias("outlier-dominated"))
            .with_columns(source=pl.lit("ftbench")))
    pub = pl.DataFrame(published.get("samples_per_hour", [])).rename({"samples_per_hour": "samples/hour"}) \
        .with_columns(source=pl.lit("published"), variant=pl.lit("not stated"), scale=pl.lit("full"),
                      weights_source=pl.lit("hub"), batch_size=pl.lit(None, dtype=pl.Int64),
                      **{"samples/hour": pl.col("samples/hour").cast(pl.Float64)})
    table = pl.concat([pub, ours], how="diagonal_relaxed").sort("model", "dataset", "source", "gpu", "variant",
                                                                  "batch_size")
    note = ("Samples fine-tuned per hour per model, dataset and GPU: the published Study B table beside our "
            "steady-state figures (every variant and batch size). Runs from other machines merge in through "
            "config `merge_runs`; a run's GPU is part of its key. Tiny- or proxy-scale rows measure the pipeline, "
            "not the published model. Samples/hour counts every measured step (the published figure is an epoch's "
            "samples over its time), so one-off costs that recur with new sequence lengths (cuDNN attention "
            "plans, recompiles; see the profiles) weigh in; the median-step column leaves them out. A short run "
            "weighs them more than an epoch would; \"outlier-dominated\" marks runs where steps slower than 3x "
            "the median take over a tenth of the measured time (the record names them and why). " + NOISE_NOTE)
    return [note, ("Samples per hour", table.select("model", "dataset", "source", "gpu", "variant", "batch_size",
                                                    "scale", "samples/hour", "samples/hour at the median step",
                                                    "noise (CV)", "outlier-dominated"),
                   "samples_per_hour")]


BUSY_GPU_BOUND_PCT = 100 * GPU_BOUND_SHARE  # mean NVML utilisation at or above this over the windows: GPU-bound


def _bound(busy_pct) -> str | None:
    if busy_pct is None:
        return None
    return "GPU-bound" if busy_pct >= BUSY_GPU_BOUND_PCT else "host-bound"


def _round(x, digits=1):
    return round(x, digits) if x is not None else None


def _profile_verdict(r: dict) -> str | None:
    """GPU-bound or host-bound: from the run's trace profile where it has one (same run, same GPU kind), else from
    NVML's busy share over the measured windows; the source named."""
    if r.get("profile.cpu_bound") is not None:
        return ("host-bound" if r["profile.cpu_bound"] else "GPU-bound") + " (trace profile)"
    bound = _bound(r.get("device_usage.gpu_util_mean_pct"))
    return bound and bound + " (NVML)"


def study_b_table(df: pl.DataFrame, published: dict, stand_ins: dict | None = None, **_) -> list:
    """Study B's headline table (H100 SXM5, Unsloth QLoRA): each published cell beside our full-scale records of
    it on every GPU, measured by the published variant or, where it could not run, by its named stand-in (the same
    model through PEFT, Unsloth's kernels left out); ratio with its noise verdict, and GPU-bound or host-bound from
    the GPU's busy share, beside what the study's profiles found. Tiny and proxy records never fill a cell."""
    stand_ins = stand_ins or {}
    cells = published.get("table", [])
    rows = []
    full = full_scale(df)
    for cell in cells:
        order = [cell["variant"], *stand_ins.get(cell["variant"], [])]
        found = full.filter((pl.col("model") == cell["model"]) & (pl.col("dataset") == cell["dataset"])
                            & (pl.col("batch_size") == cell["batch_size"]) & pl.col("variant").is_in(order)
                            & pl.col("status").is_in(["ok", "oom", "timeout"]))
        base = {"model": cell["model"], "dataset": cell["dataset"], "batch": cell["batch_size"],
                "published samples/h (H100 SXM5, Unsloth QLoRA)": cell["samples_per_hour"],
                "published profile": cell.get("bound")}
        if found.is_empty():
            why = full.filter((pl.col("model") == cell["model"]) & (pl.col("dataset") == cell["dataset"])
                              & (pl.col("batch_size") == cell["batch_size"]) & pl.col("variant").is_in(order))
            reasons = "; ".join(f"{r['variant']} on {r['gpu']}: {r['status']} ({(r['reason'] or '')[:140]})"
                                for r in why.iter_rows(named=True))
            rows.append({**base, "status": "not measured", "why": reasons or "not run yet at full scale on a GPU"})
            continue
        for gpu in sorted(found["gpu"].unique().to_list()):
            on = found.filter(pl.col("gpu") == gpu)
            ranked = sorted(on.iter_rows(named=True),
                            key=lambda r: (r["status"] != "ok", order.index(r["variant"])))
            r = ranked[0]
            ours = r["throughput.samples_per_hour"] if r["status"] == "ok" else None
            ratio = ours / cell["samples_per_hour"] if ours else None
            busy = r.get("device_usage.gpu_util_mean_pct")
            stood_in = r["variant"] != cell["variant"]
            unsloth = full.filter((pl.col("model") == cell["model"]) & (pl.col("dataset") == cell["dataset"])
                                  & (pl.col("batch_size") == cell["batch_size"]) & (pl.col("gpu") == gpu)
                                  & (pl.col("variant") == cell["variant"]))
            why_not = "; ".join((x["reason"] or x["status"])[:160] for x in unsloth.iter_rows(named=True)) \
                if stood_in else None
            rows.append({**base, "GPU": gpu, "measured by": r["variant"] + (" (PEFT, Unsloth's kernels left out)"
                                                                              if stood_in else ""),
                         "built": r.get("model.build"), "status": r["status"],
                         "samples/h": round(ours) if ours else None,
                         "x published": _verdict(ratio, r["timing.noise_cv"], None) if ratio else None,
                         "noise (CV)": r["timing.noise_cv"], "steps": r["timing.steps_measured"],
                         "peak GiB": r.get("memory.at_failure_gib") or r.get("memory.peak_reserved_gib"),
                         "GPU busy %": round(busy, 1) if busy is not None else None,
                         "profiled busy %": _round(r.get("profile.busy_pct")),
                         "ours": _profile_verdict(r) if r["status"] == "ok" else None,
                         "idle mostly in": r.get("profile.idle_cause"),
                         "why": (f"{r['variant']} ran out of memory on the {gpu} " + (
                             f"after {r['timing.steps_measured']} measured steps" if r["timing.steps_measured"]
                             else "before any measured step") if r["status"] == "oom" else None) or
                                (f"{cell['variant']}: {why_not}" if why_not else None)})
    table = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    measured = sum(1 for c in cells if any(r.get("status") == "ok" and r["model"] == c["model"]
                                           and r["dataset"] == c["dataset"] and r["batch"] == c["batch_size"]
                                           for r in rows))
    note = (f"Study B's headline table at full scale: {measured} of {len(cells)} published cells measured (status ok "
            "on some GPU). Each cell is the published Unsloth QLoRA run; where Unsloth could not run here (the record "
            "says why: a model built in the training process, ftbench.build.stages, cannot go through Unsloth's "
            "from_pretrained), the same 4-bit model through PEFT with Unsloth's kernels left out stands in, named in "
            "\"measured by\". x published = our samples/hour over the published figure, judged against our run's noise "
            "alone (the study published none). GPU busy % is NVML's mean utilisation over the measured windows; "
            f">= {BUSY_GPU_BOUND_PCT:g} % reads GPU-bound, below it host-bound. Where the cell's run was profiled on "
            "the same GPU kind (its profile page), \"ours\" is the trace's verdict instead (kernels cover < "
            f"{BUSY_GPU_BOUND_PCT:g} % of the profiled steps: host-bound), \"profiled busy %\" the share of those steps' time kernels ran (the "
            "profiler's own host overhead lowers it), and \"idle mostly in\" where that idle time goes: the host "
            "operator running through the longest gaps, or many short gaps between kernels (launch and Python "
            "overhead). An oom row gives the memory it reached; the cell's row on a larger GPU follows. "
            + NOISE_NOTE)
    return [note, ("Study B's published table, ours beside it", table, "study_b_table")]


def unsloth_vs_peft(df: pl.DataFrame, published: dict, pairs=(), **_) -> list:
    """Unsloth's speed and memory relative to plain PEFT: at equal batch size (where PEFT ran out of memory,
    that is the result), and at each one's largest batch size that ran, with the smallest that did not."""
    df = df.with_columns(memory_gib=peak_memory(), median_sph=median_step_samples_per_hour())
    keys = ["model", "dataset", "gpu"]
    equal, largest = [], []

    def limit(rows: pl.DataFrame, top: int) -> str:
        over = sorted(b for b in rows.filter(pl.col("status") == "oom")["batch_size"] if b > top)
        return f"oom at {over[0]}" if over else "not reached"

    for fast, base in pairs:
        a = df.filter((pl.col("variant") == fast) & (pl.col("status") == "ok"))
        b = df.filter((pl.col("variant") == base) & pl.col("status").is_in(["ok", "oom"]))
        for r in a.join(b, on=keys + ["batch_size"], suffix="_peft").iter_rows(named=True):
            both = r["status_peft"] == "ok"
            equal.append({"model": r["model"], "dataset": r["dataset"], "gpu": r["gpu"], "unsloth": fast, "peft": base,
                          "batch_size": r["batch_size"], "PEFT status": r["status_peft"],
                          "speedup (PEFT step / Unsloth step)":
                          _verdict(r["timing.step_time_s_peft"] / r["timing.step_time_s"], r["timing.noise_cv"],
                                   r["timing.noise_cv_peft"]) if both else None,
                          "noise CV (Unsloth, PEFT)": f"{_fmt(r['timing.noise_cv'])}, {_fmt(r['timing.noise_cv_peft'])}"
                          if both else None,
                          "memory ratio (Unsloth / PEFT)": r["memory_gib"] / r["memory_gib_peft"] if both else None,
                          "Unsloth memory GiB": r["memory_gib"],
                          "Unsloth first step s": r["timing.first_step_s"],
                          "PEFT first step s": r["timing.first_step_s_peft"] if both else None})
        ok_b = b.filter(pl.col("status") == "ok")
        top_a = a.sort("batch_size").group_by(keys, maintain_order=True).last()
        top_b = ok_b.sort("batch_size").group_by(keys, maintain_order=True).last()
        for r in top_a.join(top_b, on=keys, suffix="_peft").iter_rows(named=True):
            same = [pl.col(k) == r[k] for k in keys]
            largest.append({"model": r["model"], "dataset": r["dataset"], "gpu": r["gpu"], "unsloth": fast,
                            "peft": base, "Unsloth largest batch": r["batch_size"],
                            "Unsloth limit": limit(df.filter(pl.col("variant") == fast, *same), r["batch_size"]),
                            "PEFT largest batch": r["batch_size_peft"],
                            "PEFT limit": limit(b.filter(*same), r["batch_size_peft"]),
                            "samples/hour ratio (Unsloth / PEFT)": r["throughput.samples_per_hour"]
                            / r["throughput.samples_per_hour_peft"],
                            "median-step samples/hour ratio": r["median_sph"] / r["median_sph_peft"],
                            "Unsloth memory GiB": r["memory_gib"], "PEFT memory GiB": r["memory_gib_peft"]})
    claim = published.get("unsloth_claim", {})
    note = (f"Published claim (Study D, Unsloth on Alpaca): {claim.get('speedup', '?')}x the speed of Hugging Face, "
            f"{claim.get('memory_mb_unsloth', '?')} MB vs {claim.get('memory_mb_hf', '?')} MB of memory. Ours: step-time "
            "speed-up and memory ratio at equal batch size (a PEFT run out of memory says so), then samples/hour at "
            "each one's largest batch size that ran in this matrix, with the smallest that ran out of memory (\"not "
            "reached\": the matrix tried nothing larger, so the true limit is higher). Memory is the peak reserved "
            "on the GPU, the host's peak RSS on a CPU. " + NOISE_NOTE)
    order = ["model", "dataset", "gpu", "unsloth", "peft"]
    blocks = [note]
    blocks.append(("At equal batch size", pl.DataFrame(equal, infer_schema_length=None).sort(order + ["batch_size"])
                   if equal else pl.DataFrame({"result": ["no batch size where both ran (Unsloth needs a CUDA GPU)"]}),
                   "unsloth_equal"))
    blocks.append(("At each one's largest batch size", pl.DataFrame(largest, infer_schema_length=None).sort(order)
                   if largest else pl.DataFrame({"result": ["no pair ran ok"]}), "unsloth_largest"))
    return blocks


def _fmt(cv) -> str:
    return "–" if cv is None else f"{cv:.1%}"


def _variant_rows(df: pl.DataFrame, variants: dict) -> pl.DataFrame:
    """Our step time (ms), GPU utilisation and data-wait share per variant, with the variants' knobs."""
    rows = []
    for r in df.iter_rows(named=True):
        knobs = variants.get(r["variant"]) or {}
        step = r["timing.step_time_s"]
        rows.append({"variant": r["variant"], "gpu": r["gpu"], "scale": r["scale"], "status": r["status"],
                     "workers": knobs.get("dataloader_workers", 0), "ms/step (ours)": step * 1e3 if step else None,
                     "noise (CV)": r["timing.noise_cv"],
                     "GPU util % (ours)": r["device_usage.gpu_util_mean_pct"],
                     "data wait % (ours)": None if r["data.wait_share"] is None else 100 * r["data.wait_share"],
                     "reason": r["reason"]})
    return pl.DataFrame(rows, infer_schema_length=None)


def diffusion_vs_published(df: pl.DataFrame, published: dict, variants: dict | None = None, baseline="workers-0",
                           final="pinned", **_) -> list:
    """Study C: the before/after table and the worker-count curve, ours beside the published ones."""
    from ftbench.judge.figures import svg_string, worker_curve

    ours = _variant_rows(df, variants or {})
    steps = pl.DataFrame(published.get("steps", []))
    table = steps.rename({"ms_per_step": "ms/step (published)", "gpu_util_pct": "GPU util % (published)"}).join(
        ours, on="variant", how="left")
    ok = ours.filter(pl.col("status") == "ok")
    # each ok run's speed-up over the baseline measured on the same GPU at the same scale
    base = ok.filter(pl.col("variant") == baseline).select("gpu", "scale", pl.col("ms/step (ours)").alias("base"),
                                                           pl.col("noise (CV)").alias("base_noise"))
    speedup = f"speed-up over {baseline}"
    rated = ok.join(base, on=["gpu", "scale"]).with_columns((pl.col("base") / pl.col("ms/step (ours)")).alias(speedup))
    rated = rated.with_columns(verdict(pl.col(speedup), pl.col("noise (CV)"), pl.col("base_noise")).alias(
        f"{speedup} (beyond noise)"))
    speed = ""
    for b in base.iter_rows(named=True):
        same = rated.filter((pl.col("gpu") == b["gpu"]) & (pl.col("scale") == b["scale"]))
        where = f"On {b['gpu']} ({b['scale']} scale): "
        for f in same.filter(pl.col("variant") == final).iter_rows(named=True):
            speed += (f"{where}the study's final configuration ({final}) {f['ms/step (ours)']:.1f} ms vs {baseline} "
                      f"{b['base']:.1f} ms per step: {f[speedup + ' (beyond noise)']} (published 290 -> 98 ms, "
                      "2.96x). ")
        best = same.sort("ms/step (ours)").row(0, named=True)
        if best["variant"] != final:
            util = best["GPU util % (ours)"]
            speed += (f"{where}fastest variant {best['variant']} {best['ms/step (ours)']:.1f} ms, "
                      f"{best[speedup + ' (beyond noise)']} over {baseline}"
                      + (f", at {util:.0f}% GPU utilisation. " if util is not None else ". "))
    sweep = ours.filter(pl.col("variant").str.starts_with("workers-")).sort("gpu", "scale", "workers")
    beyond = ours.filter(~pl.col("variant").is_in(steps["variant"].to_list() if len(steps) else [])
                         & ~pl.col("variant").str.starts_with("workers-")).sort("gpu", "scale", "variant")
    beyond = beyond.join(rated.select("variant", "gpu", "scale", f"{speedup} (beyond noise)"),
                         on=["variant", "gpu", "scale"], how="left")
    pub_sweep = [{"workers": int(k), "ms/step": v, "source": "published"}
                 for k, v in published.get("workers_ms_per_step", {}).items() if isinstance(v, (int, float))]
    curve = pl.concat([pl.DataFrame(pub_sweep, schema={"workers": pl.Int64, "ms/step": pl.Float64, "source": pl.Utf8}),
                       sweep.filter(pl.col("status") == "ok").select(
                           pl.col("workers").cast(pl.Int64), pl.col("ms/step (ours)").alias("ms/step"),
                           pl.format("ftbench ({})", pl.col("gpu")).alias("source"))], how="vertical_relaxed")
    note = ("A step is one optimizer step: gradient accumulation 4 micro-batches of batch 1 (the published "
            "write-up does not say whether its ms/step counts micro-batches or optimizer steps). GPU utilisation "
            "is NVML's mean over the steady-state steps; data wait % is the part of the step spent waiting "
            "for the data loader. " + speed + NOISE_NOTE + " Published note: " + (published.get("workers_note", "")))
    return [note, ("Before and after", table, "before_after"),
            ("Beyond the study (knobs in config: cached latents, sync-free clipping, CUDA-graph compile)", beyond,
             "beyond"), ("Worker-count sweep", sweep, "workers"),
            svg_string(worker_curve(curve))]


def lmm_vs_published(df: pl.DataFrame, published: dict, baseline="bf16", **_) -> list:
    """Study A's table: each variant relative to the baseline of the same gradient checkpointing (`bf16-gc` for
    the `-gc` variants: checkpointing alone nearly doubles the step, 0.66 s against 0.36 s at batch 1 on an
    H100) at the same batch size and GPU: step time, memory, first step and eval loss as ratios, with compile
    time, recompiles, graph breaks and break-even steps; the published figures (and their ratios to the
    published baseline) beside the variant that measures them (`fp8-te-gc` measures the published `fp8-te`)."""
    ok = df.filter(pl.col("status") == "ok").with_columns(
        memory_gib=peak_memory(), ckpt=pl.col("variant.gradient_checkpointing").fill_null(False),
        published_variant=pl.col("variant").str.replace(r"-gc$", ""))
    same = ["model", "scale", "dataset", "gpu", "batch_size", "ckpt"]
    base = ok.filter(pl.col("published_variant") == baseline).select(
        *same, pl.col("variant").alias("baseline"), pl.col("timing.step_time_s").alias("b_step"),
        pl.col("memory_gib").alias("b_mem"), pl.col("timing.noise_cv").alias("b_noise"),
        pl.col("timing.first_step_s").alias("b_first"), pl.col("loss.eval").alias("b_loss"))
    j = ok.join(base, on=same, how="left")
    saved = pl.col("b_step") - pl.col("timing.step_time_s")
    is_base = pl.col("variant") == pl.col("baseline")
    ours = j.select(
        "variant", "published_variant", "gpu", "scale", "batch_size", "baseline",
        pl.when(is_base).then(pl.lit("baseline")).otherwise(
            verdict(pl.col("timing.step_time_s") / pl.col("b_step"), pl.col("timing.noise_cv"), pl.col("b_noise")))
        .alias("step time vs baseline"), pl.col("timing.noise_cv").alias("noise (CV)"),
        (pl.col("memory_gib") / pl.col("b_mem")).alias("memory vs baseline"),
        pl.col("timing.first_step_s").alias("first step s"),
        (pl.col("timing.first_step_s") / pl.col("b_first")).alias("first step vs baseline"),
        pl.col("compile.compile_s").alias("compile s"),
        pl.col("timing.first_step_overhead_s").alias("first-step overhead s"),
        pl.col("compile.recompiles").alias("recompiles"), pl.col("compile.graph_breaks").alias("graph breaks"),
        pl.when(saved > 0).then(((pl.col("timing.first_step_s") - pl.col("b_first")) / saved).clip(lower_bound=0))
        .otherwise(None).alias("break-even steps"),
        pl.col("loss.eval").alias("eval loss"), (pl.col("loss.eval") / pl.col("b_loss")).alias("eval loss vs baseline"),
        pl.col("extra.image_tokens_per_sample").alias("image tokens/sample"),
        pl.col("throughput.tokens_per_sample").alias("tokens/sample"), pl.col("ckpt").alias("grad ckpt"))
    pb = published.get("baseline", {})
    pub = pl.DataFrame(published.get("variants", []))
    if len(pub):
        pub = pub.rename({"variant": "published_variant", "step_time": "published step time",
                          "memory": "published memory", "first_step_s": "published first step s",
                          "eval_loss": "published eval loss"})
        pub = pub.with_columns((pl.col(column) / pb[key] if pb.get(key) else pl.lit(None)).alias(ratio)
                               for key, column, ratio in (
                                   ("first_step_s", "published first step s", "published first step vs baseline"),
                                   ("eval_loss", "published eval loss", "published eval loss vs baseline")))
        table = ours.join(pub, on="published_variant", how="left")
    else:
        table = ours
    # the study's own setting (gradient checkpointing) leads; within it the baseline, then each variant by GPU,
    # scale and batch size
    table = table.drop("published_variant").sort(
        "grad ckpt", pl.col("variant") != pl.col("baseline"), "variant", "gpu", "scale", "batch_size",
        descending=[True, False, False, False, False, False], nulls_last=True)
    failed = df.filter(pl.col("status") != "ok").select("variant", "gpu", "batch_size", "status", "reason")
    be = published.get("break_even_steps_bs1", {})
    note = (f"Relative to {baseline} of the same gradient checkpointing ({baseline}-gc for the -gc variants, which "
            "measure the published variant of the same name), model, scale, batch size and GPU (ratios below 1 are "
            "faster / smaller). Break-even: steps after which the variant's extra first-step time is repaid by its "
            f"faster steps (published at batch 1: {', '.join(f'{k} {v}' for k, v in be.items())}). Published "
            f"baseline: first step {pb.get('first_step_s')} s, eval loss {pb.get('eval_loss')} (after 10 steps); "
            "the published ratios are the variant's published figure over these. "
            "Recompiles count graphs compiled after the first step (new shapes or guards); graph breaks split "
            "even the first step into several graphs. Compile s is TorchDynamo/Inductor's own accounting (forward and "
            "backward graphs); first-step overhead is the first step minus the median step, whatever its cause. "
            "A fixed shape bypasses AnyRes (images at 336x336, as published): compare tokens/sample before reading "
            "its step-time ratio. Eval losses of random weights mean nothing. " + NOISE_NOTE)
    return [note, ("Relative to the baseline, beside the published table", table, "lmm_relative"),
            ("Runs that did not complete", failed, "lmm_failed")]


def decision_guide(df: pl.DataFrame, published: dict, memory_gib=(16, 24, 48, 80, 140),
                   run_samples=(1_000, 10_000, 100_000), **_) -> list:
    """Which variant (and batch size) to use, per GPU, model and dataset, for a memory budget and a run length:
    the one that finishes the run soonest, counting its first step (compilation) once and its median step for
    the rest, among the runs whose peak memory fits the budget. The runner-up and the margin say how close
    the choice is; a margin inside the two runs' noise reads as a tie. One GPU: multi-GPU runs are the
    scaling table's."""
    ok = df.filter(pl.col("status") == "ok", pl.col("timing.step_time_s").is_not_null(),
                   pl.col("parallel.world_size").fill_null(1) == 1).with_columns(memory_gib=peak_memory())
    keys = ["gpu", "model", "scale", "dataset"]
    rows = []
    for group in ok.partition_by(keys, maintain_order=True):
        g = group.row(0, named=True)
        for budget in memory_gib:
            fits = group.filter(pl.col("memory_gib") <= budget)
            for n in run_samples:
                row = {**{k: g[k] for k in keys}, "memory budget GiB": budget, "run length (samples)": n}
                if fits.height == 0:
                    rows.append({**row, "use": "nothing measured fits"})
                    continue
                per_step = pl.col("batch_size") * pl.col("extra.gradient_accumulation_steps").fill_null(1)
                steps = (n / per_step).ceil()
                ranked = fits.with_columns(hours=(pl.col("timing.first_step_s").fill_null(pl.col("timing.step_time_s"))
                                                  + (steps - 1) * pl.col("timing.step_time_s")) / 3600).sort("hours")
                best = ranked.row(0, named=True)
                row.update({"use": f"{best['variant']} @ batch {best['batch_size']}", "hours": best["hours"],
                            "peak GiB": best["memory_gib"], "first step s": best["timing.first_step_s"],
                            "s/step": best["timing.step_time_s"]})
                if ranked.height > 1:
                    second = ranked.row(1, named=True)
                    margin = second["hours"] / best["hours"]
                    row["runner-up"] = f"{second['variant']} @ batch {second['batch_size']}"
                    row["runner-up takes"] = _verdict(margin, best["timing.noise_cv"], second["timing.noise_cv"])
                rows.append(row)
    note = ("A decision guide from the measured records of each GPU present: for a memory budget (peak reserved "
            "device memory; host RSS on a CPU) and a run length in samples, the variant and batch size that finish "
            "soonest. Time = first step (compilation, Unsloth's JIT, cuDNN plans) + (steps - 1) x median step, with "
            "steps = samples / (batch size x gradient accumulation): a compiled variant wins only once the run is long enough to repay its "
            "first step (its break-even). Model load and evaluation are left out; losses are not compared (random "
            "weights). " + NOISE_NOTE)
    table = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({"result": ["no run completed"]})
    return [note, ("What to use, by memory budget and run length", table, "decision_guide")]

