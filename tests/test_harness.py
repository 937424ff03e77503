"""The measurement harness: step clock statistics, record schema, status handling."""

import time

import pytest
import torch

from ftbench.harness import (RECORD_TEMPLATE, DeviceSampler, StepClock, Unsupported, guarded, memory_now,
                             new_record, provenance)

CPU = torch.device("cpu")


def test_step_clock_excludes_warmup_and_reports_quantiles():
    clock = StepClock(CPU, warmup_steps=2)
    clock.start()
    for i, dt in enumerate([0.05, 0.03, 0.01, 0.01, 0.02, 0.01, 0.01]):
        time.sleep(dt)
        clock.step_end(samples=4, tokens=100, padded_tokens=128, loss=1.0, flops=1e9)
    s = clock.summary()
    assert s["steps_measured"] == 5 and s["warmup_steps"] == 2
    assert s["first_step_s"] >= 0.05
    assert 0.009 < s["step_time_s"] < 0.02  # median of the steady steps, not the first ones
    assert s["step_time_p10_s"] <= s["step_time_s"] <= s["step_time_p90_s"]
    thr = s["throughput"]
    assert thr["tokens_per_s"] / thr["samples_per_s"] == pytest.approx(25)
    assert thr["samples_per_hour"] == pytest.approx(3600 * thr["samples_per_s"])
    t0, t1 = clock.window()
    assert t1 - t0 == pytest.approx(sum(r["step_time_s"] for r in clock.measured))


def test_record_has_the_fixed_schema_whatever_the_status():
    for exc in (None, Unsupported("no CUDA"), torch.OutOfMemoryError("CUDA out of memory"), KeyError("x")):
        rec = new_record({"study": "s"}, {"peft": "lora"})
        with guarded(rec, CPU):
            if exc is not None:
                raise exc
        assert set(rec) == set(RECORD_TEMPLATE)
        for group in ("timing", "memory", "throughput"):
            assert set(rec[group]) == set(RECORD_TEMPLATE[group])
        expected = {type(None): "ok", Unsupported: "unsupported", torch.OutOfMemoryError: "oom", KeyError: "error"}
        assert rec["status"] == expected[type(exc)]
    assert "KeyError" in rec["reason"] and "traceback" in rec["extra"]


def test_unsupported_keeps_its_reason():
    rec = new_record({}, {})
    with guarded(rec, CPU):
        raise Unsupported("FP8 needs compute capability 8.9 or newer; this GPU has 8.0")
    assert rec["reason"].startswith("FP8 needs compute capability")


def test_sampler_without_gpu_measures_nothing_and_says_so():
    with DeviceSampler(CPU) as s:
        time.sleep(0.05)
    assert s.summary(0, time.perf_counter(), 1)["gpu_util_mean_pct"] is None


def test_memory_and_provenance_on_cpu(tmp_path):
    mem = memory_now(CPU)
    assert mem["host_peak_rss_gib"] > 0 and mem["peak_allocated_gib"] is None
    prov = provenance(CPU, tmp_path, "abc", "random", "synthetic", "tiny")
    assert prov["versions"]["torch"] == "2.13.0+cpu" or torch.__version__.startswith(prov["versions"]["torch"])
    assert prov["device"]["type"] == "cpu" and prov["config_hash"] == "abc" and prov["scale"] == "tiny"
