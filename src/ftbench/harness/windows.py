"""When a measured window closes and when measuring stops: steps and seconds, the agreement of several ranks on
both, and the noise target (`cv_target`); and a closed window's summary."""

from __future__ import annotations

import math
import statistics

from ftbench.config.settings import MeasureSettings
from ftbench.core.records import cv


class WindowRule:
    """The Meter's rule for its windows. One process closes a window after `steps` steps and `min_seconds` of host
    time (at most `window_cap` steps). Several ranks close windows by step counts agreed through `agree` (a function
    returning the maximum of an int over the ranks: one collective), so that every rank closes its windows and stops
    at the same step (a rank that stopped alone would leave the others waiting)."""

    MAX_CALIBRATIONS = 3

    def __init__(self, measure: MeasureSettings):
        self.measure = measure
        self.agree = None
        self.window_steps = None  # several ranks: the steps the next window takes, agreed
        self.calibrated = 0  # several ranks: measured windows shorter than min_seconds, counted as warm-up instead
        self.stopped_early = None  # with cv_target: {"cv_target", "cv", "windows"} where the windows' noise ended them

    def closes(self, warmup: bool, in_window: int, host_s: float) -> bool:
        """Whether the step just taken closes the open window (`host_s`: host seconds since it opened)."""
        m = self.measure
        if warmup:
            return in_window >= m.warmup_steps
        if self.agree is not None:  # several ranks: windows by steps only (agreed after warm-up)
            return in_window >= (self.window_steps or m.steps)
        return (in_window >= m.steps and host_s >= m.min_seconds) or in_window >= m.window_cap

    def too_short(self, warmup: bool, host_s: float, truncated: bool) -> bool:
        """Several ranks close windows by agreed step counts, sized from the steps before them: after warm-up steps
        slower than a measured step (compiling, capturing CUDA graphs) a window can end before `min_seconds`
        (8 steps in 3.3 s of a 20-s minimum on 2 H100s, 2026-11-27), and with `cv_target` such a window was half
        the measurement. A window shorter than `min_seconds` on any rank (one collective: the maximum) is warm-up
        instead, and the next is agreed from its steps; at most MAX_CALIBRATIONS times a run."""
        m = self.measure
        if (self.agree is None or warmup or truncated or not m.min_seconds
                or self.calibrated >= self.MAX_CALIBRATIONS):
            return False
        short = self.agree(1 if host_s < m.min_seconds else 0) > 0
        self.calibrated += short
        return short

    def noise_low_enough(self, warmup: bool, windows: list[dict]) -> bool:
        """With `cv_target`, after `min_repeats` (at least two) measured windows: whether the coefficient of
        variation of their throughputs (real tokens/s where the steps count tokens, else samples/s) is at most the
        target. Several ranks decide together (one collective: any rank above the target keeps every rank going),
        so that all stop at the same step."""
        m = self.measure
        if not m.cv_target or warmup or len(windows) < max(2, m.min_repeats):
            return False
        rates = [w["tokens"] / w["device_s"] if w["tokens"] and w["device_s"] else w["samples_per_s"]
                 for w in windows]
        spread = cv(rates)
        low = spread is not None and spread <= m.cv_target
        if self.agree is not None:
            low = self.agree(0 if low else 1) == 0
        if low:
            self.stopped_early = {"cv_target": m.cv_target, "cv": spread, "windows": len(windows)}
        return low

    def agree_window(self, rows: list[dict]) -> None:
        """Several ranks: the steps the next window takes, the same on every rank: the window's minimum steps, or
        more where the median step of `rows` says `min_seconds` needs more; the maximum over ranks. Agreed after
        warm-up (its first step left out) and again after each window from that window's steps: warm-up steps
        that meet new shapes can be several times a measured step (Qwen3-8B japanese_alpaca over 2 H100s: 2.3 s
        against 0.5 s), which sized every window at a quarter of `min_seconds` when agreed once."""
        m = self.measure
        times = [r["step_time_s"] for r in rows]
        need = m.steps
        if m.min_seconds and times and statistics.median(times) > 0:
            need = max(need, math.ceil(m.min_seconds / statistics.median(times)))
        self.window_steps = min(self.agree(need), m.window_cap)


def window_summary(rows: list[dict], repeat: int, host_span: tuple[float, float], energy_j: float | None,
                   truncated: bool) -> dict:
    """A measured window from its steps' rows: steps, device and host time, median step, samples and tokens."""
    times = [r["step_time_s"] for r in rows]
    samples = sum(r["samples"] for r in rows)
    return {"repeat": repeat, "steps": len(rows), "device_s": sum(times), "host_s": host_span[1] - host_span[0],
            "host_span": host_span, "median_step_s": statistics.median(times), "samples": samples,
            "samples_per_s": samples / sum(times) if sum(times) else None,
            "tokens": None if any(r.get("tokens") is None for r in rows) else sum(r["tokens"] for r in rows),
            "energy_j": energy_j, "truncated": truncated}
