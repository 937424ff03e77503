"""Aggregation: every run's metrics.json into one tidy table (polars)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from ftbench.config.settings import merged_profile_summaries
from ftbench.harness.gpus import folder_machines, machine_named
from ftbench.core.records import new_record_from_template, read_record, short_host_changes
from ftbench.harness.source import short_code
from ftbench.config.techniques import legend, record_knobs

KEY = ["study", "model", "scale", "dataset", "variant", "batch_size", "gpu"]


def _mean_of(rows: list, key: str) -> float | None:
    """The mean of `key` over `rows` (None when any row lacks it, or there is none)."""
    values = [r.get(key) for r in rows]
    return None if not values or None in values else sum(values) / len(values)


def flatten(record: dict) -> dict:
    """One row per run (schema 2): nested groups become `group.field` columns; provenance keeps a few fields."""
    row = {k: record["run"][k] for k in ("study", "model", "scale", "dataset", "variant", "batch_size")}
    prov = record.get("provenance", {})
    dev = prov.get("device", {})
    row.update(status=record["status"], reason=record["reason"],
               gpu=gpu_name(dev.get("name")) if dev.get("type") == "cuda" else "cpu",
               device_type=dev.get("type"), gpu_uuid=dev.get("uuid"), driver=dev.get("driver"), cuda=dev.get("cuda"),
               machine=prov.get("machine"),
               weights_source=prov.get("weights_source"), data_source=prov.get("data_source"),
               git_commit=prov.get("git_commit"), code=short_code(prov), config_hash=prov.get("config_hash"),
               source_digest=prov.get("source_digest") or prov.get("git_commit"),
               torch=prov.get("versions", {}).get("torch"), schema_version=record["schema_version"],
               timestamp=prov.get("timestamp"),
               gpu_memory_gib=dev.get("total_memory_gib") if dev.get("type") == "cuda" else None,
               gpu_sm_clock_max_mhz=dev.get("sm_clock_max_mhz"), gpu_power_limit_w=dev.get("power_limit_w"))
    for group in ("timing", "throughput", "memory", "device_usage", "energy", "flops", "compile", "loss", "data",
                  "precision", "outliers", "measure"):
        for k, v in record[group].items():
            if not isinstance(v, (list, dict)):
                row[f"{group}.{k}"] = v
    model = record["model"]
    peer = (record.get("extra") or {}).get("peer") or {}  # another system's run and the settings it ran with
    row["peer.system"], row["peer.version"] = peer.get("system"), peer.get("version")
    row["peer.settings"] = json.dumps(peer["settings"], sort_keys=True) if peer.get("settings") else None
    row["model.build"] = (model.get("build") or {}).get("method")
    row["model.trainable_parameters"] = model["trainable_parameters"]
    row["model.parameters"] = model["parameters"]
    adapted = model.get("adapted_modules") or {}
    row["model.adapted_modules"] = ",".join(adapted.get("names", [])) or None
    par = record.get("parallel") or {}
    row.update({"parallel.strategy": par.get("strategy") or record["variant"].get("parallel"),
                "parallel.world_size": par.get("world_size") or record["variant"].get("gpus") or 1,
                "parallel.samples_per_s_per_gpu": par.get("samples_per_s_per_gpu"),
                "parallel.peak_allocated_gib_max": par.get("peak_allocated_gib_max"),
                # the ranks' mean SM clock (records before 2026-11-26's thirteenth session: None; rank 0's is
                # device_usage's)
                "parallel.sm_clock_mean_mhz": _mean_of(par.get("per_rank") or [], "sm_clock_mean_mhz"),
                # the largest rank's host memory (a lone run's own), and the seconds from the job's start to its
                # first training step (build, wrap, compile's first graph)
                "parallel.host_peak_rss_gib_max": max((r.get("host_peak_rss_gib") or 0 for r in par.get("per_rank")
                                                       or []), default=None) or record["memory"].get("host_peak_rss_gib"),
                "extra.time_to_first_step_s": (record.get("extra") or {}).get("time_to_first_step_s")})
    # every knob the run recorded (token_budget: batch = rows of this many tokens; a knob newer than the record is
    # absent: its default, ftbench.core.knobs.DEFAULTS)
    row.update({f"variant.{k}": v for k, v in record["variant"].items()
                if k != "name" and not isinstance(v, (list, dict))})
    for k in ("gradient_checkpointing", "compile", "token_budget"):
        row.setdefault(f"variant.{k}", None)
    row["variant.padding_free"] = bool(record["variant"].get("padding_free"))  # a batch packed into one row
    row["extra.image_tokens_per_sample"] = record.get("extra", {}).get("image_tokens_per_sample")
    row["extra.host_changes"] = short_host_changes(record.get("extra", {}).get("host_changes"))
    row["extra.teardown"] = (record.get("extra") or {}).get("teardown")
    row["extra.shapes_measured"] = (record.get("extra") or {}).get("shapes_measured")
    row["extra.new_shapes_measured"] = (record.get("extra") or {}).get("new_shapes_measured")
    row["extra.gradient_accumulation_steps"] = record.get("extra", {}).get("gradient_accumulation_steps") or 1
    # the quality study's held-out curve (ftbench.data.heldout) as JSON text, and a GGUF model's origin
    held_out = (record.get("loss") or {}).get("held_out")
    row["loss.held_out"] = json.dumps(held_out) if held_out else None
    gguf = model.get("gguf") or {}
    row["model.gguf"] = f"{gguf.get('file')} ({gguf.get('quantization')}, sha256 {gguf.get('sha256', '')[:12]})" \
        if gguf else None
    return row


# the names published tables use for what a device reports: the SXM5 H100 reports "H100 80GB HBM3" (the PCIe
# card "H100 PCIe", the NVL "H100 NVL"), the workstation Blackwell "RTX PRO 6000 Blackwell Max-Q Workstation Edition"
GPU_KEYS = {"H100 80GB HBM3": "H100 SXM5",
            "RTX PRO 6000 Blackwell Max-Q Workstation Edition": "RTX PRO 6000 Blackwell Max-Q"}


def gpu_name(name: str | None) -> str | None:
    """One key per GPU model, as published tables name it: NVIDIA's prefix dropped, then GPU_KEYS
    ("NVIDIA H100 80GB HBM3" -> "H100 SXM5"), so our runs and the published rows of one GPU share a key."""
    if not name:
        return name
    short = name.removeprefix("NVIDIA ").strip()
    return GPU_KEYS.get(short, short)


def peak_memory() -> pl.Expr:
    """Peak reserved device memory where a GPU ran, the host's peak RSS on a CPU (GiB)."""
    return pl.coalesce("memory.peak_reserved_gib", "memory.host_peak_rss_gib")


def code_of(row: dict, suffix: str = "") -> str | None:
    """The code a run ran (column `source_digest`, the commit for records older than digests; `suffix`: a joined
    row's other side): two runs are of the same code when these are equal."""
    return row.get(f"source_digest{suffix}") or row.get(f"git_commit{suffix}")


def full_scale(df: pl.DataFrame) -> pl.DataFrame:
    """The records that may fill a published cell: full scale, on a CUDA GPU."""
    if df.is_empty() or "device_type" not in df.columns:
        return df.clear()
    return df.filter((pl.col("scale") == "full") & (pl.col("device_type") == "cuda"))


def median_step_samples_per_hour() -> pl.Expr:
    """Samples per hour at the median step time: what a run gives once one-off per-shape costs are paid."""
    return 3600 * pl.col("batch_size") / pl.col("timing.step_time_s")


NUMERIC_GROUPS = ("timing.", "throughput.", "memory.", "device_usage.", "energy.", "flops.", "loss.", "data.",
                  "compile.", "model.parameters", "model.trainable_parameters", "outliers.count", "outliers.time",
                  "parallel.world_size", "parallel.samples_per_s_per_gpu", "parallel.peak_allocated_gib_max",
                  "parallel.sm_clock_mean_mhz", "parallel.host_peak_rss_gib_max", "extra.time_to_first_step_s",
                  "gpu_memory_gib")


def typed(df: pl.DataFrame) -> pl.DataFrame:
    """Numeric columns stay numeric when no run filled them (every run crashed, or ran on a CPU)."""
    return df.with_columns(pl.col(c).cast(pl.Float64) for c, t in df.schema.items()
                           if t == pl.Null and c.startswith(NUMERIC_GROUPS))


def read_runs(path) -> pl.DataFrame:
    """Runs measured elsewhere: a runs.parquet table, one metrics.json, or a folder searched for metrics.json (or such
    runs already read: a table, as it is). Records of runs with a fault injected (`extra.fault_injected`: tests of
    the supervisor on a lent host) are left out."""
    if isinstance(path, pl.DataFrame):
        return path
    path = Path(path)
    if path.suffix == ".parquet":
        return pl.read_parquet(path)
    files = sorted(path.rglob("metrics.json")) if path.is_dir() else [path]
    records = [read_record(f) for f in files]
    rows = [flatten(r) for r in records if not (r.get("extra") or {}).get("fault_injected")]
    if path.is_dir():
        named = folder_machines(path)
        for row in rows:
            row["machine"] = machine_named(row["machine"], row["gpu_uuid"], named) or named[""]
    return typed(pl.DataFrame(rows, infer_schema_length=None))


PROFILE_COLUMNS = ("profile.busy_pct", "profile.cpu_bound", "profile.idle_cause", "profile.data_loading_share",
                   "profile.kernels_per_step", "profile.idle_gaps_per_step", "profile.gemm_share",
                   "profile.fp8_work_share", "profile.dequant_4bit_share", "profile.kernel_ms_per_step",
                   "profile.attention_share", "profile.attention_backend", "profile.attention_exact")


def idle_cause(summary: dict) -> str | None:
    """Where a profile's idle device time goes, in a phrase: the host operator through the longest idle gaps where
    gaps of 10 ms or more hold most of it, else the short gaps between kernels (launch and Python overhead)."""
    steps = summary.get("per_step") or []
    idle = sum(st["idle_gap_ms_total"] for st in steps)
    if summary.get("device") != "cuda" or not idle:
        return None
    causes = summary.get("idle_causes") or []
    long_ = sum(c["idle_ms"] for c in causes)
    if long_ > idle - long_:
        return f"{causes[0]['host_op']} ({causes[0]['idle_ms']:.0f} of {idle:.0f} ms idle)"
    return (f"{sum(st['idle_gaps'] for st in steps)} gaps between kernels, most under 10 ms ({idle - long_:.0f} of "
            f"{idle:.0f} ms idle): launch and Python overhead")


def _per_step(summary: dict, key: str) -> float | None:
    """A count's mean over a profile's steps (None where the summary predates it)."""
    values = [st.get(key) for st in summary.get("per_step") or []]
    return sum(values) / len(values) if values and None not in values else None


def kernel_shares(summary: dict) -> dict:
    """The FP8 casts' and bitsandbytes' 4-bit dequantization's shares of kernel time. Summaries written before the
    two were told apart (no `dequant_4bit_share`) counted the dequantization kernels as FP8 work and missed torchao's
    casts fused by Inductor: on read, their top operators correct both (lower bounds: only the top kernels are
    listed)."""
    fp8, nf4 = summary.get("fp8_work_share"), summary.get("dequant_4bit_share")
    if fp8 is not None and nf4 is None and summary.get("device") == "cuda":
        from ftbench.harness.kernels import FP8_WORK_NAME_BEFORE, is_dequant_4bit, is_fp8_work

        tops = [(o.get("name", ""), o.get("share") or 0.0) for o in summary.get("top_operators") or []]
        nf4 = sum(share for name, share in tops if is_dequant_4bit(name))
        # and torchao's casts fused by Inductor, which the old names missed
        fused = sum(share for name, share in tops if is_fp8_work(name) and not FP8_WORK_NAME_BEFORE.search(name))
        fp8 = max(fp8 - nf4, 0.0) + fused
    return {"profile.fp8_work_share": fp8, "profile.dequant_4bit_share": nf4}


def kernel_time(summary: dict) -> dict:
    """The device's kernel time per profiled step, attention's share of it and the attention implementation that
    ran most of it. Summaries written before these were counted give them from their top operators (each top
    operator's share is of the same summed time, so the kernel time is exact; attention's share is a lower bound)."""
    from ftbench.harness.kernels import by_attention_backend

    ms, shares = summary.get("kernel_ms_per_step"), summary.get("attention_shares")
    tops = [o for o in summary.get("top_operators") or [] if o.get("share")]
    if summary.get("device") != "cuda":
        return {"profile.kernel_ms_per_step": None, "profile.attention_share": None, "profile.attention_backend": None,
                "profile.attention_exact": None}
    if ms is None and tops and summary.get("steps"):
        ms = tops[0]["self_time_ms"] / tops[0]["share"] / summary["steps"]
    exact = shares is not None
    if shares is None:
        shares = by_attention_backend((o["name"], o["share"]) for o in tops)
    return {"profile.kernel_ms_per_step": ms, "profile.attention_share": sum(shares.values()) if shares else None,
            "profile.attention_backend": max(shares, key=shares.get) if shares else None,
            "profile.attention_exact": exact}


def profile_rows(summaries) -> pl.DataFrame:
    """Profile summaries (results/profiles/.../summary.json, or a merged folder's profiles/) as rows keyed like the
    runs: the trace's GPU busy share, whether it reads host-bound, and the host operator through the longest idle
    time. A profile of the same run on the same GPU kind describes it wherever either was measured."""
    rows = []
    for path in summaries:
        s = json.loads(Path(path).read_text())
        if s.get("status") != "ok" or s.get("busy_share") is None:
            continue
        rows.append({**{k: s["run"][k] for k in KEY[:-1]},
                     "gpu": gpu_name(s.get("gpu")) if s.get("device") == "cuda" else "cpu",
                     "profile.busy_pct": 100 * s["busy_share"], "profile.cpu_bound": s.get("cpu_bound"),
                     "profile.idle_cause": idle_cause(s), "profile.data_loading_share": s.get("data_loading_share"),
                     "profile.kernels_per_step": _per_step(s, "kernels"),
                     "profile.idle_gaps_per_step": _per_step(s, "idle_gaps"),
                     "profile.gemm_share": s.get("gemm_share"), **kernel_shares(s), **kernel_time(s)})
    schema = {**{k: pl.String for k in KEY}, "batch_size": pl.Int64, "profile.busy_pct": pl.Float64,
              "profile.cpu_bound": pl.Boolean, "profile.idle_cause": pl.String,
              "profile.data_loading_share": pl.Float64, "profile.kernels_per_step": pl.Float64,
              "profile.idle_gaps_per_step": pl.Float64, "profile.gemm_share": pl.Float64,
              "profile.fp8_work_share": pl.Float64, "profile.dequant_4bit_share": pl.Float64,
              "profile.kernel_ms_per_step": pl.Float64, "profile.attention_share": pl.Float64,
              "profile.attention_backend": pl.String, "profile.attention_exact": pl.Boolean}
    return pl.DataFrame(rows, schema=schema).unique(subset=KEY, keep="last", maintain_order=True)


def oldest_first(df: pl.DataFrame) -> pl.DataFrame:
    """Merged records in the order they were measured (their `timestamp`; rows without one first), so that of the
    same run the latest copy comes last and wins: folder names do not order leases (`h100x4-2026-11-26-f` sorts
    after `h100-2026-11-26-e`, measured hours later)."""
    if "timestamp" not in df.columns or df.is_empty():
        return df
    return df.sort("timestamp", nulls_last=False, maintain_order=True)


def aggregate(paths, extra_tables=(), study: str | None = None, profiles=(), with_replaced: bool = False):
    """All runs, plus runs from other machines (tables, records or folders of records, or runs already read; their
    rows of `study` only); a run's GPU is part of its key, so the same run measured on two GPUs stays two rows, and a run
    measured here replaces the same run of a merged table. Profiles (`profile_rows`: the given summaries and every
    merged folder's profiles/) join their runs by key. `with_replaced`: also the runs a later copy of the same run
    replaced (another lease's measurement of it), as a second table: what each lease measured beside its peers
    (compare.frontier reads a peer against the top rung of its own lease from them)."""
    rows = [flatten(read_record(p)) for p in paths]
    merged = []
    for t in extra_tables:
        other = read_runs(t)
        if study is not None and len(other):
            other = other.filter(pl.col("study") == study)
        merged.append(other)
    # merged records oldest first, then ours: the same run keeps its last copy (the latest measured, ours above all)
    merged = [oldest_first(pl.concat(merged, how="diagonal_relaxed"))] if merged else []
    df = pl.concat([*merged, typed(pl.DataFrame(rows, infer_schema_length=None))], how="diagonal_relaxed")
    # tables merged from older versions lack the columns added since: every column a record gives is there
    df = typed(df.with_columns(pl.lit(None).alias(c) for c in RECORD_COLUMNS if c not in df.columns))
    indexed = df.with_row_index("_row")
    kept = indexed.unique(subset=KEY, keep="last", maintain_order=True)
    replaced = indexed.join(kept.select("_row"), on="_row", how="anti").drop("_row")
    df = kept.drop("_row")
    merged = [s for t in extra_tables if not isinstance(t, pl.DataFrame) and Path(t).is_dir()
              for s in merged_profile_summaries(t)]
    prof = profile_rows([*merged, *profiles])
    df = df.drop([c for c in PROFILE_COLUMNS if c in df.columns]).join(
        prof.with_columns(pl.col("batch_size").cast(df.schema["batch_size"])), on=KEY, how="left")
    df = df.sort([natural_key(pl.col(k)) if df.schema[k] == pl.String else pl.col(k) for k in KEY])
    return (df, replaced) if with_replaced else df


RECORD_COLUMNS = tuple(flatten(new_record_from_template({}, {})))


def natural_key(col: pl.Expr) -> pl.Expr:
    """Sort text with its numbers as numbers: workers-2 before workers-12."""
    return col.str.replace_all(r"(\d+)", "0000000000$1").str.replace_all(r"0*(\d{10})", "$1")


TABLE_COLUMNS = {
    "study": "study", "model": "model", "scale": "scale", "dataset": "dataset", "variant": "variant",
    "batch_size": "batch", "gpu": "GPU", "status": "status", "timing.step_time_s": "step s (median)",
    "timing.step_time_p10_s": "p10", "timing.step_time_p90_s": "p90", "timing.steps_measured": "steps",
    "timing.noise_cv": "noise CV", "timing.cv_within": "CV within", "timing.cv_across_repeats": "CV across repeats",
    "timing.cv_median_across_repeats": "CV of window medians",
    "outliers.dominated": "outlier-dominated", "timing.first_step_s": "first step s", "compile.compile_s": "compile s",
    "timing.model_load_s": "load s", "timing.host_cpu_step_s": "host CPU s/step",
    "throughput.samples_per_hour": "samples/h", "throughput.tokens_per_s": "tokens/s",
    "memory.peak_allocated_gib": "peak alloc GiB", "memory.peak_reserved_gib": "peak reserved GiB",
    "memory.device_peak_used_gib": "NVML peak GiB", "memory.process_peak_used_gib": "process GiB",
    "memory.host_peak_rss_gib": "host RSS GiB", "memory.alloc_retries": "allocator retries",
    "device_usage.gpu_util_mean_pct": "GPU util %", "energy.per_step_j": "J/step", "energy.per_sample_j": "J/sample",
    "data.wait_share": "data wait %", "precision.gemm": "GEMM dtype",
    "extra.host_changes": "changed by host", "extra.teardown": "failed after its record",
    "flops.mfu": "MFU %", "flops.hfu": "HFU %", "loss.eval": "eval loss", "variant.gradient_checkpointing": "grad ckpt",
    "compile.recompiles": "recompiles", "compile.backend": "compile backend", "compile.graph_breaks": "graph breaks",
    "extra.image_tokens_per_sample": "image tokens/sample", "extra.shapes_measured": "shapes in the windows",
    "extra.new_shapes_measured": "new shapes in the windows", "weights_source": "weights", "code": "code that ran", "reason": "reason",
}


def named_columns(df: pl.DataFrame, names: dict) -> pl.DataFrame:
    """The columns of `names` that `df` has, in that order, renamed to their names; a column whose name ends in
    "%" holds a share (0-1) and is shown in percent."""
    cols = [c for c in names if c in df.columns]
    percent = [c for c in cols if names[c].endswith("%") and df.schema[c].is_numeric()]
    return df.with_columns([pl.col(c) * 100 for c in percent]).select(cols).rename({c: names[c] for c in cols})


def display_table(df: pl.DataFrame) -> pl.DataFrame:
    """The runs table a reader sees: named columns, those no run filled left out (a CPU has no GPU figures)."""
    return named_columns(df, {c: n for c, n in TABLE_COLUMNS.items()
                              if c in df.columns and (c in KEY or df[c].null_count() < df.height)})


STYLE = ("body{font-family:sans-serif;font-size:13px}table{border-collapse:collapse;margin-bottom:1em}"
         "div.scroll{max-width:100%;max-height:80vh;overflow:auto}"
         "td,th{border:1px solid #ccc;padding:3px 6px;white-space:nowrap}"
         "th{background:#eee;position:sticky;top:0;cursor:pointer}"
         "td.text{white-space:normal;min-width:36em;max-width:56em}"
         "td.num{text-align:right;font-variant-numeric:tabular-nums}td.na{color:#999;text-align:center}")
# click a column header to sort by it (numbers as numbers, "–" last); inline, so the page stays offline
SORT_SCRIPT = ("<script>document.querySelectorAll('th').forEach(function(th){th.onclick=function(){"
               "var t=th.closest('table'),b=t.tBodies[0],i=th.cellIndex,d=th.dataset.d=th.dataset.d=='a'?'d':'a';"
               "var v=function(r){var x=r.cells[i].innerText.replace(/,/g,'');return x=='–'?null:"
               "(isNaN(parseFloat(x))?x:parseFloat(x));};Array.from(b.rows).sort(function(p,q){var a=v(p),c=v(q);"
               "if(a===null)return 1;if(c===null)return -1;var s=a<c?-1:a>c?1:0;return d=='a'?s:-s;})"
               ".forEach(function(r){b.appendChild(r);});};});</script>")


def _cell(v, whole: bool = False) -> str:
    """A table cell; a long text cut at 140 characters (whole in its tooltip) unless `whole`."""
    if v is None:
        return "<td class='na'>–</td>"
    if isinstance(v, float):
        txt = f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
        return f"<td class='num'>{txt}</td>"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"<td class='num'>{v}</td>"
    raw = str(v)
    cut = raw if whole else raw[:140] + ("…" if len(raw) > 140 else "")
    s, shown = _escape(raw), _escape(cut)  # cut the text, not its escapes
    return f"<td title='{s}'{' class=text' if len(raw) > 40 else ''}>{shown}</td>"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("'", "&#39;")


WHOLE_COLUMNS = ("techniques, in words", "stands on + adds")  # words a reader needs whole, never cut


def report_link(path: str, text: str) -> str:
    """A link, in the report's front page, that opens the result at `path` (its path in the workflow, as the report
    keys it) in one click; Snakemake's report (9.27) shows a result by this view, as its own result buttons do."""
    return (f"<a href=\"javascript:app.setView({{content: 'html', contentPath: results['{path}'].data_uri, "
            f"resultPath: '{path}'}})\">{text}</a>")


def html_table(df: pl.DataFrame, table_id: str = "") -> str:
    head = "".join(f"<th>{c}</th>" for c in df.columns)
    whole = [c in WHOLE_COLUMNS for c in df.columns]
    body = "\n".join("<tr>" + "".join(_cell(v, w) for v, w in zip(row, whole)) + "</tr>" for row in df.iter_rows())
    return (f"<div class='scroll'><table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody>"
            "</table></div>")


VARIANT_COLUMNS = ("variant", "one GPU", "measured by")  # the columns whose cells name a variant
NOT_A_VARIANT = ("not stated",)  # what a published row says where the study named no variant


def variants_shown(blocks: list, known=None) -> list[str]:
    """The variants a page's tables name (`VARIANT_COLUMNS`), in the order they first appear; with `known` (the
    variant names of config and records), each part of a cell that pairs them ("a vs b", "a, b") that is one."""
    names = {}
    for b in blocks:
        if not isinstance(b, str):
            for c in VARIANT_COLUMNS:
                if c in b[1].columns:
                    for v in b[1][c].to_list():
                        if not v or v in NOT_A_VARIANT:
                            continue
                        parts = [v] if known is None else [p for p in re.split(r" vs |, ", str(v)) if p in known]
                        names.update(dict.fromkeys(str(p) for p in parts))
    return list(names)


def variant_knobs(records) -> dict:
    """Each variant's knobs as its first record gives them (`records`: a runs frame or rows with the flattened
    `variant.*` knobs; ftbench.config.techniques.record_knobs)."""
    if isinstance(records, pl.DataFrame):  # a variant's first record gives its knobs: one row each is read
        records = (records.unique("variant", keep="first", maintain_order=True) if "variant" in records.columns
                   else records).iter_rows(named=True)
    return record_knobs(records)


def legend_block(blocks: list, pool: dict | None, records=None, fallback: dict | None = None) -> tuple | None:
    """The legend of a page of `blocks`: each variant its tables name, what it adds to the rung it stands on and its
    techniques in words (ftbench.config.techniques.legend), so a reader never needs the YAML to know what ran."""
    knobs = variant_knobs(records)
    known = {*(pool or {}), *knobs, *(fallback or {})} if (pool or knobs or fallback) else None
    names = variants_shown(blocks, known)
    if not names:
        return None
    return ("Variants on this page, in words", pl.DataFrame(legend(names, pool, knobs, fallback)), "legend")


def html_page(title: str, blocks: list, pool: dict | None = None, records=None) -> str:
    """A self-contained HTML page (no scripts, no network): blocks are strings (paragraphs; inline SVG
    passes as it is) or (heading, DataFrame, id) tuples. Where its tables name variants, it ends with their legend
    in words, from `pool` (config's variants) or `records` (rows with their `variant.*` knobs)."""
    extra = legend_block(blocks, pool, records)
    blocks = [*blocks, extra] if extra else blocks
    parts = []
    for b in blocks:
        if isinstance(b, str):
            parts.append(b if b.lstrip().startswith(("<svg", "<div")) else f"<p>{b}</p>")
        else:
            heading, df, table_id = b
            parts.append(f"<h4>{heading}</h4>" + html_table(df, table_id))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
            f"</head><body><h3>{title}</h3>{''.join(parts)}{SORT_SCRIPT}</body></html>")


def to_html(df: pl.DataFrame, title: str, note: str = "", pool: dict | None = None, records=None) -> str:
    return html_page(title, [note, ("Runs", df, "runs")], pool, records)


def token_table_html(stats: list[dict]) -> str:
    rows = []
    for s in stats:
        if s.get("error"):
            rows.append({"dataset": s["dataset"], "model": s["model"], "measure": f"not computed: {s['error']}",
                         "data source": s["data_source"], "tokenizer": s["tokenizer"]})
        for measure in ("text_tokens", "image_tokens_anyres", "image_tokens_fixed"):
            if measure in s:
                m = s[measure]
                rows.append({"dataset": s["dataset"], "model": s["model"], "measure": measure,
                             "samples": m["n"], "mean": m["mean"], "median": m["median"], "p95": m["p95"],
                             "max": m["max"], "mean after truncation": m["mean_truncated"],
                             "p95 after truncation": m["p95_truncated"], "share truncated": m["share_truncated"],
                             "data source": s["data_source"], "tokenizer": s["tokenizer"]})
    note = (f"Tokens per sample with each model's tokenizer (chat template applied), before and after truncation "
            f"at {stats[0]['max_length'] if stats else '?'} tokens; for images, the image tokens the LLaVA-NeXT "
            "processor expands under AnyRes and with every image resized to 336×336. Published: japanese_alpaca "
            "mean 117 and wikipedia_ja mean 861 after truncation (Qwen3 tokenizer); 2,928 image tokens for a "
            "500×500 image.")
    return html_page("Token statistics", [note, ("Tokens per sample", pl.DataFrame(rows, infer_schema_length=None),
                                                  "token_stats")])
