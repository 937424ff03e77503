"""The technique ladder and the frontier's rows: each rung against the rung before it and rung 0, its loss on the same
rows, whether it may stand on the frontier, and the fastest configuration measured."""
from __future__ import annotations

import math
import statistics

import polars as pl

from ftbench.judge.analysis import peak_memory
from ftbench.config.techniques import adds_words
from ftbench.judge.compare.common import (NOISE_NOTE, UNSTATED, _verdict, gemms_in, held_back, machine_key, mfu_against, peak_gib, peer_of,
                     scale_order, tokens_noise)


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
        what = f"the LM head's loss through ftbench.build.head ({r['variant.lm_head']})"
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


def standing(runs, base: dict | None, refs: dict) -> list[dict]:
    """The ok runs among `runs` that may stand on the frontier (`frontier_place`: their loss checked on the same rows
    where they change the arithmetic)."""
    return [r for r in runs if r["status"] == "ok" and r["throughput.tokens_per_s"]
            and frontier_place(r, base, same_rows_check(r, refs)).startswith("yes")]


def fastest_by(runs, key_of=machine_key, key: str = "throughput.tokens_per_s") -> dict:
    """The fastest run (real tokens/s, the column `key`) of each `key_of` (by default each machine, with its model,
    scale, data and GPU): a faster run of the same variant on another machine does not hide this machine's."""
    tops = {}
    for r in runs:
        k = key_of(r)
        if k not in tops or r[key] > tops[k][key]:
            tops[k] = r
    return tops


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


def ladder(df: pl.DataFrame, published: dict, rungs=(), beside=(), by_batch=True, eval_loss=False, title="Ladder",
           same_rows: str | None = None, replaced: pl.DataFrame | None = None, own_tops: dict | None = None,
           quality: dict | None = None, pool: dict | None = None, **_) -> list:
    """The technique ladder: each rung a variant that adds one technique to the rung before, measured at the
    same model, dataset, GPU and batch size; real (unpadded) tokens/s, MFU, peak memory, the loss over the first
    steps (the same samples for every rung: a faster rung that trains a different model shows here), x previous
    and x baseline with their noise verdicts. Variants `beside` the ladder (Unsloth) are rows of their own. Ends
    with the fastest configuration per GPU among everything in the table, at any batch size, and its memory.
    `by_batch` false: rungs at different batch sizes side by side (each rung at its own batch: `frontier`);
    `eval_loss`: the loss compared is the evaluation set's (rungs that reorder the training samples); `replaced`:
    runs a later lease's measurement replaced in `df`, still each machine's own (its top rung, with `same_rows`);
    `own_tops` (with `same_rows`), filled: per machine and GEMM precision, the project's own fastest run standing on
    the frontier, replaced runs included (what a peer is read against: `peer_table`); `quality`: the quality study's
    verdicts by variant (`quality_by_variant`), shown beside each rung's speed, and the fastest configuration named
    only among rungs that keep quality; `pool`: config's variants as written, each row saying what its variant adds
    to the rung it stands on, in words."""
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
    rows, runs, tops, stood = [], [], {}, []
    for group in df.partition_by(keys, maintain_order=True):
        by = {r["variant"]: r for r in group.iter_rows(named=True)}
        base = by.get(rungs[0]) if rungs else None
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
            stood += stand
            tops.update(fastest_by(stand))
            if own_tops is not None:
                own_tops.update(fastest_by([r for r in stand if not peer_of(r)],
                                           lambda r: (*machine_key(r), gemms_in(r))))
        prev = None
        for i, name in enumerate(names):
            r = by.get(name)
            if r is None:
                continue
            row = rung_row(r, str(i) if name in rungs else "beside", base, prev if name in rungs else None, every,
                           eval_loss)
            if pool:  # "lora-tb-cg = lora-tb + compiled layers in CUDA graphs"
                row = {**{k: row[k] for k in list(row)[:7]}, "stands on + adds": adds_words(name, pool),
                       **{k: row[k] for k in list(row)[7:]}}
            if same_rows:
                cmp = same_rows_check(r, refs)
                row["loss vs rung 0's step, same rows"] = same_rows_text(cmp) if row["tokens/s (real)"] and cmp \
                    else None
                row["on the frontier"] = frontier_place(r, base, cmp) if r["status"] == "ok" else None
            if quality:
                row["quality (real model)"] = quality_text(quality_of(quality, r))
            rows.append(row)
            runs.append(r)
            if name in rungs and r["status"] == "ok":
                prev = r
    if same_rows:
        against_top(rows, runs, tops)
    note = ladder_note(by_batch, eval_loss, same_rows, quality)
    kind = title.lower()
    if not rows:
        return [note, (title, pl.DataFrame({"result": ["no rung ran"]}), kind)]
    # full-scale GPU rows first, smaller scales and CPU rows after them (stable: rung order kept within each)
    table = pl.DataFrame(rows, infer_schema_length=None).with_columns(_order=scale_order()).sort(
        "_order", maintain_order=True).drop("_order")
    return [fastest_line(table, tops, stood, quality), note, (title, table, kind)]


def rung_row(r: dict, rung: str, base: dict | None, prev: dict | None, every: dict, eval_loss: bool) -> dict:
    """One rung's row: its speed, MFU, memory and loss, against the rung before it (`prev`, at r's batch where that
    rung ran it: `every`) and rung 0 (`base`)."""
    ok = r["status"] == "ok"
    tps = r["throughput.tokens_per_s"] if ok else None

    def times(other, same_batch=False):
        """r against `other`; with same_batch, against other's variant at r's batch where it ran (else against
        `other`, its batch named): each rung's own gain, not a change of batch."""
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
    return {"model": r["model"], "scale": r["scale"], "dataset": r["dataset"], "gpu": r["gpu"],
            "batch": r["batch_size"], "rung": rung, "variant": r["variant"], "status": r["status"],
            "tokens/s (real)": tps, "MFU % (bf16 peak)": mfu_against(r, "bf16") if ok else None,
            "MFU % (FP8 peak)": mfu_against(r, "fp8") if ok and r.get("precision.gemm") == "fp8" else None,
            "peak memory GiB": r["memory_gib"] if ok else None,
            ("loss, evaluation set" if eval_loss else "loss, first steps (mean)"): loss if ok else None,
            "loss vs baseline": (loss - base_loss) if ok and same_steps and loss is not None
            and base_loss is not None else None,
            "x previous": times(prev, same_batch=True) if rung != "beside" else None,
            "x baseline": times(base) if r is not base else None,
            "reason": r["reason"] if not ok else None}


def ladder_note(by_batch: bool, eval_loss: bool, same_rows: str | None, quality: dict | None) -> str:
    """What the ladder's columns mean."""
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
    if quality:
        note += (" 'Quality (real model)': the verdict of the quality study (the report's front page, "
                 "results/quality/quality.html) for the same technique fine-tuning a pretrained model on real text: "
                 "its held-out loss paired seed by seed with the baseline's at the same tokens, the adapters as "
                 "served on the bf16 base: keeps quality where the 90 % interval of the mean difference lies under "
                 "the practical margin, costs quality where it lies over it (ftbench.judge.quality), on the GPU kind "
                 "named. The speed is Qwen3-8B's here, the quality SmolLM2-135M's there; a rung that does not keep "
                 "quality is never named the fastest configuration.")
    return note


def quality_by_variant(rows) -> dict:
    """The quality study's verdicts (results/quality/verdicts.csv rows, `ftbench.judge.quality_page.verdict_table`) by variant
    and GPU kind, one per dataset the study ran the technique on."""
    out = {}
    for q in rows:
        out.setdefault(q["variant"], {}).setdefault(q["gpu"], []).append(q)
    return out


def read_quality(paths) -> dict | None:
    """The quality study's verdicts file (a rule's optional input: none where no quality study runs) by variant."""
    return quality_by_variant(pl.read_csv(paths[0]).iter_rows(named=True)) if paths else None


def quality_of(quality: dict, r: dict) -> list[dict] | None:
    """A run's technique's quality verdicts, one a dataset: measured on its own GPU kind where the study ran there,
    else on any GPU, else on a CPU; None where the technique has none."""
    kinds = quality.get(r["variant"]) or {}
    if r["gpu"] in kinds:
        return kinds[r["gpu"]]
    return next((q for g, q in sorted(kinds.items(), key=lambda x: x[0] == "cpu")), None)


def quality_text(qs: list[dict] | None) -> str:
    """A technique's quality verdicts as the ladder's cell: each dataset's, then the GPU."""
    if not qs:
        return "quality not measured"
    parts = []
    for q in qs:
        delta, lo, hi, margin = (q.get(k) for k in ("delta (nats)", "interval low", "interval high", "margin (nats)"))
        at = ""
        if delta is not None and q["quality"] != "quality not measured":
            span = f" [{lo:+.4f}, {hi:+.4f}]" if lo is not None and hi is not None and math.isfinite(lo) else ""
            at = f"{delta:+.4f} nats{span}" + (f" against a margin of {margin:.4f}" if margin else "") + \
                 " as served, paired seeds; "
        parts.append(f"{q['quality']} ({at}{q.get('dataset') or 'its data'})")
    return f"{'; '.join(parts)}; {qs[0]['gpu']}"


def keeps_quality(quality: dict | None, r: dict) -> bool:
    """Whether the technique keeps quality on every dataset the study measured on its GPU kind: a technique run on
    fewer of them than another has passed an easier test, and is not said to keep quality."""
    qs = quality_of(quality or {}, r) or []
    if not qs:
        return False
    studied = {q.get("dataset") for kinds in (quality or {}).values() for q in kinds.get(qs[0]["gpu"], [])}
    return {q.get("dataset") for q in qs if q["quality"] == "keeps quality"} == studied


def fastest_line(table: pl.DataFrame, tops: dict, stood: list, quality: dict | None) -> str:
    """The ladder's lead: the fastest configuration per GPU, model and scale (among the rows, or with `tops` each
    machine's fastest run standing on the frontier, replaced ones too); with `quality`, the fastest that keeps quality,
    a faster rung that does not named with its verdict."""
    best = {True: [], False: []}  # per GPU, model and scale (a proxy model's tokens/s says nothing of the full one's)
    group_of = ("gpu", "model", "scale", "dataset")
    measured = table.filter(pl.col("tokens/s (real)").is_not_null())
    if "on the frontier" in table.columns:  # a rung that changes the arithmetic leads only with its loss check
        measured = measured.filter(pl.col("on the frontier").str.starts_with("yes"))
    shown = {(r["gpu"], r["model"], r["scale"], r["dataset"], r["variant"]): r for r in table.iter_rows(named=True)}
    if tops:  # with same_rows: each machine's fastest standing run, replaced ones too (a later lease's measurement
        # of the top rung without rung 0 beside it cannot check its loss, yet the same variant stood on another)
        fastest = fastest_by(tops.values(), lambda r: tuple(r[k] for k in group_of))
        leads = [standing_lead(r, shown.get((*(r[k] for k in group_of), r["variant"])) or {})
                 for r in sorted(fastest.values(), key=lambda r: (r["gpu"] == "cpu", r["scale"] != "full"))]
        kept = fastest_by([r for r in stood if keeps_quality(quality, r)], lambda r: tuple(r[k] for k in group_of))
        kept = {k: standing_lead(r, {}) for k, r in kept.items()}
    else:
        leads = [group.sort("tokens/s (real)", descending=True).row(0, named=True)
                 for group in measured.partition_by(list(group_of), maintain_order=True)]
        kept = fastest_by([r for r in measured.iter_rows(named=True) if keeps_quality(quality, r)],
                          lambda r: tuple(r[k] for k in group_of), key="tokens/s (real)")

    def said(top):
        return (f"<b>{top['variant']}</b> at batch {top['batch']}, {top['tokens/s (real)']:,.0f} real tokens/s, "
                f"{top['peak memory GiB']:.1f} GiB peak.")

    for top in leads:
        line = f"On {top['gpu']}, {top['model']} ({top['scale']} scale), {top['dataset']}: "
        if quality:
            q = quality_of(quality, {"variant": top["variant"], "gpu": top["gpu"]})
            if not keeps_quality(quality, top):
                other = kept.get(tuple(top[k] for k in group_of))
                line += (f"fastest that keeps quality: {said(other)}" if other else
                         "no rung here has a 'keeps quality' verdict, so none is named the fastest.")
                line += f" Faster, without that verdict: {said(top)[:-1]} ({quality_text(q)})."
            else:
                line += said(top) + f" Quality: {quality_text(q)}."
        else:
            line += said(top)
        best[top["scale"] == "full" and top["gpu"] != "cpu"].append(line + top.get("then", ""))
    lead = "Fastest configuration measured at full scale on a GPU: " + (" ".join(best[True]) or "none ran.")
    if best[False]:
        lead += (" <br>Smaller scales and CPUs, apart (their speed says nothing of the published model's): "
                 + " ".join(best[False]))
    return lead


def standing_lead(r: dict, latest: dict) -> dict:
    """A fastest standing run `r` as the lead line's row, and where the same variant's latest run (`latest`, the row
    the table shows) does not stand, why, said beside it."""
    refused = (latest.get("on the frontier") or "yes").startswith("no") and latest.get("tokens/s (real)")
    return {"gpu": r["gpu"], "model": r["model"], "scale": r["scale"], "dataset": r["dataset"], "variant": r["variant"],
            "batch": r["batch_size"], "tokens/s (real)": r["throughput.tokens_per_s"],
            "peak memory GiB": peak_gib(r) or 0.0,
            "then": (f" Its latest run ({latest['tokens/s (real)']:,.0f} real tokens/s) does not stand on the "
                     f"frontier: {latest['on the frontier'].removeprefix('no: ')}." if refused else "")}

