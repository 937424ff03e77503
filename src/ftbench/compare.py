"""Comparisons the studies drew, computed from our runs and put beside the published figures."""

from __future__ import annotations

import polars as pl

from .analysis import html_page

MEMORY_COLUMNS = ("memory.peak_reserved_gib", "memory.host_peak_rss_gib")


def _memory(df: pl.DataFrame) -> pl.Expr:
    """Peak reserved device memory where a GPU ran, the host's peak RSS otherwise."""
    return pl.coalesce([pl.col(c) for c in MEMORY_COLUMNS])


def samples_per_hour_vs_published(df: pl.DataFrame, published: dict, **_) -> list:
    ours = (df.filter(pl.col("status") == "ok")
            .select("model", "dataset", "gpu", "variant", "batch_size", "scale", "weights_source",
                    pl.col("throughput.samples_per_hour").round(0).alias("samples/hour"))
            .with_columns(source=pl.lit("ftbench")))
    pub = pl.DataFrame(published.get("samples_per_hour", [])).rename({"samples_per_hour": "samples/hour"}) \
        .with_columns(source=pl.lit("published"), variant=pl.lit("not stated"), scale=pl.lit("full"),
                      weights_source=pl.lit("hub"), batch_size=pl.lit(None, dtype=pl.Int64),
                      **{"samples/hour": pl.col("samples/hour").cast(pl.Float64)})
    table = pl.concat([pub, ours], how="diagonal_relaxed").sort("model", "dataset", "source", "gpu", "variant")
    note = ("Samples fine-tuned per hour per model, dataset and GPU: the published Study B table beside our "
            "steady-state figures (every variant and batch size). Runs from other machines merge in through "
            "config `merge_runs`; a run's GPU is part of its key. Tiny- or proxy-scale rows measure the pipeline, "
            "not the published model.")
    return [note, ("Samples per hour", table.select("model", "dataset", "source", "gpu", "variant", "batch_size",
                                                    "scale", "samples/hour"), "samples_per_hour")]


def unsloth_vs_peft(df: pl.DataFrame, published: dict, pairs=(), **_) -> list:
    """Unsloth's speed and memory relative to plain PEFT: at equal batch size, and at each one's largest
    batch size that ran (status ok)."""
    ok = df.filter(pl.col("status") == "ok").with_columns(memory_gib=_memory(df))
    keys = ["model", "dataset", "gpu"]
    equal, largest = [], []
    for fast, base in pairs:
        a = ok.filter(pl.col("variant") == fast)
        b = ok.filter(pl.col("variant") == base)
        j = a.join(b, on=keys + ["batch_size"], suffix="_peft")
        for r in j.iter_rows(named=True):
            equal.append({"model": r["model"], "dataset": r["dataset"], "gpu": r["gpu"], "unsloth": fast, "peft": base,
                          "batch_size": r["batch_size"],
                          "speedup (PEFT step / Unsloth step)": r["timing.step_time_s_peft"] / r["timing.step_time_s"],
                          "memory ratio (Unsloth / PEFT)": r["memory_gib"] / r["memory_gib_peft"],
                          "Unsloth first step s": r["timing.first_step_s"],
                          "PEFT first step s": r["timing.first_step_s_peft"]})
        top_a = a.sort("batch_size").group_by(keys, maintain_order=True).last()
        top_b = b.sort("batch_size").group_by(keys, maintain_order=True).last()
        for r in top_a.join(top_b, on=keys, suffix="_peft").iter_rows(named=True):
            largest.append({"model": r["model"], "dataset": r["dataset"], "gpu": r["gpu"], "unsloth": fast,
                            "peft": base, "Unsloth largest batch": r["batch_size"], "PEFT largest batch": r["batch_size_peft"],
                            "samples/hour ratio (Unsloth / PEFT)": r["throughput.samples_per_hour"]
                            / r["throughput.samples_per_hour_peft"],
                            "Unsloth memory GiB": r["memory_gib"], "PEFT memory GiB": r["memory_gib_peft"]})
    claim = published.get("unsloth_claim", {})
    note = (f"Published claim (Study D, Unsloth on Alpaca): {claim.get('speedup', '?')}x the speed of Hugging Face, "
            f"{claim.get('memory_mb_unsloth', '?')} MB vs {claim.get('memory_mb_hf', '?')} MB of memory. Ours: step-time "
            "speed-up and memory ratio at equal batch size, then samples/hour at each one's largest batch size that "
            "ran in this matrix (a larger sweep finds the true limits). Memory is the peak reserved on the GPU, the "
            "host's peak RSS on a CPU.")
    blocks = [note]
    blocks.append(("At equal batch size", pl.DataFrame(equal) if equal else pl.DataFrame(
        {"result": ["no batch size where both ran ok (Unsloth needs a CUDA GPU)"]}), "unsloth_equal"))
    blocks.append(("At each one's largest batch size", pl.DataFrame(largest) if largest else pl.DataFrame(
        {"result": ["no pair ran ok"]}), "unsloth_largest"))
    return blocks


COMPARISONS = {"samples_per_hour_vs_published": samples_per_hour_vs_published, "unsloth_vs_peft": unsloth_vs_peft}


def comparison_page(df: pl.DataFrame, title: str, comparisons: dict, published: dict) -> str:
    blocks = []
    for name, kwargs in comparisons.items():
        blocks.append(f"<b>{name.replace('_', ' ')}</b>")
        blocks += COMPARISONS[name](df, published, **(kwargs or {}))
    return html_page(title, blocks)
