"""What a run's job asks of the machine and the scheduler: its time limits, nodes, GPUs and the CUDA allocator's
settings."""

from __future__ import annotations


def run_limits(params: dict) -> tuple[float | None, float | None]:
    """(time limit s, host memory limit GiB) of a run from its params: the variant's time limit over the study's."""
    settings = params["settings"]
    return (params["variant"].get("time_limit_s") or settings.get("time_limit_s"),
            settings.get("host_memory_limit_gib"))


def stall_limit(params: dict) -> float | None:
    """How long a run that has made its first step may go without reporting progress (training.stall_limit_s)."""
    return (params.get("settings") or {}).get("stall_limit_s")


def run_nodes(params: dict) -> int:
    """The torchrun launchers ("nodes") a run's ranks are spread over (its variant's `nodes`)."""
    return int((params.get("variant") or {}).get("nodes") or 1)


def alloc_conf(env) -> str | None:
    """The CUDA allocator settings an environment sets: torch's unified PYTORCH_ALLOC_CONF first, then the older
    PYTORCH_CUDA_ALLOC_CONF (torch reads them in that order)."""
    return env.get("PYTORCH_ALLOC_CONF") or env.get("PYTORCH_CUDA_ALLOC_CONF")


def run_alloc_conf(params: dict, current: str | None) -> str | None:
    """The training process's CUDA allocator settings (PYTORCH_ALLOC_CONF): what the environment sets (`current`,
    `alloc_conf`), with expandable segments where the run's variant asks for them (knob expandable_segments)."""
    if not (params.get("variant") or {}).get("expandable_segments"):
        return current
    kept = [s for s in (current or "").split(",") if s and not s.startswith("expandable_segments:")]
    return ",".join([*kept, "expandable_segments:True"])


def run_gpus(params: dict) -> int:
    """The GPUs a run trains on (its variant's `gpus`): what its job asks Snakemake and SLURM for, and the
    ranks its supervisor starts."""
    return int((params.get("variant") or {}).get("gpus") or 1)
