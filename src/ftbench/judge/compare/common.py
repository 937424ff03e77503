"""What every comparison page shares: the noise verdict of a ratio, a run's noise, and what a run is (its machine, its GEMM
precision, a peer or one of ours, a card held back)."""
from __future__ import annotations

import polars as pl

from ftbench.harness.flops import peak_tflops
from ftbench.judge.verdicts import NOISE_SIGMAS


NOISE_NOTE = ("Noise: each run's relative uncertainty is its CV across repeated windows (or, with one window, the "
              "within-run CV of its step times over the square root of the steps); a ratio whose distance from 1 is "
              f"within {NOISE_SIGMAS}x the two runs' combined uncertainty (root sum of squares) reads \"no measurable "
              "difference\".")


def _verdict(ratio, noise_a, noise_b) -> str | None:
    """A ratio as text: "no measurable difference" inside the combined noise, else the ratio (2 decimals);
    "(noise not recorded)" when neither run recorded its noise."""
    if ratio is None:
        return None
    text = f"{round(ratio, 2)}x"
    if noise_a is None and noise_b is None:
        return f"{text} (noise not recorded)"
    combined = ((noise_a or 0) ** 2 + (noise_b or 0) ** 2) ** 0.5
    return "no measurable difference" if abs(ratio - 1) <= NOISE_SIGMAS * combined else text


def verdict(ratio: pl.Expr, noise_a: pl.Expr, noise_b: pl.Expr) -> pl.Expr:
    """_verdict over columns (comparison tables are a few dozen rows)."""
    return pl.struct(r=ratio, a=noise_a, b=noise_b).map_elements(
        lambda x: _verdict(x["r"], x["a"], x["b"]), return_dtype=pl.String)


def tokens_noise(r: dict):
    """A run's relative uncertainty in tokens/s: across its windows' real tokens/s where it has them (a window's
    sample count can vary where its tokens do not), else its noise_cv."""
    return r.get("timing.noise_cv_tokens") if r.get("timing.noise_cv_tokens") is not None else r["timing.noise_cv"]


def machine_key(r: dict) -> tuple:
    return r["model"], r["scale"], r["dataset"], r["gpu"], r.get("machine")


def peer_of(r: dict) -> str | None:
    """The other system a run is (Unsloth, Liger Kernel's patch, NeMo AutoModel), from its record's `peer` or, for
    records older than it (Unsloth's and Liger's), its knobs; None for one of the project's own rungs."""
    if r.get("peer.system"):
        return r["peer.system"]
    return "Unsloth" if r.get("variant.framework") == "unsloth" else "Liger Kernel" if r.get("variant.liger") else None


UNSTATED = "not compared: the peer's settings are not in its record (a peer is compared at its best or not at all)"


def mfu_against(r: dict, precision: str) -> float | None:
    """A run's model FLOPs per second as a percentage of its GPU's dense peak in `precision` (None where the GPU's
    peak is unknown: a CPU, or a card without that precision)."""
    peak, done = peak_tflops(r.get("gpu"), precision), r.get("flops.model_tflops")
    return 100 * done / peak if peak and done else None


def peak_gib(r: dict) -> float | None:
    """A run row's peak memory, as `analysis.peak_memory` reads it: reserved on a GPU, the host's RSS on a CPU."""
    return r.get("memory.peak_reserved_gib") or r.get("memory.host_peak_rss_gib")


def scale_order() -> pl.Expr:
    """0 for a full-scale GPU row, 1 for a smaller scale on a GPU, 2 for a CPU row: what a page shows first."""
    return (pl.when((pl.col("scale") == "full") & (pl.col("gpu") != "cpu")).then(0)
            .when(pl.col("gpu") != "cpu").then(1).otherwise(2))


def gemms_in(r: dict) -> str:
    """The precision a run's GEMMs ran in, as a peer is compared: fp8, else bf16 (QLoRA dequantizes to bf16)."""
    return "fp8" if r.get("precision.gemm") == "fp8" else "bf16"


HELD_BACK = {"clock": 0.75, "power": 0.85, "busy": 85.0}  # fractions of the card's maximum SM clock and power limit


def held_back(r: dict) -> str | None:
    """Why a run's card ran held back, or None: through its windows at least 85 % busy, yet under 75 % of the card's
    maximum SM clock while drawing under 85 % of its power limit: slowed by something other than the power limit (a
    throttled card), so its speed is the card's, not the code's. A card at its power limit clocks down too (the FP8
    top rung: 83 % of its clock at 99 % of its power) and is not held back."""
    clock, top = r.get("device_usage.sm_clock_mean_mhz"), r.get("gpu_sm_clock_max_mhz")
    power, limit, busy = r.get("device_usage.power_mean_w"), r.get("gpu_power_limit_w"), r.get(
        "device_usage.gpu_util_mean_pct")
    if not (clock and top and power and limit and busy) or busy < HELD_BACK["busy"]:
        return None
    if clock < HELD_BACK["clock"] * top and power < HELD_BACK["power"] * limit:
        return (f"its card ran at {clock:,.0f} MHz ({100 * clock / top:.0f} % of its {top:,.0f}) drawing {power:.0f} W "
                f"({100 * power / limit:.0f} % of its {limit:.0f}-W limit) while {busy:.0f} % busy: held back by "
                "something other than its power limit")
    return None


def _cv_text(r: dict) -> str:
    return f"CV {100 * tokens_noise(r):.1f} %" if tokens_noise(r) is not None else "CV unknown"

