"""The arithmetic of a paired verdict: a held-out curve read at given tokens, the tokens it takes to reach a loss,
and a Student-t interval of paired differences (scipy is not among the pins)."""

from __future__ import annotations

import json
import math
import statistics


def points(row: dict) -> list[dict] | None:
    """A run's held-out curve, its points in token order (None: the run measured no curve)."""
    text = row.get("loss.held_out")
    if not text:
        return None
    pts = [p for p in json.loads(text).get("points") or [] if p.get("loss") is not None and math.isfinite(p["loss"])]
    return sorted(pts, key=lambda p: p["tokens"]) or None


def loss_at(pts: list[dict], tokens: float) -> float | None:
    """The curve's loss at `tokens`, linear between its points; None outside them."""
    for a, b in zip(pts, pts[1:]):
        if a["tokens"] <= tokens <= b["tokens"]:
            if b["tokens"] == a["tokens"]:
                return b["loss"]
            f = (tokens - a["tokens"]) / (b["tokens"] - a["tokens"])
            return a["loss"] + f * (b["loss"] - a["loss"])
    if pts and pts[-1]["tokens"] == tokens:
        return pts[-1]["loss"]
    return None


def tokens_to(pts: list[dict], target: float) -> float | None:
    """The first token count at which the curve reaches `target` (linear between points); None if it never does."""
    for a, b in zip(pts, pts[1:]):
        if b["loss"] <= target:
            if a["loss"] <= target:
                return float(a["tokens"])
            f = (a["loss"] - target) / (a["loss"] - b["loss"])
            return a["tokens"] + f * (b["tokens"] - a["tokens"])
    return float(pts[0]["tokens"]) if pts and pts[0]["loss"] <= target else None


def dense_from(pts: list[dict]) -> float:
    """The label tokens from which a curve has a point after every optimizer step to its end (its last steps scored
    one by one: training.held_out_last_steps); inf where its last two points lie more than a step apart."""
    i = len(pts) - 1
    while i > 0 and pts[i]["step"] - pts[i - 1]["step"] == 1:
        i -= 1
    return pts[i]["tokens"] if i < len(pts) - 1 else math.inf


def read_floor(curves: list, short_by: float) -> float:
    """The fewest label tokens a run may end at and still be paired with these (the baseline's seeds') curves:
    `short_by` of their fewest short, or, where every one of them scored each of its last steps, as low as the first
    of those points on each (each read between points a step apart, within its schedule's last steps)."""
    curves = [c for c in curves if c]
    if not curves:
        return math.inf
    return min((1 - short_by) * min(c[-1]["tokens"] for c in curves), max(dense_from(c) for c in curves))


def readable(pts: list[dict], tokens: float, short_by: float) -> bool:
    """Whether a curve may be read at `tokens`: at most `short_by` of its tokens before its end, at one of its points,
    or between two points a step apart; not across a stretch of several steps, where a straight line between two
    points of a falling, flattening curve lies above it."""
    if tokens >= (1 - short_by) * pts[-1]["tokens"]:
        return True
    return any(a["tokens"] <= tokens <= b["tokens"]
               and (tokens in (a["tokens"], b["tokens"]) or b["step"] - a["step"] == 1) for a, b in zip(pts, pts[1:]))


def read_together(mine: dict, base: dict, seeds: list, short_by: float) -> tuple[list, list, float | None]:
    """The seeds two families' curves ({seed: curve}) are read at together, and the tokens: the fewest any of their
    runs trained, where every one of their curves is `readable`; else the seed whose runs end first is left out, and
    so on. A run of a longer schedule than its pair's (a longer arm: more than `short_by` more tokens) is read along
    its curve wherever its pair ends. Returns (seeds read, seeds left out, tokens)."""
    def same_schedule(s):
        return (1 - short_by) * mine[s][-1]["tokens"] <= base[s][-1]["tokens"]

    seeds, left = list(seeds), []
    while seeds:
        ends = {s: min(mine[s][-1]["tokens"], base[s][-1]["tokens"]) for s in seeds}
        tokens = min(ends.values())
        if all(readable(base[s], tokens, short_by) and (readable(mine[s], tokens, short_by) or not same_schedule(s))
               for s in seeds):
            return seeds, left, tokens
        first = min(seeds, key=ends.get)
        seeds.remove(first)
        left.append(first)
    return [], left, None


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (bisection on its CDF, the regularized incomplete beta by its continued fraction)."""
    def betacf(a, b, x):
        tiny = 1e-300

        def guard(v):
            return v if abs(v) > tiny else tiny
        c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
        h = d
        for m in range(1, 300):
            for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                        -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
                d = 1.0 / guard(1.0 + num * d)
                c = guard(1.0 + num / c)
                h *= d * c
            if abs(d * c - 1.0) < 1e-15:
                break
        return h

    def cdf(t):
        x = df / (df + t * t)
        if x >= 1.0:
            return 0.5
        a, b = df / 2.0, 0.5
        front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
        ib = front * betacf(a, b, x) / a if x < (a + 1) / (a + b + 2) else 1 - front * betacf(b, a, 1 - x) / b
        return 1 - 0.5 * ib if t >= 0 else 0.5 * ib

    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def interval(diffs: list[float], confidence: float) -> tuple[float, float, float, float | None]:
    """(mean, low, high, sd) of paired differences: the mean's two-sided `confidence` interval by Student's t."""
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, -math.inf, math.inf, None
    sd = statistics.stdev(diffs)
    half = t_quantile(0.5 + confidence / 2, len(diffs) - 1) * sd / math.sqrt(len(diffs))
    return mean, mean - half, mean + half, sd
