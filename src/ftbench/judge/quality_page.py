"""The quality study's pages: the report's front fragment (speed against quality, what the fine-tune learned) and
the quality page (every verdict, the published claims, the FP8 GEMM errors), from `ftbench.judge.quality`'s rows."""

from __future__ import annotations

import math
import statistics

import polars as pl

from ftbench.judge.quality import COSTS, INCONCLUSIVE, KEEPS, NOT_MEASURED, by_stand_in, points

# a verdict's colour in the figures: as the published findings' grids colour holds, differs, inconclusive
COLOURS = {KEEPS: "#4c9a2a", COSTS: "#e07b39", INCONCLUSIVE: "#d9c34a", NOT_MEASURED: "#bbbbbb"}


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


def baseline_curves_chart(frame: pl.DataFrame, baseline: str, name: str):
    """The front page's curves: the baseline's held-out loss against label tokens, a line a seed (`baseline` and
    its `-sN` seeds), a panel per GPU and dataset; `name`: the baseline's display name."""
    import re

    import altair as alt

    mine = frame.filter(pl.col("variant").map_elements(lambda v: bool(re.fullmatch(rf"{re.escape(baseline)}(-s\d+)?", v)),
                                                       return_dtype=pl.Boolean))
    data = mine.with_columns(pl.format("{} · {}", "gpu", "dataset").alias("run on")).to_pandas()
    return alt.Chart(data).mark_line(point=True, opacity=0.8).encode(
        x=alt.X("tokens:Q", title="label tokens trained"), y=alt.Y("held-out loss:Q", scale=alt.Scale(zero=False)),
        detail="run:N", color=alt.Color("gpu:N", legend=None),
        tooltip=["run", "tokens", alt.Tooltip("held-out loss:Q", format=".4f")]
    ).properties(width=300, height=170).facet(
        facet=alt.Facet("run on:N", title=None), columns=3,
        title=f"Held-out loss while fine-tuning: {name}, a line a seed").resolve_scale(x="independent", y="independent")


def speed_quality_frame(rows: list[dict], names: dict | None = None, peers: dict | None = None) -> pl.DataFrame:
    """A point a technique and dataset that has a speed at Qwen3-8B's shapes: its real tokens/s there and its held-out
    loss difference from the baseline with its interval, as served where measured, else as trained (said); its
    display name (`names`), the peer it is (`peers`: Unsloth, Liger, NeMo AutoModel; else ftbench) and whether it lies
    on the frontier of those that keep quality (none faster is as good: `frontier`)."""
    out = []
    for r in rows:
        if r.get("technique", r["variant"]) != r["variant"] or r.get("tokens/s at Qwen3-8B") is None:
            continue
        against = r.get("judged against") or "the baseline"
        stand_in = by_stand_in(r)
        if stand_in and r.get("seed of the baseline"):
            continue  # the stand-in itself: the zero of its GPU kind's differences, not a verdict
        served = r.get("delta (nats)") is not None
        delta = r["delta (nats)"] if served else r.get("delta as trained")
        if delta is None:
            continue
        lo, hi = (r["interval low"], r["interval high"]) if served else (r.get("as trained low"), r.get("as trained high"))
        finite = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)
        out.append({"variant": r["variant"], "name": (names or {}).get(r["variant"], r["variant"]),
                    "peer": (peers or {}).get(r["variant"]) or "ftbench", "dataset": r["dataset"], "gpu": r["gpu"],
                    "tokens/s at Qwen3-8B": r["tokens/s at Qwen3-8B"], "delta (nats)": delta,
                    "batch": r.get("speed batch") or 0, "mixed": bool(r.get("speed mixed")),
                    "low": lo if finite else delta, "high": hi if finite else delta,
                    "margin": r.get("margin (nats)"), "verdict": r["quality"] if served else
                    f"{r['quality (as trained)']} (as trained only)", "seen": "as served" if served else "as trained",
                    "baseline": bool(r.get("seed of the baseline")), "pairs": r.get("paired seeds") or 0,
                    "against": against.split(" (")[0], "stand_in": stand_in})
    # a technique judged on several GPU kinds is one point a dataset: against the baseline itself before a stand-in,
    # its verdict as served where one has it, then the one of most paired seeds
    best = {}
    for o in out:
        key, rank = (o["variant"], o["dataset"]), (not o["stand_in"], o["seen"] == "as served", o["pairs"])
        if key not in best or rank > best[key][0]:
            best[key] = (rank, o)
    out = [o for _, o in best.values()]
    for dataset in {o["dataset"] for o in out}:  # the frontier: keeps quality (or is the baseline), none faster as good
        keep = sorted((o for o in out if o["dataset"] == dataset and (o["verdict"] == KEEPS or o["baseline"])),
                      key=lambda o: -o["tokens/s at Qwen3-8B"])
        best = math.inf
        for o in keep:
            o["frontier"] = o["delta (nats)"] < best
            best = min(best, o["delta (nats)"])
    fastest_first = sorted({o["variant"]: o["tokens/s at Qwen3-8B"] for o in out}.items(), key=lambda kv: -kv[1])
    key = {v: str(i) for i, (v, _) in enumerate(fastest_first, 1)}  # a point's number in the figure, fastest 1
    return pl.DataFrame([{**{k: v for k, v in o.items() if k not in ("pairs", "stand_in")},
                          "frontier": o.get("frontier", False),
                          "key": key[o["variant"]]} for o in out], schema={
        "variant": pl.String, "name": pl.String, "peer": pl.String, "dataset": pl.String, "gpu": pl.String,
        "tokens/s at Qwen3-8B": pl.Float64, "delta (nats)": pl.Float64, "batch": pl.Int64, "mixed": pl.Boolean,
        "low": pl.Float64, "high": pl.Float64, "margin": pl.Float64, "verdict": pl.String, "seen": pl.String,
        "baseline": pl.Boolean, "against": pl.String, "frontier": pl.Boolean, "key": pl.String})


def speed_quality_key(frame: pl.DataFrame) -> str:
    """The figure's numbers in words: each technique's number, display name and real tokens/s, fastest first; the
    batch its speed was measured at where it is not the one most of them ran (a recipe that fit fewer rows), and
    where its speed is a mix of two phases' records (a bf16 tail: ftbench.judge.quality.with_tails)."""
    from ftbench.judge.analysis import _escape

    seen = frame.unique("variant", keep="first", maintain_order=True).sort("tokens/s at Qwen3-8B", descending=True)
    usual = seen["batch"].mode().sort()[0] if len(seen) else None
    return "; ".join(f"<b>{r['key']}</b> {_escape(r['name'])} ({r['tokens/s at Qwen3-8B']:,.0f}"
                     f"{'' if r['batch'] == usual else ' at batch ' + str(r['batch'])}"
                     f"{', a mix of its two phases' if r['mixed'] else ''})"
                     for r in seen.iter_rows(named=True))


def speed_quality_chart(frame: pl.DataFrame):
    """Speed against quality: each technique at its real tokens/s (Qwen3-8B, one GPU kind) and its held-out loss
    difference with its interval, numbered fastest first (`speed_quality_key` names them in words); the practical
    margin a band, the frontier of those that keep quality a line, the peers (Unsloth, Liger, NeMo AutoModel) their
    own shapes; a panel per dataset."""
    import altair as alt

    data = frame.with_columns((-pl.col("margin")).alias("margin low"),
                              pl.col("verdict").str.replace(r" \(as trained only\)$", "").alias("judged")).to_pandas()
    base = alt.Chart(data)
    x = alt.X("tokens/s at Qwen3-8B:Q", title="real tokens/s, Qwen3-8B (one GPU)", scale=alt.Scale(zero=False))
    y = alt.Y("delta (nats):Q", title=["held-out loss - the baseline's", "(or its stand-in's), nats"])
    band = base.mark_rect(color="#9bbf85", opacity=0.25).encode(y="min(margin low):Q", y2="max(margin):Q")
    zero = base.mark_rule(color="black", opacity=0.3).encode(y=alt.datum(0))
    frontier = base.transform_filter(alt.datum.frontier).mark_line(color="#4c9a2a", strokeWidth=2).encode(
        x=x, y=y, order="tokens/s at Qwen3-8B:Q")
    colour = alt.Color("judged:N", title="verdict", scale=alt.Scale(domain=list(COLOURS), range=list(COLOURS.values())),
                       legend=alt.Legend(labelLimit=400, orient="bottom"))
    bars = base.mark_rule().encode(x=x, y="low:Q", y2="high:Q", color=colour)
    points = base.mark_point(filled=True, size=80).encode(
        x=x, y=y, color=colour,
        shape=alt.Shape("peer:N", legend=alt.Legend(title="who", orient="bottom")),
        opacity=alt.Opacity("seen:N", scale=alt.Scale(domain=["as served", "as trained"], range=[1, 0.45]),
                            legend=alt.Legend(orient="bottom")),
        tooltip=["name", "variant", "gpu", "verdict", "seen", "against", alt.Tooltip("delta (nats):Q", format="+.4f"),
                 alt.Tooltip("low:Q", format="+.4f"), alt.Tooltip("high:Q", format="+.4f"),
                 alt.Tooltip("tokens/s at Qwen3-8B:Q", format=",.0f")])
    labels = base.mark_text(align="left", dx=5, dy=-7, fontSize=10, fontWeight="bold", color="#333").encode(
        x=x, y=y, text="key:N")
    return alt.layer(band, zero, bars, frontier, points, labels).properties(width=400, height=260).facet(
        column=alt.Column("dataset:N", title=None), title=alt.TitleParams(
            "Speed against quality", subtitle="band: the practical margin; bars: the 90 % interval of the paired "
                                              "differences; line: the frontier of those that keep quality"))


def speed_quality_line(frame: pl.DataFrame) -> str:
    """A sentence under the figure: the fastest technique that keeps quality as served on every dataset of the
    figure (one it has no verdict on holds it back, as the ladder's rule does), and the fastest overall, by their
    display names; with several datasets, a second: the fastest that keeps quality on each dataset alone (where one
    dataset holds a rung back, which one)."""
    if not len(frame):
        return "No technique has both a speed at Qwen3-8B's shapes and a quality verdict yet."
    by = {}
    for r in frame.iter_rows(named=True):
        by.setdefault(r["variant"], []).append(r)
    speed = {v: rs[0]["tokens/s at Qwen3-8B"] for v, rs in by.items()}
    name = {v: rs[0]["name"] for v, rs in by.items()}
    datasets = sorted({r["dataset"] for rs in by.values() for r in rs})
    # the datasets each technique keeps quality on (the baseline is the zero, not a technique)
    kept = {v: {r["dataset"] for r in rs if r["verdict"] == KEEPS} for v, rs in by.items() if not rs[0]["baseline"]}
    keeps = [v for v, on in kept.items() if on == set(datasets)]
    fastest = max(speed, key=speed.get)
    best = max(keeps, key=speed.get) if keeps else None
    said = (f"Fastest that keeps quality (as served, on every dataset): {name[best]} at {speed[best]:,.0f} "
            f"real tokens/s" if keeps else
            "No technique beyond the baseline with a speed at Qwen3-8B's shapes keeps quality as served on every "
            "dataset yet")
    alone = []  # where the datasets disagree: the fastest that keeps quality on each one alone
    for d in datasets if len(datasets) > 1 else []:
        mine = [v for v, on in kept.items() if d in on]
        top = max(mine, key=speed.get) if mine else None
        alone.append(f"{d}: {name[top]} at {speed[top]:,.0f}" if top else f"{d}: none beyond the baseline")
    return (f"{said}; fastest overall: {name[fastest]} at {speed[fastest]:,.0f} "
            f"({', '.join(sorted({r['verdict'] for r in by[fastest]}))})"
            + (f". Fastest that keeps quality on one dataset alone: {'; '.join(alone)}." if alone else "."))


def svg(chart) -> str:
    import vl_convert

    return vl_convert.vegalite_to_svg(chart.to_json())


SHOWN = ["variant", "techniques, in words", "gpu", "dataset", "judged against", "quality", "delta (nats)",
         "interval low", "interval high", "margin (nats)", "quality (as trained)", "delta as trained", "as trained low",
         "as trained high", "seeds", "paired seeds", "stands on", "delta from it", "compared at tokens",
         "held-out loss before", "held-out loss after", "tokens to quality (x baseline)",
         "longer arm: tokens to quality (x baseline)", "tokens/s at Qwen3-8B", "speed (x baseline)",
         "speed measured on", "time to quality (x baseline, projection)",
         "longer arm: time to quality (x baseline, projection)", "scored", "why"]


def verdict_table(rows: list[dict]) -> pl.DataFrame:
    df = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({c: [] for c in SHOWN})
    return df.select([c for c in SHOWN if c in df.columns]).with_columns(
        pl.col(pl.Float64).round(4))


def interval_text(mean, lo, hi, paired) -> str:
    """A paired difference as the tables read it: "+0.0016 [-0.0014, +0.0046]" (its interval from two seeds on)."""
    if mean is None:
        return ""
    return f"{mean:+.4f} [{lo:+.4f}, {hi:+.4f}]" if lo is not None and (paired or 0) > 1 else f"{mean:+.4f}"


# the page's verdict table: what a reader decides on, in a screen's width (results/quality/verdicts.csv has every
# column: the interval's ends, the rung stood on, the tokens compared at, the losses before and after, why)
ON_PAGE = ["name", "variant", "gpu", "dataset", "quality", "served: mean [90 % interval]", "margin (nats)",
           "quality (as trained)", "as trained: mean [90 % interval]", "paired seeds", "tokens/s at Qwen3-8B",
           "tokens to quality (x baseline)", "time to quality (x baseline, projection)"]


# the verdict, legend and claims tables in a screen's width: headers and cells wrap (an interval under its mean),
# long texts within 12-40 em
VERDICTS_STYLE = ("<style>#quality-verdicts th,#quality-verdicts td,#quality-claims th,#quality-claims td"
                  "{white-space:normal}#quality-verdicts td.text,#quality-claims td.text,#legend td.text"
                  "{min-width:12em;max-width:40em}</style>")


def page_table(table: pl.DataFrame, names: dict | None = None) -> pl.DataFrame:
    """The verdict table (`verdict_table`) as the quality page shows it: each technique by its display name (`names`)
    and code, each view's verdict beside its mean difference and interval in one cell, the margin, the seeds paired,
    the speed and the tokens to quality (`ON_PAGE`)."""
    if not len(table):
        return table
    rows = table.to_dicts()
    for r in rows:
        r["name"] = (names or {}).get(r["variant"], r["variant"])
        r["served: mean [90 % interval]"] = interval_text(r.get("delta (nats)"), r.get("interval low"),
                                                          r.get("interval high"), r.get("paired seeds"))
        r["as trained: mean [90 % interval]"] = interval_text(r.get("delta as trained"), r.get("as trained low"),
                                                              r.get("as trained high"), r.get("paired seeds"))
        if r.get("judged against") == r["variant"]:  # the baseline: the zero the others are read from
            r["served: mean [90 % interval]"] = r["as trained: mean [90 % interval]"] = "(the baseline)"
        # within the baseline's tokens, else on the longer arm (said), in one column each
        tokens, arm = r.get("tokens to quality (x baseline)"), r.get("longer arm: tokens to quality (x baseline)")
        r["tokens to quality (x baseline)"] = f"{tokens:.2f}x" if tokens is not None else \
            f"on its longer arm: {arm}" if arm else None
        time = r.get("time to quality (x baseline, projection)")
        arm_time = r.get("longer arm: time to quality (x baseline, projection)")
        r["time to quality (x baseline, projection)"] = f"{time:.2f}x" if time is not None else \
            f"{arm_time:.2f}x (longer arm)" if arm_time is not None else None
    df = pl.DataFrame(rows, infer_schema_length=None)
    return df.select([c for c in ON_PAGE if c in df.columns])


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


def fp8_error_table(check: dict) -> pl.DataFrame:
    """One shipped check's FP8 forms' per-GEMM relative error, a row a projection and GEMM, a column a form."""
    rows = check["rows"]
    df = pl.DataFrame(rows).with_columns(pl.col("rel_fro_error").round(5))
    return df.pivot(on="form", index=["model", "projection", "gemm", "reduction"], values="rel_fro_error")


def answer_tables(answers: list[dict], most: int | None = None, words: int | None = None) -> list[str]:
    """Held-out prompts answered before and after the baseline's fine-tune, a table a run that generated them; the
    first `most` prompts, each text cut to `words` words (the front page), else all of them whole."""
    from ftbench.judge.analysis import html_table

    def cut(texts):
        return [t if words is None or len(t.split()) <= words else " ".join(t.split()[:words]) + " …"
                for t in texts][:most]

    parts = []
    for a in answers:
        if not a.get("before"):
            continue
        n = len(a["prompts"])
        table = pl.DataFrame({"held-out prompt": cut(a["prompts"]), "before fine-tuning": cut(a["before"]),
                              "after fine-tuning": cut(a["after"] or ["(no fine-tuned model)"] * n),
                              "held-out answer": cut(a.get("references") or [""] * n)})
        parts.append("<p>Held-out prompts (never trained on) answered before and after the baseline's fine-tune:</p>")
        parts.append(html_table(table, "quality-answers"))
    return parts[:2] if most else parts


PAGE = "results/quality/quality.html"


def learned(rows: list[dict]) -> list[str]:
    """The baseline's held-out loss before and after, a line a GPU and dataset where the baseline itself ran (not where
    a stand-in took its place: ftbench.judge.quality.reference_of)."""
    from ftbench.judge.analysis import _escape

    parts = []
    base = [r for r in rows if r["seed of the baseline"] and r["held-out loss before"] is not None
            and not by_stand_in(r)]
    for gpu, dataset in dict.fromkeys((r["gpu"], r["dataset"]) for r in base):
        mine = [r for r in base if (r["gpu"], r["dataset"]) == (gpu, dataset)]
        before = statistics.fmean(r["held-out loss before"] for r in mine)
        after = statistics.fmean(r["held-out loss after"] for r in mine)
        parts.append(f"<p><b>On {_escape(gpu)}: held-out loss {before:.3f} before fine-tuning, {after:.3f} after "
                     f"{statistics.fmean(r['tokens trained'] for r in mine):,.0f} label tokens</b> "
                     f"({_escape(dataset)}; bf16 LoRA, mean of {len(mine)} seed(s); lower by {before - after:.2f} "
                     f"nats; scored on {_escape(mine[0]['scored'])}).</p>")
    return parts


def front_fragment(rows: list[dict], claims: list[dict], chart_svg: str, answers: list[dict], origin: str,
                   fp8_errors: list[dict] | None = None, full: bool = True, names: dict | None = None,
                   peers: dict | None = None, front_curves: str | None = None, legend: tuple | None = None) -> str:
    """The report's front page (`full` false) answers two questions, each with a figure: what is fastest while
    keeping quality (speed against quality and one sentence), and what the real fine-tune learned (held-out loss
    before and after, the baseline's curves (`front_curves`, else every curve: `chart_svg`), two held-out prompts
    answered before and after), the quality page one click away.
    The quality page (`full`) adds the verdict table (each technique by its display name, `names`, and its code)
    with its variants' legend (`legend`: ftbench.judge.analysis.legend_block's), the published claims, every prompt
    and the FP8 GEMM errors."""
    from ftbench.judge.analysis import _escape, html_table, report_link

    frame = speed_quality_frame(rows, names, peers)
    speed = ([svg(speed_quality_chart(frame)), f"<p>{speed_quality_key(frame)}.</p>"] if len(frame) else []) \
        + [f"<p><b>{_escape(speed_quality_line(frame))}</b></p>"]
    if not full:
        return "\n".join([
            "<h3>What is fastest while keeping quality?</h3>", *speed,
            f"<p>Each technique's verdict, interval and margin: {report_link(PAGE, 'the quality verdicts')}.</p>",
            "<h3>What did the real fine-tune learn?</h3>", *learned(rows), front_curves or chart_svg,
            *answer_tables(answers, most=2, words=40),
            f"<details><summary>Where the model and the text come from</summary><p>{_escape(origin)}</p></details>"])
    parts = ["<h2>Speed that keeps quality: a real fine-tune</h2>", f"<p>{_escape(origin)}</p>", *learned(rows),
             *speed, chart_svg]
    parts.append("<p>A row a technique (its runs under every seed carry the same verdict: results/quality/"
                 "verdicts.csv has each, with every column: the rung it stands on, the tokens compared at, the "
                 "losses before and after, why). The verdict reads the adapters as served on the bf16 base; as "
                 "trained beside it. Scored on the text to be learned only; the mean difference from the baseline, "
                 "its 90 % interval and the margin in nats.</p>")
    table = verdict_table([r for r in rows if r.get("technique", r["variant"]) == r["variant"]])
    parts.append(VERDICTS_STYLE + html_table(page_table(table, names), "quality-verdicts"))
    if legend:  # what each variant of the table is, in words
        heading, frame, table_id = legend
        parts.append(f"<p>{heading}:</p>" + html_table(frame, table_id))
    if claims:
        parts.append("<p>The published quality claims, read from the verdicts:</p>")
        parts.append(html_table(pl.DataFrame(claims), "quality-claims"))
    parts += answer_tables(answers)
    for c in fp8_errors or []:  # each shipped check: synthetic operands at both models' shapes, real activations
        parts.append(f"<p>Each FP8 form's GEMM error against fp32 (relative Frobenius), measured on {c['device']} "
                     f"(torch {c['torch']}; bench/fp8_gemm_error.py). {_escape(c['method'])}</p>")
        parts.append(html_table(fp8_error_table(c), "fp8-gemm-error"))
    return "\n".join(parts)
