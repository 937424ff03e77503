"""A verdict per published cell (ftbench.judge.verdicts, through the coverage table): the published value is read from
config/published/, a record inside it, outside it and within its noise gets holds / differs / holds; a timeout and
a stand-in never hold; a cell that differs names the run's own evidence; the front page's counts are the table's."""

import re

import polars as pl
import pytest
import yaml
from conftest import ROOT
from test_analysis import H100, record
from test_coverage import lmm

from ftbench.judge.analysis import flatten
from ftbench.judge.coverage import coverage_html, coverage_rows, summary
from ftbench.judge.verdicts import VERDICTS, evidence, judge, published_range, step_balance

STUDY_A = yaml.safe_load((ROOT / "config" / "published" / "study_a.yaml").read_text())
STUDY_C = yaml.safe_load((ROOT / "config" / "published" / "study_c.yaml").read_text())
# the default config's account of which variants measure Study A's published ones
MEASURED_BY = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["studies"]["lmm"]["coverage"][0]["measured_by"]


def cells(rows):
    table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                          [{"table": "study_a", "published": STUDY_A, "measured_by": MEASURED_BY}])
    return table, {(r["variant"], r["batch"]): r for r in table.to_dicts()}


def test_published_values_are_data():
    fp8 = next(v for v in STUDY_A["variants"] if v["variant"] == "fp8-te")
    assert published_range(fp8["step_time_ratio"]) == (0.93, 0.96)  # "4-7% faster"
    assert all(published_range(v["step_time_ratio"]) for v in STUDY_A["variants"])
    assert published_range(27000) == (27000.0, 27000.0) and published_range("4-7% faster") is None
    for published in (STUDY_A, STUDY_C):
        assert {"gpu", "step", "metric", "unit"} <= set(published["conditions"])


@pytest.mark.parametrize("fp8_step, noise, verdict", [
    (0.95, 0.01, "holds"),    # inside 0.93-0.96
    (1.18, 0.01, "differs"),  # 1.23x the range's top, far beyond 2 x its noise
    (0.975, 0.01, "holds"),   # above the range by 1.6 %, inside 2 x the combined noise (1.4 %)
    (0.975, 0.001, "differs"),  # the same figure with a tenth of the noise: outside it
])
def test_a_record_inside_outside_and_within_the_noise_of_the_published_range(fp8_step, noise, verdict):
    rows = [lmm("bf16-gc", 4, step=1.0), lmm("fp8-te-gc", 4, step=fp8_step)]
    rows[0]["timing.noise_cv"] = rows[1]["timing.noise_cv"] = noise
    _, by = cells(rows)
    cell = by[("fp8-te", 4)]
    assert cell["verdict"] == verdict, cell["how"]
    if verdict == "differs":
        assert "slower than published" in cell["how"] and cell["cause (measured)"]


def test_a_timeout_and_a_stand_in_never_hold():
    rows = [lmm("bf16-gc", 1, step=1.0),
            lmm("compile-gc", 1, status="timeout", reason="exceeded its time limit of 180 s", compile_="default")]
    _, by = cells(rows)
    assert by[("compile", 1)]["verdict"] == "not measured" and not by[("compile", 1)]["measured"]
    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())
    stand_in = record("llm", "qlora-gc-pf", 2.0, gpu=H100, batch=32, scale="full", model="qwen3-32b")
    stand_in["run"]["dataset"] = "japanese_alpaca"
    stand_in["throughput"]["samples_per_hour"] = 27000.0  # exactly the published figure, by a stand-in
    table = coverage_rows(pl.DataFrame([flatten(stand_in)], infer_schema_length=None),
                          [{"table": "study_b", "published": published,
                            "measured_by": {"unsloth-qlora": ["unsloth-qlora", "qlora-gc-pf"]}}])
    cell = table.filter(pl.col("measured")).row(0, named=True)
    assert cell["verdict"] == "not comparable" and "stand-in: qlora-gc-pf" in cell["how"]
    assert "holds" not in table["verdict"].to_list()


def test_the_study_system_out_of_memory_is_named_by_its_measured_peak_beside_the_stand_in():
    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())
    recs = []
    for variant, status in (("unsloth-qlora", "oom"), ("qlora-gc", "ok")):
        r = record("llm", variant, 2.0, gpu=H100, batch=32, scale="full", model="gpt-oss-120b", mem=78.1)
        r["run"]["dataset"], r["status"] = "japanese_alpaca", status
        r["reason"] = "CUDA out of memory. Tried to allocate 720.00 MiB." if status == "oom" else None
        r["throughput"]["samples_per_hour"] = 5000.0
        recs.append(flatten(r))
    table = coverage_rows(pl.DataFrame(recs, infer_schema_length=None),
                          [{"table": "study_b", "published": published,
                            "measured_by": {"unsloth-qlora": ["unsloth-qlora", "qlora-gc"]}}])
    cell = table.filter(pl.col("measured") & (pl.col("model") == "gpt-oss-120b")).row(0, named=True)
    assert "unsloth-qlora cannot run here (oom at 78.1 GiB on the H100" in cell["why"]
    assert cell["verdict"] == "not comparable"


def test_the_study_system_with_a_setting_changed_fills_its_cell_as_itself_and_says_which():
    """Unsloth with its own compile off is Unsloth, not a stand-in: it fills the cell (here on the H200, the H100
    having run out of memory), and the note names the knob it changed, against the study variant's record (one
    made before the knob existed ran with its default)."""
    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())
    runs = (("unsloth-qlora", "error", H100, {"framework": "unsloth"}),
            ("unsloth-qlora-eager", "oom", H100, {"framework": "unsloth", "unsloth_compile": False}),
            ("unsloth-qlora-eager", "ok", "NVIDIA H200", {"framework": "unsloth", "unsloth_compile": False}),
            ("qlora-gc", "ok", "NVIDIA H200", {}))
    recs = []
    for variant, status, gpu, knobs in runs:
        r = record("llm", variant, 2.0, gpu=gpu, batch=32, scale="full", model="gpt-oss-120b", mem=78.1)
        r["run"]["dataset"], r["status"] = "japanese_alpaca", status
        r["variant"].update(knobs)
        r["reason"] = {"error": "StopIteration (no message) in dict_keys_getitem", "oom": "CUDA out of memory."}.get(status)
        r["throughput"]["samples_per_hour"] = 31557.0 if variant == "unsloth-qlora-eager" else 5881.0
        r["provenance"]["git_commit"] = "5f8bf02aa" if status == "error" else "f8e0545bb"
        recs.append(flatten(r))
    table = coverage_rows(pl.DataFrame(recs, infer_schema_length=None),
                          [{"table": "study_b", "published": published, "measured_by": {
                              "unsloth-qlora": ["unsloth-qlora", "unsloth-qlora-eager", "qlora-gc"]}}])
    cell = table.filter(pl.col("measured") & (pl.col("model") == "gpt-oss-120b")).row(0, named=True)
    assert cell["measured by"] == "unsloth-qlora-eager" and cell["GPU"] == "H200"
    assert cell["verdict"] == "not comparable" and cell["how"] == "measured on the H200, not the H100 SXM5"
    # the failed record names the code it ran: a later commit may run where it could not
    assert cell["why"].startswith("unsloth-qlora-eager: the same system with unsloth_compile False (unsloth-qlora: "
                                  "error at commit 5f8bf02: StopIteration (no message)")
    unfilled = table.filter(~pl.col("measured") & (pl.col("model") == "gpt-oss-120b")).row(0, named=True)
    assert "unsloth-qlora on the H100 SXM5: error at commit 5f8bf02 (StopIteration" in unfilled["why"]
    assert "unsloth-qlora-eager on the H200: ok;" in unfilled["why"]  # an ok record needs no commit
    assert "the H100 SXM5 ran out of memory; measured on the H200" in cell["why"] and "stands in" not in cell["why"]


def test_an_fp8_cell_names_where_its_step_went_against_the_bf16_profile():
    # Study A at batch 8 on an H100 (h100-2026-11-26): FP8's GEMMs are faster, its casts cost less than that,
    # and attention, run by another implementation, costs more than both
    bf16 = {"variant": "bf16-gc", "profile.kernel_ms_per_step": 3896.0, "profile.gemm_share": 1523 / 3896,
            "profile.fp8_work_share": 0.0, "profile.attention_share": 610 / 3896,
            "profile.attention_backend": "cuDNN SDPA", "profile.attention_exact": False}
    fp8 = {"variant": "fp8-te-gc", "profile.kernel_ms_per_step": 4286.0, "profile.gemm_share": 925 / 4286,
           "profile.fp8_work_share": 113 / 4286, "profile.attention_share": 1475 / 4286,
           "profile.attention_backend": "memory-efficient (CUTLASS fmha)", "profile.attention_exact": False}
    assert step_balance(fp8, bf16) == (
        "kernel time 3,896 ms a step in bf16-gc's profile, 4,286 here: GEMMs -598, FP8 casts and scaling +113, "
        "attention +865 (cuDNN SDPA there, memory-efficient (CUTLASS fmha) here), the rest +10 ms (attention from "
        "each profile's top kernels)")
    assert evidence(fp8, bf16).startswith("kernel time 3,896 ms a step in bf16-gc's profile")
    assert step_balance(fp8, {"variant": "bf16-gc"}) is None  # no profile of the baseline: no balance
    assert not evidence(fp8, {"variant": "bf16-gc"}).startswith("kernel time")


def test_a_cell_that_differs_names_the_runs_own_evidence_or_says_none_was_measured():
    row = {"profile.busy_pct": 15.6, "profile.cpu_bound": True, "profile.data_loading_share": 0.009,
           "profile.kernels_per_step": 23949.0, "profile.idle_cause": "16622 gaps between kernels",
           "timing.host_cpu_step_s": 0.446, "timing.step_time_s": 0.798}
    text = evidence(row)
    assert text.startswith("profile: host-bound, GPU busy 16 % of a step, data loader 1 %, 23,949 kernels a step")
    assert "host CPU 446 ms per 798 ms step (56%)" in text
    nf4 = evidence({"profile.busy_pct": 58.6, "profile.cpu_bound": True, "profile.gemm_share": 0.327,
                    "profile.fp8_work_share": 0.0008, "profile.dequant_4bit_share": 0.314})
    assert "GEMMs 33 % of kernel time, NF4 dequantization 31 %" in nf4  # FP8 work under 0.5 %: not named
    assert evidence({"profile.busy_pct": 40.0, "profile.cpu_bound": True,
                     "profile.data_loading_share": 0.3}).startswith("profile: loader-bound")
    assert evidence({"timing.step_time_s": 1.0}) == "cause not measured"
    # no profile: NVML's busy share and the executed FLOPs say a slow run is GPU-bound on padding (Qwen3-32B
    # wikipedia_ja through Unsloth, h100-2026-11-25-h)
    padded = evidence({"device_usage.gpu_util_mean_pct": 98.46, "flops.hfu": 0.5875,
                       "throughput.tokens_per_s": 1168.0, "throughput.padded_tokens_per_s": 2784.0,
                       "flops.model_per_step": 3.618e15, "flops.hardware_per_step": 1.331e16})
    assert padded == "NVML busy 98 %, HFU 59 %; padding 58% of the tokens (73% of executed FLOPs with recompute)"
    fixed = {"throughput.tokens_per_sample": 1194.0, "variant.compile": "default", "compile.unique_graphs": 12.0,
             "compile.recompiles": 0.0, "compile.graph_breaks": 23.0}
    assert evidence(fixed, {"throughput.tokens_per_sample": 2946.0}) == (
        "12 graphs, 0 recompiles, 23 graph breaks; 1,194 tokens/sample against the baseline's 2,946")
    assert judge(1.2, (1.0, 1.0), None, lower_is_faster=False)["how"].endswith("faster than published "
                                                                                "(noise not recorded)")


def test_the_front_page_counts_are_the_tables():
    rows = [lmm("bf16-gc", bs, step=1.0) for bs in (1, 2, 4)]
    rows += [lmm("qlora-gc", 1, step=1.17), lmm("qlora-gc", 2, step=1.5), lmm("fixed-compile-gc", 4, step=0.5),
             lmm("compile-gc", 8, status="timeout", compile_="default"), lmm("qlora-gc", 8, gpu=H100)]
    table, _ = cells(rows)
    html = coverage_html(table)
    lead = re.search(r"<b>Study A \(LLaVA-NeXT, relative to bf16\)</b>: holds (\d+) of (\d+), differs (\d+), "
                     r"inconclusive (\d+), not comparable (\d+), not measured (\d+)", html)
    counts = {v: table.filter(pl.col("verdict") == v).height for v in VERDICTS}
    assert [int(x) for x in lead.groups()] == [counts["holds"], table.height, counts["differs"],
                                               counts["inconclusive"], counts["not comparable"],
                                               counts["not measured"]]
    assert counts["holds"] == 2 and counts["differs"] == 1 and sum(counts.values()) == 42
    assert summary(table).row(0, named=True)["holds"] == counts["holds"]
    assert "<svg" in html and "Study A: step time against bf16" in html  # the grid picture


def test_study_bs_padded_batch_shape_leads_and_the_packed_run_stands_beside():
    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())

    def llm(variant, sph, padding_free, real=None, padded=None):
        rec = record("llm", variant, 2.0, gpu=H100, batch=32, scale="full", model="qwen3-32b")
        rec["run"]["dataset"] = "japanese_alpaca"
        rec["variant"] = {"padding_free": padding_free}
        rec["throughput"].update(samples_per_hour=sph, tokens_per_s=real, padded_tokens_per_s=padded)
        return flatten(rec)

    measured_by = {"unsloth-qlora": ["unsloth-qlora", "qlora-gc-pf", "qlora-gc"]}
    only_packed = [llm("qlora-gc-pf", 43228.0, True, 100.0, 100.0)]
    both = only_packed + [llm("unsloth-qlora", 27500.0, False, 100.0, 160.0)]
    for rows, verdict in ((only_packed, "not comparable"), (both, "holds")):
        table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                              [{"table": "study_b", "published": published, "measured_by": measured_by}])
        cell = table.filter(pl.col("published") == "27,000").row(0, named=True)
        assert cell["ours, packed"] == "43,228 by qlora-gc-pf on the H100 SXM5 (padding 0%; 1.60x published)"
        assert cell["verdict"] == verdict, cell["how"]
    assert cell["measured by"] == "unsloth-qlora" and cell["ours"] == "27,500 (padding 38%)"
    # a cell of a GPU we were not lent stays not measured; the packed run of another GPU stands beside it
    blackwell = table.filter(pl.col("published") == "11,000").row(0, named=True)
    assert blackwell["verdict"] == "not measured" and "1.60x" not in (blackwell["ours, packed"] or "")
    assert blackwell["ours, packed"].startswith("43,228 by qlora-gc-pf on the H100 SXM5")


@pytest.mark.parametrize("fp8_step, noise", [(0.95, 0.04), (1.05, 0.04), (0.94, 0.2), (1.18, 0.2)])
def test_a_noise_band_too_wide_to_tell_is_inconclusive_never_holds(fp8_step, noise):
    """2 x the combined CV above 10 %: inconclusive with its CV, whether the figure lies inside the published range
    or outside it but within the band."""
    rows = [lmm("bf16-gc", 4, step=1.0), lmm("fp8-te-gc", 4, step=fp8_step)]
    rows[0]["timing.noise_cv"] = rows[1]["timing.noise_cv"] = noise
    table, by = cells(rows)
    cell = by[("fp8-te", 4)]
    assert cell["verdict"] == "inconclusive" and "the noise cannot carry a verdict" in cell["how"], cell["how"]
    assert f"= {100 * 2 * (2 * noise * noise) ** 0.5:.1f} % is wider than 10 %" in cell["how"]
    assert summary(table).row(0, named=True)["inconclusive"] == 1 and "inconclusive" in VERDICTS
    assert judge(0.95, (0.93, 0.96), 0.049)["verdict"] == "holds"  # a band of 9.8 %: still a verdict


def test_a_figure_beyond_even_a_wide_noise_band_differs():
    """A band too wide to confirm a figure can still refute one: 1.18x where 0.93-0.96x was published lies beyond
    even an 11.3 % band (Study C's pinned stage: 0.74x where 0.34x was published, a 14 % band)."""
    rows = [lmm("bf16-gc", 4, step=1.0), lmm("fp8-te-gc", 4, step=1.18)]
    rows[0]["timing.noise_cv"] = rows[1]["timing.noise_cv"] = 0.04
    cell = cells(rows)[1][("fp8-te", 4)]
    assert cell["verdict"] == "differs", cell["how"]
    assert cell["how"].startswith("1.23x the published range: slower") and "beyond even its wide noise band" in cell["how"]
    assert judge(0.742, (0.338, 0.338), 0.0705)["verdict"] == "differs"
    assert judge(0.36, (0.338, 0.338), 0.0705)["verdict"] == "inconclusive"


def test_a_cell_is_never_balanced_against_its_own_profile_and_an_unmoved_step_says_so():
    """Study C's workers-0 is its own baseline: no "kernel time 165 ms a step in workers-0's profile, 165 here:  ms"."""
    row = {"variant": "workers-0", "profile.kernel_ms_per_step": 165.0, "profile.gemm_share": 0.5}
    assert step_balance(row, dict(row)) is None and step_balance(row, row) is None
    other = {**row, "variant": "workers-1"}
    text = step_balance(other, row)
    assert "165 here: no part moved by 0.5 ms or more" in text and " ms ms" not in text


def test_a_study_c_stage_that_differs_cites_the_cuda_graph_probe_measured_beside_it():
    """Study C's compile stage at 0.46x the stock step (published 0.35x) differs; its probe, the same step with CUDA
    graphs, measured on the same GPU, is cited with its own ratio (0.21x) beside the stage's."""
    def sd(variant, step):
        rec = record("diffusion", variant, step, gpu=H100, batch=1, scale="full", model="stable-diffusion-v1-5",
                     mem=3.0)
        rec["run"]["dataset"] = "naruto"
        rec["timing"]["noise_cv"] = 0.02
        return flatten(rec)

    probes = [{"variant": "compile-ro", "beside": "compile", "changes": "CUDA graphs", "cells": ["compile", "pinned"]}]
    rows = [sd("workers-0", 0.682), sd("compile", 0.312), sd("compile-ro", 0.144)]
    table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                          [{"table": "study_c", "published": STUDY_C, "probes": probes}])
    cell = table.filter(pl.col("variant") == "compile").row(0, named=True)
    assert cell["verdict"] == "differs", cell["how"]
    assert "compile-ro (CUDA graphs) on this GPU: 0.21x workers-0 at batch 1, where compile is 0.46x" in (
        cell["cause (measured)"])
    # without the probe's run, nothing is cited
    table = coverage_rows(pl.DataFrame(rows[:2], infer_schema_length=None),
                          [{"table": "study_c", "published": STUDY_C, "probes": probes}])
    cause = table.filter(pl.col("variant") == "compile").row(0, named=True)["cause (measured)"]
    assert "compile-ro" not in (cause or "")


def test_the_before_and_after_table_sets_each_cells_verdict_from_two_sets_of_records_side_by_side(tmp_path):
    """bench/verdict_diff.py: the merged leases' verdict beside a campaign's, per published cell, the cells whose
    verdict changed marked; the campaign's folder is left out of the leases a pattern finds."""
    import importlib.util

    from test_analysis import write

    spec = importlib.util.spec_from_file_location("verdict_diff", ROOT / "bench" / "verdict_diff.py")
    vd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vd)

    def rec(variant, step, digest):
        r = record("lmm", variant, step, gpu=H100, batch=1, scale="full", model="llava-v1.6-mistral-7b", mem=20.0)
        r["run"]["dataset"] = "beans"
        r["provenance"]["source_digest"] = digest
        return r

    for variant, step in (("bf16-gc", 1.0), ("fp8-te-gc", 0.95)):  # fp8-te inside the published 0.93-0.96
        write(tmp_path / "lease", rec(variant, step, "aaaa"))
    for variant, step in (("bf16-gc", 1.0), ("fp8-te-gc", 1.10)):  # the campaign: 1.10x, differs
        write(tmp_path / "campaign", rec(variant, step, "bbbb"))
    after = vd.sources([str(tmp_path / "campaign")])
    before = vd.sources([str(tmp_path / "*")], leave_out=after)
    assert before == [str(tmp_path / "lease")]
    tables = vd.coverage_tables()
    rows = {r["cell"]: r for r in vd.diff(vd.verdicts(before, False, tables), vd.verdicts(after, False, tables), "A")}
    assert len(rows) == 42 and rows["fp8-te bs1"]["before verdict"] == "holds"
    assert rows["fp8-te bs1"]["after verdict"] == "differs" and rows["fp8-te bs1"]["changed"]
    assert not rows["bf16 bs1"]["changed"] and not rows["qlora bs4"]["changed"]  # both not measured
    text = vd.markdown(list(rows.values()))
    assert "| A | fp8-te bs1 |" in text and "**yes**" in text
    assert text.rstrip().endswith("1 of 42 cells changed their verdict.")
