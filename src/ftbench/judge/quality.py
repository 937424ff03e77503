"""Speed that keeps quality, decided as a user decides: each technique's held-out loss on a real pretrained model,
paired seed by seed with the baseline's, against a practical margin.

Every run of the quality study is the same fine-tune (data, learning rate, steps) under one technique and one seed
(knob `seed`: LoRA's initial A and the data order), its held-out loss measured before the first step and every few
steps at the label tokens trained so far (ftbench.data.heldout): on the text the fine-tune is meant to learn (an
instruction's answer, a plain text's words; never the prompt or the chat template), through the technique's own path
(as trained) and, where it trains on another base than bf16 (FP8, NF4), with its adapters on the bf16 base (as
served). A technique that changes the numbers runs under the same seeds as the baseline (config `quality.seeds`).

The verdict is a paired equivalence test. For each seed both ran, the difference of their held-out losses at the same
tokens (the fewest either trained: linear between points near each curve's end, stats.readable); their mean and its
two-sided `confidence` interval (Student's t on the paired differences); the practical margin: `margin.relative` of
the baseline's held-out loss there (config, with its source):

- keeps quality: the whole interval lies below the margin (it may be better: a fall keeps quality);
- costs quality: +x nats [lo, hi]: the whole interval lies above it;
- inconclusive: the interval straddles the margin, or fewer than MIN_PAIRS seeds are paired;
- quality not measured: no curve (a speed run, a failed run), or one ending more than SHORT_BY short of the
  baseline's tokens (unless within the baseline's last steps scored one by one: stats.read_floor): never "keeps".

A technique that changes no numbers (ftbench.core.knobs.NUMERICS_FREE: pinned memory, no host sync, no per-step
metrics) runs one seed; where its curve is bit-identical to the rung it stands on (same seed), it inherits that rung's
verdict, else it is inconclusive until it runs the seeds. "Fastest that keeps quality" reads the served verdict.

Tokens to quality: the label tokens a technique's curve needs to reach the baseline seeds' mean loss at the tokens
they are read at (linear between its points; a longer run, knob-free, reads further). With a rung's real tokens/s at
Qwen3-8B's shapes (the fastest record of the same variant there, on the GPU kind the baseline's speed was measured
on), its time to quality relative to the baseline's is a projection: (tokens to quality / baseline's tokens) x
(baseline's tokens/s / its tokens/s).
"""

from __future__ import annotations

import json
import math
import re
import statistics

import polars as pl

from ftbench.core.knobs import same_numbers
from ftbench.config.techniques import words
from ftbench.judge.stats import interval, loss_at, points, read_floor, read_together, tokens_to

MIN_PAIRS = 3  # seeds a technique must share with the baseline for a verdict (an interval from fewer is too wide)
CONFIDENCE = 0.90  # the interval's two-sided confidence, unless config's quality.confidence says otherwise
MARGIN = {"relative": 0.0025, "source": "DeepSeek-V3 (2024): FP8 training's relative loss error against bf16 kept "
                                        "below 0.25 %"}
# one host kind, one model, one dataset, one way of scoring the held-out split: runs comparable with each other
GROUP = ("model", "dataset", "gpu", "scored")
VIEWS = ("served", "trained")

KEEPS, COSTS, INCONCLUSIVE, NOT_MEASURED = "keeps quality", "costs quality", "inconclusive", "quality not measured"
LONGER = "longer arm"

SHORT_BY = 0.02  # a run that ends at most this share of the baseline's tokens short is read where it ends


def decide(mean: float, lo: float, hi: float, margin: float, n: int) -> str:
    """The verdict of a paired interval against the practical margin."""
    return INCONCLUSIVE if n < MIN_PAIRS else KEEPS if hi < margin else COSTS if lo > margin else INCONCLUSIVE


def verdict(diffs: list[float], base_loss: float | None, settings: dict | None = None) -> dict:
    """The paired verdict of one technique's differences from the baseline, seed by seed, at the same tokens:
    {verdict, mean, low, high, sd, pairs, margin (nats), why}."""
    settings = settings or {}
    if not diffs or base_loss is None:
        return {"verdict": NOT_MEASURED, "pairs": 0,
                "why": "no held-out curve of this view (as served, or as trained) paired with a baseline seed's"}
    rel, conf = (settings.get("margin") or MARGIN)["relative"], settings.get("confidence", CONFIDENCE)
    margin = rel * base_loss
    mean, lo, hi, sd = interval(diffs, conf)
    word = decide(mean, lo, hi, margin, len(diffs))
    span = f"[{lo:+.4f}, {hi:+.4f}]" if len(diffs) > 1 else "(no interval from one seed)"
    why = (f"{mean:+.4f} nats {span}, {conf:.0%} interval of {len(diffs)} paired seed(s); margin +{margin:.4f} "
           f"({rel:.2%} of the baseline's {base_loss:.3f})")
    if len(diffs) < MIN_PAIRS:
        why += f": at least {MIN_PAIRS} seeds shared with the baseline are needed"
    elif word == INCONCLUSIVE:
        why += ": the interval straddles the margin; more seeds would narrow it"
    return {"verdict": word, "mean": mean, "low": lo, "high": hi, "sd": sd, "pairs": len(diffs), "margin": margin,
            "why": why}


def seed_families(names, baseline: str, seeds: list, variants: dict | None) -> dict[str, tuple]:
    """Each run's family: the same fine-tune under other seeds (its knobs but the seed equal: `variants`' flat knobs).
    The baseline's family holds the baseline, its named `seeds` (variant names) and any variant of its knobs under
    another seed."""
    def key(name):
        return knob_key(name, variants) or ("alone", name)
    own = knob_key(baseline, variants)
    return {n: ("baseline",) if n in (baseline, *seeds) or key(n) == own else key(n) for n in names}


def recorded_seeds(names, variants: dict | None) -> dict:
    """`variants` with each seed the records carry beyond config's: a run `NAME-sK` of a variant NAME config knows,
    as NAME's knobs under seed K (as `expand_seeds` names them), so a report reads every shipped seed of a family,
    not only those its own config runs."""
    out = dict(variants or {})
    for name in names:
        found = re.fullmatch(r"(.+)-s(\d+)", name)
        if found and found.group(1) in out and name not in out:
            out[name] = {**out[found.group(1)], "seed": int(found.group(2))}
    return out


def knob_key(name: str, variants: dict | None):
    """A variant's knobs but its seed, as a family key (None: its knobs are unknown)."""
    knobs = (variants or {}).get(name)
    return None if knobs is None else tuple(sorted((k, repr(v)) for k, v in knobs.items()
                                                   if k != "seed" and v is not None))


def seed_of(name: str, variants: dict | None, default: int, baseline: str, seeds: list) -> int | str:
    """A run's seed: its knob `seed`, else config's; a baseline seed named only by its variant (no knobs known) is
    its own seed, by name."""
    knobs = (variants or {}).get(name)
    if knobs is None:
        return default if name == baseline else name
    return knobs.get("seed") if knobs.get("seed") is not None else default


def speed_at_shapes(speed: pl.DataFrame | None, model: str = "qwen3-8b") -> dict[str, dict]:
    """variant -> its fastest ok record at `model`'s full shapes (real tokens/s, the GPU, the dataset and batch), on
    one GPU kind (the one most of those records ran on): speeds and projections never mix kinds."""
    if speed is None or not len(speed) or "throughput.tokens_per_s" not in speed.columns:
        return {}
    ok = speed.filter((pl.col("status") == "ok") & (pl.col("model") == model) & (pl.col("scale") == "full")
                      & pl.col("throughput.tokens_per_s").is_not_null() & (pl.col("device_type") == "cuda"))
    if not len(ok):
        return {}
    kind = ok["gpu"].value_counts(sort=True)["gpu"][0]  # one GPU kind: the one most records ran on
    best = {}
    for r in ok.filter(pl.col("gpu") == kind).sort("throughput.tokens_per_s", descending=True).iter_rows(named=True):
        best.setdefault(r["variant"], r)
    return best


def with_tails(fast: dict[str, dict], variants: dict | None) -> dict[str, dict]:
    """`fast` with the speed of each bf16 tail (knob fp8_until f, 0 < f < 1) without a record of its own, from its two
    phases' records at the same shapes and GPU kind (FP8 throughout: no fp8_until; bf16 from the first step: 0), the
    same rows a step in both: 1 / (f / the FP8 phase's tokens/s + (1 - f) / the bf16 phase's)."""
    out, variants = dict(fast), variants or {}
    rest = {n: {key: v for key, v in k.items() if key not in ("fp8_until", "seed")} for n, k in variants.items()}
    for name, k in variants.items():
        f = k.get("fp8_until")
        if name in fast or f is None or not 0 < f < 1:
            continue
        phase = {}
        for other in (o for o in variants if o in fast and rest[o] == rest[name]):
            phase.setdefault(variants[other].get("fp8_until"), other)
        if None not in phase or 0 not in phase:
            continue
        fp8, bf16 = (fast[phase[k]]["throughput.tokens_per_s"] for k in (None, 0))
        out[name] = {**fast[phase[None]], "variant": name, "throughput.tokens_per_s": 1 / (f / fp8 + (1 - f) / bf16),
                     "mix": f" (a mix: {f:.0%} of the steps at {phase[None]}'s speed, the rest at {phase[0]}'s)"}
    return out


def needs_serving(name: str, variants: dict | None) -> bool:
    """Whether a technique trains on another base than the bf16 one it is served on (FP8, NF4)."""
    return ((variants or {}).get(name) or {}).get("precision") in ("fp8", "nf4")


def view_curve(pts: list[dict] | None, view: str, serves_apart: bool) -> list[dict] | None:
    """A run's curve as trained, or as served: its `served` losses where it trains on another base (None where the
    run did not score them), else the trained curve (its trained path is its served path)."""
    if not pts or view == "trained" or not serves_apart:
        return pts
    if not all("served" in p for p in pts):
        return None
    return [{**p, "loss": p["served"]} for p in pts]


def scored_of(row: dict) -> str:
    text = row.get("loss.held_out")
    return (json.loads(text).get("scored") if text else None) or "every token"


def latest_scoring(df: pl.DataFrame) -> pl.DataFrame:
    """Each (model, dataset, GPU)'s runs of one scoring: where some scored the text alone, those; runs of the older
    scoring (every token, template included) are not mixed with them, nor judged beside them."""
    if "loss.held_out" not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.String).alias("loss.held_out"))
    df = df.with_columns(pl.Series("scored", [scored_of(r) for r in df.iter_rows(named=True)], dtype=pl.String))
    newest = {}
    for r in df.iter_rows(named=True):
        k = (r["model"], r["dataset"], r["gpu"])
        if r["scored"] != "every token" or k not in newest:
            newest[k] = r["scored"] if r["scored"] != "every token" else newest.get(k, "every token")
    rows = df.to_dicts()
    for r in rows:  # a run with no curve (a speed run, a failure) joins its group's newest scoring
        if not r.get("loss.held_out"):
            r["scored"] = newest[(r["model"], r["dataset"], r["gpu"])]
    keep = [newest[(r["model"], r["dataset"], r["gpu"])] == r["scored"] for r in rows]
    return pl.DataFrame(rows, schema=df.schema).filter(pl.Series(keep))


def paired(mine: dict, base: dict, floor: float) -> dict:
    """The paired differences of two families' curves ({seed: curve}) over the seeds both ran, read at the fewest
    tokens any of those runs trained; a run ending below `floor` tokens (more than SHORT_BY short of the baseline's),
    or where another's curve has no point a step apart (stats.read_together), is left out, and said."""
    shared = [s for s in mine if s in base and mine[s] and base[s]]
    left = [s for s in shared if mine[s][-1]["tokens"] < floor]
    shared, more, tokens = read_together(mine, base, [s for s in shared if s not in left], SHORT_BY)
    left += more
    if not shared:
        return {"diffs": [], "seeds": [], "tokens": None, "base_loss": None, "left_out": left}
    diffs = [loss_at(mine[s], tokens) - loss_at(base[s], tokens) for s in shared]
    base_loss = statistics.fmean(loss_at(base[s], tokens) for s in shared)
    return {"diffs": diffs, "seeds": shared, "tokens": tokens, "base_loss": base_loss, "left_out": left}


def identical(a: list[dict] | None, b: list[dict] | None) -> bool:
    """Two curves bit for bit: the same tokens and the same losses at every point."""
    return bool(a and b) and [(p["tokens"], p["loss"]) for p in a] == [(p["tokens"], p["loss"]) for p in b]


def quality_rows(df: pl.DataFrame, baseline: str, seeds: list, variants: dict | None = None,
                 speed: pl.DataFrame | None = None, lineage: dict | None = None, settings: dict | None = None,
                 default_seed: int = 42) -> list[dict]:
    """A row a run of each (model, dataset, GPU, scoring) group holding the baseline: its technique's paired verdicts
    (served and as trained: `verdict`), its difference from the rung it stands on (`lineage`: bases, nearest first),
    tokens to quality (also on a longer arm) and, with a speed at Qwen3-8B's shapes, time to quality relative to the
    baseline's (a projection). `seeds`: the baseline's other seeds by name (ftbench.config.pool.expand_seeds)."""
    settings = settings or {}
    fast = with_tails(speed_at_shapes(speed), variants)
    names_seeds = [x for x in seeds if isinstance(x, str)]
    out = []
    for key, group in latest_scoring(df).group_by(list(GROUP), maintain_order=True):
        rows = group.to_dicts()
        ref = reference_of({r["variant"] for r in rows}, baseline, settings)
        if ref is None:
            continue
        family = seed_families([r["variant"] for r in rows], ref, names_seeds if ref == baseline else [], variants)
        runs = {r["variant"]: {"row": r, "pts": points(r) if r["status"] == "ok" else None,
                               "key": knob_key(r["variant"], variants),
                               "seed": seed_of(r["variant"], variants, default_seed, baseline, names_seeds),
                               "family": family[r["variant"]], "apart": needs_serving(r["variant"], variants)}
                for r in rows}
        fams = {}
        for name, x in runs.items():
            fams.setdefault(x["family"], {})[x["seed"]] = name
        readings = read_group(runs, fams, lineage, settings, variants)
        if ref != baseline:
            unlike_reference(readings, fams, ref, baseline, variants)
        longer = longer_arms(runs, fams)
        read_longer = {}  # a family's longer-arm reading, once for all its seeds' rows
        for name, x in runs.items():
            row = quality_row(key, name, x, runs, fams, readings, fast, ref, variants)
            row["judged against"] = ref if ref == baseline else f"{ref} (the baseline, {baseline}, {STAND_IN_NOTE})"
            if readings[x["family"]].get("unjudged"):
                row.update({"tokens to quality": None, "tokens to quality (x baseline)": None,
                            "time to quality (x baseline, projection)": None})
            if x["family"] in longer.values():  # a longer arm: read for tokens to quality, never at the same tokens
                row.update({"quality": LONGER, "quality (as trained)": LONGER,
                            "why": "a longer arm (more steps, the schedule stretched): read for tokens to quality"})
            if x["family"] not in read_longer:
                read_longer[x["family"]] = longer_reading(longer.get(x["family"]), runs, fams,
                                                          row["compared at tokens"])
            said, rel = read_longer[x["family"]] or (None, None)
            row["longer arm: tokens to quality (x baseline)"] = said
            row["longer arm: time to quality (x baseline, projection)"] = rel / row["speed (x baseline)"] \
                if rel and row["speed (x baseline)"] else None
            out.append(row)
    return out


ROW_KNOBS = ("padding_free", "token_budget")  # how a batch's rows are laid out: padded, or packed and how


STAND_IN_NOTE = "did not run here"  # ends a row's "judged against" where a stand-in judged it (`reference_of`)


def by_stand_in(row: dict) -> bool:
    """Whether a row was judged against a stand-in (`reference_of`), not the baseline itself."""
    return (row.get("judged against") or "").endswith(f"{STAND_IN_NOTE})")


def reference_of(names: set, baseline: str, settings: dict) -> str | None:
    """What a group's runs are judged against: the baseline where it ran there, else config's `quality.stand_in`
    where that ran (a GPU kind whose lease ran the techniques beside a bf16 rung but not the baseline), else None
    (the group is not judged)."""
    if baseline in names:
        return baseline
    stand_in = settings.get("stand_in")
    return stand_in if stand_in in names else None


def unlike_reference(readings: dict, fams: dict, ref: str, baseline: str, variants: dict | None) -> None:
    """Against a stand-in, only the families laid out in rows as it is (padded, or packed to the same budget) are
    judged: another layout moves the held-out loss by itself (packed rows against padded ones), so the others are not
    measured, and say why."""
    knobs = variants or {}
    for fkey, fam in fams.items():
        name = next(iter(fam.values()))
        if fkey == ("baseline",) or all(knobs.get(name, {}).get(k) == knobs.get(ref, {}).get(k) for k in ROW_KNOBS):
            continue
        why = (f"not judged: the baseline ({baseline}) did not run on this GPU kind, and its stand-in {ref} lays "
               f"out its rows otherwise ({', '.join(ROW_KNOBS)})")
        for view in VIEWS:
            readings[fkey][view] = {"verdict": NOT_MEASURED, "pairs": 0, "why": why}
        readings[fkey]["unjudged"] = True


def longer_arms(runs: dict, fams: dict) -> dict:
    """{a family's key: the key of its longer arm} (the same knobs with `steps_scale`, ftbench.core.knobs)."""
    family_of = {x["key"]: x["family"] for x in runs.values() if x["key"] is not None}
    out = {}
    for fkey in fams:
        if fkey != ("baseline",) and fkey[0] != "alone" and any(k == "steps_scale" for k, _ in fkey):
            target = family_of.get(tuple(kv for kv in fkey if kv[0] != "steps_scale"))
            if target is not None:
                out[target] = fkey
    return out


def longer_reading(fkey, runs: dict, fams: dict, tokens) -> tuple[str, float | None] | None:
    """A technique's tokens to quality read on its longer arm, (in words, the multiple): the mean over its seeds of the
    label tokens each needs to reach the baseline seeds' mean at `tokens` (as served), as a multiple of `tokens`;
    "not within Nx" (no multiple) where a seed never reaches it; None without a longer arm."""
    if fkey is None or not tokens:
        return None
    scale = next(float(v) for k, v in fkey if k == "steps_scale")
    base = [c for c in curves_of(fams[("baseline",)], runs, "trained").values() if c and loss_at(c, tokens)]
    if not base:
        return None
    target = statistics.fmean(loss_at(c, tokens) for c in base)
    arms = [c for c in curves_of(fams[fkey], runs, "served").values() if c]
    if not arms:
        return None
    reached = [tokens_to(c, target) for c in arms]
    if None in reached:
        return f"not within {scale:g}x ({reached.count(None)} of {len(arms)} seeds never reached it)", None
    rel = statistics.fmean(reached) / tokens
    return f"{rel:.2f}x ({len(arms)} seeds, a {scale:g}x arm)", rel


def curves_of(fam: dict, runs: dict, view: str) -> dict:
    """{seed: curve} of a family in one view."""
    return {s: view_curve(runs[n]["pts"], view, runs[n]["apart"]) for s, n in fam.items()}


def read_group(runs: dict, fams: dict, lineage: dict | None, settings: dict, variants: dict | None = None) -> dict:
    """Each family's paired verdicts in both views, against the baseline and against the nearest family it stands
    on; families of one seed whose curve is bit-identical to the rung they stand on inherit its verdicts."""
    base = fams[("baseline",)]
    base_curves = {v: curves_of(base, runs, v) for v in VIEWS}
    floor = read_floor(list(base_curves["trained"].values()), SHORT_BY)
    out = {}
    for fkey, fam in fams.items():
        r = {}
        for view in VIEWS:
            pair = paired(curves_of(fam, runs, view), base_curves[view], floor)
            r[view] = {**verdict(pair["diffs"], pair["base_loss"], settings), **pair}
        r["stands on"] = stands_on(fkey, fam, runs, fams, lineage)
        if r["stands on"]:
            on = fams[r["stands on"]]
            pair = paired(curves_of(fam, runs, "trained"), curves_of(on, runs, "trained"), -math.inf)
            r["step"] = interval(pair["diffs"], settings.get("confidence", CONFIDENCE)) if pair["diffs"] else None
        out[fkey] = r
    for fkey in sorted(out, key=lambda k: len(lineage_of(fams[k], lineage))):  # nearest the baseline first
        inherit(fkey, out, fams, runs, variants)
    base_losses = [c[-1]["loss"] for c in base_curves["trained"].values() if c]
    for view in VIEWS:  # the baseline against itself: its seeds' spread, not a verdict of a difference
        if base_losses:
            out[("baseline",)][view]["why"] = (
                f"the baseline: {len(base_losses)} seed(s), held-out loss {statistics.fmean(base_losses):.4f} at the "
                f"end" + (f", sd {statistics.stdev(base_losses):.4f}" if len(base_losses) > 1 else ""))
    return out


def lineage_of(fam: dict, lineage: dict | None) -> list[str]:
    name = next(iter(fam.values()))
    return (lineage or {}).get(name, [name])


def stands_on(fkey, fam: dict, runs: dict, fams: dict, lineage: dict | None):
    """The family of the nearest variant a family's variants are built on that ran in the group (None: none)."""
    for name in fam.values():
        for b in (lineage or {}).get(name, [name])[1:]:
            if b in runs and runs[b]["family"] != fkey:
                return runs[b]["family"]
    return None


def numbers_alike(a: str, b: str, variants: dict | None) -> bool:
    """Whether two variants' knobs differ only in knobs that change no numbers (ftbench.core.knobs.NUMERICS_FREE)."""
    ka, kb = (variants or {}).get(a), (variants or {}).get(b)
    return ka is not None and kb is not None and same_numbers(ka, kb)


def inherit(fkey, out: dict, fams: dict, runs: dict, variants: dict | None = None) -> None:
    """A one-seed family of a technique that changes no numbers, bit-identical (same seed, same curve, as trained)
    to the rung it stands on, takes that rung's verdicts, and says so; one that differs stays inconclusive, and says
    that too."""
    r, on = out[fkey], out[fkey]["stands on"]
    if on is None or len(fams[fkey]) != 1 or fkey == ("baseline",) or r["trained"]["pairs"] >= MIN_PAIRS:
        return
    (seed, name), = fams[fkey].items()
    other = fams[on].get(seed)
    if other is None or not numbers_alike(name, other, variants):
        return
    mine, theirs = runs[name]["pts"], runs[other]["pts"] if other else None
    if identical(mine, theirs) and not runs[name]["apart"] and not runs[other]["apart"]:
        for view in VIEWS:
            r[view] = {**out[on][view], "why": f"bit-identical to {other} (seed {seed}, every held-out point): its "
                                               f"verdict, {out[on][view]['why']}"}
    elif mine and theirs:
        gap = max(abs(a["loss"] - b["loss"]) for a, b in zip(mine, theirs))
        for view in VIEWS:
            r[view]["why"] += f"; not bit-identical to {other} (up to {gap:.2e} nats apart): it needs its own seeds"


def head_of(fam: dict, fkey, baseline: str) -> str:
    """The name a family of seeds goes by: the baseline's, else its run under the first seed it ran (config's seed,
    whose variant carries no seed suffix, where it ran)."""
    if fkey == ("baseline",):
        return baseline
    return min(fam.values(), key=len)


def quality_row(key, name: str, x: dict, runs: dict, fams: dict, readings: dict, fast: dict, baseline: str,
                variants: dict | None) -> dict:
    """One run's row of the verdict table, carrying its technique's (its family's) verdicts."""
    r, pts = x["row"], x["pts"]
    fam, reading = fams[x["family"]], readings[x["family"]]
    served, trained = reading["served"], reading["trained"]
    why = served["why"]
    if not pts:
        word = NOT_MEASURED
        why = (f"the run's status is {r['status']}: {r.get('reason') or ''}".strip(": ") if r["status"] != "ok"
               else "the run measured no held-out curve")
    else:
        word = served["verdict"]
        if x["seed"] in (served.get("left_out") or []):
            word, why = NOT_MEASURED, (f"its curve ends at {pts[-1]['tokens']:,} label tokens, more than "
                                       f"{SHORT_BY:.0%} short of the baseline's, or of its seeds' where their "
                                       f"curves were not scored each step: not read ({why})")
    if x["apart"] and word != NOT_MEASURED:
        why = f"served on the bf16 base: {why}; as trained: {trained['verdict']}, {trained['why']}"
    base_pts = [c for c in curves_of(fams[("baseline",)], runs, "trained").values() if c]
    tokens = trained.get("tokens") or (min(c[-1]["tokens"] for c in base_pts) if base_pts else None)
    target = statistics.fmean(loss_at(c, tokens) for c in base_pts if loss_at(c, tokens) is not None) \
        if base_pts and tokens else None
    ttq = tokens_to(pts, target) if pts and target is not None else None
    rel_tokens = ttq / tokens if ttq is not None and tokens else None
    s = next((fast[n] for n in fam.values() if n in fast), None)  # a seed of a technique runs at its speed
    base_speed = next((fast[n] for n in fams[("baseline",)].values() if n in fast
                       and (s is None or fast[n]["gpu"] == s["gpu"])), None)  # one GPU kind, never a mix
    speedup = s["throughput.tokens_per_s"] / base_speed["throughput.tokens_per_s"] if s and base_speed else None
    rel_time = rel_tokens / speedup if rel_tokens is not None and speedup else None
    step = reading.get("step")
    return {
        "model": key[0], "dataset": key[1], "gpu": key[2], "scored": key[3], "variant": name,
        "technique": head_of(fam, x["family"], baseline),
        "techniques, in words": words(name, knobs=(variants or {}).get(name) or {}),
        "seed": x["seed"], "seed of the baseline": x["family"] == ("baseline",),
        "seeds": len(fam), "paired seeds": served.get("pairs") or 0,
        "held-out loss before": pts[0]["loss"] if pts and pts[0]["tokens"] == 0 else None,
        "held-out loss after": pts[-1]["loss"] if pts else None,
        "tokens trained": pts[-1]["tokens"] if pts else None,
        "compared at tokens": served.get("tokens") or tokens,
        "baseline loss there": served.get("base_loss"),
        "quality": word, "quality (as trained)": trained["verdict"] if pts else NOT_MEASURED,
        "delta (nats)": served.get("mean"), "interval low": served.get("low"), "interval high": served.get("high"),
        "margin (nats)": served.get("margin"),
        "delta as trained": trained.get("mean"), "as trained low": trained.get("low"),
        "as trained high": trained.get("high"),
        "stands on": next(iter(fams[reading["stands on"]].values())) if reading.get("stands on") else None,
        "delta from it": step[0] if step else None,
        "why": why, "tokens to quality": ttq, "tokens to quality (x baseline)": rel_tokens,
        "tokens/s at Qwen3-8B": s["throughput.tokens_per_s"] if s else None,
        "speed measured on": f"{s['gpu']}, {s['dataset']} batch {s['batch_size']}{s.get('mix', '')}" if s else None,
        "speed batch": s["batch_size"] if s else None, "speed mixed": bool(s and s.get("mix")),
        "speed (x baseline)": speedup,
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
