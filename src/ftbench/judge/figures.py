"""Figures (altair), saved as SVG through vl-convert, so the report needs no chart library online."""

from __future__ import annotations

import altair as alt
import polars as pl


def metric_vs_batch(df: pl.DataFrame, column: str, title: str, y_title: str) -> alt.Chart:
    """One line per variant against batch size; a row of panels per model, scale and GPU (runs merged from other
    machines get their own rows), a column per dataset; failed runs drop out."""
    from ftbench.judge.analysis import natural_key

    ok = df.filter((pl.col("status") == "ok") & pl.col(column).is_not_null())
    order = ok.select(pl.col("variant").unique()).sort(natural_key(pl.col("variant")))["variant"].to_list()
    # 20 distinct colours (variants beyond 20 repeat with a distinct point shape), names never cut
    color = alt.Color("variant:N", sort=order, scale=alt.Scale(scheme="tableau20"),
                      legend=alt.Legend(labelLimit=400, columns=1 + len(order) // 16))
    data = ok.select("dataset", "variant", "gpu", "batch_size", pl.col(column).alias("value"),
                     pl.format("{} ({}) on {}", "model", "scale", "gpu").alias("run on")).to_pandas()
    tooltip = ["run on", "dataset", "variant", "batch_size", alt.Tooltip("value:Q", format=".4g")]
    if data["batch_size"].nunique() == 1:  # one batch size: compare the variants side by side
        chart = alt.Chart(data).mark_bar().encode(
            x=alt.X("variant:N", sort=order, axis=alt.Axis(labelAngle=-40, labelLimit=300)),
            y=alt.Y("value:Q", title=y_title), color=color.legend(None), tooltip=tooltip
        ).properties(width=max(320, 22 * len(order)), height=200)
    else:
        chart = alt.Chart(data).mark_line(point=True).encode(
            x=alt.X("batch_size:O", title="batch size", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("value:Q", title=y_title), color=color, shape=alt.Shape("variant:N", sort=order, legend=None),
            tooltip=tooltip).properties(width=260, height=180)
    return chart.facet(row=alt.Row("run on:N", title=None, header=alt.Header(labelLimit=600, labelAngle=0,
                                                                             labelAlign="left")),
                       column=alt.Column("dataset:N"), title=title).resolve_scale(y="independent", x="independent")


def token_histogram(rows: list[dict]) -> alt.Chart:
    """Tokens per sample per dataset and measure: the four statistics as side-by-side labelled bars, one
    panel per dataset and measure (each with its own scale: text and image tokens differ tenfold)."""
    data = pl.DataFrame(rows).with_columns(
        panel=pl.format("{} · {}", "dataset", pl.col("measure").str.replace_all("_", " ")),
        statistic=pl.col("statistic").replace({"mean_truncated": "mean after truncation"})).to_pandas()
    order = ["mean", "median", "p95", "mean after truncation"]
    base = alt.Chart(data).encode(
        x=alt.X("statistic:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30, labelLimit=200)),
        y=alt.Y("value:Q", title="tokens per sample"),
        tooltip=["dataset", "model", "measure", "statistic", alt.Tooltip("value:Q", format=".1f")])
    bars = base.mark_bar(size=28).encode(color=alt.Color("statistic:N", sort=order, legend=None))
    labels = base.mark_text(dy=-6, fontSize=10).encode(text=alt.Text("value:Q", format=",.0f"))
    return (bars + labels).properties(width=170, height=160).facet(
        facet=alt.Facet("panel:N", title=None, header=alt.Header(labelLimit=400)), columns=4,
        title="Tokens per sample (each model's tokenizer; image tokens as the LLaVA-NeXT processor expands them)"
    ).resolve_scale(y="independent")


def worker_curve(df: pl.DataFrame) -> alt.Chart:
    """Step time against data-loader workers, ours and the published sweep."""
    return alt.Chart(df.to_pandas(), title="Step time vs data-loader workers").mark_line(point=True).encode(
        x=alt.X("workers:O", axis=alt.Axis(labelAngle=0)), y=alt.Y("ms/step:Q", title="ms per step"),
        color="source:N", tooltip=["source", "workers", alt.Tooltip("ms/step:Q", format=".1f")]
    ).properties(width=360, height=220)


def gpu_bars(df: pl.DataFrame) -> alt.Chart:
    """Samples per hour of each run on each GPU kind, bars side by side (one colour per GPU); a run that did not
    train on a GPU shows its status (e.g. oom) where its bar would be. Columns: run, gpu, samples/h, status."""
    data = df.with_columns(label=pl.when(pl.col("status") != "ok").then(pl.col("status"))).to_pandas()
    base = alt.Chart(data).encode(
        x=alt.X("run:N", title=None, sort=None, axis=alt.Axis(labelAngle=-30, labelLimit=400)),
        xOffset=alt.XOffset("gpu:N"), color=alt.Color("gpu:N", title="GPU", legend=alt.Legend(labelLimit=400)),
        tooltip=["run", "gpu", "status", alt.Tooltip("samples/h:Q", format=",.0f")])
    bars = base.mark_bar().encode(y=alt.Y("samples/h:Q", title="samples / hour"))
    status = base.mark_text(angle=270, align="left", dy=0, fontSize=11).encode(y=alt.datum(0), text="label:N")
    return (bars + status).properties(width=max(300, 70 * data["run"].nunique()), height=220,
                                      title="The same runs on each GPU kind")


VERDICT_COLOURS = {"holds": "#4c9a2a", "differs": "#e07b39", "inconclusive": "#d9c34a", "not comparable": "#8fa9c7",
                   "not measured": "#e4e4e4"}


def verdict_grid(cells: pl.DataFrame, title: str, names: dict | None = None) -> alt.Chart:
    """A study's published cells as a grid, each coloured by its verdict, ours (bold) above the published figure:
    Study A's by variant and batch size with the ratios to bf16, another study's a row a claim (what varies among
    its model, dataset, variant and batch) and a column a metric where it has several. `names`: variants' display
    names (ftbench.config.techniques.display_names); the code where none. Columns: study, model, dataset, variant, batch,
    verdict, status, how, ours, published (Study A: ratio, published x)."""
    names = names or {}
    cells = cells.with_columns(pl.col("variant").replace_strict(names, default=pl.col("variant")).alias("name"))
    if set(cells["study"]) == {"A"}:
        return study_a_grid(cells)
    return _claims_grid(cells, title)


def _short(text: str | None, most: int = 26) -> str:
    text = (text or "").strip() or "–"
    return text if len(text) <= most else text[:most - 1] + "…"


def _claims_grid(cells: pl.DataFrame, title: str) -> alt.Chart:
    from ftbench.judge.verdicts import VERDICTS

    varies = [c for c in ("model", "dataset", "name", "batch") if cells[c].cast(pl.String).n_unique() > 1]
    by_metric = cells["metric"].n_unique() > 1
    rows = [r for r in cells.iter_rows(named=True)]

    def said(r, c):  # a part of a claim's label, or nothing where the study does not state it
        v = r[c]
        return None if v is None or str(v) in ("–", "(not stated)") else f"batch {v}" if c == "batch" else str(v)

    data = pl.DataFrame({
        "claim": [" · ".join(filter(None, (said(r, c) for c in varies))) or str(r["name"]) for r in rows],
        "metric": [r["metric"] if by_metric else "" for r in rows],
        "verdict": [r["verdict"] for r in rows], "how": [r["how"] or "" for r in rows],
        "variant": [r["variant"] for r in rows],
        "ours": [_short(r["ours"]) for r in rows], "pub": ["pub " + _short(r["published"], 22) for r in rows],
    }).to_pandas()
    order = list(dict.fromkeys(data["claim"]))
    base = alt.Chart(data).encode(
        x=alt.X("metric:N", title=None, axis=alt.Axis(labelAngle=0, orient="top", labelLimit=205)),
        y=alt.Y("claim:N", sort=order, title=None, axis=alt.Axis(labelLimit=320)))
    cells_ = base.mark_rect(stroke="white", strokeWidth=2).encode(
        color=alt.Color("verdict:N", scale=alt.Scale(domain=list(VERDICTS), range=[VERDICT_COLOURS[v] for v in VERDICTS]),
                        legend=alt.Legend(title="verdict", orient="bottom")),
        tooltip=["claim", "variant", "metric", "verdict", "how", "ours", "pub"])
    ours = base.mark_text(dy=-6, fontSize=11, fontWeight="bold").encode(text="ours:N")
    pub = base.mark_text(dy=8, fontSize=10, color="#333").encode(text="pub:N")
    return (cells_ + ours + pub).properties(
        width=210 * max(1, data["metric"].nunique()), height=len(order) * 40,
        padding={"left": 60, "top": 5, "right": 5, "bottom": 5},
        title=alt.TitleParams(title, subtitle="ours (bold) above the published figure; colour: the verdict"))


def study_a_grid(cells: pl.DataFrame) -> alt.Chart:
    """Study A's published cells as a grid, variant by batch size, each coloured by its verdict, with our ratio to
    bf16 and the published one written in it. Columns: variant, batch, verdict, ratio, published x, status; `name`
    (the variant's display name) where given."""
    from ftbench.judge.verdicts import VERDICTS

    if "name" not in cells.columns:
        cells = cells.with_columns(pl.col("variant").alias("name"))
    order = list(dict.fromkeys(cells["name"].to_list()))
    data = cells.select(
        "variant", "name", pl.col("batch").cast(pl.Int64), "verdict", "status", "how",
        pl.when(pl.col("ratio").is_not_null()).then(pl.format("ours x{}", pl.col("ratio").round(2)))
        .when(pl.col("status") == "timeout").then(pl.lit("timeout"))
        .when(pl.col("status") == "oom").then(pl.lit("oom"))
        .when(pl.col("verdict") == "not measured").then(pl.lit("–"))
        .when(pl.col("variant") == "bf16").then(pl.lit("baseline"))
        .otherwise(pl.lit("no bf16 there")).alias("ours"),
        pl.format("pub x{}", pl.col("published x")).fill_null("").alias("pub")).to_pandas()
    base = alt.Chart(data).encode(
        x=alt.X("batch:O", title="batch size", axis=alt.Axis(labelAngle=0, orient="top")),
        y=alt.Y("name:N", sort=order, title=None, axis=alt.Axis(labelLimit=360)))
    cells_ = base.mark_rect(stroke="white", strokeWidth=2).encode(
        color=alt.Color("verdict:N", scale=alt.Scale(domain=list(VERDICTS), range=[VERDICT_COLOURS[v] for v in VERDICTS]),
                        legend=alt.Legend(title="verdict", orient="bottom")),
        tooltip=["name", "variant", "batch", "verdict", "how", "ours", "pub", "status"])
    ours = base.mark_text(dy=-6, fontSize=11, fontWeight="bold").encode(text="ours:N")
    pub = base.mark_text(dy=8, fontSize=10, color="#333").encode(text="pub:N")
    return (cells_ + ours + pub).properties(
        width=6 * 92, height=len(order) * 40, padding={"left": 40, "top": 5, "right": 5, "bottom": 5},
        title=alt.TitleParams("Study A: step time against bf16 of the same batch and GPU",
                              subtitle="ours (bold) above the published range; colour: the verdict"))


def svg_string(chart: alt.Chart) -> str:
    import vl_convert as vlc

    return vlc.vegalite_to_svg(chart.to_json())


def save_svg(chart: alt.Chart, path) -> None:
    with open(path, "w") as f:
        f.write(svg_string(chart))
