"""Reading run records: schema-2 records as they are, schema-1 records (measurements made before the Meter)
converted on read, and a clear error naming the file when a record is not valid JSON."""

from __future__ import annotations

import copy
import csv
import json
import os
import statistics
from pathlib import Path

SCHEMA_VERSION = 2

# extra.host_changes: what the host changed from the request, each entry naming the setting behind it and why
# ("no CUDA GPU"; "shared GPU"); tables show the short form (the change alone)


SHARED_GPU = "its speed is not a measurement"  # the change a run that shared its GPU records (tiny_jobs_per_gpu)


def shared_gpu(record: dict) -> bool:
    """Whether a run shared its GPU with other jobs (its losses are measurements, its speed is not)."""
    return any(SHARED_GPU in str(c) for c in (record.get("extra") or {}).get("host_changes") or [])


def host_change(change: str, setting: str, why: str = "no CUDA GPU") -> str:
    """One entry of extra.host_changes: "precision bf16 -> fp32 (training.cpu_precision: no CUDA GPU)"."""
    return f"{change} ({setting}: {why})"


COMPILE_CACHE_NOTES = {"cold": "cold: an empty Inductor cache for this run (left in the host's cache after it)",
                       "warm": "warm: the host's Inductor cache (FTBENCH_COMPILE_CACHE=warm)"}


def compile_cache_kind(compiles) -> str | None:
    """The Inductor cache a run compiles into: "cold", an empty one of its own (ftbench.run.execute's compile_cache),
    unless FTBENCH_COMPILE_CACHE=warm; an eager run: None. extra.compile_cache is its COMPILE_CACHE_NOTES entry."""
    if not compiles:
        return None
    return "warm" if os.environ.get("FTBENCH_COMPILE_CACHE") == "warm" else "cold"


def short_host_changes(changes) -> str | None:
    """The entries without their settings, joined for a table: "precision bf16 -> fp32; ..." (None: no change)."""
    return "; ".join(c.rsplit(" (", 1)[0] if c.endswith(")") and " (" in c else c for c in changes or []) or None


# Every metrics.json has exactly these keys, whatever its status; a value is None where not measured.
# config/schema/metrics.schema.json is the same shape as a JSON Schema; records of schema 1 are converted on
# read (upgrade_v1 below).
RECORD_TEMPLATE = {
    "schema_version": SCHEMA_VERSION,
    "status": None,  # ok | oom | unsupported | error
    "reason": None,
    "run": {"study": None, "model": None, "scale": None, "dataset": None, "variant": None, "batch_size": None},
    "variant": {},
    # what actually ran: storage dtype of the frozen and trainable weights, the dtype of the GEMMs (what the
    # host changed from the request, training.cpu_*, is in extra.host_changes)
    "precision": {"requested": None, "frozen_weights": None, "trainable_weights": None, "gemm": None,
                  "fp8_layers": None},
    # the measurement itself: timer, window rule, repeats, and each window as it closed
    "measure": {"timer": None, "warmup_steps": None, "min_steps": None, "min_seconds": None, "repeats": None,
                "truncated": None, "windows": []},
    "timing": {"model_load_s": None, "first_step_s": None, "first_step_overhead_s": None, "step_time_s": None,
               "step_time_p10_s": None, "step_time_p90_s": None, "step_time_mean_s": None, "cv_within": None,
               "cv_across_repeats": None, "cv_median_across_repeats": None, "noise_cv": None, "noise_cv_tokens": None, "steps_measured": None, "window_s": None,
               "host_window_s": None, "host_cpu_step_s": None, "train_s": None, "eval_s": None},
    "outliers": {"factor": None, "count": None, "time_s": None, "time_share": None, "dominated": None, "steps": []},
    "throughput": {"samples_per_s": None, "samples_per_hour": None, "samples_per_hour_median_step": None,
                   "tokens_per_s": None, "padded_tokens_per_s": None, "tokens_per_sample": None},
    "memory": {"peak_allocated_gib": None, "peak_reserved_gib": None, "device_peak_used_gib": None,
               "process_peak_used_gib": None, "host_peak_rss_gib": None, "at_failure_gib": None,
               "alloc_retries": None},
    "device_usage": {"gpu_util_mean_pct": None, "power_mean_w": None, "sm_clock_mean_mhz": None, "samples": None},
    "energy": {"source": None, "window_j": None, "per_step_j": None, "per_sample_j": None, "per_token_j": None},
    "flops": {"model_per_step": None, "hardware_per_step": None, "model_tflops": None, "hardware_tflops": None,
              "peak_tflops": None, "peak_precision": None, "mfu": None, "hfu": None},
    "compile": {"backend": None, "compile_s": None, "frame_compile_s": None, "backward_compile_s": None, "unique_graphs": None,
                "graphs_first_step": None, "recompiles": None, "graph_breaks": None, "cudagraph_skips": None,
                "eval_graphs": None, "eval_compile_s": None, "fx_cache_hits": None, "fx_cache_misses": None,
                "autograd_cache_hits": None, "autograd_cache_misses": None},
    "data": {"wait_share": None, "workers": None, "persistent_workers": None, "pin_memory": None},
    "model": {"parameters": None, "trainable_parameters": None, "adapted_modules": None, "gguf": None},
    # trace, trace_tokens: each step's loss and real tokens, derived on read from steps.csv (read_record)
    "loss": {"first": None, "last": None, "eval": None, "first_steps": None, "mean_first_steps": None, "trace": None,
             "trace_tokens": None, "held_out": None},
    # several GPUs (variant knob gpus > 1): the totals above count every rank; per_rank has each rank's own
    "parallel": {"strategy": None, "world_size": None, "backend": None, "samples_per_s_per_gpu": None,
                 "tokens_per_s_per_gpu": None, "peak_allocated_gib_max": None, "per_rank": []},
    "extra": {},
    "provenance": {},
}


def new_record_from_template(run: dict, variant: dict) -> dict:
    rec = copy.deepcopy(RECORD_TEMPLATE)
    rec["run"].update(run)
    rec["variant"] = dict(variant)
    return rec


def write_json_atomic(path, obj) -> None:
    """Write to a temporary file beside `path`, then rename: a reader never sees half a record."""
    path = Path(path)
    os.replace(_written_beside(path, obj), path)


def _written_beside(path: Path, obj) -> Path:
    """`obj` as JSON in a temporary file beside `path` (same file system: renamed or linked into place whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    return tmp


def write_json_first(path, obj) -> bool:
    """Write `path` whole unless it exists, atomically (a hard link of a finished temporary file): of several
    writers the first wins. False where another wrote it first (several failed ranks: the first failure's record
    stands, not a peer's "connection closed" that followed it)."""
    path = Path(path)
    tmp = _written_beside(path, obj)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


class RecordError(ValueError):
    """A metrics.json that cannot be read: the message names the file."""


def read_record(path) -> dict:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecordError(f"{path}: not a readable run record ({type(e).__name__}: {e})") from e
    steps = read_steps(path.with_name("steps.csv"))  # read once: the conversion, the trace and the windows use it
    if record.get("schema_version") == 1:
        record = upgrade_v1(record, steps or None)
    elif record.get("schema_version") != SCHEMA_VERSION:
        raise RecordError(f"{path}: unknown schema_version {record.get('schema_version')!r}")
    for group, keys in RECORD_TEMPLATE.items():  # groups and keys added to schema 2 since the record was written
        if isinstance(keys, dict) and group not in record:
            record[group] = copy.deepcopy(keys)
        if isinstance(keys, dict) and isinstance(record.get(group), dict):
            for key, default in keys.items():
                record[group].setdefault(key, copy.deepcopy(default))
    windows = record["measure"].get("windows") or []
    if record["timing"]["cv_median_across_repeats"] is None:  # records written before the field
        record["timing"]["cv_median_across_repeats"] = cv([w.get("median_step_s") for w in windows])
    # each step's loss and real tokens in order (warm-up included), from the steps.csv beside the record: what
    # compares two runs' losses step by step on the same rows (compare.frontier)
    record["loss"]["trace"], record["loss"]["trace_tokens"] = step_trace(steps)
    if record["timing"]["noise_cv_tokens"] is None and windows and "tokens" not in windows[0]:
        # records written before windows counted tokens: the same windows, from the steps they logged
        record["timing"]["noise_cv_tokens"] = tokens_cv(windows_from_rows(steps))
    return record


def read_steps(steps_csv) -> list[dict]:
    """A run's steps.csv as rows (empty without one)."""
    if not Path(steps_csv).is_file():
        return []
    with open(steps_csv) as f:
        return list(csv.DictReader(f))


def windows_from_steps(steps_csv) -> list[dict]:
    """A run's measured windows (repeat by repeat: device seconds, real tokens) from its steps.csv."""
    return windows_from_rows(read_steps(steps_csv))


def windows_from_rows(steps: list[dict]) -> list[dict]:
    windows: dict = {}
    for row in steps:
        if row.get("phase") == "measure" and row.get("repeat"):
            windows.setdefault(row["repeat"], []).append(row)
    return [{"device_s": sum(float(r["step_time_s"]) for r in rows),
             "tokens": None if any(not r.get("tokens") for r in rows) else sum(float(r["tokens"]) for r in rows)}
            for rows in windows.values()]


def step_trace(rows: list[dict]) -> tuple[str | None, str | None]:
    """A run's per-step losses and real tokens (its steps.csv rows), each as one comma-separated string (a table
    cell); None without steps or where a step has no loss."""
    if not rows or any(not r.get("loss") for r in rows):
        return None, None
    return (",".join(f"{float(r['loss']):.6g}" for r in rows),
            ",".join(str(int(float(r["tokens"]))) if r.get("tokens") else "" for r in rows))


def tokens_cv(windows) -> float | None:
    """Coefficient of variation across repeated windows of real tokens per second: the noise of a tokens/s
    figure. Samples per second can vary where tokens per second do not (rows of a token budget hold 2 or 9
    sequences of the same 4,096 tokens)."""
    rates = [w["tokens"] / w["device_s"] for w in windows if w.get("tokens") is not None and w.get("device_s")]
    return cv(rates) if len(rates) == len(windows) else None


def cv(values) -> float | None:
    """Coefficient of variation (sample stdev / mean) of the values given (None ignored); None for fewer than
    two or a zero mean. The one definition the Meter and the record readers use."""
    values = [v for v in values if v is not None]
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def _num(v):
    return float(v) if v not in (None, "") else None


def upgrade_v1(old: dict, steps: list[dict] | None = None) -> dict:
    """A schema-1 record in schema 2. Schema 1 synchronised the host at every step; its `compile_s` was the
    first step minus the median (now `first_step_overhead_s`); its MFU counted padded tokens and the recompute
    of checkpointing (now HFU; MFU is left empty); its energy was mean power times the window. Where the
    record's steps.csv is beside it, the within-run CV and outlier steps are computed from it."""
    rec = copy.deepcopy(RECORD_TEMPLATE)
    for key in ("status", "reason", "run", "variant", "model", "loss", "extra", "provenance"):
        rec[key] = copy.deepcopy(old.get(key, rec[key]))
    t_old = old.get("timing", {})
    t = rec["timing"]
    for key in ("model_load_s", "first_step_s", "step_time_s", "step_time_p10_s", "step_time_p90_s",
                "steps_measured", "train_s", "eval_s"):
        t[key] = t_old.get(key)
    t["first_step_overhead_s"] = t_old.get("compile_s")
    rec["measure"].update(timer="host_synchronised_per_step (schema 1)", warmup_steps=t_old.get("warmup_steps"),
                          min_steps=t_old.get("steps_measured"), min_seconds=0, repeats=1, truncated=False)
    rec["throughput"].update({k: v for k, v in old.get("throughput", {}).items() if k in rec["throughput"]})
    if t["step_time_s"] and old["run"].get("batch_size"):
        rec["throughput"]["samples_per_hour_median_step"] = 3600 * old["run"]["batch_size"] / t["step_time_s"]
    rec["memory"].update({k: v for k, v in old.get("memory", {}).items() if k in rec["memory"]})
    usage = old.get("device_usage", {})
    rec["device_usage"].update(gpu_util_mean_pct=usage.get("gpu_util_mean_pct"),
                               power_mean_w=usage.get("power_mean_w"), samples=usage.get("samples"))
    if usage.get("energy_per_step_j") is not None:
        rec["energy"].update(source="mean_power_x_window (schema 1)", per_step_j=usage["energy_per_step_j"])
    f_old = old.get("flops", {})
    peak = f_old.get("peak_tflops")
    rec["flops"].update(hardware_per_step=f_old.get("per_step"), hardware_tflops=f_old.get("achieved_tflops"),
                        hfu=f_old.get("mfu"), peak_tflops=peak,
                        peak_precision=("fp8" if old["variant"].get("precision") == "fp8" else "bf16") if peak else None)
    dynamo = (old.get("extra") or {}).get("dynamo") or {}
    rec["compile"].update({k: dynamo.get(k) for k in ("unique_graphs", "graphs_first_step", "recompiles",
                                                       "graph_breaks")})
    rec["data"]["wait_share"] = (old.get("data") or {}).get("wait_share")
    rec["precision"]["requested"] = old["variant"].get("precision")
    rec["extra"]["converted_from_schema"] = 1
    if not steps and t["step_time_s"] and t["step_time_p10_s"] is not None and (t["steps_measured"] or 0) > 1:
        # no per-step times kept: the CV a normal distribution with this p10-p90 spread would have
        estimate = (t["step_time_p90_s"] - t["step_time_p10_s"]) / (2 * 1.2816 * t["step_time_s"])
        t.update(cv_within=estimate, noise_cv=estimate / t["steps_measured"] ** 0.5)
        rec["extra"]["cv_estimated_from"] = "p10-p90 (normal approximation)"
    if steps:
        warm = t_old.get("warmup_steps") or 0
        times = [_num(r["step_time_s"]) for r in steps[warm:] if _num(r.get("step_time_s")) is not None]
        if len(times) > 1:
            within = cv(times)
            t.update(cv_within=within, noise_cv=within / len(times) ** 0.5, step_time_mean_s=statistics.fmean(times),
                     window_s=sum(times))
            median = statistics.median(times)
            out = [{"step": warm + i + 1, "time_s": x, "x_median": x / median, "reasons": ["unknown"]}
                   for i, x in enumerate(times) if x > 3 * median]
            spent = sum(o["time_s"] for o in out)
            rec["outliers"].update(factor=3.0, count=len(out), time_s=spent, time_share=spent / sum(times),
                                   dominated=spent / sum(times) > 0.1, steps=out)
    return rec
