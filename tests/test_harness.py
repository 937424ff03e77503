"""The measurement harness: the Meter's windows, statistics and synchronisation, the record, status handling."""

import json
import time
from pathlib import Path

import pytest
import torch

from ftbench.harness import meter as harness
from ftbench.harness import trackers
from ftbench.config.settings import MeasureSettings
from ftbench.harness.summary import summarize
from ftbench.harness.meter import (RECORD_TEMPLATE, Meter, Unsupported, guarded, new_record, provenance,
                                   write_json_atomic)
from ftbench.harness.trackers import DeviceSampler, Progress, memory_now

CPU = torch.device("cpu")


def measured_run(meter, durations, **fields):
    meter.start()
    for dt in durations:
        time.sleep(dt)
        if meter.step(4, tokens=100, padded_tokens=128, flops_model=1e9, flops_hardware=2e9, **fields):
            break
    meter.finish()


def test_meter_excludes_warmup_and_reports_windows_quantiles_and_noise():
    meter = Meter(CPU, MeasureSettings(warmup_steps=2, steps=3, repeats=2))
    measured_run(meter, [0.05, 0.03] + [0.01, 0.012, 0.011] * 3)
    assert meter.done and len(meter.rows) == 8  # training stops once the last window closes
    rec = new_record({}, {})
    summarize(meter, rec, peak_tflops=None, peak_precision=None)
    t, m = rec["timing"], rec["measure"]
    assert m["timer"] == "host_clock" and [w["steps"] for w in m["windows"]] == [3, 3] and not m["truncated"]
    assert t["steps_measured"] == 6 and t["first_step_s"] >= 0.05
    assert 0.009 < t["step_time_s"] < 0.03  # median of the steady steps, not the warm-up ones
    assert t["step_time_p10_s"] <= t["step_time_s"] <= t["step_time_p90_s"]
    assert t["cv_within"] < 0.5 and t["cv_across_repeats"] is not None and t["noise_cv"] == t["cv_across_repeats"]
    assert t["window_s"] == pytest.approx(sum(r["step_time_s"] for r in meter.measured))
    assert t["host_window_s"] >= t["window_s"] * 0.99
    thr = rec["throughput"]
    assert thr["tokens_per_s"] / thr["samples_per_s"] == pytest.approx(25)
    assert thr["samples_per_hour"] == pytest.approx(3600 * 24 / t["window_s"])
    f = rec["flops"]
    assert f["model_per_step"] == 1e9 and f["hardware_per_step"] == 2e9 and f["mfu"] is None
    assert rec["outliers"]["count"] == 0 and rec["outliers"]["dominated"] is False


def test_min_seconds_extends_a_window_until_it_holds_enough_time():
    meter = Meter(CPU, MeasureSettings(warmup_steps=0, steps=2, min_seconds=0.1, repeats=1))
    measured_run(meter, [0.02] * 40)
    assert meter.done and 5 <= len(meter.measured) <= 8


def test_ranks_size_each_window_from_the_last_one_not_only_from_a_slow_warm_up():
    """Several ranks close windows by agreed step counts. Warm-up steps four times a measured step size the first
    window short: shorter than `min_seconds`, it counts as warm-up (the ranks decide together), and the windows
    kept are agreed from the steps before them and hold `min_seconds`."""
    meter = Meter(CPU, MeasureSettings(warmup_steps=3, steps=2, min_seconds=0.1, repeats=3))
    asked = []
    meter.rule.agree = lambda n: asked.append(n) or n  # one rank: the maximum over ranks is its own number
    measured_run(meter, [0.04] * 3 + [0.01] * 200)
    steps = [w["steps"] for w in meter.windows]
    assert meter.done and len(steps) == 3 and all(n >= 8 for n in steps)  # from the measured 0.01-s steps
    assert all(w["host_s"] >= 0.1 for w in meter.windows)
    # agreed: the first window's steps from warm-up (0.1 s / 0.04 s), "too short" (1), its successor's steps, then
    # for each kept window "too short" (0) and, but after the last, the next window's steps
    assert asked[0] < 5 and asked[1] == 1 and asked[2] >= 8 and asked[3] == 0
    assert meter.rule.calibrated == 1
    calibration = [r for r in meter.rows if r["phase"] == "warmup"]
    assert len(calibration) == 3 + asked[0] and all(r["repeat"] is None for r in calibration)
    assert [r["repeat"] for r in meter.measured][:1] == [0]  # the first window kept is repeat 0
    rec = new_record({}, {})
    summarize(meter, rec, None, None)
    assert rec["extra"]["measure_calibration"]["windows_as_warmup"] == 1 and not rec["measure"]["truncated"]
    # one rank: windows end by time, never re-measured
    meter = Meter(CPU, MeasureSettings(warmup_steps=3, steps=2, min_seconds=0.1, repeats=2))
    measured_run(meter, [0.04] * 3 + [0.01] * 200)
    assert meter.rule.calibrated == 0 and len(meter.windows) == 2


def test_windows_stop_once_their_noise_is_at_most_the_cv_target():
    """cv_target: steady steps end the measurement after min_repeats windows (not `repeats`), the record says why
    and is not truncated; noisy windows go on to `repeats`; several ranks stop only when every rank agrees."""
    def run(durations, **knobs):
        meter = Meter(CPU, MeasureSettings(warmup_steps=1, steps=4, repeats=5, **knobs))
        measured_run(meter, durations)
        rec = new_record({}, {})
        summarize(meter, rec, None, None)
        return meter, rec

    meter, rec = run([0.02] + [0.01] * 40, cv_target=0.2)
    assert len(meter.windows) == 2 and meter.done and rec["measure"]["truncated"] is False
    stop = rec["extra"]["measure_stop"]
    assert stop["cv_target"] == 0.2 and stop["windows"] == 2 and stop["cv"] <= 0.2
    meter, rec = run([0.02] + [0.01] * 40, cv_target=0.2, min_repeats=3)
    assert len(meter.windows) == 3
    noisy = [0.02] + [0.005] * 4 + [0.03] * 4 + [0.005] * 4 + [0.03] * 4 + [0.005] * 4 + [0.03] * 8
    meter, rec = run(noisy, cv_target=0.05)  # the windows' throughputs differ 6x: all five windows
    assert len(meter.windows) == 5 and "measure_stop" not in rec["extra"] and not rec["measure"]["truncated"]
    meter, rec = run([0.02] + [0.01] * 40)  # no target: `repeats` windows, as always
    assert len(meter.windows) == 5
    # several ranks: this rank's noise is low, another's is not (the collective returns the maximum)
    meter = Meter(CPU, MeasureSettings(warmup_steps=1, steps=4, repeats=3, cv_target=0.2))
    meter.rule.agree = lambda n: max(n, 1)  # window steps pass through; on stopping, the other rank votes to go on
    measured_run(meter, [0.02] + [0.01] * 40)
    assert len(meter.windows) == 3 and meter.rule.stopped_early is None


def test_a_slow_step_is_an_outlier_with_its_reason_and_dominates_throughput():
    meter = Meter(CPU, MeasureSettings(warmup_steps=1, steps=6))
    meter.start()
    for i, dt in enumerate([0.01, 0.01, 0.01, 0.2, 0.01, 0.01, 0.01]):
        time.sleep(dt)
        meter.step(1, shape="1x64" if i != 3 else "1x128")
    rec = new_record({}, {})
    summarize(meter, rec, None, None)
    out = rec["outliers"]
    assert out["count"] == 1 and out["steps"][0]["step"] == 4 and out["steps"][0]["x_median"] > 3
    assert out["steps"][0]["reasons"] == ["new shape 1x128"]
    assert out["dominated"] is True and out["time_share"] > 0.5
    assert rec["throughput"]["samples_per_hour_median_step"] > 2 * rec["throughput"]["samples_per_hour"]


def test_an_early_end_truncates_the_window_and_says_so():
    meter = Meter(CPU, MeasureSettings(warmup_steps=1, steps=5, repeats=2))
    measured_run(meter, [0.001] * 4)  # data ran out after 4 steps
    rec = new_record({}, {})
    summarize(meter, rec, None, None)
    assert rec["measure"]["truncated"] is True and rec["timing"]["steps_measured"] == 3


class FakeEvent:
    """A CUDA event on a machine without CUDA: records the host clock, answers elapsed_time in ms."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def test_the_timing_path_never_synchronises_inside_a_window(monkeypatch):
    steps_done, syncs = [0], []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(steps_done[0]))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(harness, "memory_now", lambda device: dict.fromkeys(
        ["host_peak_rss_gib", "allocated_gib", "reserved_gib", "peak_allocated_gib", "peak_reserved_gib"], 0.0))
    energy = iter(range(0, 10**9, 5000))  # mJ: 5 J more at every reading
    monkeypatch.setattr(DeviceSampler, "energy_mj", lambda self: next(energy))
    meter = Meter(torch.device("cuda", 0), MeasureSettings(warmup_steps=2, steps=3, repeats=2), memory_log_every=1)
    meter.start()
    for _ in range(20):
        time.sleep(0.002)
        steps_done[0] += 1
        if meter.step(2, tokens=10, loss=torch.tensor(1.5)):
            break
    # once at the start, then only where a segment ends: warm-up (step 2) and each window (steps 5 and 8)
    assert syncs == [0, 2, 5, 8]
    assert len(meter.memory_log) == 8  # the memory log reads allocator statistics, which need no sync
    rec = new_record({}, {})
    summarize(meter, rec, 989.4, "bf16")
    assert rec["measure"]["timer"] == "cuda_events" and all(r["loss"] == 1.5 for r in meter.rows)
    assert rec["energy"]["source"] == "nvml_total_energy_counter"
    assert rec["energy"]["per_step_j"] == pytest.approx(5 / 3) and rec["energy"]["per_token_j"] == pytest.approx(0.5 / 3)


def test_record_has_the_fixed_schema_whatever_the_status():
    for exc in (None, Unsupported("no CUDA"), torch.OutOfMemoryError("CUDA out of memory"), KeyError("x")):
        rec = new_record({"study": "s"}, {"peft": "lora"})
        with guarded(rec, CPU):
            if exc is not None:
                raise exc
        assert set(rec) == set(RECORD_TEMPLATE)
        for group in ("timing", "memory", "throughput", "flops", "energy", "compile"):
            assert set(rec[group]) == set(RECORD_TEMPLATE[group])
        expected = {type(None): "ok", Unsupported: "unsupported", torch.OutOfMemoryError: "oom", KeyError: "error"}
        assert rec["status"] == expected[type(exc)]
    assert "KeyError" in rec["reason"] and "traceback" in rec["extra"]


def test_an_error_without_a_message_is_recorded_with_where_it_was_raised():
    def first_key(d):  # what Dynamo's dict_keys_getitem does with a dict shorter than its guard expected
        return next(iter(d))

    def router(d):
        return first_key(d)

    rec = new_record({"study": "s"}, {"peft": "lora"})
    with guarded(rec, CPU):
        router({})
    assert rec["status"] == "error"
    assert rec["reason"] == ("StopIteration (no message) in first_key (tests/test_harness.py:"
                             f"{first_key.__code__.co_firstlineno + 1}), called from router (tests/test_harness.py:"
                             f"{router.__code__.co_firstlineno + 1})")


def test_records_are_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "metrics.json"
    write_json_atomic(path, {"a": 1})

    def broken_dumps(*a, **k):
        raise RuntimeError("killed mid-write")

    from ftbench.core import records

    monkeypatch.setattr(records.json, "dumps", broken_dumps)
    with pytest.raises(RuntimeError):
        write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 1}  # the old record whole, never half of a new one


def test_sampler_without_gpu_measures_nothing_and_says_so():
    with DeviceSampler(CPU) as s:
        time.sleep(0.05)
    assert s.summary([(0, time.perf_counter())])["gpu_util_mean_pct"] is None and s.energy_mj() is None


def test_memory_and_provenance_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    mem = memory_now(CPU)
    assert mem["host_peak_rss_gib"] > 0 and mem["peak_allocated_gib"] is None
    prov = provenance(CPU, tmp_path, "abc", "random", "synthetic", "tiny")
    assert prov["versions"]["torch"] == "2.13.0+cpu" or torch.__version__.startswith(prov["versions"]["torch"])
    assert prov["device"]["type"] == "cpu" and prov["config_hash"] == "abc" and prov["scale"] == "tiny"
    # the host's processor and its load when the job began: two hosts of one GPU kind told apart
    assert prov["device"]["cpu_model"] and prov["device"]["load_avg_1m"] >= 0
    assert prov["cuda_alloc_conf"] == "expandable_segments:True"  # the allocator's settings travel with the record


def test_compile_accounting_keeps_training_apart_from_evaluation():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    f = torch.compile(lambda x: (x * 2).sum(), backend="eager")
    meter = Meter(CPU, MeasureSettings(warmup_steps=1, steps=2), count_graphs=True)
    meter.start()
    for _ in range(3):
        f(torch.ones(4))
        meter.step(1)
    meter.finish()
    f(torch.ones(2, 3))  # evaluation meets a new shape: a graph compiled after training, not a recompile of it
    rec = new_record({}, {})
    summarize(meter, rec, peak_tflops=None, peak_precision=None)
    c = rec["compile"]
    assert c["unique_graphs"] == c["graphs_first_step"] == 1 and c["recompiles"] == 0
    assert c["eval_graphs"] == 1 and c["eval_compile_s"] >= 0


def test_progress_file_is_written_at_most_every_fifth_of_a_second(tmp_path, monkeypatch):
    progress = tmp_path / "progress.json"
    monkeypatch.setenv("FTBENCH_PROGRESS", str(progress))
    writes = []
    monkeypatch.setattr(Progress, "write", lambda self, step, graphs: writes.append(step))
    clock = [1000.0]  # the harness's clock, stepped by hand: 100 steps 5 ms apart, whatever the machine's load

    class Clock:  # the time module, but perf_counter reads `clock`
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def perf_counter():
            return clock[0]

    monkeypatch.setattr(harness, "time", Clock())
    monkeypatch.setattr(trackers, "time", Clock())  # the progress file's clock
    meter = Meter(CPU, MeasureSettings(warmup_steps=0, steps=10**6, repeats=1))
    meter.start()
    for _ in range(100):
        clock[0] += 0.005
        meter.step(1)
    assert writes[0] == 1 and len(writes) == 3 and meter.steps_taken == 100  # at 0, 0.2 and 0.4 s of 0.5


def test_a_compiled_run_compiles_into_an_empty_cache_of_its_own_unless_asked_to_keep_the_hosts(tmp_path, monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    from ftbench.run.execute import compile_cache
    from ftbench.core.knobs import Variant

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "host-cache"))
    monkeypatch.setenv("FTBENCH_PROGRESS", str(tmp_path / "job" / "progress.json"))
    (tmp_path / "job").mkdir()
    rec = new_record({}, {})
    with compile_cache(Variant(name="c", compile="default"), rec):
        inside = cache_dir()
        assert inside != str(tmp_path / "host-cache") and inside.startswith(str(tmp_path / "job"))
        assert not any(p for p in Path(inside).iterdir())  # empty when the run starts
    assert rec["extra"]["compile_cache"].startswith("cold")
    assert cache_dir() == str(tmp_path / "host-cache") and not Path(inside).exists()
    rec = new_record({}, {})
    with compile_cache(Variant(name="c", compile="default"), rec):  # what a cold run compiled stays on the host
        (Path(cache_dir()) / "fxgraph").mkdir()
        (Path(cache_dir()) / "fxgraph" / "entry").write_text("x")
    assert (tmp_path / "host-cache" / "fxgraph" / "entry").read_text() == "x"
    monkeypatch.setenv("FTBENCH_COMPILE_CACHE", "warm")
    rec = new_record({}, {})
    with compile_cache(Variant(name="c", compile="default"), rec):
        assert cache_dir() == str(tmp_path / "host-cache")
    assert rec["extra"]["compile_cache"].startswith("warm")
    rec = new_record({}, {})
    with compile_cache(Variant(name="e"), rec):  # an eager run: nothing changes, nothing recorded
        assert cache_dir() == str(tmp_path / "host-cache")
    assert "compile_cache" not in rec["extra"]


def test_a_run_killed_while_it_compiles_its_first_step_has_said_how_many_graphs_it_compiled(tmp_path, monkeypatch):
    import torch._dynamo

    progress = tmp_path / "progress.json"
    monkeypatch.setenv("FTBENCH_PROGRESS", str(progress))
    torch._dynamo.reset()
    f = torch.compile(lambda x: (x + 1).sum(), backend="eager")
    with Meter(CPU, MeasureSettings(warmup_steps=1, steps=2), count_graphs=True):
        f(torch.ones(3))
        seen = json.loads(progress.read_text())
    assert seen["step"] is None and seen["compiled_graphs"] >= 1  # no step yet: the supervisor says "none"
    torch._dynamo.reset()
    progress.write_text("")
    torch.compile(lambda x: x * 3, backend="eager")(torch.ones(2))  # after the run: no longer watched
    assert progress.read_text() == ""
