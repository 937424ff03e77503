"""One GPU per job on a host with several: a job takes the first free GPU slots by locking one file per
slot, and its child process sees only those GPUs (CUDA_VISIBLE_DEVICES). Snakemake itself assigns no GPU
ids to local jobs, so without this two jobs on a 2-GPU box would train on the same GPU. The locks are
released when the job's process ends, however it ends (flock)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HOST_MEMORY = Path("/dev/shm")  # a tmpfs: files there live in the host's memory


def host_gpu_uuids() -> list[str]:
    """The UUID of every GPU of this host, whatever CUDA_VISIBLE_DEVICES hides from this process (nvidia-smi lists
    them all); [] on a machine without."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except Exception:  # best effort, as `describe`: a failed job's record is written whatever this finds
        return []
    return [line.strip() for line in out.splitlines() if line.strip().startswith("GPU-")]


def machine_of(hostname: str | None, gpu_uuids) -> str | None:
    """A machine's name in the records: its host name and a digest of its GPUs' UUIDs, so that two lent machines
    of one kind (both named "vm", four H200s each) differ by their cards and the GPUs of one host share it; the host
    name alone on a machine without GPUs. A ratio divides runs of one machine (ftbench.judge.coverage)."""
    cards = sorted(str(u).removeprefix("GPU-") for u in gpu_uuids or [] if u)
    if not cards:
        return hostname or None
    return f"{hostname or '?'}/{hashlib.sha256(','.join(cards).encode()).hexdigest()[:8]}"


def folder_machines(folder: Path) -> dict[str, str]:
    """The machine (`ftbench.harness.gpus.machine_of`) of a folder's records that name none (records before 2026-11-27):
    GPU UUID -> machine from a campaign's calls (campaign.json: each call names its host and GPUs; a campaign split
    over leases ran on several machines), and under "" the folder itself, one lease of measurements/ being one
    machine."""
    try:
        calls = json.loads((folder / "campaign.json").read_text()).get("calls") or []
    except (OSError, ValueError):
        calls = []
    return {"": f"lease {folder.resolve().name}", **calls_machines(calls)}


def calls_machines(calls: list[dict]) -> dict[str, str]:
    """GPU UUID (without "GPU-") -> the machine of the campaign call that listed it (each call names its host and
    GPUs)."""
    return {str(u).removeprefix("GPU-"): machine_of(c.get("hostname"), c.get("gpu_uuids"))
            for c in calls for u in c.get("gpu_uuids") or [] if u}


def machine_named(machine: str | None, gpu_uuid, named: dict[str, str]) -> str | None:
    """A record's machine: the one it names (provenance.machine), else the one `named` (`calls_machines`,
    `folder_machines`) gives its GPU."""
    return machine or named.get(str(gpu_uuid).removeprefix("GPU-"))


def this_machine() -> str | None:
    """This machine's name (`machine_of`), as its records give it (provenance.machine)."""
    return machine_of(platform.node(), host_gpu_uuids())


def visible_gpus() -> list[str]:
    """The GPUs this job may use: CUDA_VISIBLE_DEVICES as given (a scheduler's choice, e.g. SLURM's), else
    every GPU nvidia-smi lists; FTBENCH_GPU_IDS overrides both (tests, unusual hosts)."""
    for var in ("FTBENCH_GPU_IDS", "CUDA_VISIBLE_DEVICES"):
        if os.environ.get(var) not in (None, ""):
            return [g.strip() for g in os.environ[var].split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def lock_dir() -> Path:
    path = Path(os.environ.get("FTBENCH_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / "ftbench-gpu-locks"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def share() -> int:
    """Slots per GPU (FTBENCH_GPU_SHARE, set by the Snakefile from `tiny_jobs_per_gpu`; 1: a job holds a GPU)."""
    return max(1, int(os.environ.get("FTBENCH_GPU_SHARE") or 1))


def shares_gpu(count: int, scale: str | None, losses_only: bool = False) -> bool:
    """Whether a job takes one slot of a shared GPU instead of whole GPUs: one GPU, tiny scale or a study whose runs
    only their losses matter (training.share_gpu: the quality study), on a host whose GPUs are shared
    (`tiny_jobs_per_gpu` above 1). Snakemake then asks no `gpu` resource for it."""
    return count == 1 and (scale == "tiny" or bool(losses_only)) and share() > 1


def _slot_names(gpu: str, n: int) -> list[str]:
    return [f"gpu-{gpu}"] + [f"gpu-{gpu}.{k}" for k in range(1, n)]


def _try_lock(name: str):
    """The open, locked file of lock `name`, or None where another job holds it."""
    f = open(lock_dir() / f"{name}.lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def _release(files) -> None:
    for f in files:
        fcntl.flock(f, fcntl.LOCK_UN)
        f.close()


@contextmanager
def gpu_slots(count: int, shared: bool = False, wait_s: float = 3600.0, poll_s: float = 0.5):
    """Hold `count` GPUs for the duration of the block; yields their ids (empty on a machine without GPUs,
    where nothing is locked). Each GPU has `share()` slot locks: a job holds every slot of its GPUs, a `shared`
    job (one GPU, tiny scale) one slot of one GPU, beside up to share() - 1 others. Waits for slots held by other
    jobs, up to `wait_s`."""
    gpus = visible_gpus()
    if not gpus or count <= 0:
        yield []
        return
    if os.environ.get("SLURM_JOB_ID") and "FTBENCH_GPU_IDS" not in os.environ:
        yield gpus[:count]  # the cluster's scheduler gave this job its own GPUs already (and renumbers them)
        return
    if count > len(gpus):
        raise RuntimeError(f"the job asks for {count} GPUs; this host shows {len(gpus)}: {gpus}")
    n, deadline = share(), time.monotonic() + wait_s
    held, gates = {}, {}  # lock name -> (gpu, open file); gpu -> open gate file

    def gated(gpu) -> bool:  # a job waiting to hold this whole GPU: tiny jobs take none of its slots meanwhile
        f = _try_lock(f"gpu-{gpu}.gate")
        _release([f] if f else [])
        return f is None

    try:
        while True:
            if shared:
                for gpu in (g for g in gpus if not gated(g)):
                    name, f = next(((m, f) for m in _slot_names(gpu, n) if (f := _try_lock(m))), (None, None))
                    if f:
                        held[name] = (gpu, f)
                        break
                if held:
                    break
            else:
                # a whole GPU: first the gates of `count` GPUs (all or none, so two such jobs never hold one gate
                # each of the same pair), then every slot of each, kept as they free up (no starving behind tiny jobs)
                for gpu in gpus if not gates else ():
                    if len(gates) < count and (f := _try_lock(f"gpu-{gpu}.gate")):
                        gates[gpu] = f
                if len(gates) < count:
                    _release(gates.values())
                    gates = {}
                for gpu in gates:
                    for name in _slot_names(gpu, n):
                        if name not in held and (f := _try_lock(name)):
                            held[name] = (gpu, f)
                if gates and len(held) == count * n:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {count} free GPU slot(s) among {gpus} after {wait_s:g} s")
            time.sleep(poll_s)
        yield list(dict.fromkeys(g for g, _ in held.values()))
    finally:
        _release([f for _, f in held.values()] + list(gates.values()))


def cpu_name() -> str:
    """The host processor's name as records give it for a CPU run (`uname -p`, else the machine type)."""
    import platform

    try:
        return platform.processor() or platform.machine()  # `uname -p` runs in a subprocess
    except Exception:
        return platform.machine()


def host_cpu() -> dict:
    """The host's processor model (/proc/cpuinfo's model name, else cpu_name) and its load now (the 1-minute load
    average, in busy logical CPUs): what tells two hosts with the same GPU apart where a step waits on the host, and
    whether neighbours shared the host's CPUs."""
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpu_model": model or cpu_name(), "load_avg_1m": load}


def describe(slots: list[str]) -> dict:
    """The device a job held, named the way the child's own record names it (harness.device_info), for a
    record the supervisor writes in its place (crash, timeout): nvidia-smi on the job's first slot, else the
    host's processor."""
    info = {"type": "cpu", "name": cpu_name(), "total_memory_gib": None,
            "driver": None, "uuid": None, "cpu_count": os.cpu_count(), **host_cpu(),
            "visible_devices": ",".join(slots) or None}
    if not slots:
        return info
    try:
        out = subprocess.run(["nvidia-smi", f"--id={slots[0]}", "--query-gpu=name,uuid,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
        name, uuid, total_mib, driver = [x.strip() for x in out.strip().splitlines()[0].split(",")]
        info.update(type="cuda", name=name, uuid=uuid, total_memory_gib=float(total_mib) / 1024, driver=driver)
    except Exception:  # best effort: a record without its device's name is still a record
        pass
    return info
