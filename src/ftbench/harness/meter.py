"""The one measurement every runner goes through (Meter: load, warm-up, measured windows, evaluation), with the run's
record, provenance and status; its trackers are ftbench.harness.trackers, its window rule ftbench.harness.windows."""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import os
import platform
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

from ftbench.config.resources import alloc_conf
from ftbench.config.settings import MeasureSettings
from ftbench.harness.gpus import HOST_MEMORY, cpu_name, host_cpu, this_machine
from ftbench.harness.source import code_identity
from ftbench.harness.trackers import (GIB, DeviceSampler, GcClock, PhaseTimes, Progress, StepClock, _nvml,  # noqa: F401
                                      _nvml_handle, compiled_graphs, memory_log_row, memory_now, synchronize)
from ftbench.harness.windows import WindowRule, window_summary
from ftbench.core.records import (RECORD_TEMPLATE, SCHEMA_VERSION, cv, new_record_from_template,  # noqa: F401  (the record's
                      write_json_atomic)  # shape and its writer live with its readers, torch-free)

STEP_COLUMNS = ["step", "phase", "repeat", "step_time_s", "host_step_s", "host_cpu_s", "t_end_s", "samples", "tokens",
                "padded_tokens", "loss", "flops_model", "flops_hardware", "data_wait_s", "gc_pause_s", "gc_full",
                "compiled_graphs", "shape"]  # steps.csv
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


def _scalar(v):
    """A recorded value as a plain number: tensors are read here, after the window's one synchronisation."""
    if isinstance(v, torch.Tensor):
        return v.item()
    return v


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
        self.progress = Progress(inject)
        self.rows, self.windows, self.memory_log = [], [], []  # rows: one a step, filled when its window closes
        self.clock = StepClock(self.cuda)
        self.phases = PhaseTimes(device, self.progress)  # load and evaluation, outside the windows
        self.timing = self.phases.timing
        self.done, self._pending, self._steps = False, [], 0
        self._phase = None  # "warmup" | repeat index
        self._trained = None  # compile time and graph count when training finished
        self.rule = WindowRule(measure)  # when a window closes and measuring stops (several ranks: `rule.agree`)

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

    def load(self):
        return self.phases.timed("model_load_s")

    def eval(self):
        return self.phases.timed("eval_s")

    def start(self):
        """Open the run's first segment (warm-up, or the first window when there is none)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.gc_freeze:  # the model, data and trainer built: their objects never walked again
            self.gc.freeze()
        self._gc_last = self.gc.reading()
        synchronize(self.device)
        self._origin_host = time.perf_counter()
        self._open(self.clock.mark(), self._origin_host, "warmup" if self.measure.warmup_steps else 0)

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
        self._pending.append({"mark": self.clock.mark(), "host": time.perf_counter(), "cpu": time.thread_time(),
                              "row": row, "lazy": lazy})
        self._steps += 1
        self._in_window += 1
        if self.profiler is not None:
            self.profiler.step()
        self.progress.stepped(self._steps, row.get("compiled_graphs"), self._pending[-1]["host"] - self._origin_host)
        if self.rule.closes(self._phase == "warmup", self._in_window, time.perf_counter() - self._host_start):
            self._close()
        if self._steps % self.memory_log_every == 0 or self.done:  # allocator statistics: no synchronisation
            self.memory_log.append(memory_log_row(self._steps, self.device, **(log_fields or {})))
        return self.done

    def _close(self, truncated: bool = False):
        synchronize(self.device)  # the one synchronisation of a window, at its end
        host_end = time.perf_counter()
        energy_end = self.sampler.energy_mj() if self._phase != "warmup" else None
        prev_mark, prev_host, prev_cpu = self._boundary, self._host_start, self._cpu_start
        calibrating = self.rule.too_short(self._phase == "warmup", host_end - self._host_start, truncated)
        warm = self._phase == "warmup" or calibrating
        for p in self._pending:
            row = p["row"]
            row.update(phase="warmup" if warm else "measure", repeat=None if warm else self._phase,
                       step_time_s=self.clock.elapsed_s(prev_mark, p["mark"]), host_step_s=p["host"] - prev_host,
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
        if not calibrating and (nxt >= self.measure.repeats
                                or self.rule.noise_low_enough(self._phase == "warmup", self.windows)):
            self.done = True
        elif self.rule.agree is not None:  # every rank closes the same windows, so every rank agrees here
            self.rule.agree_window(self.rows[-closed:] if self._phase != "warmup" and closed else self.rows[1:])
        self._open(prev_mark, host_end, nxt, prev_cpu)

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
        write_csv(path, self.rows, STEP_COLUMNS)


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


