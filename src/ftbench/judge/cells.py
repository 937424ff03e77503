"""Each published study's cells filled from the records: Study A's precisions and shapes against bf16, Study B's
samples per hour, Study C's loader workers, Study D's Unsloth claim and its several GPUs; the verdicts and what a
cell's evidence says. ftbench.judge.coverage gathers them into the front page's table."""

from __future__ import annotations

import polars as pl

from ftbench.judge.analysis import code_of, full_scale
from ftbench.judge.compare.common import _verdict
from ftbench.core.knobs import DEFAULTS
from ftbench.judge.verdicts import combined_noise, evidence, judge, published_range, step_noise

GIB_PER_GB = 1e9 / 2**30


def _rows(df: pl.DataFrame, **match) -> list[dict]:
    for k, v in match.items():
        df = df.filter(pl.col(k).is_in(v) if isinstance(v, list) else pl.col(k) == v)
    return list(df.iter_rows(named=True))


def _gpu_mem(r: dict) -> float | None:
    return r.get("gpu_memory_gib")


def _in_order(rows: list[dict], order: list[str]) -> list[dict]:
    """The records, earlier variants in `order` first (variants not in it last; otherwise as they came)."""
    rank = {v: i for i, v in enumerate(order)}
    return sorted(rows, key=lambda r: rank.get(r["variant"], len(order)))


def _pick(rows: list[dict], order: list[str], counts_timeout: bool, published_gib: float | None):
    """The record that fills a cell, and the status it fills it with: ok first (earlier variants in `order` first);
    a timeout where the variant compiles (the compile budget ran out: a result); an oom only on a GPU with at least
    the published GPU's memory (elsewhere it says which GPU to try). None when no record fills it."""
    rows = _in_order(rows, order)
    for r in rows:
        if r["status"] == "ok":
            return r
    for r in rows:
        if r["status"] == "timeout" and counts_timeout and r.get("variant.compile"):
            return r
    for r in rows:
        if r["status"] == "oom" and published_gib and (_gpu_mem(r) or 0) >= published_gib:
            return r
    return None


def _why(rows: list[dict], published_gib: float | None, order: list[str] | None = None) -> str:
    """What the records of a cell no record fills say, each "variant on the GPU: status at commit X (why)" (an ok
    record: its status alone); with `order`, the study's own variant and its settings first."""
    if not rows:
        return "not run yet at full scale on a GPU"
    parts = []
    rows = _in_order(rows, order) if order else rows
    for r in rows:
        text = f"{r['variant']} on the {r['gpu']}: {r['status']}"
        if r["status"] == "oom":
            text += _oom_at(r) + _at(r)
            if published_gib and (_gpu_mem(r) or 0) < published_gib:
                text += f" (a GPU with >= {published_gib:.0f} GiB, as the study's, may hold it)"
        elif r["status"] != "ok":
            text += _at(r) + (f" ({r['reason'][:120]})" if r.get("reason") else "")
        parts.append(text)
    return "; ".join(parts)


def _oom_at(r: dict) -> str:
    """" at N GiB": the memory a run held when it ran out (its peak where the failure's was not recorded)."""
    at = r.get("memory.at_failure_gib") or r.get("memory.peak_reserved_gib")
    return f" at {at:.1f} GiB" if at else ""


def _baseline_peak(full: pl.DataFrame, model, bs: int, baselines: list[str]) -> str:
    """Where a cell not yet run would fit: the baseline's peak at that batch, by GPU ("" where none ran)."""
    r = min((r for r in _rows(full, model=model, variant=baselines, batch_size=bs, status="ok") if r.get("peak_gib")),
            key=lambda r: baselines.index(r["variant"]), default=None)
    return f"; {r['variant']} at batch {bs} peaked at {r['peak_gib']:.1f} GiB on the {r['gpu']}" if r else ""


def probe_evidence(full: pl.DataFrame, r: dict, probes: list[dict], cell: str, baseline: str) -> str | None:
    """What a probe measured beside a cell that differs: a variant that changes one thing of the one it stands
    beside (`probes` in the coverage config: {variant, beside, changes, cells}), run on the cell's GPU; at the probe's
    batch nearest the cell's, both against the baseline: "fp8-te-gc-cudnn (attention pinned to cuDNN's SDPA) on
    this GPU: 0.70x bf16-gc at batch 8, where fp8-te-gc is 0.89x". None where no probe of this cell ran here."""
    said = []
    for probe in probes:
        if cell not in probe.get("cells", []):
            continue
        pairs = []
        for p in _rows(full, model=r["model"], gpu=r["gpu"], variant=probe["variant"], status="ok"):
            at = {"model": r["model"], "gpu": r["gpu"], "batch_size": p["batch_size"], "status": "ok"}
            b = next(iter(_rows(full, variant=baseline, **at)), None)
            beside = next(iter(_rows(full, variant=probe["beside"], **at)), None)
            if b and beside:
                pairs.append((abs(p["batch_size"] - r["batch_size"]), p, b, beside))
        if pairs:
            _, p, b, beside = min(pairs, key=lambda x: (x[0], -x[1]["batch_size"]))
            said.append(f"{probe['variant']} ({probe['changes']}) on this GPU: "
                        f"{p['timing.step_time_s'] / b['timing.step_time_s']:.2f}x {baseline} at batch "
                        f"{p['batch_size']}, where {probe['beside']} is "
                        f"{beside['timing.step_time_s'] / b['timing.step_time_s']:.2f}x")
    return "; ".join(said) or None


def _two_machines(m: str | None, n: str | None) -> bool:
    """Two runs' machines (column `machine`: `ftbench.harness.gpus.machine_of`, or the lease or campaign call that ran a
    record older than it) differ; unknown on either side is not told apart."""
    return bool(m and n and m != n)


def _other_code(r: dict, b: dict, across_code: bool) -> dict | None:
    """A ratio of two runs of different code, or of two machines, is not judged unless the user merged across them
    on purpose (`merge_across_code`): "not comparable: baseline from other code" (or "from another machine"), both
    named."""
    if across_code:
        return None
    if code_of(r) != code_of(b):
        return _not_comparable(f"baseline from other code (this cell's files {(code_of(r) or '?')[:10]} at commit "
                               f"{_commit(r)}, the baseline's {(code_of(b) or '?')[:10]} at commit {_commit(b)}); "
                               "merge_across_code: true divides them on purpose")
    if _two_machines(r.get("machine"), b.get("machine")):
        return _not_comparable(f"baseline from another machine (this cell on {r['machine']}, the baseline on "
                               f"{b['machine']}, two {r['gpu']} machines); merge_across_code: true divides them on "
                               "purpose")
    return None


def _merged_note(r: dict, b: dict) -> str:
    """What a ratio merged across code or machines on purpose divides: "; the baseline ran other code (...)", "; the
    baseline ran on another machine (...)", or ""."""
    note = ""
    if code_of(r) != code_of(b):
        note += f"; the baseline ran other code (commit {_commit(b)}, this cell {_commit(r)})"
    if _two_machines(r.get("machine"), b.get("machine")):
        note += f"; the baseline ran on another machine ({b['machine']}, this cell {r['machine']})"
    return note


def study_a(df: pl.DataFrame, published: dict, measured_by: dict | None = None,
            probes: list[dict] | None = None, across_code: bool = False) -> list[dict]:
    """Study A's relative table: each of the seven variants (bf16 the baseline) at each published batch size; ours
    is the step time and peak memory relative to the baseline of the same GPU and batch (the same position in
    `measured_by`: a gradient-checkpointed variant against the gradient-checkpointed baseline). A cell that differs
    also says what its probes measured beside it (`probe_evidence`). A baseline of other code is no ratio unless
    `across_code` (`_other_code`)."""
    measured_by = measured_by or {}
    gib = (published.get("gpu") or {}).get("memory_gb", 0) * GIB_PER_GB or None
    full = full_scale(df)
    cells = [{"variant": "bf16", "step_time": "baseline", "memory": "baseline"}] + published.get("variants", [])
    out = []
    for cell in cells:
        order = measured_by.get(cell["variant"], [cell["variant"]])
        for bs in published.get("batch_sizes", []):
            rows = _rows(full, model=published.get("model"), variant=order, batch_size=bs)
            base = {"study": "A", "model": published.get("model"), "dataset": published.get("dataset"),
                    "variant": cell["variant"], "batch": bs, "metric": "step time, memory vs bf16",
                    "published": f"{cell['step_time']}; memory {cell['memory']}"}
            rng = published_range(cell.get("step_time_ratio"))
            if rng:
                base["published x"] = f"{rng[0]:.2f}-{rng[1]:.2f}" if rng[0] != rng[1] else f"{rng[0]:.2f}"
            r = _pick(rows, order, True, gib)
            if r is None:
                out.append({**base, "why": _why(rows, gib) + _baseline_peak(full, published.get("model"), bs,
                                                                              measured_by.get("bf16", ["bf16"]))})
                continue
            ours, ratio, judged, b = r["status"], None, None, None
            if r["status"] == "ok":
                i = order.index(r["variant"])
                baseline = measured_by.get("bf16", ["bf16"])[i:i + 1]
                b = next(iter(_rows(full, model=r["model"], gpu=r["gpu"], batch_size=bs, status="ok",
                                    variant=baseline)), None)
                step = r["timing.step_time_s"]
                if b is None:
                    ours = f"{step:.3g} s/step (no baseline on this GPU)"
                    judged = _not_comparable(f"no {baseline[0] if baseline else 'bf16'} baseline on the {r['gpu']} "
                                             f"at batch {bs}")
                elif b is r or b["variant"] == r["variant"]:
                    ours = f"{step:.3g} s/step, {r['peak_gib']:.1f} GiB"
                    judged = _not_comparable(f"the baseline of the ratios: an absolute time on the {r['gpu']}, "
                                             "not the study's GPU")
                else:
                    ratio = step / b["timing.step_time_s"]
                    noise = combined_noise(step_noise(r), step_noise(b))
                    ours = (f"step {_verdict(ratio, step_noise(r), step_noise(b))}, memory "
                            f"{r['peak_gib'] / b['peak_gib']:.2f}x")
                    judged = (_other_code(r, b, across_code)
                              or (judge(ratio, rng, noise) if rng else _not_comparable("no published figure as data")))
                    if judged["verdict"] != "not comparable":  # merged across code or machines on purpose: say so
                        judged["how"] += _merged_note(r, b)
            elif r["status"] == "timeout":  # a limit we chose ran out: no number, never a result
                ours = f"timeout: {(r['reason'] or '')[:110]}"
                judged = {"verdict": "not measured", "how": "a timeout is not a measurement"}
            else:
                ours = f"oom at {r.get('memory.at_failure_gib') or 0:.1f} GiB on the {r['gpu']}"
                judged = _not_comparable(f"out of memory on the {r['gpu']} (the study's GPU held it)")
            row = {**base, "GPU": r["gpu"], "measured by": r["variant"], "status": r["status"], "ours": ours,
                   "ratio": ratio, "noise (CV)": step_noise(r), "measured": judged["verdict"] != "not measured",
                   **_judged(judged, r, b)}
            if b is not None and row["verdict"] == "differs" and (
                    probed := probe_evidence(full, r, probes or [], cell["variant"], b["variant"])):
                row["cause (measured)"] += "; " + probed
            out.append(row)
    return out


def _not_comparable(why: str) -> dict:
    return {"verdict": "not comparable", "how": why}


def _judged(judged: dict, r: dict | None, base: dict | None = None) -> dict:
    """The verdict columns of a cell: the verdict, how far and which way (or why not comparable), and where it
    differs or cannot be compared, the run's own evidence of where its step goes."""
    out = {"verdict": judged["verdict"], "how": judged["how"]}
    if r is not None and r.get("status") == "ok" and judged["verdict"] in ("differs", "not comparable"):
        out["cause (measured)"] = evidence(r, base)
    return out


def study_b(df: pl.DataFrame, published: dict, measured_by: dict | None = None, **_) -> list[dict]:
    """Study B's samples per hour: each published (model, GPU, dataset) cell at the study's method and batch size
    (the published `table`; the Blackwell card ran the same batches). A cell of a GPU we were not lent stays
    empty; an H100 cell the H100 cannot hold is filled by a GPU with more memory, and says so."""
    measured_by = measured_by or {}
    full = full_scale(df)
    runs = {(c["model"], c["dataset"]): c for c in published.get("table", [])}
    out = []
    for cell in published.get("samples_per_hour", []):
        how = runs.get((cell["model"], cell["dataset"]), {})
        variant, bs = how.get("variant", "unsloth-qlora"), how.get("batch_size")
        order = measured_by.get(variant, [variant])
        rows = _rows(full, model=cell["model"], dataset=cell["dataset"], variant=order, batch_size=bs)
        # the study's batch shape (padded batches, as its SFTTrainer made them) leads; a packed run stands beside
        packed = [x for x in rows if x.get("variant.padding_free")]
        rows = [x for x in rows if not x.get("variant.padding_free")]
        here = [r for r in rows if r["gpu"] == cell["gpu"]]
        base = {"study": "B", "model": cell["model"], "dataset": cell["dataset"], "variant": variant, "batch": bs,
                "metric": f"samples/h on the {cell['gpu']}", "published": f"{cell['samples_per_hour']:,}",
                "ours, packed": _packed(packed, order, cell)}
        r = _pick(here, order, False, None)
        if r is None and any(x["status"] == "oom" for x in here):  # the published GPU cannot hold ours: a larger one
            r = _pick([x for x in rows if x["gpu"] != cell["gpu"]], order, False, None)
        too_big = None
        if r is None and rows:  # or a larger GPU's run allocated more at its peak than the published GPU holds
            cap = full.filter(pl.col("gpu") == cell["gpu"])["gpu_memory_gib"].max()
            r = too_big = next((x for x in _in_order(rows, order) if x["gpu"] != cell["gpu"] and x["status"] == "ok"
                                and cap and (x.get("memory.peak_allocated_gib") or 0) > cap), None)
        if r is None and any(x["gpu"] == cell["gpu"] for x in packed):  # only packed rows: beside, never in its place
            out.append({**base, "measured": True, "status": "ok", "verdict": "not comparable",
                        "how": "measured only in packed rows (no padding), not the study's padded batches",
                        "why": _why(rows, None, order) if rows else "no run in the study's batch shape (padded) yet"})
            continue
        if r is None:
            why = _why(here, None, order) if here else (
                f"no record from the {cell['gpu']} (samples/h are per GPU); ours elsewhere: {_why(rows, None, order)}"
                if rows else "not run yet at full scale on a GPU")
            out.append({**base, "why": why})
            continue
        ours = r["throughput.samples_per_hour"]
        note = None
        if too_big is not None:
            note = (f"it allocated {r['memory.peak_allocated_gib']:.1f} GiB at its peak, more than the {cell['gpu']} "
                    f"holds ({cap:.1f} GiB); measured on the {r['gpu']}")
        elif r["gpu"] != cell["gpu"]:
            note = f"the {cell['gpu']} ran out of memory; measured on the {r['gpu']}"
        otherwise = _same_system(rows, variant, r)
        if otherwise is not None:  # the study's system with a setting changed: judged as the system, and says which
            note = "; ".join(x for x in (f"{r['variant']}: the same system with {otherwise} ({variant}: "
                                         f"{_first_reason(rows, variant)})", note) if x)
        if r["variant"] != variant and otherwise is None:  # a stand-in is never the study's system: beside, not a verdict
            note = "; ".join(x for x in (note, f"{variant} cannot run here ({(_first_reason(rows, variant))}); "
                                         f"{r['variant']} stands in") if x)
            judged = _not_comparable(f"a stand-in: {r['variant']} for the study's {variant}")
        elif r["gpu"] != cell["gpu"]:
            judged = _not_comparable(f"measured on the {r['gpu']}, not the {cell['gpu']}")
        else:
            judged = judge(ours, published_range(cell["samples_per_hour"]), r["timing.noise_cv"],
                           lower_is_faster=False)
        out.append({**base, "GPU": r["gpu"], "measured by": r["variant"], "status": "ok",
                    "ours": f"{ours:,.0f} ({_padding(r)})", "ratio": ours / cell["samples_per_hour"],
                    "noise (CV)": r["timing.noise_cv"], "why": note, "measured": True,
                    "x published": _verdict(ours / cell["samples_per_hour"], r["timing.noise_cv"], None),
                    **_judged(judged, r)})
    return out


def _same_system(rows: list[dict], variant: str, r: dict) -> str | None:
    """Where `r` is not the study's variant but runs the same framework (Unsloth with its own compile off, say):
    the knobs it sets otherwise, from the study variant's record beside it ("unsloth_compile False"); None for a
    stand-in (another framework), or where the study variant has no record to compare with."""
    study = next((x for x in rows if x["variant"] == variant), None)
    if (r["variant"] == variant or study is None or study.get("variant.framework") is None
            or study.get("variant.framework") != r.get("variant.framework")):
        return None

    def knob(row, k):  # a record made before the knob existed ran with its default
        return row.get(k) if row.get(k) is not None else DEFAULTS.get(k.removeprefix("variant."))

    knobs = sorted(k for k in r if k.startswith("variant.") and k.removeprefix("variant.") in DEFAULTS
                   and knob(r, k) != knob(study, k))
    return ", ".join(f"{k.removeprefix('variant.')} {knob(r, k)}" for k in knobs) or "no knob changed"


def _padding(r: dict) -> str:
    """A run's padding share: the padded tokens it computed that were not real ones."""
    real, padded = r.get("throughput.tokens_per_s"), r.get("throughput.padded_tokens_per_s")
    return f"padding {1 - real / padded:.0%}" if real and padded else "padding not recorded"


def _packed(packed: list[dict], order: list[str], cell: dict) -> str | None:
    """The packed run beside a Study B cell (on the published GPU, else the one that held it): samples/h, who, where,
    its padding share and its ratio to the published figure."""
    r = _pick([x for x in packed if x["gpu"] == cell["gpu"]], order, False, None) or _pick(packed, order, False, None)
    if r is None:
        return None
    sph = r["throughput.samples_per_hour"]
    return (f"{sph:,.0f} by {r['variant']} on the {r['gpu']} ({_padding(r)}; {sph / cell['samples_per_hour']:.2f}x "
            "published)")


def _commit(r: dict) -> str:
    return (r.get("git_commit") or "?")[:7]


def _at(r: dict) -> str:
    """" at commit abc1234": the code a failed record ran (a later commit may run where it could not)."""
    return f" at commit {_commit(r)}" if r.get("git_commit") else ""


def _first_reason(rows: list[dict], variant: str) -> str:
    for r in rows:
        if r["variant"] == variant and r["status"] == "oom":  # the measured limit, not the allocator's sentence
            return f"oom{_oom_at(r)} on the {r['gpu']}{_at(r)}"
        if r["variant"] == variant and r.get("reason"):
            return f"{r['status']}{_at(r)}: {r['reason'][:90]}"
    return "no record"


def study_c(df: pl.DataFrame, published: dict, measured_by: dict | None = None, across_code: bool = False,
            probes: list[dict] | None = None) -> list[dict]:
    """Study C's time per step: the worker sweep and the before/after stages, each as a ratio to the stock script
    (0 workers) of the same GPU, beside the published ratio (the study's GPU is not ours). A stage that differs or
    that the noise cannot judge says what its probes measured beside it on the same GPU (`probe_evidence`)."""
    full = full_scale(df)
    cells = {f"workers-{k}": v for k, v in published.get("workers_ms_per_step", {}).items()}
    cells.update({s["variant"]: s["ms_per_step"] for s in published.get("steps", [])})
    stock = cells.get("workers-0")
    out = []
    for variant, ms in cells.items():
        rows = _rows(full, variant=variant)
        base = {"study": "C", "model": "stable-diffusion-v1-5", "dataset": "naruto", "variant": variant, "batch": 1,
                "metric": "ms/step vs 0 workers",
                "published": (f"{ms} ms" + (f" ({ms / stock:.2f}x)" if stock else "")) if isinstance(ms, (int, float))
                else str(ms), "published x": f"{ms / stock:.2f}" if stock and isinstance(ms, (int, float)) else None}
        r = _pick(rows, [variant], False, None)
        if r is None and any(x["status"] in ("error", "crashed") for x in rows) and not isinstance(ms, (int, float)):
            r = next(x for x in rows if x["status"] in ("error", "crashed"))  # the study's own result was an error
        if r is None:
            out.append({**base, "why": _why(rows, None)})
            continue
        if r["status"] != "ok":
            out.append({**base, "GPU": r["gpu"], "measured by": variant, "status": r["status"], "measured": True,
                        "ours": f"{r['status']}, as published", "why": (r["reason"] or "")[:120],
                        "verdict": "holds", "how": "failed as published"})
            continue
        b = next(iter(_rows(full, variant="workers-0", gpu=r["gpu"], status="ok")), None)
        step = r["timing.step_time_s"]
        ratio = step / b["timing.step_time_s"] if b and b["variant"] != variant else None
        if not isinstance(ms, (int, float)):
            judged = _not_comparable(f"the published cell is a failure ({ms}: {published.get('workers_note', '')}); "
                                     "ours ran")
        elif ratio is None and b is not None:
            judged = _not_comparable(f"{step * 1000:.0f} ms against the published {ms} ms: an absolute time on the "
                                     f"{r['gpu']}, not the study's GPU; the other cells are ratios to this one")
        elif ratio is None:
            judged = _not_comparable(f"no workers-0 baseline on the {r['gpu']}")
        else:
            judged = _other_code(r, b, across_code) or judge(ratio, published_range(ms / stock), combined_noise(
                r["timing.noise_cv"], b["timing.noise_cv"]))
            if judged["verdict"] != "not comparable":  # merged across code or machines on purpose: say so
                judged["how"] += _merged_note(r, b)
        row = {**base, "GPU": r["gpu"], "measured by": variant, "status": "ok", "measured": True,
               "ours": f"{step * 1000:.0f} ms" + (f" ({_verdict(ratio, r['timing.noise_cv'], b['timing.noise_cv'])})"
                                                  if ratio else ""), "ratio": ratio,
               "noise (CV)": r["timing.noise_cv"], **_judged(judged, r, b)}
        if b is not None and row["verdict"] in ("differs", "inconclusive") and (
                probed := probe_evidence(full, r, probes or [], variant, b["variant"])):
            row["cause (measured)"] = "; ".join(x for x in (row.get("cause (measured)"), probed) if x)
        out.append(row)
    return out


HF_TWINS = ["qlora-gc", "qlora"]  # Study D's Hugging Face side, the same knobs as unsloth-qlora first


