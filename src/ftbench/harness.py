"""The one measurement harness every runner shares: trackers, the run record, provenance, status."""

from __future__ import annotations

import copy
import csv
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

SCHEMA_VERSION = 1
GIB = 1024**3
PACKAGES = ["torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "torchao", "diffusers",
            "datasets", "unsloth", "transformer_engine", "snakemake"]

# Every metrics.json has exactly these keys, whatever its status; a value is None where not measured.
RECORD_TEMPLATE = {
    "schema_version": SCHEMA_VERSION,
    "status": None,  # ok | oom | unsupported | error
    "reason": None,
    "run": {"study": None, "model": None, "scale": None, "dataset": None, "variant": None, "batch_size": None},
    "variant": {},
    "timing": {"model_load_s": None, "first_step_s": None, "step_time_s": None, "step_time_p10_s": None,
               "step_time_p90_s": None, "steps_measured": None, "warmup_steps": None, "train_s": None,
               "compile_s": None, "eval_s": None},
    "throughput": {"samples_per_s": None, "samples_per_hour": None, "tokens_per_s": None,
                   "padded_tokens_per_s": None, "tokens_per_sample": None},
    "memory": {"peak_allocated_gib": None, "peak_reserved_gib": None, "device_peak_used_gib": None,
               "host_peak_rss_gib": None, "at_failure_gib": None},
    "device_usage": {"gpu_util_mean_pct": None, "power_mean_w": None, "energy_per_step_j": None,
                     "samples": None},
    "flops": {"per_step": None, "achieved_tflops": None, "peak_tflops": None, "mfu": None},
    "data": {"wait_share": None},  # share of steady-state step time spent waiting for batches
    "model": {"parameters": None, "trainable_parameters": None, "adapted_modules": None},
    "loss": {"first": None, "last": None, "eval": None},
    "extra": {},
    "provenance": {},
}


class Unsupported(Exception):
    """The variant cannot run on this machine; the message says why (no CUDA, capability, library)."""


def new_record(run: dict, variant: dict) -> dict:
    rec = copy.deepcopy(RECORD_TEMPLATE)
    rec["run"].update(run)
    rec["variant"] = dict(variant)
    return rec


def pick_device() -> torch.device:
    """The current CUDA device if any (honours CUDA_VISIBLE_DEVICES; never assumes GPU 0), else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _nvml_handle(device: torch.device):
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            if str(pynvml.nvmlDeviceGetUUID(h)).replace("GPU-", "") == uuid.replace("GPU-", ""):
                return h
        return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
    except Exception:  # no NVML (CPU machine, driver without it): the NVML figures stay None
        return None


def device_info(device: torch.device) -> dict:
    info = {"type": device.type, "name": platform.processor() or platform.machine(), "capability": None,
            "total_memory_gib": None, "driver": None, "cuda": torch.version.cuda, "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    total_memory_gib=props.total_memory / GIB)
        handle = _nvml_handle(device)
        if handle is not None:
            import pynvml

            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
    return info


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git_commit(base_dir) -> str | None:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=base_dir, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=base_dir,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def provenance(device: torch.device, base_dir, config_hash: str, weights_source: str, data_source: str,
               scale: str) -> dict:
    return {"versions": _versions(), "device": device_info(device), "git_commit": git_commit(base_dir),
            "config_hash": config_hash, "weights_source": weights_source, "data_source": data_source,
            "scale": scale, "host": platform.node(),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


class DeviceSampler:
    """Samples GPU utilisation, power and used memory through NVML in a background thread."""

    def __init__(self, device: torch.device, interval_s: float = 0.1):
        self.handle = _nvml_handle(device)
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float]] = []  # time, util %, power W, used bytes
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.handle is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        import pynvml

        while not self._stop.is_set():
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
                power = pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
                used = pynvml.nvmlDeviceGetMemoryInfo(self.handle).used
                self.samples.append((time.perf_counter(), util, power, used))
            except Exception:
                pass
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def window(self, t0: float, t1: float) -> list:
        return [s for s in self.samples if t0 <= s[0] <= t1]

    def summary(self, t0: float, t1: float, steps: int) -> dict:
        win = self.window(t0, t1)
        if not win:
            return {"gpu_util_mean_pct": None, "power_mean_w": None, "energy_per_step_j": None,
                    "samples": len(win), "device_peak_used_gib": self.peak_used_gib()}
        power = statistics.fmean(s[2] for s in win)
        return {"gpu_util_mean_pct": statistics.fmean(s[1] for s in win), "power_mean_w": power,
                "energy_per_step_j": power * (t1 - t0) / max(steps, 1), "samples": len(win),
                "device_peak_used_gib": self.peak_used_gib()}

    def peak_used_gib(self) -> float | None:
        return max(s[3] for s in self.samples) / GIB if self.samples else None


def memory_now(device: torch.device) -> dict:
    """Allocated, reserved and peak-allocated device memory (GiB); host RSS peak on any machine."""
    out = {"host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}
    if device.type == "cuda":
        out.update(allocated_gib=torch.cuda.memory_allocated(device) / GIB,
                   reserved_gib=torch.cuda.memory_reserved(device) / GIB,
                   peak_allocated_gib=torch.cuda.max_memory_allocated(device) / GIB,
                   peak_reserved_gib=torch.cuda.max_memory_reserved(device) / GIB)
    else:
        out.update(allocated_gib=None, reserved_gib=None, peak_allocated_gib=None, peak_reserved_gib=None)
    return out


class StepClock:
    """Device-synchronised step boundaries. Step i's time runs from the end of step i-1 (or `start`)
    to its own end, so it holds data loading and everything else a training step costs."""

    def __init__(self, device: torch.device, warmup_steps: int):
        self.device = device
        self.warmup_steps = warmup_steps
        self.steps: list[dict] = []
        self.t_start = self._prev = None

    def start(self):
        synchronize(self.device)
        self.t_start = self._prev = time.perf_counter()

    def step_end(self, samples: int, tokens=None, padded_tokens=None, loss=None, flops=None,
                 data_wait_s=None) -> dict:
        """Close a step; `data_wait_s` is the host time the step spent waiting for its batch."""
        synchronize(self.device)
        now = time.perf_counter()
        row = {"step": len(self.steps) + 1, "step_time_s": now - self._prev, "t_end_s": now - self.t_start,
               "samples": samples, "tokens": tokens, "padded_tokens": padded_tokens, "loss": loss, "flops": flops,
               "data_wait_s": data_wait_s}
        self.steps.append(row)
        self._prev = now
        return row

    @property
    def measured(self) -> list[dict]:
        return self.steps[self.warmup_steps:]

    def window(self) -> tuple[float, float]:
        """perf_counter times bounding the measured (steady-state) steps."""
        m = self.measured
        if not m:
            return (0.0, 0.0)
        return (self.t_start + m[0]["t_end_s"] - m[0]["step_time_s"], self.t_start + m[-1]["t_end_s"])

    def summary(self) -> dict:
        m = self.measured
        out = {"first_step_s": self.steps[0]["step_time_s"] if self.steps else None,
               "steps_measured": len(m), "warmup_steps": self.warmup_steps,
               "train_s": self.steps[-1]["t_end_s"] if self.steps else None}
        if not m:
            return out
        times = sorted(r["step_time_s"] for r in m)
        q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else [times[0]] * 9
        total = sum(times)
        out.update(step_time_s=statistics.median(times), step_time_p10_s=q[0], step_time_p90_s=q[-1])
        samples = sum(r["samples"] for r in m)
        thr = {"samples_per_s": samples / total, "samples_per_hour": 3600 * samples / total}
        if all(r["tokens"] is not None for r in m):
            thr["tokens_per_s"] = sum(r["tokens"] for r in m) / total
            thr["tokens_per_sample"] = sum(r["tokens"] for r in m) / samples
        if all(r["padded_tokens"] is not None for r in m):
            thr["padded_tokens_per_s"] = sum(r["padded_tokens"] for r in m) / total
        if all(r["data_wait_s"] is not None for r in m):
            out["data_wait_share"] = sum(r["data_wait_s"] for r in m) / total
        if all(r["flops"] is not None for r in m):
            thr["flops_per_s"] = sum(r["flops"] for r in m) / total
            thr["flops_per_step"] = statistics.fmean(r["flops"] for r in m)
        out["throughput"] = thr
        return out

    def write_csv(self, path):
        write_csv(path, self.steps)


def write_csv(path, rows: list[dict]):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fields = list(rows[0]) if rows else ["step"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


@contextmanager
def timed(out: dict, key: str, device: torch.device):
    synchronize(device)
    t0 = time.perf_counter()
    yield
    synchronize(device)
    out[key] = time.perf_counter() - t0


@contextmanager
def guarded(record: dict, device: torch.device):
    """Turn what a run raises into its status: a failed variant is a result, not a crash."""
    try:
        yield
        record["status"] = "ok"
    except Unsupported as e:
        record.update(status="unsupported", reason=str(e))
    except torch.OutOfMemoryError as e:
        mem = memory_now(device)
        record.update(status="oom", reason=str(e).splitlines()[0][:500])
        record["memory"]["at_failure_gib"] = mem["peak_reserved_gib"]
    except Exception as e:  # noqa: BLE001 — any other failure is recorded with its exception
        record.update(status="error", reason=f"{type(e).__name__}: {e}"[:2000])
        record["extra"]["traceback"] = traceback.format_exc()[-4000:]


def write_record(path, record: dict):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2, default=str))


def memory_log_row(step: int, device: torch.device, **extra) -> dict:
    """One line of the published memory log: allocated, reserved and peak at a step (host RSS too)."""
    mem = memory_now(device)
    return {"step": step, **extra, "allocated_gib": mem["allocated_gib"], "reserved_gib": mem["reserved_gib"],
            "peak_allocated_gib": mem["peak_allocated_gib"], "host_peak_rss_gib": mem["host_peak_rss_gib"]}


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def dynamo_counters(graphs_after_first_step: int) -> dict:
    """Graphs compiled, graph breaks, and recompiles: graphs compiled after the first step, i.e. for shapes
    (or guards) the first step did not see; graph breaks split even the first step into several graphs."""
    from torch._dynamo.utils import counters

    graphs = compiled_graphs()
    return {"unique_graphs": graphs, "graphs_first_step": graphs_after_first_step,
            "recompiles": graphs - graphs_after_first_step, "graph_breaks": sum(counters["graph_break"].values())}


class TimedBatches:
    """Batches from a loader, epoch after epoch; each fetch is timed (the host's wait for data) and marked
    `ftbench.data` for the profiler."""

    def __init__(self, loader):
        self.loader, self._it = loader, iter(loader)

    def next(self) -> tuple[dict, float]:
        t0 = time.perf_counter()
        with torch.profiler.record_function("ftbench.data"):
            try:
                batch = next(self._it)
            except StopIteration:
                self._it = iter(self.loader)
                batch = next(self._it)
        return batch, time.perf_counter() - t0
