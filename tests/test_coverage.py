"""The coverage table: a published cell is filled only by a full-scale record on a CUDA GPU."""

import json

import polars as pl
import pytest
import yaml
from conftest import ROOT
from test_analysis import H100, record

from ftbench.judge.analysis import flatten
from ftbench.judge.coverage import coverage_html, coverage_rows, summary

H200 = "NVIDIA H200"
STUDY_A = yaml.safe_load((ROOT / "config" / "published" / "study_a.yaml").read_text())
MEASURED_BY = {"bf16": ["bf16-gc", "bf16"], "qlora": ["qlora-gc", "qlora"], "compile": ["compile-gc", "compile"],
               "fixed-compile": ["fixed-compile-gc", "fixed-compile"]}


def lmm(variant, batch, scale="full", gpu=H100, step=1.0, mem=20.0, status="ok", memory_gib=79.2, reason=None,
        compile_=None):
    rec = record("lmm", variant, step, gpu=gpu, batch=batch, scale=scale, model="llava-v1.6-mistral-7b", mem=mem)
    rec["run"]["dataset"] = "beans"
    rec["status"], rec["reason"] = status, reason
    rec["variant"] = {"compile": compile_}
    if status == "oom":
        rec["memory"]["at_failure_gib"] = mem
    if gpu:
        rec["provenance"]["device"]["total_memory_gib"] = memory_gib
    return flatten(rec)


def cells(rows):
    table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                          [{"table": "study_a", "published": STUDY_A, "measured_by": MEASURED_BY}])
    return table, {(r["variant"], r["batch"]): r for r in table.to_dicts()}


def test_study_a_has_42_published_cells_and_tiny_or_proxy_records_fill_none():
    rows = [lmm("bf16-gc", 1, scale="tiny", gpu=None), lmm("qlora-gc", 1, scale="tiny", gpu=None),
            lmm("bf16-gc", 2, scale="proxy"), lmm("qlora-gc", 2, scale="proxy"),
            lmm("bf16-gc", 4, scale="full", gpu=None)]  # full scale, but on a CPU
    table, by = cells(rows)
    assert table.height == 42 and not table["measured"].any()
    assert summary(table).row(0, named=True)["measured at full scale"] == 0
    assert by[("bf16", 2)]["status"] == "not measured"


def test_a_full_scale_gpu_record_fills_its_cell_with_a_ratio_to_the_same_gpus_baseline():
    rows = [lmm("bf16-gc", 1, step=0.66, mem=17.6), lmm("qlora-gc", 1, step=0.87, mem=9.4),
            lmm("bf16", 1, step=0.36, mem=36.0),  # the unchecpointed baseline: not the -gc variant's baseline
            lmm("qlora-gc", 2, gpu=H200, memory_gib=139.8)]  # no bf16-gc at batch 2 on the H200: no ratio
    _, by = cells(rows)
    q = by[("qlora", 1)]
    assert q["measured"] and q["measured by"] == "qlora-gc" and q["GPU"] == "H100 SXM5"
    assert q["ours"].startswith("step 1.32x") and "memory 0.53x" in q["ours"]
    assert by[("bf16", 1)]["measured by"] == "bf16-gc"
    assert "no baseline on this GPU" in by[("qlora", 2)]["ours"]


def test_a_cell_not_yet_run_says_how_much_memory_its_baseline_took_and_where():
    rows = [lmm("bf16-gc", 24, gpu=H200, memory_gib=139.8, mem=86.7), lmm("bf16", 24, gpu=H200, mem=120.0),
            lmm("bf16-gc", 16, scale="proxy", mem=30.0)]  # a proxy record says nothing about the full model
    _, by = cells(rows)
    why = by[("qlora", 24)]["why"]
    assert why.startswith("not run yet") and "bf16-gc at batch 24 peaked at 86.7 GiB on the H200" in why
    assert "bf16 at" not in why  # the baseline the cell is measured against, only
    assert by[("qlora", 16)]["why"] == "not run yet at full scale on a GPU"


def test_timeouts_count_for_compile_variants_and_ooms_only_on_a_gpu_as_large_as_the_studys():
    rows = [lmm("compile-gc", 1, status="timeout", reason="exceeded its time limit of 180 s", compile_="default"),
            lmm("bf16-gc", 1, status="timeout", reason="hung"),  # a timeout of an eager variant says nothing
            lmm("qlora-gc", 24, status="oom", mem=78.9),  # the H100 (79 GiB) is smaller than the study's 96 GB
            lmm("bf16-gc", 24, status="oom", mem=139.0, gpu=H200, memory_gib=139.8)]
    _, by = cells(rows)
    # a timeout shows in its cell, never as a result: not measured
    assert not by[("compile", 1)]["measured"] and by[("compile", 1)]["status"] == "timeout"
    assert by[("compile", 1)]["verdict"] == "not measured"
    assert not by[("bf16", 1)]["measured"] and "timeout" in by[("bf16", 1)]["why"]
    assert not by[("qlora", 24)]["measured"] and "may hold it" in by[("qlora", 24)]["why"]
    assert by[("bf16", 24)]["measured"] and by[("bf16", 24)]["status"] == "oom"


def test_study_b_cells_are_per_gpu_and_a_larger_gpu_fills_an_h100_cell_only_after_an_h100_oom():
    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())

    def llm(model, dataset, variant, batch, gpu, status="ok", sph=None):
        rec = record("llm", variant, 2.0, gpu=gpu, batch=batch, scale="full", model=model)
        rec["run"]["dataset"] = dataset
        rec["status"] = status
        rec["throughput"]["samples_per_hour"] = sph
        return flatten(rec)

    rows = [llm("qwen3-32b", "japanese_alpaca", "qlora-gc-pf", 32, H100, sph=43228.0),
            llm("qwen3-32b", "wikipedia_ja", "qlora-gc-pf", 32, H100, status="oom"),
            llm("qwen3-32b", "wikipedia_ja", "qlora-gc-pf", 32, H200, sph=7403.0),
            llm("gpt-oss-120b", "japanese_alpaca", "qlora-gc", 32, H200, sph=5881.0)]  # no H100 record: not filled
    table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                          [{"table": "study_b", "published": published,
                            "measured_by": {"unsloth-qlora": ["unsloth-qlora", "qlora-gc-pf", "qlora-gc"]}}])
    measured = table.filter(pl.col("measured"))
    assert measured.height == 2 and table.height == 8
    wiki = measured.filter(pl.col("dataset") == "wikipedia_ja").row(0, named=True)
    assert wiki["GPU"] == "H200" and "ran out of memory" in wiki["why"]
    blackwell = table.filter(pl.col("metric").str.contains("Blackwell"))
    assert not blackwell["measured"].any()
    html = coverage_html(table)
    # both measured cells are the PEFT stand-in, never the study's Unsloth: not comparable, never "holds"
    assert "<b>Study B (samples per hour)</b>: holds 0 of 8, differs 0, inconclusive 0, not comparable 2, not measured 6" in html

    # no H100 oom, but a larger GPU's run allocated more at its peak than an H100 holds (gpt-oss-120b wikipedia_ja
    # through Unsloth: 125.7 GiB on the H200, h200-2026-11-25-b): measured, so it fills the H100 cell and says why
    for r in rows:
        r["gpu_memory_gib"] = 79.2 if r["gpu"] == "H100 SXM5" else 139.8
    rows[-1]["memory.peak_allocated_gib"] = 82.8
    fits = dict(rows[-1], **{"memory.peak_allocated_gib": 60.0, "dataset": "wikipedia_ja", "batch_size": 16})
    table = coverage_rows(pl.DataFrame(rows + [fits], infer_schema_length=None),
                          [{"table": "study_b", "published": published,
                            "measured_by": {"unsloth-qlora": ["unsloth-qlora", "qlora-gc-pf", "qlora-gc"]}}])
    oss = {r["dataset"]: r for r in table.filter((pl.col("model") == "gpt-oss-120b")
                                                 & (pl.col("metric").str.contains("H100"))).to_dicts()}
    assert oss["japanese_alpaca"]["GPU"] == "H200" and oss["japanese_alpaca"]["verdict"] == "not comparable"
    assert "allocated 82.8 GiB at its peak, more than the H100 SXM5 holds (79.2 GiB)" in oss["japanese_alpaca"]["why"]
    assert not oss["wikipedia_ja"]["measured"]  # 60 GiB would fit an H100: run it there


def test_a_compiled_cell_whose_window_met_a_new_shape_is_judged_by_its_median_steps_noise_and_names_other_code():
    # compile-gc at batch 1 on an H100 (h100-2026-11-26): one of the windows held a recompile (187 s), so the
    # windows' CV was 138 %; its number is the median step, whose windows' medians agree within 1 %
    cell = lmm("compile-gc", 1, step=0.474, compile_="default")
    cell.update({"timing.noise_cv": 1.38, "timing.cv_median_across_repeats": 0.01, "extra.new_shapes_measured": 1,
                 "extra.shapes_measured": 3, "git_commit": "5f8bf02345fe"})
    base = lmm("bf16-gc", 1, step=0.66)
    base["git_commit"] = "af3431c9bf29"
    assert cells([cell, base])[1][("compile", 1)]["verdict"] == "not comparable"  # other code: not by default
    table = coverage_rows(pl.DataFrame([cell, base], infer_schema_length=None),
                          [{"table": "study_a", "published": STUDY_A, "measured_by": MEASURED_BY}], across_code=True)
    row = {(r["variant"], r["batch"]): r for r in table.to_dicts()}[("compile", 1)]  # merged on purpose
    assert row["noise (CV %)"] == pytest.approx(1.0) and row["ratio"] == pytest.approx(0.474 / 0.66)
    assert row["verdict"] == "differs"  # 0.72x against the published 0.80-0.89: not inside 138 % of noise
    assert row["how"].endswith("faster than published; the baseline ran other code (commit af3431c, this cell "
                               "5f8bf02)")
    base["git_commit"] = "5f8bf02345fe"  # the same code: nothing to say
    assert "other code" not in cells([cell, base])[1][("compile", 1)]["how"]


def test_a_cell_that_differs_cites_the_probe_measured_beside_it_on_its_gpu_at_the_nearest_batch():
    """A probe (a variant that changes one thing of another) run on the cell's GPU is cited where the cell differs,
    at the probe's batch nearest the cell's, both against the same baseline; another GPU's probe is not."""
    probes = [{"variant": "fp8-te-gc-cudnn", "beside": "fp8-te-gc", "changes": "attention pinned to cuDNN's SDPA",
               "cells": ["fp8-te"]}]
    rows = [lmm("bf16-gc", 8, step=4.0), lmm("fp8-te-gc", 8, step=4.4), lmm("fp8-te-gc-cudnn", 8, step=2.8),
            lmm("bf16-gc", 16, step=8.0), lmm("fp8-te-gc", 16, step=8.8),
            lmm("bf16-gc", 1, gpu=H200, step=0.5), lmm("fp8-te-gc", 1, gpu=H200, step=0.6),
            lmm("fp8-te-gc-cudnn", 1, gpu=H200, step=0.1), lmm("bf16-gc", 4, step=2.0), lmm("fp8-te-gc", 4, step=1.9)]
    measured_by = {**MEASURED_BY, "fp8-te": ["fp8-te-gc", "fp8-te"]}
    table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                          [{"table": "study_a", "published": STUDY_A, "measured_by": measured_by, "probes": probes}])
    got = {(r["variant"], r["batch"]): r for r in table.to_dicts()}
    assert got[("fp8-te", 16)]["verdict"] == "differs"  # 1.10x, where the study found 4-7 % faster
    assert got[("fp8-te", 16)]["cause (measured)"].endswith(
        "fp8-te-gc-cudnn (attention pinned to cuDNN's SDPA) on this GPU: 0.70x bf16-gc at batch 8, "
        "where fp8-te-gc is 1.10x")
    assert "fp8-te-gc-cudnn" not in (got[("fp8-te", 4)]["cause (measured)"] or "")  # it holds: nothing to explain
    assert got[("fp8-te", 4)]["verdict"] == "holds"
    # the H200's cell cites the H200's probe (batch 1), not the H100's
    assert "0.20x bf16-gc at batch 1, where fp8-te-gc is 1.20x" in got[("fp8-te", 1)]["cause (measured)"]


def test_study_d_multi_gpu_claim_is_judged_per_gpu_count_from_twins_of_the_same_code():
    """Study D's "multi-GPU training: up to 10x faster" as data: each GPU count judged from a multi-GPU run and its
    one-GPU twin (same knobs but gpus/parallel, same code) on real tokens/s; near-linear holds, a lower speed-up
    differs, a twin of other code is no pair, and the 8-GPU cell says no such host is lent."""
    import yaml

    from ftbench.judge.coverage import coverage_rows

    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())

    def run(variant, gpus, tokens, code="c1", parallel=None, when="2026-11-26T12:00:00+00:00", noise=0.005):
        return {"timestamp": when, "model": "qwen3-8b", "dataset": "wikipedia_ja", "batch_size": 2, "gpu": "H100 SXM5", "scale": "full",
                "device_type": "cuda", "status": "ok", "reason": None, "variant": variant, "source_digest": code,
                "throughput.tokens_per_s": tokens, "timing.noise_cv_tokens": noise, "timing.noise_cv": 0.1,
                "throughput.samples_per_s": 1.0, "timing.step_time_s": 0.5, "parallel.world_size": gpus,
                "parallel.strategy": parallel, "variant.gpus": gpus, "variant.parallel": parallel,
                "variant.token_budget": 4096, "variant.precision": "fp8", "memory.peak_reserved_gib": 60.0,
                "memory.peak_allocated_gib": 55.0, "memory.host_peak_rss_gib": 16.0, "gpu_memory_gib": 79.2}

    rows = [run("top", 1, 17000.0), run("top-ddp2", 2, 33000.0, parallel="ddp"),
            run("top-ddp4", 4, 50000.0, parallel="ddp"), run("top-ddp4-other", 4, 68000.0, code="c2", parallel="ddp"),
            # at 2 GPUs beside the pair above: an earlier, less noisy pair (a later lease measures again on purpose)
            # and a later one whose noise cannot carry a verdict; and the one-GPU run measured again on other code
            # later (its c1 twin still pairs: Study D reads every code's latest copy)
            run("top-ddp2-earlier", 2, 32000.0, parallel="ddp", when="2026-11-25T12:00:00+00:00", noise=0.001),
            run("top-ddp2-wide", 2, 20000.0, parallel="ddp", when="2026-11-26T18:00:00+00:00", noise=0.2),
            run("top", 1, 18000.0, code="c3", when="2026-11-26T19:00:00+00:00")]
    table = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                          [{"table": "study_d", "published": published}])
    cells = {r["variant"]: r for r in table.filter(pl.col("metric") == "multi-GPU speed-up").to_dicts()}
    assert set(cells) == {"2 GPUs vs one", "4 GPUs vs one", "8 GPUs vs one"}
    two, four, eight = cells["2 GPUs vs one"], cells["4 GPUs vs one"], cells["8 GPUs vs one"]
    assert two["verdict"] == "holds" and two["ratio"] == pytest.approx(33000 / 17000) and "real tokens/s" in two["ours"]
    assert two["measured by"] == "top-ddp2 vs top" and "3 pair(s) at 2 GPUs" in two["why"]
    assert four["verdict"] == "differs" and "below near-linear scaling" in four["how"]  # 2.94x on 4 GPUs
    assert four["measured by"] == "top-ddp4 vs top"  # the run of other code has no twin: never paired silently
    assert eight["verdict"] == "not measured" and "no 8-GPU host is lent" in eight["why"]
    # merged across code on purpose, the multi-GPU twins still pair within one code: the one-GPU run measured again on
    # other code later does not take its c1 copy away (it did: 4 GPUs read "not measured", 2026-11-26)
    across = coverage_rows(pl.DataFrame(rows, infer_schema_length=None),
                           [{"table": "study_d", "published": published}], across_code=True)
    cells = {r["variant"]: r for r in across.filter(pl.col("metric") == "multi-GPU speed-up").to_dicts()}
    assert cells["2 GPUs vs one"]["measured by"] == "top-ddp2 vs top"
    assert cells["4 GPUs vs one"]["measured by"] == "top-ddp4 vs top"


def test_a_ratio_across_two_source_digests_is_not_judged_silently():
    """A Study A cell whose bf16 baseline ran other code (another source digest) is "not comparable: baseline from
    other code" with both named; merged on purpose (merge_across_code) it is judged and says so; the front page
    says whether its records are one commit or a merge."""
    from ftbench.judge.coverage import coverage_html, provenance_line

    rows = [lmm("bf16-gc", 4, step=1.0), lmm("fixed-compile-gc", 4, step=0.46)]
    rows[0]["source_digest"], rows[1]["source_digest"] = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
    df = pl.DataFrame(rows, infer_schema_length=None)
    studies = [{"table": "study_a", "published": STUDY_A, "measured_by": MEASURED_BY}]
    cell = coverage_rows(df, studies).filter((pl.col("variant") == "fixed-compile") & (pl.col("batch") == 4)).row(0, named=True)
    assert cell["verdict"] == "not comparable" and "baseline from other code" in cell["how"], cell["how"]
    assert "bbbbbbbbbb" in cell["how"] and "aaaaaaaaaa" in cell["how"] and "merge_across_code" in cell["how"]
    merged = coverage_rows(df, studies, across_code=True).filter(
        (pl.col("variant") == "fixed-compile") & (pl.col("batch") == 4)).row(0, named=True)
    assert merged["verdict"] == "holds" and "the baseline ran other code" in merged["how"]
    line = provenance_line(df)
    assert line.startswith("Merged: 2 full-scale records of 2 versions of the code") and "not comparable" in line
    rows[0]["source_digest"] = "bbbbbbbbbbbbbbbb"
    one = pl.DataFrame(rows, infer_schema_length=None)
    assert coverage_rows(one, studies).filter((pl.col("variant") == "fixed-compile") & (pl.col("batch") == 4))[
        "verdict"].item() == "holds"
    assert provenance_line(one).startswith("One commit: every full-scale record ran the same files (bbbbbbbbbb")
    assert "One commit" in coverage_html(coverage_rows(one, studies), provenance_line(one))
    # files that were not the commit git named: the line says so rather than naming the commit alone
    named = one.with_columns(git_commit=pl.lit("ff1a05030b37958b"),
                             code=pl.lit("ff1a05030b + 3 changed (files bbbbbbbbbbbbbbbb)"))
    assert "commit ff1a050 + 3 changed files)" in provenance_line(named), provenance_line(named)
    assert "commit ff1a050)" in provenance_line(named.with_columns(code=pl.lit("ff1a05030b (files bbbbbbbbbbbbbbbb)")))


def test_a_ratio_across_two_machines_of_one_code_is_not_judged_silently(tmp_path):
    """One code on two machines of one GPU kind: a cell whose baseline ran on the other machine is "not comparable:
    baseline from another machine", both named; merged on purpose it is judged and says so. The machine comes from
    the record (provenance.machine, since 2026-11-27), else from the campaign call that ran the record's GPU
    (campaign.json), else from the lease folder; two GPUs of one campaign call are one machine."""
    import json

    from ftbench.judge.analysis import read_runs
    from ftbench.judge.coverage import provenance_line
    from test_analysis import write

    from ftbench.harness.gpus import machine_of

    studies = [{"table": "study_a", "published": STUDY_A, "measured_by": MEASURED_BY}]

    def rec(variant, batch, step, uuid):
        r = record("lmm", variant, step, gpu=H200, batch=batch, scale="full", model="llava-v1.6-mistral-7b", mem=20)
        r["run"]["dataset"] = "beans"
        r["provenance"]["device"].update(uuid=uuid, total_memory_gib=139.8)
        r["provenance"]["source_digest"] = "aaaaaaaaaaaaaaaa"
        return r

    camp = tmp_path / "campaign"
    for r in (rec("bf16-gc", 1, 1.0, "GPU-a0"), rec("bf16-gc", 4, 2.0, "GPU-a1"),  # machine a: batches 1, 4
              rec("fixed-compile-gc", 4, 1.0, "GPU-a0"),  # beside its baseline on another GPU of machine a
              rec("fixed-compile-gc", 1, 0.5, "GPU-b3")):  # machine b, a later lease: its baseline is on a
        write(camp, r)
    calls = [{"hostname": "vm", "gpu_uuids": ["GPU-a0", "GPU-a1"]}, {"hostname": "vm", "gpu_uuids": ["GPU-b2", "GPU-b3"]}]
    (camp / "campaign.json").write_text(json.dumps({"calls": calls}))
    df = read_runs(camp)
    a, b = machine_of("vm", ["GPU-a1", "GPU-a0"]), machine_of("vm", ["GPU-b2", "GPU-b3"])
    assert a != b and a.startswith("vm/") and machine_of("vm", []) == "vm"
    assert sorted(set(df["machine"])) == sorted({a, b})
    by = {(r["variant"], r["batch"]): r for r in coverage_rows(df, studies).to_dicts()}
    assert by[("fixed-compile", 4)]["verdict"] != "not comparable"  # two GPUs of one host: one machine
    one = by[("fixed-compile", 1)]
    assert one["verdict"] == "not comparable" and "baseline from another machine" in one["how"], one["how"]
    assert a in one["how"] and b in one["how"] and "merge_across_code" in one["how"]
    merged = {(r["variant"], r["batch"]): r for r in coverage_rows(df, studies, across_code=True).to_dicts()}
    assert merged[("fixed-compile", 1)]["verdict"] == "holds"
    assert "the baseline ran on another machine" in merged[("fixed-compile", 1)]["how"]
    assert "of 2 machines" in provenance_line(df) and "one machine" in provenance_line(df)
    # a record that names its machine keeps it; a lease folder without campaign.json is one machine
    lease = tmp_path / "lease"
    named = rec("bf16-gc", 2, 1.0, "GPU-c0")
    named["provenance"]["machine"] = "node7/12345678"
    write(lease, named)
    write(lease, rec("qlora-gc", 2, 1.2, "GPU-c1"))
    assert sorted(read_runs(lease)["machine"]) == ["lease lease", "node7/12345678"]


def test_a_record_names_the_machine_that_ran_it(monkeypatch):
    """Every GPU of the host, not only the job's (nvidia-smi lists them all), in one name: two jobs on two GPUs of
    one host name one machine."""
    import subprocess

    from ftbench.harness import gpus

    listed = "GPU-b\nGPU-a\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listed))
    monkeypatch.setattr(gpus.platform, "node", lambda: "host1")
    assert gpus.host_gpu_uuids() == ["GPU-b", "GPU-a"]
    assert gpus.this_machine() == gpus.machine_of("host1", ["GPU-a", "GPU-b"]) != gpus.machine_of("host1", ["GPU-a"])


def test_the_front_page_leads_with_the_shipped_verdicts_while_the_users_runs_measure_none(tmp_path, monkeypatch):
    """The default pipeline's tiny runs fill no published cell: the front page then opens with what ships in
    measurements/ (judged on its own, labelled with its GPUs, commits and dates, and how to replace it), the user's
    runs after it; once the user's own runs measure a cell, theirs lead. A merge of the user's (merge_runs) replaces
    what ships, and a pattern that names nothing shows nothing."""
    from ftbench.config import settings as ftc
    from ftbench.judge.coverage import coverage_html, provenance_line

    studies = [{"table": "study_a", "published": STUDY_A, "measured_by": MEASURED_BY}]
    rows = [lmm("bf16-gc", 4, step=1.0), lmm("fixed-compile-gc", 4, step=0.46)]
    for r in rows:
        r["timestamp"] = "2026-11-24T10:00:00+00:00"
    shipped_df = pl.DataFrame(rows, infer_schema_length=None)
    theirs = coverage_rows(shipped_df, studies)
    tiny = pl.DataFrame([{**r, "scale": "tiny"} for r in rows], infer_schema_length=None)
    mine = coverage_rows(tiny, studies)  # the default pipeline's tiny runs: no full-scale record
    line = provenance_line(shipped_df, dates=True)
    assert "2026-11-24" in line
    page = coverage_html(mine, provenance_line(tiny), (theirs, line))
    shipped_at, yours_at = page.index("shipped in measurements/"), page.index("Your runs")
    assert shipped_at < yours_at and "holds 1 of 42" in page[shipped_at:yours_at]
    assert "holds 0 of 42" in page[yours_at:] and "shipped_runs" in page and "2026-11-24" in page
    assert page.count("<svg") == 1  # one grid: the shipped cells'
    fastest = coverage_html(mine, provenance_line(tiny), (theirs, line), "the top rung, 20,000 real tokens/s")
    assert fastest.index("The fastest LoRA measured") < fastest.index("Your runs")  # in the shipped block
    assert "The fastest LoRA measured" not in page
    assert "id='coverage'" not in page and 'id="coverage"' not in page  # your unmeasured cells: counts alone
    mine_measured = coverage_rows(shipped_df, studies)
    page = coverage_html(mine_measured, "mine", (theirs, line))
    assert page.index("Your runs") < page.index("shipped in measurements/")
    assert "Your runs" not in coverage_html(mine, None, (coverage_rows(tiny, studies), "none"))
    (tmp_path / "measurements" / "h100-x").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert ftc.shipped_sources({"shipped_runs": ["measurements/*"]}) == ["measurements/h100-x"]
    assert ftc.shipped_sources({"shipped_runs": ["measurements/*"], "merge_runs": ["x"]}) == []
    assert ftc.shipped_sources({"shipped_runs": ["nothing/*"]}) == []
    # a campaign (one commit, one host) stands for the studies it measured, the leases beside it for the others
    for name in ("h200x4-2026-11-27", "h200x4-2026-11-28"):
        (tmp_path / "measurements" / name / "lmm").mkdir(parents=True)
        (tmp_path / "measurements" / name / "campaign.json").write_text("{}")
    (tmp_path / "measurements" / "h200x4-2026-11-28" / "lmm" / "metrics.json").write_text("{}")
    (tmp_path / "measurements" / "h200x4-2026-11-27" / "lmm" / "metrics.json").write_text("{}")
    found = ftc.shipped_sources({"shipped_runs": ["measurements/*"]})
    assert found == ["measurements/h100-x", "measurements/h200x4-2026-11-27", "measurements/h200x4-2026-11-28"]
    assert ftc.campaign_owners(found) == {"lmm": "measurements/h200x4-2026-11-28"}  # the last by name


def test_a_study_a_campaign_measured_is_read_from_the_campaign_alone(tmp_path):
    """What ships: Study A's records of a lease beside the campaign (other code, another host) are not read, so no
    ratio divides them with the campaign's; another study's records of that lease still are; the page names the
    campaign with its own provenance (one commit)."""
    from ftbench.judge.coverage import shipped_records
    from ftbench.core.records import RECORD_TEMPLATE

    def write(folder, study, variant, digest, campaign=False):
        rec = json.loads(json.dumps(RECORD_TEMPLATE))
        rec["run"].update(study=study, model="m", scale="full", dataset="d", variant=variant, batch_size=4)
        rec.update(status="ok", reason=None)
        rec["provenance"].update(source_digest=digest, git_commit="c" * 40, timestamp="2026-11-26T10:00:00+00:00",
                                 device={"type": "cuda", "name": "NVIDIA H200", "uuid": f"GPU-{folder}"})
        f = tmp_path / folder / study / "m" / "full" / "d" / variant / "bs4" / "metrics.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(rec))
        if campaign:
            (tmp_path / folder / "campaign.json").write_text("{}")

    write("lease", "lmm", "bf16-gc", "a" * 16)
    write("lease", "llm", "lora", "a" * 16)
    write("camp", "lmm", "fp8-te-gc", "b" * 16, campaign=True)
    merged, note, only = shipped_records([str(tmp_path / "lease"), str(tmp_path / "camp")],
                                   [{"table": "study_a", "study": "lmm"}, {"table": "study_b", "study": "llm"}])
    got = sorted(zip(merged["study"].to_list(), merged["variant"].to_list(), merged["source_digest"].to_list()))
    assert got == [("llm", "lora", "a" * 16), ("lmm", "fp8-te-gc", "b" * 16)]
    assert note.startswith(f"Study A: from the campaign {tmp_path / 'camp'} alone. One commit: every full-scale record "
                           "ran the same files (bbbbbbbbbb")
    assert only == {}  # a campaign not named after a table stands for the studies it holds


def test_study_d_speed_claim_is_judged_at_a_gpu_bound_pair_and_the_host_bound_one_stands_beside():
    """Unsloth's 1.98x is judged where both runs keep the GPU busy (>= 80 %): a host-bound pair (the GPU 17 % busy)
    cannot show a kernel library's speed, so it is context, never the verdict; with none GPU-bound: not comparable."""
    import yaml

    from ftbench.judge.coverage import coverage_rows

    published = yaml.safe_load((ROOT / "config" / "published" / "study_b.yaml").read_text())

    def run(variant, model, batch, step, busy):
        return {"model": model, "dataset": "japanese_alpaca", "batch_size": batch, "gpu": "H100 SXM5",
                "scale": "full", "device_type": "cuda", "status": "ok", "reason": None, "variant": variant,
                "timing.step_time_s": step, "timing.noise_cv": 0.01, "device_usage.gpu_util_mean_pct": busy,
                "memory.peak_reserved_gib": 20.0, "memory.peak_allocated_gib": 18.0, "memory.host_peak_rss_gib": 4.0,
                "gpu_memory_gib": 79.2}

    host_bound = [run("unsloth-qlora", "qwen3-8b", 4, 1.0, 17.0), run("qlora", "qwen3-8b", 4, 0.9, 30.0)]
    gpu_bound = [run("unsloth-qlora", "qwen3-32b", 32, 1.0, 95.0), run("qlora", "qwen3-32b", 32, 1.98, 97.0)]
    studies = [{"table": "study_d", "published": published}]
    cell = coverage_rows(pl.DataFrame(host_bound + gpu_bound), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["model"] == "qwen3-32b" and cell["verdict"] == "holds" and cell["ratio"] == pytest.approx(1.98)
    assert "GPU-bound pair carries the verdict (busy 95 %)" in cell["why"]
    assert "qwen3-8b japanese_alpaca bs4 on the H100 SXM5: 0.90x at GPU busy 17 %" in cell["why"]
    alone = coverage_rows(pl.DataFrame(host_bound), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert alone["verdict"] == "not comparable" and "no GPU-bound pair" in alone["how"] and "17 %" in alone["how"]
    # PEFT with the same knobs as Unsloth's variant (gradient checkpointing) is its twin where it ran at that shape
    twin = run("qlora-gc", "qwen3-32b", 32, 2.2, 96.0)
    cell = coverage_rows(pl.DataFrame(host_bound + gpu_bound + [twin]), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["measured by"] == "unsloth-qlora, qlora-gc" and cell["ratio"] == pytest.approx(2.2)
    assert "0.90x at GPU busy 17 %" in cell["why"]  # where no qlora-gc ran, plain qlora is the pair
    # a pair of two codes is no pair unless merged across code on purpose
    other = [{**gpu_bound[0], "source_digest": "aaaa"}, {**gpu_bound[1], "source_digest": "bbbb"}]
    rows = [{**r, "source_digest": "aaaa"} for r in host_bound] + other
    cell = coverage_rows(pl.DataFrame(rows), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["model"] == "qwen3-8b" and cell["verdict"] == "not comparable"
    cell = coverage_rows(pl.DataFrame(rows), studies, across_code=True).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["model"] == "qwen3-32b" and cell["verdict"] == "holds"
    assert "the two runs ran other code (Unsloth's files aaaa, PEFT's bbbb): merged across code" in cell["how"]
    # none of the claim's data GPU-bound: a GPU-bound pair on other data carries it, saying so; alpaca's stays beside
    long_rows = [{**run("unsloth-qlora", "qwen3-8b", 16, 1.0, 97.0), "dataset": "wikipedia_ja"},
                 {**run("qlora-gc", "qwen3-8b", 16, 2.0, 93.0), "dataset": "wikipedia_ja"}]
    cell = coverage_rows(pl.DataFrame(host_bound + long_rows), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["dataset"] == "alpaca" and cell["ratio"] == pytest.approx(2.0) and cell["verdict"] == "holds"
    assert "on wikipedia_ja: no japanese_alpaca pair keeps the GPU busy" in cell["why"]
    assert "qwen3-8b japanese_alpaca bs4 on the H100 SXM5: 0.90x at GPU busy 17 %" in cell["why"]
    # of two GPU-bound pairs on other data, PEFT with Unsloth's knobs (qlora-gc) carries it over plain qlora
    plain = [{**run("unsloth-qlora", "qwen3-8b", 4, 1.0, 84.0), "dataset": "wikipedia_ja"},
             {**run("qlora", "qwen3-8b", 4, 1.5, 82.0), "dataset": "wikipedia_ja"}]
    cell = coverage_rows(pl.DataFrame(host_bound + plain + long_rows), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["batch"] == 16 and cell["measured by"] == "unsloth-qlora, qlora-gc", cell
    # ... and a GPU-bound alpaca pair comes first whatever other data measured
    cell = coverage_rows(pl.DataFrame(host_bound + long_rows + gpu_bound), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["model"] == "qwen3-32b" and cell["ratio"] == pytest.approx(1.98) and "on wikipedia_ja" not in cell["why"]
    # where no GPU-bound pair's noise can carry a verdict, the one closest to it shows (its verdict inconclusive),
    # not merely the busiest: two pairs, the busier one the noisier
    wide = [{**r, "timing.noise_cv": 0.07} for r in long_rows]
    narrow = [{**r, "batch_size": 32, "timing.noise_cv": 0.045, "timing.step_time_s": 2.2 * (r["variant"] ==
              "qlora-gc") or 1.0, "device_usage.gpu_util_mean_pct": 90.0} for r in long_rows]
    cell = coverage_rows(pl.DataFrame(host_bound + wide + narrow), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["ratio"] == pytest.approx(2.2) and cell["verdict"] == "inconclusive", cell
    assert "2 x CV 6.4 %" in cell["how"] and "busy 90 %" in cell["why"]
    # the pair padded to one length (every step the same work) pairs with its own twin, and carries where its noise can
    fixed = [{**r, "variant": r["variant"].replace("qlora-gc", "qlora-gc-fixed").replace("unsloth-qlora",
              "unsloth-qlora-fixed"), "timing.noise_cv": 0.01, "timing.step_time_s": 2.3 * (r["variant"] == "qlora-gc")
              or 1.0} for r in long_rows]
    cell = coverage_rows(pl.DataFrame(host_bound + wide + fixed), studies).filter(
        pl.col("metric") == "speed-up over Hugging Face").row(0, named=True)
    assert cell["measured by"] == "unsloth-qlora-fixed, qlora-gc-fixed" and cell["ratio"] == pytest.approx(2.3)
    assert cell["verdict"] == "differs" and "unsloth-qlora-fixed on the H100 SXM5" not in cell["why"]
    assert "qwen3-8b wikipedia_ja bs16 on the H100 SXM5: 2.00x" in cell["why"]  # the padded-to-its-longest pair beside


def test_studies_b_and_d_each_read_from_their_own_campaign_though_both_are_llm_records(tmp_path):
    """Issue 63: bench/campaign.py study_b and study_d both write `llm` records; each campaign's folder (its
    campaign.json names it) stands for its own published table, read from it alone, while a lease's records stay in
    the merge for everything else."""
    from ftbench.judge.coverage import shipped_records
    from ftbench.core.records import RECORD_TEMPLATE

    def write(folder, variant, digest, campaign=None):
        rec = json.loads(json.dumps(RECORD_TEMPLATE))
        rec["run"].update(study="llm", model="m", scale="full", dataset="d", variant=variant, batch_size=4)
        rec.update(status="ok", reason=None)
        rec["provenance"].update(source_digest=digest, git_commit="c" * 40, timestamp="2026-11-28T10:00:00+00:00",
                                 device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{folder}"})
        f = tmp_path / folder / "llm" / "m" / "full" / "d" / variant / "bs4" / "metrics.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps(rec))
        if campaign:
            (tmp_path / folder / "campaign.json").write_text(json.dumps({"campaign": campaign}))

    write("lease", "lora", "a" * 16)
    write("study_b-vm-2026-11-28", "unsloth-qlora", "b" * 16, campaign="study_b")
    write("study_d-vm-2026-11-28", "qlora-gc", "d" * 16, campaign="study_d")
    folders = [str(tmp_path / f) for f in ("lease", "study_b-vm-2026-11-28", "study_d-vm-2026-11-28")]
    tables = [{"table": "study_b", "study": "llm"}, {"table": "study_d", "study": "llm"}]
    merged, note, only = shipped_records(folders, tables)
    assert sorted(merged["variant"].to_list()) == ["lora", "qlora-gc", "unsloth-qlora"]
    assert only["study_b"]["variant"].to_list() == ["unsloth-qlora"] and only["study_d"]["variant"].to_list() == ["qlora-gc"]
    assert "Study B: from the campaign" in note and "Study D: from the campaign" in note
