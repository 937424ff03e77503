"""Does a published finding hold? One computed verdict per published cell, from the published value as data
(config/published/: a number or a range, with its unit and conditions) and our record of the cell:

- holds: our figure lies inside the published range, or within the noise of it (NOISE_SIGMAS x our noise CV);
- differs: outside it beyond the noise, by how much, and which way (faster or slower than published);
- inconclusive: the noise band (NOISE_SIGMAS x our noise CV) is wider than INCONCLUSIVE_BAND, so the record can
  tell neither (never "holds"): the CV is given;
- not comparable: the record cannot answer the question as published (a stand-in for the study's system, a GPU
  of another kind for an absolute figure, an out-of-memory result), and why;
- not measured: no record, or one that ended before its number existed (a timeout is never a result).

Where a cell differs, its cause is what the run's own evidence says (`evidence`): where its step's kernel time moved
against the baseline's profile (`step_balance`: GEMMs, FP8 casts and scaling, attention and its implementation),
the profile's verdict (GPU-bound, loader-bound, host launch-bound), the data wait, the host's CPU time per step,
recompiles and graph breaks, tokens per sample and padding against the baseline. Nothing is typed in by hand; with
no evidence it says so.
"""

from __future__ import annotations

NOISE_SIGMAS = 2  # a ratio is a difference only when it lies outside this many combined noise CVs of 1
INCONCLUSIVE_BAND = 0.10  # NOISE_SIGMAS x the noise CV above this: the verdict says nothing either way
VERDICTS = ("holds", "differs", "inconclusive", "not comparable", "not measured")
LOADER_BOUND_SHARE = 0.2  # the data loader holds at least this share of a profiled step: loader-bound
TOKENS_DIFFER = 0.05  # tokens per sample this much apart from the baseline's: a different workload


def published_range(value) -> tuple[float, float] | None:
    """A published figure as (low, high): a number is a range of one point; [a, b] a range; text is not data."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value), float(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return float(min(value)), float(max(value))
    return None


def judge(ours: float, published: tuple[float, float], noise: float | None, lower_is_faster: bool = True) -> dict:
    """Our figure against the published range, in the published unit: verdict, and how far and which way.
    `noise` is the relative noise of our figure (a CV; combined over the runs a ratio divides)."""
    lo, hi = published
    what = "range" if lo != hi else "value"
    band = NOISE_SIGMAS * (noise or 0.0)
    beyond = not lo * (1 - band) <= ours <= hi * (1 + band)  # outside the published figure's noise band
    if not carries(noise) and not beyond:  # a band this wide would call almost anything "holds"; a figure
        # beyond even this band still differs (0.74x where 0.34x was published, a 14 % band)
        return {"verdict": "inconclusive",
                "how": f"the noise cannot carry a verdict: {NOISE_SIGMAS} x CV {100 * noise:.1f} % = "
                       f"{100 * band:.1f} % is wider than {100 * INCONCLUSIVE_BAND:.0f} % (ours {ours:.3g}, published {what} "
                       f"{lo:.3g}{'' if lo == hi else f'-{hi:.3g}'})"}
    if lo <= ours <= hi:
        return {"verdict": "holds", "how": f"inside the published {what}"}
    if lo * (1 - band) <= ours <= hi * (1 + band):
        return {"verdict": "holds", "how": f"within the noise of the published {what} ({NOISE_SIGMAS} x CV "
                                           f"{100 * noise:.1f} %)"}
    off = ours / hi if ours > hi else ours / lo
    slower = (ours > hi) == lower_is_faster
    how = f"{off:.2f}x the published {what}: {'slower' if slower else 'faster'} than published"
    if not carries(noise):
        how += f", beyond even its wide noise band ({NOISE_SIGMAS} x CV {100 * noise:.1f} %)"
    if noise is None:
        how += " (noise not recorded)"
    return {"verdict": "differs", "how": how}


def carries(noise: float | None) -> bool:
    """Whether a noise CV is narrow enough to carry a verdict: NOISE_SIGMAS x CV at most INCONCLUSIVE_BAND (no
    recorded noise counts as none)."""
    return NOISE_SIGMAS * (noise or 0.0) <= INCONCLUSIVE_BAND


def step_noise(r: dict) -> float | None:
    """The noise of a run's median step (`r` a flat row: `timing.noise_cv`, ...): its windows' CV, or where a window
    met a new batch shape (a compile inside it) the CV of the windows' median steps, since the median step is the
    number and a recompile is not noise of it."""
    if r.get("extra.new_shapes_measured") and r.get("timing.cv_median_across_repeats") is not None:
        return r["timing.cv_median_across_repeats"]
    return r.get("timing.noise_cv")


def combined_noise(*cvs) -> float | None:
    values = [c for c in cvs if c is not None]
    return sum(c * c for c in values) ** 0.5 if values else None


def _kernel_ms(row: dict, share: str) -> float:
    return (row.get(share) or 0.0) * row["profile.kernel_ms_per_step"]


def step_balance(row: dict, base: dict) -> str | None:
    """Where a step's kernel time moved against the baseline's profile (the same batch, the same GPU kind): the
    GEMMs, the FP8 casts and scaling, attention (and the implementation that ran it) and the rest, in ms a step.
    None where either profile lacks its kernel time."""
    ms, ref = row.get("profile.kernel_ms_per_step"), base.get("profile.kernel_ms_per_step")
    if not ms or not ref or row is base or row.get("variant") == base.get("variant"):  # (a cell is its own baseline)
        return None
    moved = {name: _kernel_ms(row, share) - _kernel_ms(base, share) for name, share in (
        ("GEMMs", "profile.gemm_share"), ("FP8 casts and scaling", "profile.fp8_work_share"),
        ("attention", "profile.attention_share"))}
    moved["the rest"] = (ms - ref) - sum(moved.values())
    ran, before = row.get("profile.attention_backend"), base.get("profile.attention_backend")
    parts = [f"{name} {ms_:+.0f}" + (f" ({before} there, {ran} here)" if name == "attention" and ran and before
                                     and ran != before else "")
             for name, ms_ in moved.items() if abs(ms_) >= 0.5]
    bound = "" if row.get("profile.attention_exact") and base.get("profile.attention_exact") else \
        " (attention from each profile's top kernels)"
    moved_text = ", ".join(parts) + " ms" if parts else "no part moved by 0.5 ms or more"
    return (f"kernel time {ref:,.0f} ms a step in {base.get('variant', 'the baseline')}'s profile, {ms:,.0f} here: "
            + moved_text + bound)


def evidence(row: dict, base: dict | None = None) -> str:
    """What the run's own records say about where its step goes (and against its baseline's, where the cell is a
    ratio): the kernel time's balance against the baseline's profile, a profile's verdict, data wait, host CPU per
    step, recompiles and graph breaks, tokens per sample, padding. "cause not measured" where the record holds none
    of it."""
    parts = [balance] if base is not None and (balance := step_balance(row, base)) else []
    busy, bound, cause = row.get("profile.busy_pct"), row.get("profile.cpu_bound"), row.get("profile.idle_cause")
    loading = row.get("profile.data_loading_share")
    if busy is not None:
        kind = ("loader-bound" if loading is not None and loading >= LOADER_BOUND_SHARE else
                "host-bound" if bound else "GPU-bound")
        kernels = row.get("profile.kernels_per_step")
        parts.append(f"profile: {kind}, GPU busy {busy:.0f} % of a step"
                     + (f", data loader {100 * loading:.0f} %" if loading is not None else "")
                     + (f", {kernels:,.0f} kernels a step" if kernels else "")
                     + (f"; GEMMs {100 * row['profile.gemm_share']:.0f} % of kernel time"
                        if row.get("profile.gemm_share") is not None else "")
                     + (f", FP8 casts and scaling {100 * row['profile.fp8_work_share']:.0f} %"
                        if (row.get("profile.fp8_work_share") or 0) >= 0.005 else "")
                     + (f", NF4 dequantization {100 * row['profile.dequant_4bit_share']:.0f} %"
                        if (row.get("profile.dequant_4bit_share") or 0) >= 0.005 else "")
                     + (f"; idle: {cause}" if cause and bound else ""))
    nvml, hfu = row.get("device_usage.gpu_util_mean_pct"), row.get("flops.hfu")
    if busy is None and nvml is not None:  # no profile: NVML's share of the windows a kernel ran, and how full
        parts.append(f"NVML busy {nvml:.0f} %" + (f", HFU {100 * hfu:.0f} %" if hfu else ""))
    wait = row.get("data.wait_share")
    if wait is not None and busy is None:
        parts.append(f"data wait {100 * wait:.1f} % of the step")
    cpu, step = row.get("timing.host_cpu_step_s"), row.get("timing.step_time_s")
    if cpu is not None and step:
        parts.append(f"host CPU {1000 * cpu:.0f} ms per {1000 * step:.0f} ms step ({cpu / step:.0%})")
    if row.get("variant.compile"):
        graphs, again, breaks = (row.get("compile.unique_graphs"), row.get("compile.recompiles"),
                                 row.get("compile.graph_breaks"))
        if any(x is not None for x in (graphs, again, breaks)):
            parts.append(", ".join(f"{x:.0f} {name}" for x, name in ((graphs, "graphs"), (again, "recompiles"),
                                                                     (breaks, "graph breaks")) if x is not None))
        if row.get("extra.new_shapes_measured"):
            parts.append(f"{row['extra.new_shapes_measured']:.0f} of the {row['extra.shapes_measured']:.0f} batch "
                         "shapes in the measured windows were new (each a compile)")
    tokens = row.get("throughput.tokens_per_sample")
    if base is not None and tokens and base.get("throughput.tokens_per_sample"):
        ref = base["throughput.tokens_per_sample"]
        if abs(tokens / ref - 1) > TOKENS_DIFFER:
            parts.append(f"{tokens:,.0f} tokens/sample against the baseline's {ref:,.0f}")
    real, padded = row.get("throughput.tokens_per_s"), row.get("throughput.padded_tokens_per_s")
    if real and padded and padded > real * (1 + TOKENS_DIFFER):
        model, hardware = row.get("flops.model_per_step"), row.get("flops.hardware_per_step")
        parts.append(f"padding {1 - real / padded:.0%} of the tokens"
                     + (f" ({1 - model / hardware:.0%} of executed FLOPs with recompute)" if model and hardware
                        else ""))
    return "; ".join(parts) or "cause not measured"


def counts_line(c: dict) -> str:
    """"holds 3 of 42, differs 20, inconclusive 1, not comparable 5, not measured 13": of every published cell of a
    study."""
    return (f"holds {c['holds']} of {sum(c.values())}, differs {c['differs']}, inconclusive {c.get('inconclusive', 0)}, "
            f"not comparable {c['not comparable']}, not measured {c['not measured']}")
