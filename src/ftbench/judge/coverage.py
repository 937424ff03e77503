"""Coverage: every published cell of every study, with our full-scale GPU record of it beside it, or why there is
none. One function per published table turns the study's published file (config/published/) into cells and fills
each from the records; nothing here is typed by hand. Only a record of the published model at full scale on a CUDA
GPU fills a cell: tiny and proxy runs measure the pipeline, not the study."""

from __future__ import annotations

from html import escape

import polars as pl

from ftbench.judge.analysis import KEY, full_scale, html_table, legend_block, oldest_first, peak_memory, read_runs, typed
from ftbench.judge.analysis import variant_knobs
from ftbench.judge.cells import study_a, study_b, study_c
from ftbench.judge.cells_d import study_d
from ftbench.judge.verdicts import VERDICTS, counts_line


def merged_records(parquets, extra=()) -> pl.DataFrame:
    """Every study's runs (the aggregate tables) and the merged records of other machines, oldest first, one row per
    run key and code (`source_digest`): the latest measured copy of a run on each code, so that a pair of one code
    (Study D's) is still found after a later lease measured one side again on other code. `coverage_rows` judges
    the other studies on the latest copy of each run (the aggregate tables, which already hold this config's
    merged records, win)."""
    others = [f for f in (p if isinstance(p, pl.DataFrame) else read_runs(p) for p in extra) if len(f)]
    frames = [oldest_first(typed(pl.concat(others, how="diagonal_relaxed")))] if others else []
    frames += [f for f in (read_runs(p) for p in parquets) if len(f)]
    if not frames:
        return pl.DataFrame()
    df = typed(pl.concat(frames, how="diagonal_relaxed"))
    code = [c for c in ("source_digest", "git_commit") if c in df.columns]
    df = df.with_columns((pl.coalesce(code) if code else pl.lit(None, pl.String)).alias("_code"))
    return df.unique(subset=[k for k in KEY if k in df.columns] + ["_code"], keep="last", maintain_order=True)


def shipped_records(folders, tables=(), frames: dict | None = None) -> tuple[pl.DataFrame, str | None,
                                                                             dict[str, pl.DataFrame]]:
    """The records that ship in `folders` (config shipped_runs), merged as `merged_records` merges, where a campaign
    stands for what it measured, so that none of its ratios divides runs of other code or another host:
    - a campaign named after a published table (bench/campaign.py study_b: its campaign.json's `campaign`) stands for
      that table: the table reads its study's records from that campaign alone (Studies B and D both read `llm`
      records, each from its own campaign); a study whose every table such campaigns stand for, by one folder, is read
      from it alone elsewhere too;
    - any other campaign stands for the studies it holds records of (`config.campaign_owners`).
    Returns the merged records, a line naming each such campaign with its own provenance (one commit, one host, its
    dates), and {table: its campaign's records} for the tables a campaign stands for. `frames`: {folder: its runs}
    where the caller has read them already (`read_runs`)."""
    from ftbench.config.settings import campaign_of, campaign_owners

    named_tables = {t["table"] for t in tables} & set(TABLES)
    by_table, owners = {}, {}  # table -> its campaign's folder; study -> the folder it is read from alone
    for f in sorted(folders):
        name = campaign_of(f)
        if name in named_tables:
            by_table[name] = f
        elif name is not None:
            owners.update(campaign_owners([f]))
    for study in {t.get("study") for t in tables if t.get("study")}:
        mine = [t["table"] for t in tables if t.get("study") == study]
        folders_of = {by_table.get(t) for t in mine}
        if len(folders_of) == 1 and None not in folders_of:  # every table of the study from one campaign
            owners[study] = folders_of.pop()
    runs = {f: read_runs((frames or {}).get(f, f)) for f in folders}  # each folder read once
    kept = []
    for f, df in runs.items():
        others = [s for s, c in owners.items() if c != f]
        kept.append(df.filter(~pl.col("study").is_in(others)) if len(df) and others else df)
    merged = merged_records([], kept)
    study_of = {t["table"]: t.get("study") for t in tables}
    only = {table: merged_records([], [runs[f].filter(pl.col("study") == study_of[table])
                                       if study_of[table] and len(runs[f]) else runs[f]])
            for table, f in by_table.items()}
    if merged.is_empty():
        return merged, None, only

    def named(study: str) -> str:  # the published tables a study's records fill: "Study A", "Study B and Study D"
        return " and ".join(title(t["table"]) for t in tables if t.get("study") == study) or f"The {study} records"

    notes = [f"{named(study)}: from the campaign {folder} alone. "
             f"{provenance_line(merged.filter(pl.col('study') == study), dates=True)}"
             for study, folder in owners.items()]
    notes += [f"{title(table)}: from the campaign {f} alone. {provenance_line(only[table], dates=True)}"
              for table, f in by_table.items() if f not in owners.values() and not only[table].is_empty()]
    return merged, " ".join(notes) or None, only


def title(table: str) -> str:
    """A published table's name: study_b -> "Study B"."""
    return f"Study {table.removeprefix('study_').upper()}"


def latest(df: pl.DataFrame) -> pl.DataFrame:
    """One row per run key, its last (latest measured: `merged_records` orders them) copy."""
    return df if df.is_empty() else df.unique(subset=[k for k in KEY if k in df.columns], keep="last",
                                              maintain_order=True)


TABLES = {"study_a": study_a, "study_b": study_b, "study_c": study_c, "study_d": study_d}
NAMES = {"A": "Study A (LLaVA-NeXT, relative to bf16)", "B": "Study B (samples per hour)",
         "C": "Study C (SD 1.5, time per step)", "D": "Study D (Unsloth's claim, several GPUs)"}


def coverage_rows(df: pl.DataFrame, studies: list[dict], across_code: bool = False,
                  only: dict[str, pl.DataFrame] | None = None) -> pl.DataFrame:
    """All cells: `studies` lists {table: <TABLES key>, published: dict, measured_by: dict, probes: list (study_a)};
    `across_code`: ratios may divide runs of different code (the config's merge_across_code), the note stays; `only`:
    {table: the records it is read from alone} (its campaign's, `shipped_records`), in place of `df`."""
    def ready(df):
        if not df.is_empty() and "gpu_memory_gib" not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=pl.Float64).alias("gpu_memory_gib"))
        return df.with_columns(peak_gib=peak_memory()) if not df.is_empty() else df

    every, only = ready(df), {t: ready(d) for t, d in (only or {}).items()}
    rows = []
    for s in studies:
        df = only.get(s["table"], every)
        probes = {"probes": s["probes"]} if s.get("probes") else {}  # study_a's and study_c's
        # Study D pairs runs of one code (its multi-GPU twins always; Unsloth's pair unless merged across code), among
        # every code's latest copy; the others judge each run's latest copy. (With merge_across_code, each run's
        # latest copy alone dropped the one-GPU twins of the multi-GPU runs measured before it: 4 GPUs read "not
        # measured".)
        runs = df if s["table"] == "study_d" else latest(df)
        rows += TABLES[s["table"]](runs, s["published"], s.get("measured_by"), across_code=across_code, **probes)
    # what a reader asks first (published, ours, the verdict and why) before how it was measured
    cols = ["study", "model", "dataset", "variant", "batch", "published", "ours", "verdict", "how", "cause (measured)",
            "metric", "GPU", "measured by", "status", "published x", "ratio", "x published", "noise (CV)",
            "ours, packed", "why", "measured"]
    table = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame({c: [] for c in cols})
    for c in cols:
        if c not in table.columns:
            table = table.with_columns(pl.lit(None).alias(c))
    return (table.with_columns(pl.col("measured").fill_null(False), pl.col("status").fill_null("not measured"),
                               pl.col("verdict").fill_null("not measured"),
                               (100 * pl.col("noise (CV)").cast(pl.Float64)).round(2).alias("noise (CV)"))  # in %
            .select(cols).rename({"noise (CV)": "noise (CV %)"}).sort("study", maintain_order=True))


def summary(table: pl.DataFrame) -> pl.DataFrame:
    """Per study: its published cells, how many a full-scale GPU record measured, and the count of each verdict."""
    return (table.group_by("study", maintain_order=True)
            .agg(pl.len().alias("published cells"), pl.col("measured").sum().alias("measured at full scale"),
                 *[(pl.col("verdict") == v).sum().alias(v) for v in VERDICTS])
            .with_columns(pl.col("study").replace_strict(NAMES, default=pl.col("study")).alias("study")))


NOTE = ("Every published cell of the four studies, computed from the records and config/published/. A cell is "
        "measured when a record of the published model at full scale on a CUDA GPU fills it: status ok, or an oom "
        "only on a GPU with at least the study's GPU memory; a compiling variant's timeout shows its reason in the "
        "cell, as not measured (its compile budget ran out: no number). Tiny and proxy records never fill a cell. \"measured by\" names the variant that ran "
        "it: Study A's variants with gradient checkpointing (-gc; the study's published memory implies it), Study B's "
        "Unsloth with a setting changed (named in \"why\") or, where Unsloth has no record of its own, the PEFT "
        "stand-in (never judged). Ratios: Study A against bf16 of the same "
        "GPU and batch, Study C against 0 workers of the same GPU, Study B against the published figure itself, Study "
        "D's several GPUs against the same variant on one GPU; a ratio divides runs of the same code on one machine "
        "unless merge_across_code is on.")


# Snakemake's report (9.27) shows its front page in a flex container that centres its content vertically
# (`items-center ... h-screen overflow-auto`): content taller than the window overflows at the top too, where no
# scrolling reaches, so a reader saw the coverage table from its middle; and the description column is 32rem wide
# (`prose max-w-lg`), so the table ran under the rule graph beside it (both seen in headless Chromium,
# 2026-11-25). The front page starts at the top, the description takes the width the table needs, and the rule
# graph wraps below it.
FRONT_STYLE = ("<style>div.flex.items-center.h-screen.overflow-auto:has(.ftbench-coverage) { align-items: flex-start; "
               "justify-content: flex-start; } "
               "div.grow.flex.gap-3.items-start:has(.ftbench-coverage) { flex-wrap: wrap; min-width: 0; } "
               "div.grow.flex.gap-3.items-start > div:has(.ftbench-coverage) { min-width: 0; flex: 1 1 100%; } "
               "div.prose.max-w-lg:has(.ftbench-coverage) { max-width: min(78rem, 100%); } "
               ".ftbench-coverage { overflow-x: auto; } .ftbench-grid svg { max-width: 100%; height: auto; } "
               "div.prose:has(.ftbench-coverage) svg { max-width: 100%; height: auto; } "
               # on a phone the report's menu (a fifth of the width, but never narrower than its words) took 57 % of
               # a 390-pixel screen beside the front page (seen in headless Chromium, 2026-12-07): a third of it there
               "@media (max-width: 640px) { body:has(.ftbench-coverage) nav:not(.w-0) { min-width: 0 !important; "
               "width: 34vw !important; flex: 0 0 34vw; font-size: 0.75rem; } }</style>")


def _commit_named(r: dict) -> str:
    """A record's commit as the front page names it: "04dc138", or "04dc138 + 3 changed files" where the files that
    ran were not that commit's (ftbench.harness.source.short_code)."""
    code, commit = r.get("code") or "", r["git_commit"][:7]
    return f"{commit} + {code.split(' + ')[1].split(' changed')[0]} changed files" if " changed (files " in code else commit


def provenance_line(df: pl.DataFrame, across_code: bool = False, dates: bool = False) -> str:
    """What the front page's records are: one version of the code (a campaign) or a merge of several, on which
    GPUs; and whether ratios may cross versions; `dates`: when they ran (first and last record's day)."""
    full = full_scale(df)
    if full.is_empty():
        return "No full-scale GPU record yet: every published cell is not measured."
    when = ""
    if dates and "timestamp" in full.columns:
        days = sorted({str(t)[:10] for t in full["timestamp"].to_list() if t})
        when = f", {days[0]}" + (f" to {days[-1]}" if days[-1] != days[0] else "") if days else ""
    codes = sorted({c for c in full["source_digest"].to_list() if c}) if "source_digest" in full.columns else []
    commits = sorted({_commit_named(r) for r in full.iter_rows(named=True) if r.get("git_commit")}) \
        if "git_commit" in full.columns else []
    if len(commits) > 6:
        commits = commits[:5] + [f"and {len(commits) - 5} more"]
    gpus = sorted({g for g in full["gpu"].to_list() if g})
    cards = full["gpu_uuid"].drop_nulls().n_unique() if "gpu_uuid" in full.columns else 0
    machines = full["machine"].drop_nulls().n_unique() if "machine" in full.columns else 0
    where = (f"{', '.join(gpus)} ({cards} card{'s' if cards != 1 else ''}"
             + (f" of {machines} machines" if machines > 1 else "") + ")")
    if len(codes) <= 1:
        return (f"One commit: every full-scale record ran the same files ({(codes or ['?'])[0][:10]}, commit "
                f"{', '.join(commits)}) on {where}{when}"
                + ("; a ratio divides only runs of one machine, other pairs are not comparable"
                   if machines > 1 and not across_code else "") + ".")
    rule = ("ratios divide runs of different code or machines only because merge_across_code is on: each such cell "
            "says so" if across_code else
            "a ratio divides only runs of the same code on one machine; other pairs are not comparable")
    return (f"Merged: {len(full)} full-scale records of {len(codes)} versions of the code (commits "
            f"{', '.join(commits)}) on {where}{when}; {rule}.")


def coverage_html(table: pl.DataFrame, provenance: str | None = None, shipped: tuple | None = None,
                  fastest: str | None = None, records=None, pool: dict | None = None) -> str:
    """The coverage page: where its records come from, per study the verdict counts, Study A's grid, then every
    cell. `shipped`: (table, provenance) of the records that ship in measurements/ (config shipped_runs), judged on
    their own: ahead of the user's cells while those measure none at full scale (the default pipeline's tiny runs),
    after them otherwise, with one line on replacing them; `fastest`: the shipped records' fastest LoRA and its lead
    over the best peer at its best (compare.headline), opening that block; `records`: rows of the runs behind both
    (their `variant.*` knobs), for the legend of the variants the cells name, in words (`pool`: every study's
    variants, for those without a record)."""
    legend = legend_html([table, *(shipped[:1] if shipped else [])], records, pool)
    names = cell_names([table, *(shipped[:1] if shipped else [])], records, pool)
    if shipped is None or shipped[0].is_empty() or not shipped[0]["measured"].any():
        return (f"{FRONT_STYLE}<div class='ftbench-coverage'><h3>Do the published findings hold?</h3>"
                f"{_verdicts_block(table, provenance, 'coverage', names)}<p>{VERDICT_NOTE}</p>{legend}</div>")
    measured = bool(table["measured"].any())  # your runs: unmeasured, their counts alone (every cell "not measured")
    mine = "<h4>Your runs</h4>" + _verdicts_block(table, provenance, "coverage", names, grid=measured, cells=measured)
    theirs = ("<h4>Measured on the project's lent GPUs (shipped in measurements/)</h4>"
              + (f"<p><b>The fastest LoRA measured that keeps quality, and its peers at their best</b> (Study B's frontier; "
                 f"docs/frontier.md): {fastest}</p>" if fastest else "")
              + _verdicts_block(shipped[0], shipped[1], "shipped_coverage", names, grid=not measured)
              + f"<p>{SHIPPED_NOTE}</p>")
    blocks = [mine, theirs] if measured else [theirs, mine]
    return (f"{FRONT_STYLE}<div class='ftbench-coverage'><h3>Do the published findings hold?</h3>" + "".join(blocks)
            + f"<p>{VERDICT_NOTE}</p>{legend}</div>")


def front_html(table: pl.DataFrame, provenance: str | None, shipped: tuple | None, pages: dict[str, str],
               records=None, pool: dict | None = None) -> str:
    """The report's first question at a glance: do the published findings hold? Each study's verdicts as a grid
    (a cell a published claim, coloured by its verdict, ours above the published figure) under its counts, its
    heading opening the study's comparison page (`pages`: study letter -> result path); where the records come from
    folded; every cell one click away on the coverage page. Judges your runs where they measure a cell at full
    scale, else the shipped records (config shipped_runs)."""
    from ftbench.judge.analysis import report_link
    from ftbench.judge.figures import svg_string, verdict_grid

    theirs = shipped is not None and not shipped[0].is_empty() and bool(shipped[0]["measured"].any())
    judged, source = (shipped if theirs and not table["measured"].any() else (table, provenance))
    names = cell_names([judged], records, pool)
    per_study = summary(judged)
    total = {v: int(per_study[v].sum()) for v in VERDICTS}
    parts = [f"<p>Of {int(per_study['published cells'].sum())} published cells, {counts_line(total)} "
             f"({'the records shipped in measurements/' if judged is not table else 'your runs'}; every cell with its "
             f"evidence: {report_link(PAGE, 'the coverage page')}).</p>"]
    for letter in dict.fromkeys(judged["study"].to_list()):
        cells = judged.filter(pl.col("study") == letter)
        heading = NAMES.get(letter, letter)
        link = report_link(pages[letter], heading) if letter in pages else heading
        counts = {v: int((cells["verdict"] == v).sum()) for v in VERDICTS}
        parts.append(f"<h4>{link}</h4><p>{counts_line(counts)}</p>"
                     f"<div class='ftbench-grid'>{svg_string(verdict_grid(cells, heading, names))}</div>")
    parts.append(f"<details><summary>Where these records come from</summary><p>{escape(source or '')}</p>"
                 + (f"<p>{SHIPPED_NOTE}</p>" if judged is not table else "") + "</details>")
    return (f"{FRONT_STYLE}<div class='ftbench-coverage'><h3>Do the published findings hold?</h3>" + "".join(parts)
            + "</div>")


PAGE = "results/coverage/coverage.html"


def cell_names(tables: list[pl.DataFrame], records, pool: dict | None) -> dict[str, str]:
    """The display names (ftbench.config.techniques.display_names) of the variants the tables' cells name."""
    from ftbench.config.techniques import display_names

    shown = [v for t in tables for v in t["variant"].to_list()]
    return display_names(shown, records=variant_knobs(records), fallback=pool)


def legend_html(tables: list[pl.DataFrame], records, pool: dict | None = None) -> str:
    """The variants the tables' cells name, in words (folded: a reader opens it where a name says nothing)."""
    block = legend_block([("", t, "") for t in tables], None, records, fallback=pool)
    if block is None:
        return ""
    return (f"<details><summary><b>{block[0]}</b> ({block[1].height})</summary>"
            f"{html_table(block[1], 'coverage_legend')}</details>")


def _verdicts_block(table: pl.DataFrame, provenance: str | None, table_id: str, names: dict, grid: bool = True,
                    cells: bool = True) -> str:
    """One set of records' verdicts: where they come from, per study the counts, Study A's grid, then every cell."""
    from ftbench.judge.figures import svg_string, verdict_grid

    per_study = summary(table)
    lead = "".join(f"<li><b>{r['study']}</b>: {counts_line({v: r[v] for v in VERDICTS})}</li>"
                   for r in per_study.iter_rows(named=True))
    study_a_cells = table.filter(pl.col("study") == "A")
    # the picture shrinks to the page's width (its viewBox keeps the proportions): a phone sees it whole
    picture = (f"<div class='ftbench-grid'>{svg_string(verdict_grid(study_a_cells, NAMES['A'], names))}</div>"
               if grid and study_a_cells.height else "")
    source = f"<p><b>{escape(provenance)}</b></p>" if provenance else ""
    return (f"{source}<ul>{lead}</ul>" + picture
            + "<h4>Coverage and verdicts, per study</h4>" + html_table(per_study, f"{table_id}_counts")
            + (f"<p>{NOTE}</p>" + html_table(table.drop("measured").insert_column(
                3, table["variant"].replace_strict(names, default=table["variant"]).alias("name")), table_id)
               if cells else ""))


SHIPPED_NOTE = ("These verdicts come from the records that ship with ftbench (config <code>shipped_runs</code>), not "
                "from your runs. To put your own in their place, run a campaign on your GPUs "
                "(<code>python3 bench/campaign.py study_a --out measurements/mine</code>) and build the report with "
                "<code>--config 'shipped_runs=[\"measurements/mine\"]'</code>; "
                "<code>shipped_runs=[]</code> shows your runs alone.")


VERDICT_NOTE = ("Each published cell's verdict is computed from config/published/ (a number or a range, with its unit "
                "and conditions) and our full-scale GPU record of it: <b>holds</b> inside the published range or "
                "within the noise of it (2 x the noise CV of our ratio); <b>differs</b> outside it beyond the noise, by "
                "how much and which way (also where 2 x the noise CV is wider than 10 % but the figure lies beyond "
                "even that); <b>inconclusive</b> where 2 x the noise CV is wider than 10 % and the figure lies within "
                "it, so the record can tell neither (its CV given); <b>not comparable</b> where the record cannot "
                "answer the question as published (a stand-in for the study's system, another GPU for an absolute figure, an out-of-memory "
                "result), saying why; <b>not measured</b> with no record, or a timeout (never a result). Where a "
                "cell differs, \"cause (measured)\" is the run's own evidence (profile; without one, NVML's busy "
                "share of the windows and HFU, the executed FLOPs' share of the GPU's dense peak; host CPU per step, "
                "data wait, recompiles, tokens per sample, padding), or \"cause not measured\".")
