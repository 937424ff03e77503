"""Several GPUs in one job: the job's supervisor launches one process per GPU (torchrun), every rank trains and
measures itself, and rank 0 writes the record with the totals over the ranks and each rank's own figures.

The ranks talk twice outside training: once at the end of warm-up, to agree on the window length in steps
(so that every rank stops at the same step), and once at the end, to gather their figures. Neither is inside a
measured window. A rank whose run failed (oom, error) joins neither: its peers may be waiting in one of
training's collectives (FSDP2's all-gathers, DDP's all-reduce) that it will never reach, and a collective of
another kind would hang both until NCCL's watchdog. It writes the job's record itself and leaves with
FAILED_RANK_EXIT; torchrun then stops the other ranks. On a CPU the ranks use gloo, so the whole path runs in the
test suite."""

from __future__ import annotations

import os

import torch


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def distributed():
    """torch.distributed where the ranks' process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def finish() -> None:
    """Take the process group down once a rank's job is done (its record written). Left to the interpreter's
    exit, gloo's threads can abort the process ("terminate called without an active exception", SIGABRT, seen
    once in six CPU runs of the suite on 2026-11-25), and the supervisor then reads a crash instead of the record."""
    dist = distributed()
    if dist is not None:
        dist.destroy_process_group()


FAILED_RANK_EXIT = 3  # a rank's run failed and it wrote the job's record (the supervisor says so beside it)


def alone(record: dict, strategy: str | None) -> dict:
    """A failed rank's record, written without its peers: the `parallel` section names this rank only, and the
    reason says which rank failed (its peers' figures are not gathered: see the module's docstring)."""
    r = rank()
    record["parallel"].update(strategy=strategy, world_size=world_size(), failed_rank=r)
    if not (record["reason"] or "").startswith("rank "):
        record["reason"] = f"rank {r}: {record['reason'] or record['status']}"
    return record


def agree_max(device: torch.device):
    """A function returning the maximum of an int over the ranks (the process group is the trainer's, up by
    the time it is called); the int itself where there is no group."""

    def agree(n: int) -> int:
        dist = distributed()
        if dist is None:
            return n
        t = torch.tensor([n], device=device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    return agree


def gather(record: dict, strategy: str | None) -> dict:
    """Every rank calls this with its own summarized record; rank 0's comes back with the totals over the
    ranks (throughput, FLOPs, energy), MFU/HFU against the peak of all its GPUs, and a `parallel` section:
    strategy, world size, backend, per-GPU throughput, the largest peak allocation, and each rank's figures."""
    dist = distributed()
    if dist is None or dist.get_world_size() < 2:
        return record
    thr, fl, en = record["throughput"], record["flops"], record["energy"]
    device = record["provenance"].get("device") or {}
    mine = {"rank": dist.get_rank(), "launcher": int(os.environ.get("GROUP_RANK", 0)), "status": record["status"],
            "device": device.get("uuid") or device.get("name"),
            "step_time_s": record["timing"]["step_time_s"], "window_s": record["timing"]["window_s"],
            "samples_per_s": thr["samples_per_s"], "tokens_per_s": thr["tokens_per_s"],
            "padded_tokens_per_s": thr["padded_tokens_per_s"], "model_tflops": fl["model_tflops"],
            "hardware_tflops": fl["hardware_tflops"], "energy_window_j": en["window_j"],
            "peak_allocated_gib": record["memory"]["peak_allocated_gib"],
            "peak_reserved_gib": record["memory"]["peak_reserved_gib"],
            "host_peak_rss_gib": record["memory"]["host_peak_rss_gib"],
            "time_to_first_step_s": record["extra"].get("time_to_first_step_s"),
            "build_s": (record["model"].get("build") or {}).get("build_s"),
            # the GPU's own clock under its power limit: cards of one host differ (1,776-1,838 MHz, h100x4-2026-11-26-f)
            "sm_clock_mean_mhz": record["device_usage"].get("sm_clock_mean_mhz"),
            "power_mean_w": record["device_usage"].get("power_mean_w")}
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    n = len(ranks)

    def total(key):
        values = [r[key] for r in ranks]
        return None if None in values else sum(values)

    samples_per_s = total("samples_per_s")
    if samples_per_s is not None:
        thr.update(samples_per_s=samples_per_s, samples_per_hour=3600 * samples_per_s,
                   samples_per_hour_median_step=(thr["samples_per_hour_median_step"] or 0) * n or None)
    for key in ("tokens_per_s", "padded_tokens_per_s"):
        thr[key] = total(key)
    if thr["tokens_per_s"] and samples_per_s:
        thr["tokens_per_sample"] = thr["tokens_per_s"] / samples_per_s
    peak = fl["peak_tflops"]
    for key, ratio in (("model_tflops", "mfu"), ("hardware_tflops", "hfu")):
        fl[key] = total(key)
        fl[ratio] = fl[key] / (peak * n) if fl[key] is not None and peak else None
    energy = total("energy_window_j")
    if energy is not None and samples_per_s:
        window = record["timing"]["window_s"]
        en.update(window_j=energy, per_sample_j=energy / (samples_per_s * window))
        en["per_token_j"] = energy / (thr["tokens_per_s"] * window) if thr["tokens_per_s"] else None
        en["per_step_j"] = energy / record["timing"]["steps_measured"] if record["timing"]["steps_measured"] else None
    peaks = [r["peak_allocated_gib"] for r in ranks if r["peak_allocated_gib"] is not None]
    record["parallel"].update(
        strategy=strategy, world_size=n, backend=dist.get_backend(),
        launchers=int(os.environ.get("GROUP_WORLD_SIZE", 1)),  # torchrun's nodes: launchers joined by rendezvous
        samples_per_s_per_gpu=samples_per_s / n if samples_per_s is not None else None,
        tokens_per_s_per_gpu=thr["tokens_per_s"] / n if thr["tokens_per_s"] is not None else None,
        peak_allocated_gib_max=max(peaks) if peaks else None, per_rank=ranks)
    bad = [r for r in ranks if r["status"] != "ok"]
    if bad and record["status"] == "ok":
        record.update(status=bad[0]["status"], reason=f"rank {bad[0]['rank']}: {bad[0]['status']}")
    return record
