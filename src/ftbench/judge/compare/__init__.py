"""Comparisons the studies drew, computed from our runs and put beside the published figures: one room per concern
(`studies`: the published tables; `ladder`: the technique ladder; `peers`: the frontier and its peers, the front
page's headline; `scaling`: several GPUs and GPU kinds), the page assembled here."""

from __future__ import annotations

import polars as pl

from ftbench.judge.analysis import html_page
from ftbench.judge.compare.common import (NOISE_NOTE, UNSTATED, _verdict, gemms_in, held_back, machine_key, mfu_against, peak_gib, peer_of,
                     scale_order, tokens_noise, verdict)
from ftbench.judge.compare.ladder import fastest_by, frontier_place, ladder, quality_by_variant, read_quality, same_rows_loss, standing
from ftbench.judge.compare.peers import best_peer_line, frontier, headline, lead_over, peer_reads, peer_run, peer_rows, peer_table
from ftbench.judge.compare.scaling import gpu_kinds, scaling, speedup_over
from ftbench.judge.compare.studies import (decision_guide, diffusion_vs_published, lmm_vs_published, samples_per_hour_vs_published,
                      study_b_table, unsloth_vs_peft)

__all__ = ["NOISE_NOTE", "UNSTATED", "_verdict", "best_peer_line", "comparison_page", "decision_guide",
           "diffusion_vs_published", "fastest_by", "frontier", "frontier_place", "gemms_in", "gpu_kinds", "headline",
           "held_back", "ladder", "lead_over", "lmm_vs_published", "machine_key", "mfu_against", "peak_gib", "peer_of",
           "peer_reads", "peer_rows", "peer_run", "peer_table", "quality_by_variant", "read_quality", "same_rows_loss", "samples_per_hour_vs_published",
           "scale_order", "scaling", "speedup_over", "standing", "study_b_table", "tokens_noise", "unsloth_vs_peft",
           "verdict"]


COMPARISONS = {"study_b_table": study_b_table, "scaling": scaling, "ladder": ladder, "frontier": frontier,
               "decision_guide": decision_guide, "lmm_vs_published": lmm_vs_published,
               "samples_per_hour_vs_published": samples_per_hour_vs_published, "unsloth_vs_peft": unsloth_vs_peft,
               "diffusion_vs_published": diffusion_vs_published, "gpu_kinds": gpu_kinds}


def comparison_page(df: pl.DataFrame, title: str, comparisons: dict, published: dict, variants: dict,
                    replaced: pl.DataFrame | None = None, quality: dict | None = None, pool: dict | None = None) -> str:
    """Each configured comparison of the runs `df`; `replaced`: the runs a later measurement of the same run
    replaced in `df` (analysis.aggregate), which the frontier reads each lease's own top rung from; `quality`: the
    quality study's verdicts by variant (`quality_by_variant`), which the ladder and the frontier show beside speed;
    `pool`: the study's variants as config writes them, for the page's legend (each rung's base and what it adds)."""
    blocks = []
    for name, kwargs in comparisons.items():
        blocks.append(f"<b>{name.replace('_', ' ')}</b>")
        blocks += COMPARISONS[name](df, published, variants=variants, replaced=replaced, quality=quality, pool=pool,
                                    **(kwargs or {}))
    return html_page(title, blocks, pool, df)

