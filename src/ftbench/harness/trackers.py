"""Trackers that each measure one thing beside a run's steps, as context managers or small clocks: the device's
utilisation, power and energy (NVML), the host's and the device's memory, the garbage collector's pauses, the data
loader's waits, the graphs TorchDynamo compiled, and the run's progress as its supervisor reads it."""

from __future__ import annotations

import collections
from contextlib import contextmanager
import gc
import json
import os
import resource
import signal
import statistics
import threading
import time

import torch

from ftbench.harness.ranks import rank

GIB = 1024**3
PROGRESS_EVERY_S = 0.2  # the supervisor's view of the last step reached (ftbench.run.supervise) is at most this old


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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock:
    """A step's end as the device sees it: a CUDA event recorded on the current stream (no synchronisation), or a
    host clock reading on a CPU; the seconds between two such marks are read once the window's events completed."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed_s(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


class PhaseTimes:
    """The seconds of each phase outside the measured windows (model load, evaluation), synchronised at both ends,
    each phase's start and end said to the supervisor through `progress`."""

    def __init__(self, device: torch.device, progress: Progress):
        self.device, self.progress, self.timing = device, progress, {}

    @contextmanager
    def timed(self, key: str):
        self.progress.phase(key)
        synchronize(self.device)
        t0 = time.perf_counter()
        yield
        synchronize(self.device)
        self.timing[key] = time.perf_counter() - t0
        self.progress.phase(f"{key} done")
