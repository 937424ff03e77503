"""The one measurement harness every runner shares: trackers, the run record, provenance, status."""

from __future__ import annotations

import collections
import csv
import datetime
import gc
import importlib.metadata
import json
import math
import os
import platform
import resource
import signal
import statistics
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

from ftbench.config.settings import MeasureSettings, alloc_conf
from ftbench.harness.gpus import HOST_MEMORY, cpu_name, host_cpu, this_machine
from ftbench.harness.ranks import rank
from ftbench.harness.source import code_identity
from ftbench.core.records import (RECORD_TEMPLATE, SCHEMA_VERSION, cv, new_record_from_template,  # noqa: F401  (the record's
                      write_json_atomic)  # shape and its writer live with its readers, torch-free)

GIB = 1024**3
PROGRESS_EVERY_S = 0.2  # the supervisor's view of the last step reached (ftbench.run.supervise) is at most this old
PACKAGES = ["torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "torchao", "diffusers",
            "datasets", "unsloth", "transformer_engine", "snakemake", "liger_kernel", "flash_attn_4", "nvidia_cutlass_dsl"]


class Unsupported(Exception):
    """The variant cannot run on this machine; the message says why (no CUDA, capability, library)."""


def new_record(run: dict, variant: dict) -> dict:
    return new_record_from_template(run, variant)


def pick_device() -> torch.device:
    """The current CUDA device if any (honours CUDA_VISIBLE_DEVICES; never assumes GPU 0; a rank launched by
    torchrun takes the GPU of its LOCAL_RANK among those visible), else CPU."""
    if torch.cuda.is_available():
        if "LOCAL_RANK" in os.environ:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
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


def _nvml(fn, *args):
    """One NVML query, None where the driver or the GPU does not support it."""
    try:
        return fn(*args)
    except Exception:
        return None


def device_info(device: torch.device) -> dict:
    info = {"type": device.type, "name": cpu_name(), "capability": None,
            "total_memory_gib": None, "driver": None, "cuda": torch.version.cuda, "cpu_count": os.cpu_count(),
            **host_cpu(), "uuid": None, "sm_clock_max_mhz": None, "mem_clock_max_mhz": None, "sm_clock_at_start_mhz": None,
            "power_limit_w": None, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    total_memory_gib=props.total_memory / GIB, uuid=str(getattr(props, "uuid", "")) or None)
        handle = _nvml_handle(device)
        if handle is not None:
            import pynvml

            limit = _nvml(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            info.update(driver=pynvml.nvmlSystemGetDriverVersion(),
                        uuid=_nvml(pynvml.nvmlDeviceGetUUID, handle) or info["uuid"],
                        sm_clock_max_mhz=_nvml(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
                        mem_clock_max_mhz=_nvml(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
                        sm_clock_at_start_mhz=_nvml(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
                        power_limit_w=limit / 1000 if limit else None)
    return info


def host_memory_dir(prefix: str) -> Path | None:
    """A fresh folder in host memory (/dev/shm) for this job, named after the job's own temporary folder so that
    its supervisor removes it when the job ends, killed or not (supervise.release_host_memory); None where the
    host has no writable /dev/shm."""
    import tempfile

    if not (HOST_MEMORY.is_dir() and os.access(HOST_MEMORY, os.W_OK)):
        return None
    job = job_dir()
    return Path(tempfile.mkdtemp(prefix=f"{job.name}-{prefix}" if job else prefix, dir=HOST_MEMORY))


def job_dir() -> Path | None:
    """The job's own temporary folder under the supervisor (it goes with the job, killed or not); None outside one."""
    progress = os.environ.get("FTBENCH_PROGRESS")
    return Path(progress).parent if progress else None


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def provenance(device: torch.device, base_dir, config_hash: str, weights_source: str, data_source: str,
               scale: str) -> dict:
    return {"versions": _versions(), "device": device_info(device), **code_identity(base_dir),
            "config_hash": config_hash, "weights_source": weights_source, "data_source": data_source,
            "scale": scale, "host": platform.node(), "machine": this_machine(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            # the CUDA caching allocator's settings (expandable segments, ...): where an oom's fragmentation goes
            "cuda_alloc_conf": alloc_conf(os.environ),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


class DeviceSampler:
    """NVML in a background thread: utilisation, power, SM clock, device-wide used memory and this process's
    own used memory, every `interval_s`; the total-energy counter is read at window boundaries (`energy_mj`)."""

    def __init__(self, device: torch.device, interval_s: float = 0.1):
        self.handle = _nvml_handle(device)
        self.interval_s = interval_s
        self.samples: list[tuple] = []  # time, util %, power W, SM clock MHz, used bytes
        self.process_peak_bytes: int | None = None
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.handle is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        import pynvml

        pid = os.getpid()
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu,
                                     pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
                                     pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM),
                                     pynvml.nvmlDeviceGetMemoryInfo(self.handle).used))
                for proc in _nvml(pynvml.nvmlDeviceGetComputeRunningProcesses, self.handle) or []:
                    if proc.pid == pid and proc.usedGpuMemory is not None:
                        self.process_peak_bytes = max(self.process_peak_bytes or 0, proc.usedGpuMemory)
            except Exception:
                pass
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def energy_mj(self) -> int | None:
        """NVML's total-energy counter (mJ since the driver loaded); None without NVML or on GPUs without it."""
        if self.handle is None:
            return None
        import pynvml

        return _nvml(pynvml.nvmlDeviceGetTotalEnergyConsumption, self.handle)

    def summary(self, spans: list[tuple[float, float]]) -> dict:
        """Means over the samples that fall inside the measured windows (perf_counter spans)."""
        win = [s for s in self.samples if any(t0 <= s[0] <= t1 for t0, t1 in spans)]
        out = {"gpu_util_mean_pct": None, "power_mean_w": None, "sm_clock_mean_mhz": None, "samples": len(win)}
        if win:
            out.update(gpu_util_mean_pct=statistics.fmean(s[1] for s in win),
                       power_mean_w=statistics.fmean(s[2] for s in win),
                       sm_clock_mean_mhz=statistics.fmean(s[3] for s in win))
        return out

    def peak_used_gib(self) -> float | None:
        return max(s[4] for s in self.samples) / GIB if self.samples else None


def host_peak_rss_gib() -> float:
    """This process's peak resident host memory so far (GiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def memory_now(device: torch.device) -> dict:
    """Allocated, reserved and peak-allocated device memory (GiB); host RSS peak on any machine."""
    out = {"host_peak_rss_gib": host_peak_rss_gib()}
    if device.type == "cuda":
        out.update(allocated_gib=torch.cuda.memory_allocated(device) / GIB,
                   reserved_gib=torch.cuda.memory_reserved(device) / GIB,
                   peak_allocated_gib=torch.cuda.max_memory_allocated(device) / GIB,
                   peak_reserved_gib=torch.cuda.max_memory_reserved(device) / GIB)
    else:
        out.update(allocated_gib=None, reserved_gib=None, peak_allocated_gib=None, peak_reserved_gib=None)
    return out


def _scalar(v):
    """A recorded value as a plain number: tensors are read here, after the window's one synchronisation."""
    if isinstance(v, torch.Tensor):
        return v.item()
    return v


class Progress:
    """What a run has reached, for its supervisor (ftbench.run.supervise reads the file named by FTBENCH_PROGRESS when
    the process dies): the last step, the compiled graphs and when each step ended on the host's clock (seconds
    from the first step's start; the device's own step times are read only when a window closes, so a run killed
    mid-window keeps these), rewritten at most every PROGRESS_EVERY_S and whenever TorchDynamo finishes a compile;
    and fault injection for tests (`inject`: die by SIGKILL, or hang, at a step, on one rank (`fault_rank`) or all, as a
    crashing run would, the file brought up to date first; or raise at a step, on one rank (`raise_rank`) or all, as a
    run that fails would). Each rank writes its own file (ftbench.run.supervise.rank_progress reads them all)."""

    KEEP_ENDS = 200  # the step ends kept in the file: the first ones (warm-up, first compile) and the last ones

    def __init__(self, inject: dict | None = None):
        path = os.environ.get("FTBENCH_PROGRESS")  # rank r > 0: the supervisor's path + ".rank<r>" (its child sets it)
        self.file = open(path, "w") if path else None
        self.phase_name, self.last = None, (None, None)  # the phase outside steps; the step and graphs last written
        self.inject = dict(inject or {})
        self._at = float("-inf")
        self._on_compiled = None
        # [step, s] pairs: the first KEEP_ENDS / 2, then the latest KEEP_ENDS / 2 (a long run's memory stays bounded)
        self.first_ends: list[list] = []
        self.last_ends: collections.deque = collections.deque(maxlen=self.KEEP_ENDS // 2)

    def watch_compiles(self, step, before: int = 0):
        """While compiling (a run killed in its first step's compile says how far it got): `step()` the step;
        `before`: the process's graphs before this run."""
        if self.file is not None:
            self._on_compiled = lambda *_: self.write(step(), compiled_graphs() - before)
            _compile_end_callbacks("register", self._on_compiled)

    def unwatch(self):
        if self._on_compiled is not None:
            _compile_end_callbacks("remove", self._on_compiled)
            self._on_compiled = None

    def write(self, step: int, graphs: int | None):
        ends = self.first_ends + list(self.last_ends)
        self.file.seek(0)  # ends as [step, seconds] pairs: which steps they are stays plain when the middle is left out
        self.file.write(json.dumps({"step": step or None, "compiled_graphs": graphs, "host_step_ends_s": ends,
                                    "phase": self.phase_name}))
        self.file.truncate()
        self.file.flush()
        self.last = (step, graphs)

    def phase(self, name: str | None) -> None:
        """A phase outside the steps begins or ends (evaluation, the end of training): the file is rewritten, so a
        supervisor watching for a stall sees the run moving (ftbench.run.supervise)."""
        self.phase_name = name
        if self.file is not None:
            self.write(*self.last)

    def stepped(self, step: int, graphs: int | None, end_s: float | None = None):
        """After each step (`end_s`: when it ended, from the first step's start): the file, if due, then any
        fault injected at this step."""
        if end_s is not None:
            full = len(self.first_ends) >= self.KEEP_ENDS // 2
            (self.last_ends if full else self.first_ends).append([step, round(end_s, 3)])
        now = time.perf_counter()
        if self.file is not None and now - self._at >= PROGRESS_EVERY_S:
            self.write(step, graphs)
            self._at = now
        if step == self.inject.get("raise_at_step") and rank() == self.inject.get("raise_rank", rank()):
            if self.file is not None:
                self.write(step, graphs)
            raise RuntimeError(f"injected failure at step {step}")
        if step in (self.inject.get("kill_at_step"), self.inject.get("hang_at_step")) and rank() == self.inject.get(
                "fault_rank", rank()):
            if self.file is not None:
                self.write(step, graphs)
            if self.inject.get("kill_at_step") == step:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(10**6)


class GcClock:
    """Python's garbage collector, timed (gc.callbacks): each collection's pause, summed by the Meter per step. A
    full collection (generation 2) walks every tracked object: gpt-oss-120b's 9,216 expert layers with their 4-bit
    states are ~10^6 objects, a few hundred ms of the training thread in which it launches nothing. `freeze`
    (variant knob gc_freeze) moves the objects alive after load to the permanent generation (gc.freeze, as
    Megatron-LM's and NeMo's manual GC do to the same end), never walked again; `__exit__` unfreezes them."""

    def __init__(self):
        self.pause_s, self.full, self.largest_s = 0.0, 0, 0.0
        self.frozen_objects = None
        self._t0 = None

    def _callback(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            pause, self._t0 = time.perf_counter() - self._t0, None
            self.pause_s += pause
            self.largest_s = max(self.largest_s, pause)
            self.full += info.get("generation") == 2

    def __enter__(self):
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self.frozen_objects is not None:
            gc.unfreeze()

    def freeze(self) -> None:
        gc.collect()
        gc.freeze()
        self.frozen_objects = gc.get_freeze_count()

    def reading(self) -> tuple[float, int]:
        return self.pause_s, self.full


class Meter:
    """The one measurement every runner goes through: model load, warm-up, measured windows, evaluation.

    Each step ends with `step(...)`, which records a CUDA event on the current stream (a host clock reading on
    a CPU) and nothing else: no synchronisation. The host waits for the device only at window boundaries (end
    of warm-up, end of each repeat), where the events of the steps since the last boundary are read. Step i's
    time runs from the event of step i-1 to its own, so it holds data loading and host overhead exactly as
    far as they stall the device. A host wall clock spans each window beside the events."""

    def __init__(self, device: torch.device, measure: MeasureSettings, profiler=None, memory_log_every: int = 10,
                 count_graphs: bool = False, inject: dict | None = None, gc_freeze: bool = False):
        self.device, self.measure, self.profiler = device, measure, profiler
        self.gc, self.gc_freeze = GcClock(), gc_freeze
        self._gc_last = (0.0, 0)
        self.cuda = device.type == "cuda"
        self.memory_log_every, self.count_graphs = memory_log_every, count_graphs
        # graphs this process compiled before the run (tests run several in one process): the run counts its own
        self.graphs_before = compiled_graphs() if count_graphs else 0
        self.sampler = DeviceSampler(device)
        self.rows: list[dict] = []  # one per step, filled when its window closes
        self.windows: list[dict] = []
        self.memory_log: list[dict] = []
        self.timing: dict = {}
        self.done = False
        self._pending: list[dict] = []
        self._phase = None  # "warmup" | repeat index
        self._steps = 0
        self.progress = Progress(inject)
        self._trained = None  # compile time and graph count when training finished
        # several ranks: a function that returns the maximum of an int over the ranks (one collective). The
        # window length in steps is agreed with it once, at the end of warm-up, so that every rank closes its
        # windows and stops at the same step (a rank that stopped alone would leave the others waiting)
        self.agree = None
        self._window_steps = None

    def __enter__(self):
        self.sampler.__enter__()
        self.gc.__enter__()
        if self.count_graphs:
            self.progress.watch_compiles(lambda: self._steps, self.graphs_before)
        return self

    def __exit__(self, *exc):
        self.progress.unwatch()
        self.gc.__exit__(*exc)
        self.sampler.__exit__(*exc)

    def _mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _elapsed_s(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    @contextmanager
    def timed(self, key: str):
        """Time a phase outside the measured windows (load, evaluation), synchronised at both ends."""
        self.progress.phase(key)
        synchronize(self.device)
        t0 = time.perf_counter()
        yield
        synchronize(self.device)
        self.timing[key] = time.perf_counter() - t0
        self.progress.phase(f"{key} done")

    def load(self):
        return self.timed("model_load_s")

    def eval(self):
        return self.timed("eval_s")

    def start(self):
        """Open the run's first segment (warm-up, or the first window when there is none)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.gc_freeze:  # the model, data and trainer built: their objects never walked again
            self.gc.freeze()
        self._gc_last = self.gc.reading()
        synchronize(self.device)
        self._origin_host = time.perf_counter()
        self._open(self._mark(), self._origin_host, "warmup" if self.measure.warmup_steps else 0)

    def _open(self, mark, host: float, phase, cpu: float | None = None):
        self._boundary, self._host_start, self._phase = mark, host, phase
        # the training thread's CPU time (its Python and kernel launches; loader workers are other processes)
        self._cpu_start = time.thread_time() if cpu is None else cpu
        self._energy_start = self.sampler.energy_mj() if phase != "warmup" else None
        self._in_window = 0

    def step(self, samples: int, *, lazy=None, log_fields: dict | None = None, **fields) -> bool:
        """Close a training step; `fields` (tokens, loss, flops, shape, ...) may hold tensors, and `lazy` a
        function returning more fields: both are read when the window closes. Returns True once the last
        window has closed (the caller stops training)."""
        row = {"step": self._steps + 1, "samples": samples, **fields}
        gc_now = self.gc.reading()  # the garbage collector's pauses in this step (host time, no device read)
        row.update(gc_pause_s=gc_now[0] - self._gc_last[0], gc_full=gc_now[1] - self._gc_last[1])
        self._gc_last = gc_now
        if self.count_graphs:
            row["compiled_graphs"] = compiled_graphs() - self.graphs_before
        self._pending.append({"mark": self._mark(), "host": time.perf_counter(), "cpu": time.thread_time(),
                              "row": row, "lazy": lazy})
        self._steps += 1
        self._in_window += 1
        if self.profiler is not None:
            self.profiler.step()
        self.progress.stepped(self._steps, row.get("compiled_graphs"), self._pending[-1]["host"] - self._origin_host)
        m = self.measure
        if self._phase == "warmup":
            if self._in_window >= m.warmup_steps:
                self._close()
        elif self.agree is not None:  # several ranks: windows by steps only (agreed after warm-up)
            if self._in_window >= (self._window_steps or m.steps):
                self._close()
        elif (self._in_window >= m.steps and time.perf_counter() - self._host_start >= m.min_seconds) \
                or self._in_window >= m.window_cap:
            self._close()
        if self._steps % self.memory_log_every == 0 or self.done:  # allocator statistics: no synchronisation
            self.memory_log.append(memory_log_row(self._steps, self.device, **(log_fields or {})))
        return self.done

    def _close(self, truncated: bool = False):
        synchronize(self.device)  # the one synchronisation of a window, at its end
        host_end = time.perf_counter()
        energy_end = self.sampler.energy_mj() if self._phase != "warmup" else None
        prev_mark, prev_host, prev_cpu = self._boundary, self._host_start, self._cpu_start
        calibrating = self._too_short(host_end, truncated)
        warm = self._phase == "warmup" or calibrating
        for p in self._pending:
            row = p["row"]
            row.update(phase="warmup" if warm else "measure", repeat=None if warm else self._phase,
                       step_time_s=self._elapsed_s(prev_mark, p["mark"]), host_step_s=p["host"] - prev_host,
                       host_cpu_s=p["cpu"] - prev_cpu, t_end_s=p["host"] - self._origin_host)
            for k, v in list(row.items()):
                row[k] = _scalar(v)
            if p["lazy"] is not None:
                row.update({k: _scalar(v) for k, v in p["lazy"]().items()})
            prev_mark, prev_host, prev_cpu = p["mark"], p["host"], p["cpu"]
            self.rows.append(row)
        if not warm and self._pending:
            energy_j = (energy_end - self._energy_start) / 1e3 if None not in (energy_end, self._energy_start) else None
            self.windows.append(window_summary(self.rows[-len(self._pending):], self._phase,
                                               (self._host_start, host_end), energy_j, truncated))
        closed = len(self._pending)
        self._pending = []
        nxt = self._phase if calibrating else 0 if self._phase == "warmup" else self._phase + 1
        if not calibrating and (nxt >= self.measure.repeats or self._noise_low_enough()):
            self.done = True
        elif self.agree is not None:  # every rank closes the same windows, so every rank agrees here
            self._agree_window(self.rows[-closed:] if self._phase != "warmup" and closed else self.rows[1:])
        self._open(prev_mark, host_end, nxt, prev_cpu)

    calibrated = 0  # several ranks: measured windows found shorter than min_seconds and counted as warm-up instead
    MAX_CALIBRATIONS = 3

    def _too_short(self, host_end: float, truncated: bool) -> bool:
        """Several ranks close windows by agreed step counts, sized from the steps before them: after warm-up steps
        slower than a measured step (compiling, capturing CUDA graphs) a window can end before `min_seconds`
        (8 steps in 3.3 s of a 20-s minimum on 2 H100s, 2026-11-27), and with `cv_target` such a window was half
        the measurement. A window shorter than `min_seconds` on any rank (one collective: the maximum) is warm-up
        instead, and the next is agreed from its steps; at most MAX_CALIBRATIONS times a run."""
        m = self.measure
        if (self.agree is None or self._phase == "warmup" or truncated or not m.min_seconds
                or self.calibrated >= self.MAX_CALIBRATIONS):
            return False
        short = self.agree(1 if host_end - self._host_start < m.min_seconds else 0) > 0
        self.calibrated += short
        return short

    stopped_early = None  # with cv_target: {"cv_target", "cv", "windows"} where the windows' noise ended them

    def _noise_low_enough(self) -> bool:
        """With `cv_target`, after `min_repeats` (at least two) measured windows: whether the coefficient of
        variation of their throughputs (real tokens/s where the steps count tokens, else samples/s) is at most the
        target. Several ranks decide together (one collective: any rank above the target keeps every rank going),
        so that all stop at the same step."""
        m = self.measure
        if not m.cv_target or self._phase == "warmup" or len(self.windows) < max(2, m.min_repeats):
            return False
        rates = [w["tokens"] / w["device_s"] if w["tokens"] and w["device_s"] else w["samples_per_s"]
                 for w in self.windows]
        spread = cv(rates)
        low = spread is not None and spread <= m.cv_target
        if self.agree is not None:
            low = self.agree(0 if low else 1) == 0
        if low:
            self.stopped_early = {"cv_target": m.cv_target, "cv": spread, "windows": len(self.windows)}
        return low

    def _agree_window(self, rows: list[dict]) -> None:
        """Several ranks: the steps the next window takes, the same on every rank: the window's minimum steps, or
        more where the median step of `rows` says `min_seconds` needs more; the maximum over ranks. Agreed after
        warm-up (its first step left out) and again after each window from that window's steps: warm-up steps
        that meet new shapes can be several times a measured step (Qwen3-8B japanese_alpaca over 2 H100s: 2.3 s
        against 0.5 s), which sized every window at a quarter of `min_seconds` when agreed once."""
        m = self.measure
        times = [r["step_time_s"] for r in rows or self.rows]
        need = m.steps
        if m.min_seconds and times and statistics.median(times) > 0:
            need = max(need, math.ceil(m.min_seconds / statistics.median(times)))
        self._window_steps = min(self.agree(need), m.window_cap)

    def finish(self):
        """Close what is open when training ended early (data or step budget exhausted: truncated)."""
        self.progress.phase("trained")
        if self._pending:
            self._close(truncated=self._phase != "warmup")
        if self._steps and (not self.memory_log or self.memory_log[-1]["step"] != self._steps):
            self.memory_log.append(memory_log_row(self._steps, self.device))
        if self.count_graphs and self._trained is None:  # training's own compilation, before any evaluation
            from torch._dynamo.utils import calculate_time_spent

            self._trained = (dict(calculate_time_spent()), compiled_graphs() - self.graphs_before)

    @property
    def steps_taken(self) -> int:
        return self._steps

    @property
    def measured(self) -> list[dict]:
        return [r for r in self.rows if r["phase"] == "measure"]

    @property
    def trained_compile(self):
        """TorchDynamo/Inductor's time accounting and graph count when training finished (None before)."""
        return self._trained

    def write_steps(self, path):
        write_csv(path, self.rows, ["step", "phase", "repeat", "step_time_s", "host_step_s", "host_cpu_s", "t_end_s", "samples",
                                    "tokens", "padded_tokens", "loss", "flops_model", "flops_hardware",
                                    "data_wait_s", "gc_pause_s", "gc_full", "compiled_graphs", "shape"])


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


def write_csv(path, rows: list[dict], fields: list[str] | None = None):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fields = list(fields or (rows[0] if rows else ["step"]))
    for r in rows:  # a runner's extra per-step fields go after the known ones
        fields += [k for k in r if k not in fields]
    tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}")  # whole or absent: two failed ranks may both
    with open(tmp, "w", newline="") as f:                            # write a job's files (ftbench.harness.ranks)
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


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
        record.update(status="error", reason=error_reason(e)[:2000])
        record["extra"]["traceback"] = traceback.format_exc()[-4000:]


def error_reason(e: BaseException) -> str:
    """An exception as a record's reason: its type and message, and where one without a message was raised (the
    innermost two frames: "StopIteration (no message) in dict_keys_getitem (_dynamo/utils.py:2885), called from
    GptOssTopKRouter_forward (unsloth_compiled_cache/unsloth_compiled_module_gpt_oss.py:265)")."""
    if str(e):
        return f"{type(e).__name__}: {e}"
    frames = traceback.extract_tb(e.__traceback__)[-2:][::-1]
    where = ", called from ".join(f"{f.name} ({'/'.join(Path(f.filename).parts[-2:])}:{f.lineno})" for f in frames)
    return f"{type(e).__name__} (no message)" + (f" in {where}" if where else "")


def write_record(path, record: dict):
    write_json_atomic(path, record)


def memory_log_row(step: int, device: torch.device, **extra) -> dict:
    """One line of the published memory log: allocated, reserved and peak at a step (host RSS too)."""
    mem = memory_now(device)
    return {"step": step, **extra, "allocated_gib": mem["allocated_gib"], "reserved_gib": mem["reserved_gib"],
            "peak_allocated_gib": mem["peak_allocated_gib"], "host_peak_rss_gib": mem["host_peak_rss_gib"]}


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _compile_end_callbacks(action: str, fn) -> None:
    """Register (or remove) `fn` to run each time TorchDynamo finishes compiling (a torch without the hook: no-op)."""
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:
        return
    getattr(callback_handler, f"{action}_end_callback")(fn)


class TimedBatches:
    """Batches from a loader, epoch after epoch; each fetch is timed (the host's wait for data) and marked
    `ftbench.data.datasets` for the profiler."""

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
