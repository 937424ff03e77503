"""Speed that keeps quality: each technique's held-out loss on a real pretrained model, against the baseline's seeds.

Every run of the quality study is the same fine-tune (data, learning rate, steps) under one technique, its held-out
loss measured before the first step and every few steps at the label tokens trained so far (ftbench.heldout). The
baseline (bf16 LoRA) runs under several seeds; their spread is the noise. Each technique is read at the same tokens
as the baseline (the fewest any baseline seed trained: its curve interpolated linearly there, never extrapolated),
against the seeds' mean, by the standard error of the difference, se = sqrt(sd_b^2/n_b + sd_t^2/n_t):

- one run (n_t = 1) has the spread of runs like it: the seeds of the nearest variant it is built on that ran under
  at least MIN_SEEDS of them (packed rows' runs spread wider than padded ones), else the baseline's spread;
- a technique run under several seeds (variants whose knobs differ only in the seed) is read by their mean, sd_t
  their spread, each of its rows carrying that verdict;
- keeps quality: its held-out loss is within NOISE_SIGMAS standard errors of the seeds' mean (or below it);
- costs quality: +x nats at the same tokens, where x is more than COST_SIGMAS standard errors above the mean;
- inconclusive: between the two, or with fewer than MIN_SEEDS baseline seeds (no noise to judge by);
- quality not measured: a run without a held-out curve (a speed run), or one ending more than SHORT_BY short of the
  baseline's tokens, never "keeps quality".

Tokens to quality: the label tokens a technique's curve needs to reach the baseline seeds' mean loss at those tokens
(linear between its points). With a rung's real tokens/s at Qwen3-8B's shapes (the fastest record of the same
variant there), its time to quality relative to the baseline's is a projection: (tokens to quality / baseline's
tokens) x (baseline's tokens/s / its tokens/s) — a technique 10 % faster that needs 15 % more tokens is slower.
"""

from __future__ import annotations

import json
import math
import statistics

import polars as pl

from .techniques import words

NOISE_SIGMAS = 2.0
COST_SIGMAS = 3.0
MIN_SEEDS = 3
GROUP = ("model", "dataset", "gpu")  # one host kind, one model, one dataset: runs comparable with each other

KEEPS, COSTS, INCONCLUSIVE, NOT_MEASURED = "keeps quality", "costs quality", "inconclusive", "quality not measured"


def points(row: dict) -> list[dict] | None:
    """A run's held-out curve, its points in token order (None: the run measured no curve)."""
    text = row.get("loss.held_out")
    if not text:
        return None
    pts = [p for p in json.loads(text).get("points") or [] if p.get("loss") is not None and math.isfinite(p["loss"])]
    return sorted(pts, key=lambda p: p["tokens"]) or None


def loss_at(pts: list[dict], tokens: float) -> float | None:
    """The curve's loss at `tokens`, linear between its points; None outside them."""
    for a, b in zip(pts, pts[1:]):
        if a["tokens"] <= tokens <= b["tokens"]:
            if b["tokens"] == a["tokens"]:
                return b["loss"]
            f = (tokens - a["tokens"]) / (b["tokens"] - a["tokens"])
            return a["loss"] + f * (b["loss"] - a["loss"])
    if pts and pts[-1]["tokens"] == tokens:
        return pts[-1]["loss"]
    return None


def tokens_to(pts: list[dict], target: float) -> float | None:
    """The first token count at which the curve reaches `target` (linear between points); None if it never does."""
    for a, b in zip(pts, pts[1:]):
        if b["loss"] <= target:
            if a["loss"] <= target:
                return float(a["tokens"])
            f = (a["loss"] - target) / (a["loss"] - b["loss"])
            return a["tokens"] + f * (b["tokens"] - a["tokens"])
    return float(pts[0]["tokens"]) if pts and pts[0]["loss"] <= target else None


SHORT_BY = 0.02  # a run that ends at most this share of the baseline's tokens short is read where it ends


def baseline_noise(curves: dict[str, list[dict]], tokens: float | None = None) -> dict | None:
    """The baseline seeds' reading: the tokens they are compared at (the fewest any trained, or `tokens`), their
    losses there, mean, standard deviation and count; None without a curve."""
    if not curves:
        return None
    tokens = min(c[-1]["tokens"] for c in curves.values()) if tokens is None else tokens
    losses = {name: loss_at(c, tokens) for name, c in curves.items()}
    values = [v for v in losses.values() if v is not None]
    return {"tokens": tokens, "losses": losses, "mean": statistics.fmean(values), "n": len(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,
            "before": statistics.fmean(c[0]["loss"] for c in curves.values() if c[0]["tokens"] == 0)
            if any(c[0]["tokens"] == 0 for c in curves.values()) else None}


def verdict(loss: float | None, base: dict | None, spread: tuple | None = None) -> tuple[str, str]:
    """(verdict, its sentence) for a technique's held-out loss at the baseline's tokens: one run's, or its seeds'
    mean. Judged by the standard error of its difference from the baseline seeds' mean, sqrt(sd_b^2/n_b + sd_t^2/n_t):
    `spread` = (sd_t, n_t, whose) is its own seeds' spread and count, or the spread of runs like it (the seeds of the
    variant it is built on) for one run; without it, one run with the baseline's spread."""
    if base is None:
        return INCONCLUSIVE, "no baseline curve to compare with"
    if loss is None:
        return NOT_MEASURED, "no held-out curve reaching the baseline's tokens"
    delta = loss - base["mean"]
    if base["n"] < MIN_SEEDS or not base["std"]:
        return INCONCLUSIVE, (f"{delta:+.3f} nats, but the baseline has {base['n']} seed(s) with a spread of "
                              f"{base['std'] or 0:.3f}: at least {MIN_SEEDS} seeds that differ are needed")
    sd, n, whose = spread or (base["std"], 1, "one run, the baseline's spread")
    se = math.sqrt(base["std"] ** 2 / base["n"] + sd ** 2 / n)
    band = f"standard error {se:.4f}: the baseline's {base['n']} seeds, sd {base['std']:.4f}; {whose}, sd {sd:.4f}"
    if delta <= NOISE_SIGMAS * se:
        return KEEPS, f"{delta:+.3f} nats at the same tokens, within {NOISE_SIGMAS:g} standard errors ({band})"
    if delta > COST_SIGMAS * se:
        return COSTS, f"costs quality: {delta:+.3f} nats at the same tokens ({delta / se:.1f} standard errors; {band})"
    return INCONCLUSIVE, (f"{delta:+.3f} nats: between {NOISE_SIGMAS:g} and {COST_SIGMAS:g} standard errors "
                          f"({band}); more seeds would decide")


def seed_families(names, baseline: str, seeds: list[str], variants: dict | None) -> dict[str, tuple]:
    """Each run's family: the same fine-tune under other seeds (its knobs but the seed equal: `variants`' flat knobs).
    The baseline's family holds the baseline, its named `seeds` and any variant of its knobs under another seed."""
    def key(name):
        knobs = (variants or {}).get(name)
        return ("alone", name) if knobs is None else tuple(sorted(
            (k, repr(v)) for k, v in knobs.items() if k != "seed" and v is not None))
    own = key(baseline) if (variants or {}).get(baseline) is not None else None
    return {n: ("baseline",) if n in (baseline, *seeds) or key(n) == own else key(n) for n in names}


def speed_at_shapes(speed: pl.DataFrame | None, model: str = "qwen3-8b") -> dict[str, dict]:
    """variant -> its fastest ok record at `model`'s full shapes (real tokens/s, the GPU, the dataset and batch)."""
    if speed is None or not len(speed) or "throughput.tokens_per_s" not in speed.columns:
        return {}
    ok = speed.filter((pl.col("status") == "ok") & (pl.col("model") == model) & (pl.col("scale") == "full")
                      & pl.col("throughput.tokens_per_s").is_not_null() & (pl.col("device_type") == "cuda"))
    best = {}
    for r in ok.sort("throughput.tokens_per_s", descending=True).iter_rows(named=True):
        best.setdefault(r["variant"], r)
    return best


def reading(pts: list[dict] | None, base: dict | None, seed_curves: dict) -> tuple[float | None, dict | None]:
    """A curve's loss at the baseline's tokens, and the baseline's reading it is compared with: where the run ended
    a few tokens short (at most SHORT_BY: packed rows against padded), both read where it ended."""
    at = loss_at(pts, base["tokens"]) if pts and base else None
    if at is None and pts and base and pts[-1]["tokens"] >= (1 - SHORT_BY) * base["tokens"]:
        return pts[-1]["loss"], baseline_noise(seed_curves, pts[-1]["tokens"])
    return at, base


def read_families(runs: list[dict], family: dict, seed_curves: dict) -> dict[tuple, dict]:
    """A technique run under several seeds, read as one: each family of two or more runs read at all, its curves and
    the baseline's at the fewest tokens any of them reached; its losses there, their mean and spread."""
    groups = {}
    for x in runs:
        if family[x["variant"]] != ("baseline",) and x["at"] is not None:
            groups.setdefault(family[x["variant"]], []).append(x)
    out = {}
    for key, mine in groups.items():
        if len(mine) < 2:
            continue
        tokens = min(x["here"]["tokens"] for x in mine)
        losses = [loss_at(x["pts"], tokens) for x in mine]
        out[key] = {"names": [x["variant"] for x in mine], "curves": [x["pts"] for x in mine], "tokens": tokens,
                    "losses": losses,
                    "mean": statistics.fmean(losses), "std": statistics.stdev(losses),
                    "base": baseline_noise(seed_curves, tokens)}
    return out


def quality_rows(df: pl.DataFrame, baseline: str, seeds: list[str], variants: dict | None = None,
                 speed: pl.DataFrame | None = None, lineage: dict | None = None) -> list[dict]:
    """One row per technique run of each (model, dataset, GPU) group holding the baseline: its verdict, its loss
    at the baseline's tokens, tokens to quality and, where the same variant ran at Qwen3-8B's shapes, its time to
    quality relative to the baseline's (a projection). A technique run under several seeds is read by their mean
    (each of its rows); a single run built on one (`lineage`: each variant's bases, nearest first) by that one's
    spread, the noise of runs like it."""
    fast = speed_at_shapes(speed)
    out = []
    for key, group in df.group_by(list(GROUP), maintain_order=True):
        rows = group.to_dicts()
        if baseline not in {r["variant"] for r in rows}:
            continue
        family = seed_families([r["variant"] for r in rows], baseline, seeds, variants)
        runs = [{"variant": r["variant"], "row": r, "pts": points(r) if r["status"] == "ok" else None} for r in rows]
        seed_curves = {x["variant"]: x["pts"] for x in runs if family[x["variant"]] == ("baseline",) and x["pts"]}
        base = baseline_noise(seed_curves)
        for x in runs:
            x["at"], x["here"] = reading(x["pts"], base, seed_curves)
            x["of the baseline"] = family[x["variant"]] == ("baseline",)
        fams = read_families(runs, family, seed_curves)
        for x in runs:
            fam = fams.get(family[x["variant"]])
            out.append(quality_row(key, x, base, fam if fam and x["variant"] in fam["names"] else None,
                                   spread_of(x["variant"], family, fams, lineage), fast, baseline, variants))
    return out


def spread_of(name: str, family: dict, fams: dict, lineage: dict | None) -> tuple | None:
    """The spread of runs like `name`'s: the seeds of the nearest variant it is built on that ran under at least
    MIN_SEEDS of them, as (sd, 1 run, whose); None: the baseline's."""
    for base in (lineage or {}).get(name, [name])[1:]:
        f = fams.get(family.get(base))
        if f and len(f["losses"]) >= MIN_SEEDS:
            return f["std"], 1, f"one run with the spread of {base}'s {len(f['losses'])} seeds"
    return None


def quality_row(key, x: dict, base: dict | None, fam: dict | None, spread: tuple | None, fast: dict, baseline: str,
                variants: dict | None) -> dict:
    """One run's row of the verdict table (its family's reading where it ran under several seeds)."""
    r, pts = x["row"], x["pts"]
    if fam:
        here, at = fam["base"], fam["mean"]
        word, why = verdict(at, here, (fam["std"], len(fam["losses"]), f"its {len(fam['losses'])} seeds"))
        why += f" ({', '.join(fam['names'])}, read at {fam['tokens']:,.0f} tokens)"
        ttqs = [tokens_to(c, base["mean"]) for c in fam["curves"]]
        ttq = statistics.fmean(ttqs) if None not in ttqs else None
    else:
        here, at = x["here"], x["at"]
        word, why = (verdict(at, here, spread) if pts and (at is not None or not base) else
                     (NOT_MEASURED, f"its curve ends at {pts[-1]['tokens']:,} label tokens, "
                      f"{1 - pts[-1]['tokens'] / base['tokens']:.1%} short of the baseline's {base['tokens']:,.0f} "
                      f"(read only within {SHORT_BY:.0%} of them)") if pts else
                     (NOT_MEASURED, f"the run's status is {r['status']}: {r.get('reason') or ''}".strip(": ")
                      if r["status"] != "ok" else "the run measured no held-out curve"))
        if here is not base:
            why += f" (read at {here['tokens']:,.0f} tokens, where this run ended: {base['tokens']:,.0f} elsewhere)"
        ttq = tokens_to(pts, base["mean"]) if pts and base else None
    names = fam["names"] if fam else [r["variant"]]
    s = next((fast[n] for n in names if n in fast), None)  # a seed of a technique runs at its speed
    rel_tokens = ttq / base["tokens"] if ttq is not None and base and base["tokens"] else None
    base_speed = fast.get(baseline)
    rel_time = (rel_tokens * base_speed["throughput.tokens_per_s"] / s["throughput.tokens_per_s"]
                if rel_tokens is not None and s and base_speed else None)
    return {
        "model": key[0], "dataset": key[1], "gpu": key[2], "variant": r["variant"],
        "techniques, in words": words(r["variant"], knobs=(variants or {}).get(r["variant"]) or {}),
        "seed of the baseline": x["of the baseline"],
        "held-out loss before": pts[0]["loss"] if pts and pts[0]["tokens"] == 0 else None,
        "held-out loss after": pts[-1]["loss"] if pts else None,
        "tokens trained": pts[-1]["tokens"] if pts else None,
        "compared at tokens": here["tokens"] if here else None,
        "loss at those tokens": at, "baseline mean": here["mean"] if here else None,
        "baseline sd": here["std"] if here else None, "seeds": here["n"] if here else 0,
        "its seeds": len(fam["losses"]) if fam else 1,
        "delta (nats)": at - here["mean"] if at is not None and here else None,
        "quality": word, "why": why, "tokens to quality": ttq, "tokens to quality (x baseline)": rel_tokens,
        "tokens/s at Qwen3-8B": s["throughput.tokens_per_s"] if s else None,
        "speed measured on": f"{s['gpu']}, {s['dataset']} batch {s['batch_size']}" if s else None,
        "time to quality (x baseline, projection)": rel_time}


def claims_rows(rows: list[dict], claims: list[dict], variants: dict | None = None) -> list[dict]:
    """The published quality claims read from the techniques' verdicts: holds (keeps quality), differs (costs
    quality), inconclusive, or not measured. A claim's `variant` is one variant or a list of those that carry its
    technique (Unsloth on padded batches and on packed rows); `variants`: their knobs, for the words."""
    mapping = {KEEPS: "holds", COSTS: "differs", INCONCLUSIVE: "inconclusive", NOT_MEASURED: "not measured"}
    out = []
    for c in claims:
        names = c["variant"] if isinstance(c["variant"], list) else [c["variant"]]
        mine = [r for r in rows if r["variant"] in names]
        base = {"claim": c["claim"], "source": c.get("source")}
        if not mine:
            out += [{**base, "variant": n, "techniques, in words": words(n, knobs=(variants or {}).get(n) or {}),
                     "verdict": "not measured", "evidence": "no run of this variant in the quality study"}
                    for n in names]
            continue
        for r in mine:
            out.append({**base, "variant": r["variant"], "techniques, in words": r["techniques, in words"],
                        "verdict": mapping[r["quality"]], "evidence": f"{r['gpu']}: {r['why']}"})
    return out


def curves_frame(df: pl.DataFrame) -> pl.DataFrame:
    """Every held-out curve as (run, tokens, loss) rows, for the figure."""
    rows = []
    for r in df.iter_rows(named=True):
        for p in (points(r) or []) if r["status"] == "ok" else []:
            rows.append({"run": f"{r['variant']} ({r['gpu']})", "variant": r["variant"], "gpu": r["gpu"],
                         "dataset": r["dataset"], "tokens": p["tokens"], "held-out loss": p["loss"]})
    return pl.DataFrame(rows, schema={"run": pl.String, "variant": pl.String, "gpu": pl.String, "dataset": pl.String,
                                      "tokens": pl.Int64, "held-out loss": pl.Float64})


def curves_chart(frame: pl.DataFrame):
    """Held-out loss against label tokens trained, a line per run, a panel per dataset and GPU."""
    import altair as alt

    return alt.Chart(frame.to_pandas()).mark_line(point=True).encode(
        x=alt.X("tokens:Q", title="label tokens trained"), y=alt.Y("held-out loss:Q", scale=alt.Scale(zero=False)),
        color=alt.Color("run:N", legend=alt.Legend(labelLimit=500)),
        tooltip=["run", "tokens", alt.Tooltip("held-out loss:Q", format=".4f")]
    ).properties(width=420, height=240).facet(row=alt.Row("gpu:N", title=None), column=alt.Column("dataset:N"),
                                              title="Held-out loss while fine-tuning (a real pretrained model)"
                                              ).resolve_scale(x="independent", y="independent")


def svg(chart) -> str:
    import vl_convert

    return vl_convert.vegalite_to_svg(chart.to_json())


SHOWN = ["variant", "techniques, in words", "gpu", "dataset", "quality", "held-out loss before", "held-out loss after", "compared at tokens",
         "loss at those tokens", "delta (nats)", "baseline sd", "seeds", "its seeds", "tokens to quality (x baseline)",
         "tokens/s at Qwen3-8B", "speed measured on", "time to quality (x baseline, projection)", "why"]


def verdict_table(rows: list[dict]) -> pl.DataFrame:
    df = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({c: [] for c in SHOWN})
    return df.select([c for c in SHOWN if c in df.columns]).with_columns(
        pl.col(pl.Float64).round(4))


def origin_line(df: pl.DataFrame) -> str:
    """Where the model and text came from, in a sentence (from the records)."""
    ok = df.filter(pl.col("status") == "ok")
    if not len(ok):
        return "No quality run finished."
    r = ok.row(0, named=True)
    data = " and ".join(dict.fromkeys(ok["dataset"].to_list()))
    return (f"Model: {r['model']} ({r.get('model.gguf') or r.get('weights_source')}; a real pretrained model, its "
            f"weights the GGUF file's rounding of the published ones, dequantized). Data: {data} "
            f"({r.get('data_source')}: the docstrings of Python's standard library, PSF-2.0; held out by whole "
            "module).")


def fp8_error_table(checks: list[dict]) -> pl.DataFrame:
    """The FP8 forms' per-GEMM relative error at Qwen3-8B's and the real model's shapes, a row a projection and
    GEMM, a column a form (the last check shipped)."""
    rows = checks[-1]["rows"]
    df = pl.DataFrame(rows).with_columns(pl.col("rel_fro_error").round(5))
    return df.pivot(on="form", index=["model", "projection", "gemm", "reduction"], values="rel_fro_error")


def front_fragment(rows: list[dict], claims: list[dict], chart_svg: str, answers: list[dict], origin: str,
                   fp8_errors: list[dict] | None = None) -> str:
    """The front page's real fine-tune: held-out loss before and after, the curves, the verdicts, and held-out
    prompts answered before and after."""
    from .analysis import _escape, html_table

    parts = ["<h2>Speed that keeps quality: a real fine-tune</h2>", f"<p>{_escape(origin)}</p>"]
    base = [r for r in rows if r["seed of the baseline"] and r["held-out loss before"] is not None]
    for gpu, dataset in dict.fromkeys((r["gpu"], r["dataset"]) for r in base):
        mine = [r for r in base if (r["gpu"], r["dataset"]) == (gpu, dataset)]
        before = statistics.fmean(r["held-out loss before"] for r in mine)
        after = statistics.fmean(r["loss at those tokens"] for r in mine if r["loss at those tokens"] is not None)
        parts.append(f"<p><b>On {_escape(gpu)}: held-out loss {before:.3f} before fine-tuning, {after:.3f} after "
                     f"{mine[0]['compared at tokens']:,} label tokens</b> ({_escape(dataset)}; bf16 LoRA, mean of "
                     f"{len(mine)} seed(s); lower by {before - after:.2f} nats).</p>")
    parts.append(chart_svg)
    parts.append(html_table(verdict_table(rows), "quality-verdicts"))
    if claims:
        parts.append("<p>The published quality claims, read from the verdicts:</p>")
        parts.append(html_table(pl.DataFrame(claims), "quality-claims"))
    for a in answers:
        if not a.get("before"):
            continue
        table = pl.DataFrame({"held-out prompt": a["prompts"], "before fine-tuning": a["before"],
                              "after fine-tuning": a["after"] or ["(no fine-tuned model)"] * len(a["prompts"]),
                              "held-out answer": a.get("references") or [""] * len(a["prompts"])})
        parts.append("<p>Held-out prompts (never trained on) answered before and after the baseline's fine-tune:</p>")
        parts.append(html_table(table, "quality-answers"))
    if fp8_errors:
        c = fp8_errors[-1]
        parts.append(f"<p>Does the small model understate FP8's damage? Each FP8 form's GEMM error against fp32 "
                     f"(relative Frobenius) at Qwen3-8B's projections and the real model's, measured on {c['device']} "
                     f"(torch {c['torch']}; bench/fp8_gemm_error.py). {_escape(c['method'])}</p>")
        parts.append(html_table(fp8_error_table(fp8_errors), "fp8-gemm-error"))
    return "\n".join(parts)
