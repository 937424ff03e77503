"""Comparisons the studies drew, computed from our runs and put beside the published figures."""

from __future__ import annotations

import math
import statistics

import polars as pl

from .analysis import code_of, full_scale, html_page, median_step_samples_per_hour, peak_memory
from .flops import peak_tflops
from .kernels import GPU_BOUND_SHARE
from .verdicts import NOISE_SIGMAS
NOISE_NOTE = ("Noise: each run's relative uncertainty is its CV across repeated windows (or, with one window, the "
              "within-run CV of its step times over the square root of the steps); a ratio whose distance from 1 is "
              f"within {NOISE_SIGMAS}x the two runs' combined uncertainty (root sum of squares) reads \"no measurable "
              "difference\".")


def _verdict(ratio, noise_a, noise_b) -> str | None:
    """A ratio as text: "no measurable difference" inside the combined noise, else the ratio (2 decimals);
    "(noise not recorded)" when neither run recorded its noise."""
    if ratio is None:
        return None
    text = f"{round(ratio, 2)}x"
    if noise_a is None and noise_b is None:
        return f"{text} (noise not recorded)"
    combined = ((noise_a or 0) ** 2 + (noise_b or 0) ** 2) ** 0.5
    return "no measurable difference" if abs(ratio - 1) <= NOISE_SIGMAS * combined else text


def verdict(ratio: pl.Expr, noise_a: pl.Expr, noise_b: pl.Expr) -> pl.Expr:
    """_verdict over columns (comparison tables are a few dozen rows)."""
    return pl.struct(r=ratio, a=noise_a, b=noise_b).map_elements(
        lambda x: _verdict(x["r"], x["a"], x["b"]), return_dtype=pl.String)


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
            "says why: a model built in the training process, ftbench.build, cannot go through Unsloth's "
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
    from .figures import svg_string, worker_curve

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


def tokens_noise(r: dict):
    """A run's relative uncertainty in tokens/s: across its windows' real tokens/s where it has them (a window's
    sample count can vary where its tokens do not), else its noise_cv."""
    return r.get("timing.noise_cv_tokens") if r.get("timing.noise_cv_tokens") is not None else r["timing.noise_cv"]


def same_rows_loss(run: dict, ref: dict | None) -> dict | None:
    """`run`'s training loss against `ref`'s step by step, where both trained on the same rows (the same real
    tokens at every step they share; rows of a token budget come in one order for every rung at one batch size):
    the mean difference over the shared steps and the reference's step-to-step scatter (the standard deviation of
    its successive differences over sqrt 2: how much one step's loss moves from row to row, the trend removed).
    None when either lacks its step trace or the rows differ."""
    if ref is None or run["variant"] == ref["variant"] or not run.get("loss.trace") or not ref.get("loss.trace"):
        return None
    a, b = ([float(x) for x in r["loss.trace"].split(",")] for r in (run, ref))
    ta, tb = ((r.get("loss.trace_tokens") or "").split(",") for r in (run, ref))
    n = min(len(a), len(b))
    if n < 3 or ta[:n] != tb[:n]:
        return None
    diffs = [x - y for x, y in zip(a[:n], b[:n])]
    steps = [y - x for x, y in zip(b[:n], b[1:n])]
    scatter = statistics.stdev(steps) / 2 ** 0.5
    bad = [i + 1 for i, x in enumerate(a[:n]) if not math.isfinite(x)]
    if bad:  # a loss that is NaN or infinite from some step on: never within any noise
        return {"steps": n, "non_finite": len(bad), "first_non_finite": bad[0], "mean_difference": math.nan,
                "max_difference": math.nan, "scatter": scatter, "within_noise": False}
    mean = statistics.fmean(diffs)
    return {"steps": n, "mean_difference": mean, "max_difference": max(diffs, key=abs), "scatter": scatter,
            "within_noise": abs(mean) <= scatter}


def frontier_place(r: dict, base: dict | None, cmp: dict | None) -> str:
    """Whether a rung may stand on the frontier (and lead it): never one whose training loss on the same rows left
    the noise of rung 0's step or is not finite; one that computes what rung 0 computes (the same precision, the same
    attention kernels) without that check; one that changes the arithmetic (FP8, NF4, another flash attention
    implementation, the LM head's loss in two GEMMs) only with its loss within the noise on the same rows; refused
    otherwise, saying why."""
    mine, theirs = r.get("variant.precision") or "bf16", (base or {}).get("variant.precision") or "bf16"
    what = None  # what changes the arithmetic
    if mine != theirs:
        what = mine
    elif r.get("variant.flash_impl"):
        what = f"flash attention through {r['variant.flash_impl']}"
    elif r.get("variant.lm_head"):
        what = f"the LM head's loss through ftbench.head ({r['variant.lm_head']})"
    if cmp is not None and cmp.get("non_finite"):
        return (f"no: its loss on the same rows is not finite from step {cmp['first_non_finite']} "
                f"({cmp['non_finite']} of {cmp['steps']} steps)")
    if cmp is not None and not cmp["within_noise"]:
        return f"no: its loss on the same rows differs ({cmp['mean_difference']:+.3f})"
    if what is None:
        return "yes"
    if cmp is None:
        return f"no: {what} changes the arithmetic and has no loss check on the same rows"
    return f"yes: {what}, loss within noise on the same rows"


def same_rows_text(cmp: dict) -> str:
    """`same_rows_loss` as the frontier table's cell."""
    if cmp.get("non_finite"):
        return (f"not finite from step {cmp['first_non_finite']} ({cmp['non_finite']} of {cmp['steps']} steps): "
                "differs")
    return (f"{cmp['mean_difference']:+.3f} over {cmp['steps']} steps: "
            + ("within noise" if cmp["within_noise"] else "differs")
            + f" (scatter {cmp['scatter']:.3f}; largest {cmp['max_difference']:+.3f})")


def rows_key(r: dict) -> tuple:
    """What two runs share when they trained the same rows: everything but the variant."""
    return r["model"], r["scale"], r["dataset"], r["gpu"], r["batch_size"]


def same_rows_check(r: dict, refs: dict) -> dict | None:
    """`same_rows_loss` of `r` against the reference run of its rows (`refs`: by `rows_key`)."""
    return same_rows_loss(r, refs.get(rows_key(r)))


def machine_key(r: dict) -> tuple:
    return r["model"], r["scale"], r["dataset"], r["gpu"], r.get("machine")


def standing(runs, base: dict | None, refs: dict) -> list[dict]:
    """The ok runs among `runs` that may stand on the frontier (`frontier_place`: their loss checked on the same rows
    where they change the arithmetic)."""
    return [r for r in runs if r["status"] == "ok" and r["throughput.tokens_per_s"]
            and frontier_place(r, base, same_rows_check(r, refs)).startswith("yes")]


def fastest_by(runs, key_of=machine_key) -> dict:
    """The fastest run (real tokens/s) of each `key_of` (by default each machine, with its model, scale, data and
    GPU): a faster run of the same variant on another machine does not hide this machine's."""
    tops = {}
    for r in runs:
        key = key_of(r)
        if key not in tops or r["throughput.tokens_per_s"] > tops[key]["throughput.tokens_per_s"]:
            tops[key] = r
    return tops


def peer_of(r: dict) -> str | None:
    """The other system a run is (Unsloth, Liger Kernel's patch, NeMo AutoModel), from its record's `peer` or, for
    records older than it (Unsloth's and Liger's), its knobs; None for one of the project's own rungs."""
    if r.get("peer.system"):
        return r["peer.system"]
    return "Unsloth" if r.get("variant.framework") == "unsloth" else "Liger Kernel" if r.get("variant.liger") else None


UNSTATED = "not compared: the peer's settings are not in its record (a peer is compared at its best or not at all)"


def against_top(rows: list[dict], runs: list[dict], tops: dict) -> None:
    """Each row's real tokens/s against the fastest run standing on the frontier measured on the same machine
    (`fastest_by` of the `standing` runs): a peer's ratio to the top rung of its own lease, never across machines, with whether the two
    runs' noise carries it (column "x top rung, same machine")."""
    for row, r in zip(rows, runs):
        top = tops.get(machine_key(r))
        if peer_of(r) and not r.get("peer.settings") and row["tokens/s (real)"]:
            row["x top rung, same machine"] = UNSTATED
            continue
        if row["tokens/s (real)"] and (slowed := held_back(r)):  # a throttled card's speed, not the code's
            row["x top rung, same machine"] = f"not compared: {slowed}"
            continue
        if top is None or not row["tokens/s (real)"]:
            row["x top rung, same machine"] = None
            continue
        if (top["variant"], top["batch_size"], top["throughput.tokens_per_s"]) == (
                r["variant"], r["batch_size"], r["throughput.tokens_per_s"]):
            row["x top rung, same machine"] = "top"
            continue
        ratio = row["tokens/s (real)"] / top["throughput.tokens_per_s"]
        carried = _verdict(ratio, tokens_noise(r), tokens_noise(top)) != "no measurable difference"
        row["x top rung, same machine"] = (f"{ratio:.2f}x{'' if carried else ', within noise'} ({top['variant']}, "
                                           f"{top['throughput.tokens_per_s']:,.0f})")


def mfu_against(r: dict, precision: str) -> float | None:
    """A run's model FLOPs per second as a percentage of its GPU's dense peak in `precision` (None where the GPU's
    peak is unknown: a CPU, or a card without that precision)."""
    peak, done = peak_tflops(r.get("gpu"), precision), r.get("flops.model_tflops")
    return 100 * done / peak if peak and done else None


def ladder(df: pl.DataFrame, published: dict, rungs=(), beside=(), by_batch=True, eval_loss=False, title="Ladder",
           same_rows: str | None = None, replaced: pl.DataFrame | None = None, own_tops: dict | None = None,
           **_) -> list:
    """The technique ladder: each rung a variant that adds one technique to the rung before, measured at the
    same model, dataset, GPU and batch size; real (unpadded) tokens/s, MFU, peak memory, the loss over the first
    steps (the same samples for every rung: a faster rung that trains a different model shows here), x previous
    and x baseline with their noise verdicts. Variants `beside` the ladder (Unsloth) are rows of their own. Ends
    with the fastest configuration per GPU among everything in the table, at any batch size, and its memory.
    `by_batch` false: rungs at different batch sizes side by side (each rung at its own batch: `frontier`);
    `eval_loss`: the loss compared is the evaluation set's (rungs that reorder the training samples); `replaced`:
    runs a later lease's measurement replaced in `df`, still each machine's own (its top rung, with `same_rows`);
    `own_tops` (with `same_rows`), filled: per machine and GEMM precision, the project's own fastest run standing on
    the frontier, replaced runs included (what a peer is read against: `peer_table`)."""
    names = list(rungs) + [b for b in beside if b not in rungs]
    refs = {} if not same_rows else {  # the same_rows variant's runs, by everything but the variant
        rows_key(r): r
        for r in df.filter((pl.col("variant") == same_rows) & (pl.col("status") == "ok")).iter_rows(named=True)}
    df = df.filter(pl.col("variant").is_in(names)).with_columns(memory_gib=peak_memory())
    keys = ["model", "scale", "dataset", "gpu"] + (["batch_size"] if by_batch else [])
    earlier = {}  # the replaced runs of the ladder's variants, by the group they belong to
    if same_rows and replaced is not None and replaced.height:
        for r in replaced.filter(pl.col("variant").is_in(names)).iter_rows(named=True):
            earlier.setdefault(tuple(r[k] for k in keys), []).append(r)
    rows, runs, tops = [], [], {}
    for group in df.partition_by(keys, maintain_order=True):
        by = {r["variant"]: r for r in group.iter_rows(named=True)}
        base, prev = by.get(rungs[0]) if rungs else None, None
        every = {(r["variant"], r["batch_size"]): r for r in group.iter_rows(named=True) if r["status"] == "ok"}
        if not by_batch:  # a rung measured at several batches: its fastest that ran
            by = {}
            for r in sorted(group.iter_rows(named=True),
                            key=lambda r: (r["status"] == "ok", r["throughput.tokens_per_s"] or 0)):
                by[r["variant"]] = r
            base = by.get(rungs[0]) if rungs else None
        if same_rows:  # every machine's fastest run that may stand on the frontier, from all the group's runs
            mine = earlier.get(tuple(group.row(0, named=True)[k] for k in keys), [])  # (and those replaced)
            stand = standing([*group.iter_rows(named=True), *mine], base, refs)
            tops.update(fastest_by(stand))
            if own_tops is not None:
                own_tops.update(fastest_by([r for r in stand if not peer_of(r)],
                                           lambda r: (*machine_key(r), gemms_in(r))))
        for i, name in enumerate(names):
            r = by.get(name)
            if r is None:
                continue
            ok = r["status"] == "ok"
            tps = r["throughput.tokens_per_s"] if ok else None

            def times(other, same_batch=False):
                """r against `other`; with same_batch, against other's variant at r's batch where it ran (else
                against `other`, its batch named): each rung's own gain, not a change of batch."""
                same_unit = other is not None and other.get("variant.token_budget") == r.get("variant.token_budget")
                if same_batch and same_unit:  # (a batch of rows is not a batch of samples)
                    other = every.get((other["variant"], r["batch_size"]), other)
                if not ok or other is None or other["status"] != "ok" or not other["throughput.tokens_per_s"]:
                    return None
                text = _verdict(tps / other["throughput.tokens_per_s"], tokens_noise(r), tokens_noise(other))
                if not same_batch or other["batch_size"] == r["batch_size"]:
                    return text
                return f"{text} (vs batch {other['batch_size']})"

            col = "loss.eval" if eval_loss else "loss.mean_first_steps"
            loss, base_loss = r.get(col), (base or {}).get(col)
            same_steps = base is not None and (eval_loss or r.get("loss.first_steps") == base.get("loss.first_steps"))
            rows.append({"model": r["model"], "scale": r["scale"], "dataset": r["dataset"], "gpu": r["gpu"],
                         "batch": r["batch_size"], "rung": str(i) if name in rungs else "beside", "variant": name,
                         "status": r["status"],
                         "tokens/s (real)": tps, "MFU % (bf16 peak)": mfu_against(r, "bf16") if ok else None,
                         "MFU % (FP8 peak)": mfu_against(r, "fp8") if ok and r.get("precision.gemm") == "fp8"
                         else None,
                         "peak memory GiB": r["memory_gib"] if ok else None,
                         ("loss, evaluation set" if eval_loss else "loss, first steps (mean)"): loss if ok else None,
                         "loss vs baseline": (loss - base_loss) if ok and same_steps and loss is not None
                         and base_loss is not None else None,
                         "x previous": times(prev, same_batch=True) if name in rungs else None,
                         "x baseline": times(base) if r is not base else None,
                         "reason": r["reason"] if not ok else None})
            runs.append(r)
            if same_rows:
                cmp = same_rows_check(r, refs)
                rows[-1]["loss vs rung 0's step, same rows"] = same_rows_text(cmp) if ok and cmp else None
                rows[-1]["on the frontier"] = frontier_place(r, base, cmp) if ok else None
            if name in rungs and ok:
                prev = r
    if same_rows:
        against_top(rows, runs, tops)
    same = ("same model, data and batch size" if by_batch else
            "same model and data; each rung at its own batch, its fastest measured; 'x previous' against the rung "
            "before at the same batch where that rung ran it with the same batch unit (samples, or rows of the same "
            "token budget), else at its fastest, its batch named")
    loss_is = ("the evaluation set's, the same sequences for every rung (packed rows reorder the training samples)"
               if eval_loss else "the mean over the first warm-up + window steps, which see the same samples in every "
               "rung")
    note = (f"Each rung adds one technique to the rung above it ({same}). Tokens/s counts real tokens (padding "
            "excluded); MFU counts their model FLOPs against the GPU's dense bf16 peak, and for an FP8 rung against "
            "its dense FP8 peak too (twice the bf16 peak on an H100 or H200). "
            f"The loss is {loss_is}; 'loss vs baseline' is its difference from rung 0 (random weights: equal losses "
            "mean the same computation, not a good model). " + NOISE_NOTE)
    if same_rows:
        note += (f" 'Loss vs rung 0's step, same rows': the rung's training loss step by step against {same_rows} at "
                 f"the same batch ({same_rows} is rung 0's step on the rows of a token budget, so both train on the "
                 "same tokens in the same order), mean difference over the steps both ran; within noise when it is "
                 "no larger than the step-to-step scatter of that run's loss (the standard deviation of its "
                 "successive differences over sqrt 2). Runs of the same arithmetic drift apart by a few hundredths "
                 "over ~100 steps (non-deterministic GPU kernels). 'x top rung, same machine': each row against the "
                 "fastest rung on the frontier measured on the same machine (its lease), named; peers (Unsloth, "
                 "Liger) are read there. A merged report shows each run's latest measurement; a lease's top rung "
                 "that a later lease measured again still counts as its own machine's top (named, not shown).")
    kind = title.lower()
    if not rows:
        return [note, (title, pl.DataFrame({"result": ["no rung ran"]}), kind)]
    # full-scale GPU rows first, smaller scales and CPU rows after them (stable: rung order kept within each)
    table = pl.DataFrame(rows, infer_schema_length=None).with_columns(_order=scale_order()).sort(
        "_order", maintain_order=True).drop("_order")
    best = {True: [], False: []}  # per GPU, model and scale (a proxy model's tokens/s says nothing of the full one's)
    measured = table.filter(pl.col("tokens/s (real)").is_not_null())
    if "on the frontier" in table.columns:  # a rung that changes the arithmetic leads only with its loss check
        measured = measured.filter(pl.col("on the frontier").str.starts_with("yes"))
    if tops:  # with same_rows: each machine's fastest standing run, replaced ones too (a later lease's measurement
        # of the top rung without rung 0 beside it cannot check its loss, yet the same variant stood on another)
        shown = {(r["gpu"], r["model"], r["scale"], r["dataset"], r["variant"]): r for r in table.iter_rows(named=True)}
        fastest = fastest_by(tops.values(), lambda r: (r["gpu"], r["model"], r["scale"], r["dataset"]))
        leads = [standing_lead(r, shown.get((r["gpu"], r["model"], r["scale"], r["dataset"], r["variant"])) or {})
                 for r in sorted(fastest.values(), key=lambda r: (r["gpu"] == "cpu", r["scale"] != "full"))]
    else:
        leads = [group.sort("tokens/s (real)", descending=True).row(0, named=True)
                 for group in measured.partition_by(["gpu", "model", "scale", "dataset"], maintain_order=True)]
    for top in leads:
        best[top["scale"] == "full" and top["gpu"] != "cpu"].append(
            f"On {top['gpu']}, {top['model']} ({top['scale']} scale), {top['dataset']}: <b>{top['variant']}</b> at "
            f"batch {top['batch']}, {top['tokens/s (real)']:,.0f} real tokens/s, {top['peak memory GiB']:.1f} GiB peak."
            + top.get("then", ""))
    lead = "Fastest configuration measured at full scale on a GPU: " + (" ".join(best[True]) or "none ran.")
    if best[False]:
        lead += (" <br>Smaller scales and CPUs, apart (their speed says nothing of the published model's): "
                 + " ".join(best[False]))
    return [lead, note, (title, table, kind)]


def peak_gib(r: dict) -> float | None:
    """A run row's peak memory, as `analysis.peak_memory` reads it: reserved on a GPU, the host's RSS on a CPU."""
    return r.get("memory.peak_reserved_gib") or r.get("memory.host_peak_rss_gib")


def standing_lead(r: dict, latest: dict) -> dict:
    """A fastest standing run `r` as the lead line's row, and where the same variant's latest run (`latest`, the row
    the table shows) does not stand, why, said beside it."""
    refused = (latest.get("on the frontier") or "yes").startswith("no") and latest.get("tokens/s (real)")
    return {"gpu": r["gpu"], "model": r["model"], "scale": r["scale"], "dataset": r["dataset"], "variant": r["variant"],
            "batch": r["batch_size"], "tokens/s (real)": r["throughput.tokens_per_s"],
            "peak memory GiB": peak_gib(r) or 0.0,
            "then": (f" Its latest run ({latest['tokens/s (real)']:,.0f} real tokens/s) does not stand on the "
                     f"frontier: {latest['on the frontier'].removeprefix('no: ')}." if refused else "")}


def scale_order() -> pl.Expr:
    """0 for a full-scale GPU row, 1 for a smaller scale on a GPU, 2 for a CPU row: what a page shows first."""
    return (pl.when((pl.col("scale") == "full") & (pl.col("gpu") != "cpu")).then(0)
            .when(pl.col("gpu") != "cpu").then(1).otherwise(2))


def gemms_in(r: dict) -> str:
    """The precision a run's GEMMs ran in, as a peer is compared: fp8, else bf16 (QLoRA dequantizes to bf16)."""
    return "fp8" if r.get("precision.gemm") == "fp8" else "bf16"


HELD_BACK = {"clock": 0.75, "power": 0.85, "busy": 85.0}  # fractions of the card's maximum SM clock and power limit


def held_back(r: dict) -> str | None:
    """Why a run's card ran held back, or None: through its windows at least 85 % busy, yet under 75 % of the card's
    maximum SM clock while drawing under 85 % of its power limit: slowed by something other than the power limit (a
    throttled card), so its speed is the card's, not the code's. A card at its power limit clocks down too (the FP8
    top rung: 83 % of its clock at 99 % of its power) and is not held back."""
    clock, top = r.get("device_usage.sm_clock_mean_mhz"), r.get("gpu_sm_clock_max_mhz")
    power, limit, busy = r.get("device_usage.power_mean_w"), r.get("gpu_power_limit_w"), r.get(
        "device_usage.gpu_util_mean_pct")
    if not (clock and top and power and limit and busy) or busy < HELD_BACK["busy"]:
        return None
    if clock < HELD_BACK["clock"] * top and power < HELD_BACK["power"] * limit:
        return (f"its card ran at {clock:,.0f} MHz ({100 * clock / top:.0f} % of its {top:,.0f}) drawing {power:.0f} W "
                f"({100 * power / limit:.0f} % of its {limit:.0f}-W limit) while {busy:.0f} % busy: held back by "
                "something other than its power limit")
    return None


def peer_run(runs: list[dict], own: dict) -> tuple[dict, list[str]]:
    """Of one peer's runs (a variant on one GPU kind, model and data; a later lease's and those it replaced), the
    one to read: the latest that names its settings, ran on a card not held back (`held_back`) and has a run of ours
    on its machine to be read against; else the latest. With why each later run was passed over."""
    runs = sorted(runs, key=lambda r: r.get("timestamp") or "", reverse=True)
    passed = []
    for r in runs:
        why = (None if r.get("peer.settings") else "its settings are not in its record") or held_back(r) or (
            None if ours_on(own, r) else "no rung of ours ran on its machine")
        if why is None:
            return r, passed
        passed.append(f"{run_label(r)}: {why}")
    r = runs[0]  # none to prefer: the latest, read all the same (a held-back card's lead said so)
    slowed = held_back(r)
    return r, [f"{run_label(r)}: {slowed} (no other run of it to read: read all the same)"] if slowed else []


def ours_on(own: dict, r: dict) -> list[dict]:
    """The project's own top runs (`own`: by machine key and GEMM precision) on run `r`'s machine."""
    return [x for (*m, _), x in own.items() if tuple(m) == machine_key(r)]


def run_label(r: dict) -> str:
    return f"{r['variant']} ({r['gpu']}, {r.get('machine')}, {str(r.get('timestamp') or '')[:10]})"


def peer_reads(table: pl.DataFrame, runs: pl.DataFrame, own: dict,
               replaced: pl.DataFrame | None = None) -> tuple[list, list, list]:
    """Each peer (Unsloth, Liger Kernel) beside the frontier, compared like with like: its runs whose records name the
    settings they ran with, against the project's fastest run standing on the frontier on the same machine in the
    same precision (bf16 against bf16, FP8 against FP8; a peer in NF4 against the bf16 rung: QLoRA's GEMMs are bf16)
    and against the fastest in any; a peer's run without its settings is refused, never divided.
    `table`: the frontier's rows; `runs`: the runs they came from; `own`: {(machine key, GEMM precision): the
    project's fastest run there standing on the frontier} (`ladder`'s `own_tops`: a rung or beside the ladder, the
    replaced runs of a machine included, never a peer; `replaced`: the runs a later lease's replaced, among which a
    peer's run is chosen too, `peer_run`). Returns (the peer table's rows, the refused and the passed over, and for
    each row (the peer's run, its same-precision top, its any-precision top))."""
    out, refused, read = [], [], []
    if table.is_empty() or "variant" not in table.columns or not runs.height:
        return out, refused, read

    def key(x, tokens):
        return x["variant"], x["gpu"], x["model"], x["dataset"], tokens

    rows_by = {key(r, r["throughput.tokens_per_s"] if r["status"] == "ok" else None): r
               for r in runs.iter_rows(named=True)}
    pool = runs if replaced is None or not replaced.height else pl.concat([runs, replaced], how="diagonal_relaxed")
    every = {}  # each peer's ok runs: the latest and the ones it replaced
    for r in pool.iter_rows(named=True):
        if r["status"] == "ok" and r["throughput.tokens_per_s"] and peer_of(r):
            every.setdefault(key(r, None), []).append(r)
    for t in table.iter_rows(named=True):
        r = rows_by.get(key(t, t["tokens/s (real)"]))
        system = peer_of(r) if r else None
        if not system or t["status"] != "ok" or not t["tokens/s (real)"]:
            continue
        r, passed = peer_run(every.get(key(t, None)) or [r], own)
        refused += passed
        if not r.get("peer.settings"):
            refused.append(f"{t['variant']} ({system}, {t['gpu']}): {UNSTATED.removeprefix('not compared: ')}")
            continue
        gemm = gemms_in(r)
        same = own.get((*machine_key(r), gemm))
        anyp = max(ours_on(own, r), key=lambda x: x["throughput.tokens_per_s"], default=None)
        read.append((r, same, anyp))
        out.append({"peer": system, "version": r.get("peer.version"), "variant": t["variant"], "gpu": t["gpu"],
                    "GEMMs in": gemm, "tokens/s (real)": r["throughput.tokens_per_s"],
                    "peak memory GiB": peak_gib(r),
                    "settings": r["peer.settings"],
                    "top rung's lead, same precision, same machine": lead_over(same, r),
                    "top rung's lead, any precision, same machine": lead_over(anyp, r)})
    return out, refused, read


def lead_over(top: dict | None, peer: dict, with_cv: bool = False) -> str | None:
    """Our run `top` over a peer's run, with the noise verdict of the two: "1.64x (variant, 20,392)", and with
    `with_cv` each run's CV across its windows beside it; None without a run of ours."""
    if top is None:
        return None
    tps = top["throughput.tokens_per_s"]
    cv = f", {_cv_text(top)}" if with_cv else ""
    return (f"{_verdict(tps / peer['throughput.tokens_per_s'], tokens_noise(top), tokens_noise(peer))} "
            f"({top['variant']}, {tps:,.0f}{cv})")


def _cv_text(r: dict) -> str:
    return f"CV {100 * tokens_noise(r):.1f} %" if tokens_noise(r) is not None else "CV unknown"


def peer_table(out: list, refused: list, read: list) -> list:
    """The report's "Peers at their best" from `peer_reads`, its note opening with the best peer and the lead over
    it (`best_peer_line`); without any peer's settings recorded it claims no lead."""
    note = ("Peers at their best, like with like: each peer's run whose record names the settings it ran with "
            "(the system's version, precision, checkpointing, the attention that ran, compilation, rows, the trainer's "
            "metrics, the optimizer), read against the fastest rung standing on the frontier measured on the same "
            "machine: in the same precision (bf16 GEMMs against bf16, FP8 against FP8; QLoRA's GEMMs are bf16) and "
            "in any. A lead is the rung's real tokens/s over the peer's, with its noise verdict. ")
    if not out and not refused:  # no peer beside the frontier
        return []
    if refused:
        note += "Refused a place, or passed over for the peer's earlier run: " + "; ".join(refused) + "."
    if not out:
        return [note + " No peer's run with its settings recorded: the report claims no lead over any peer.",
                ("Peers at their best", pl.DataFrame({"result": ["no peer run with its settings recorded"]}),
                 "frontier peers measured")]
    return [note.rstrip() + best_peer_line(read),
            ("Peers at their best", pl.DataFrame(out, infer_schema_length=None), "frontier peers measured")]


def headline(df: pl.DataFrame, replaced: pl.DataFrame | None = None, rungs=(), beside=(), same_rows=None,
             **_) -> str | None:
    """For the report's front page, from the frontier's records (config compare.frontier) on the model and data of
    its rung 0 (`same_rows`): its fastest run at full scale on each GPU kind (standing on the frontier: its loss
    checked where it changes the arithmetic), and the best peer at its best with the lead over it, in any precision
    and like with like. None without a full-scale GPU run."""
    if df.is_empty() or "variant" not in df.columns:
        return None
    if same_rows:  # the frontier's own rows: the model and data its rung 0 ran on (not every run of a variant)
        df = df.join(df.filter(pl.col("variant") == same_rows).select("model", "dataset").unique(),
                     on=["model", "dataset"], how="semi")
    out, (_, _, read) = frontier_reads(df, {}, rungs, beside, same_rows, replaced)
    if len(out) < 3 or "none ran" in out[0]:
        return None
    fastest = out[0].split(" <br>")[0].removeprefix(  # (the smaller scales and CPUs apart: not the published model)
        "Fastest configuration measured at full scale on a GPU: ")
    peers = best_peer_line(read).strip() if read else (
        "No peer's run with its settings recorded: no lead over any peer is claimed.")
    return f"{fastest} {peers}"


def best_peer_line(read: list) -> str:
    """The sentence a reader of the frontier wants first: the fastest peer run at its best (with its settings), and
    the project's lead over it on the same machine, in any precision and in the peer's own, each with both runs'
    noise (their CV across windows) and its verdict. `read`: (peer run, same-precision top, any-precision top)."""
    r, same, anyp = max(read, key=lambda x: x[0]["throughput.tokens_per_s"])

    def lead(top):
        return lead_over(top, r, with_cv=True) or "no rung of ours measured on its machine"
    return (f" The best peer at its best: {r['variant']} ({peer_of(r)} {r.get('peer.version') or ''}, "
            f"{r['throughput.tokens_per_s']:,.0f} real tokens/s, {_cv_text(r)}, {r['gpu']}); the top rung's lead over "
            f"it on the same machine: {lead(anyp)} in any precision, {lead(same)} {gemms_in(r)} against {gemms_in(r)}.")


def frontier(df: pl.DataFrame, published: dict, rungs=(), beside=(), same_rows=None, replaced=None, **_) -> list:
    """The speed frontier past the ladder's top (one GPU, LoRA): each rung adds one technique (rows of a token
    budget, CUDA graphs, no per-step metric syncs, fused projections and optimizer, activation offloading, FP8),
    each at its own batch; loss on the evaluation set. Then the published figures of other systems on one GPU
    (`frontier_peers` in the study's published file), each beside the fastest rung measured here on its GPU."""
    out, reads = frontier_reads(df, published, rungs, beside, same_rows, replaced)
    table = out[-1][1]
    out += peer_table(*reads)
    peers = published.get("frontier_peers") or []
    if peers:
        out += peer_rows(table, peers)
    return out


def frontier_reads(df: pl.DataFrame, published: dict, rungs, beside, same_rows, replaced) -> tuple[list, tuple]:
    """The frontier's ladder (each rung at its own batch, the evaluation loss) and its peers read like with like
    (`peer_reads`, against the project's own fastest runs of each machine that `ladder` collects): what `frontier`
    shows and `headline` sums up."""
    own = {}
    out = ladder(df, published, rungs, beside, by_batch=False, eval_loss=True, title="Frontier", same_rows=same_rows,
                 replaced=replaced, own_tops=own)
    table = out[-1][1]
    if not beside or "variant" not in table.columns:
        return out, ([], [], [])
    names = list(rungs) + list(beside)
    return out, peer_reads(table, df.filter(pl.col("variant").is_in(names)), own,
                           replaced.filter(pl.col("variant").is_in(names)) if replaced is not None and replaced.height
                           and "variant" in replaced.columns else None)


def peer_rows(table: pl.DataFrame, peers: list[dict]) -> list:
    """Published peers beside the frontier: each with its conditions and source, its MFU on its own count of model
    FLOPs, and the fastest full-scale rung measured here on the same GPU kind that may stand on the frontier (the
    ratio is context: other models and data)."""
    ours = {}
    if "tokens/s (real)" in table.columns:
        ok = table.filter(pl.col("tokens/s (real)").is_not_null() & (pl.col("scale") == "full"))
        if "on the frontier" in ok.columns:
            ok = ok.filter(pl.col("on the frontier").str.starts_with("yes"))
        for r in ok.sort("tokens/s (real)", descending=True).iter_rows(named=True):
            ours.setdefault(r["gpu"], r)
    rows = []
    for p in peers:
        peak, best = peak_tflops(p["gpu"], "bf16"), ours.get(p["gpu"])
        rows.append({"system": p["system"], "model": p["model"], "gpu": p["gpu"], "tokens/s": p["tokens_per_s"],
                     "MFU % (bf16 peak, its own FLOPs count)": 100 * p["model_tflops"] / peak if peak else None,
                     "conditions": " ".join(p["conditions"].split()), "source": p["source"],
                     "fastest here on this GPU": (f"{best['variant']} ({best['model']}, batch {best['batch']}): "
                                                  f"{best['tokens/s (real)']:,.0f} real tokens/s") if best else None,
                     "ours / theirs": best["tokens/s (real)"] / p["tokens_per_s"] if best else None})
    note = ("Published peers on one GPU, as their sources give them (other models and data than ours: context, not a "
            "verdict). 'Fastest here' is the fastest full-scale rung measured on the same GPU kind that stands on the "
            "frontier (its loss checked where it changes the arithmetic).")
    return [note, ("Published peers", pl.DataFrame(rows), "frontier peers")]


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


def scaling(df: pl.DataFrame, published: dict, pairs=(), **_) -> list:
    """Several GPUs against one: each multi-GPU variant beside the one-GPU variant it scales (`pairs`: [multi,
    single]), same model, dataset, GPU kind and per-GPU batch size. Scaling efficiency = total throughput over
    N x the one-GPU throughput (real tokens/s where both runs counted them, else samples/s); the speedup carries its
    noise verdict; the per-rank step against the one-GPU step bounds what communication and the wrapper add to a
    step; peak memory is the largest rank's."""
    rows = []
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
                         "reason": r["reason"] if not ok else (
                             f"the one-GPU run is of other code (files {(code_of(r, '_1') or '?')[:10]}, "
                             f"this run {(code_of(r) or '?')[:10]}): not divided" if other_code else None)})
    note = ("Scaling efficiency = throughput over all N GPUs / (N x the same variant's on one GPU at the same per-GPU "
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
    from .figures import gpu_bars, svg_string

    bars = pl.DataFrame([{"run": f"{r['variant']} bs{r['batch_size']} · {r['dataset']} · {r['model']} ({r['scale']})",
                          "gpu": g, "samples/h": r[f"{g}: samples/h"], "status": r[f"{g}: status"]}
                         for r in table.iter_rows(named=True) for g in [ref] + others], infer_schema_length=None)
    return [f"GPU kinds present: {', '.join([ref] + others)} (reference {ref}). " + " ".join(lead), note,
            svg_string(gpu_bars(bars)), ("GPU kinds side by side", table, "gpu_kinds")]


COMPARISONS = {"study_b_table": study_b_table, "scaling": scaling, "ladder": ladder, "frontier": frontier, "decision_guide": decision_guide, "lmm_vs_published": lmm_vs_published, "samples_per_hour_vs_published": samples_per_hour_vs_published, "unsloth_vs_peft": unsloth_vs_peft,
               "diffusion_vs_published": diffusion_vs_published, "gpu_kinds": gpu_kinds}


def comparison_page(df: pl.DataFrame, title: str, comparisons: dict, published: dict, variants: dict,
                    replaced: pl.DataFrame | None = None) -> str:
    """Each configured comparison of the runs `df`; `replaced`: the runs a later measurement of the same run
    replaced in `df` (analysis.aggregate), which the frontier reads each lease's own top rung from."""
    blocks = []
    for name, kwargs in comparisons.items():
        blocks.append(f"<b>{name.replace('_', ' ')}</b>")
        blocks += COMPARISONS[name](df, published, variants=variants, replaced=replaced, **(kwargs or {}))
    return html_page(title, blocks)
