"""Runners, one per model family, all driven through `execute`, which owns the measurement."""

from __future__ import annotations

import dataclasses
import importlib
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from ..config import RunSpec, TrainSettings, Variant
from ..flops import mfu, peak_tflops
from ..harness import (DeviceSampler, StepClock, compiled_graphs, guarded, memory_log_row,
                       memory_now, new_record, pick_device, provenance, write_csv, write_record)

RUNNERS = {"causal_lm": "ftbench.runners.causal_lm", "diffusion": "ftbench.runners.diffusion",
           "lmm": "ftbench.runners.lmm"}


@dataclass
class RunContext:
    """Everything one training job needs, resolved from config by the Snakemake script."""

    spec: RunSpec
    variant: Variant
    settings: TrainSettings
    manifest: dict
    dataset: dict  # the dataset's config entry (kind, source, ...)
    train_path: str
    eval_path: str
    base_dir: str
    config_hash: str
    profiler: object | None = None  # a torch.profiler.profile stepped once per training step
    adapter_dir: str | None = None  # where to save the trained adapter (for `generate`), if anywhere
    cache_path: str | None = None  # pre-encoded latents and text embeddings (cached-latents variants)


def execute(ctx: RunContext, metrics_path, steps_path, memory_path) -> dict:
    """Run one job in this process and write its record, whatever happens: ok, oom, unsupported, error."""
    device = pick_device()
    record = new_record(dataclasses.asdict(ctx.spec), dataclasses.asdict(ctx.variant))
    record["provenance"] = provenance(device, ctx.base_dir, ctx.config_hash, ctx.manifest["weights_source"],
                                      ctx.dataset["source"], ctx.spec.scale)
    clock = StepClock(device, ctx.settings.warmup_steps)
    memory_log: list[dict] = []
    sampler = DeviceSampler(device)
    with guarded(record, device):
        from ..variants import attention_backend, check_supported

        check_supported(ctx.variant, device)
        runner = importlib.import_module(RUNNERS[ctx.manifest["family"]])
        with sampler, (ctx.profiler or nullcontext()), attention_backend(ctx.variant):
            runner.train(ctx, record, device, clock, memory_log)
    if ctx.adapter_dir is not None:
        Path(ctx.adapter_dir).mkdir(parents=True, exist_ok=True)
        (Path(ctx.adapter_dir) / "status.txt").write_text(f"{record['status']} {record['reason'] or ''}\n")
    summarize(record, clock, sampler, device, ctx.variant.precision)
    write_record(metrics_path, record)
    clock.write_csv(steps_path)
    write_csv(memory_path, memory_log)
    return record


def summarize(record: dict, clock: StepClock, sampler: DeviceSampler, device, precision: str) -> None:
    """Fill the record's timing, throughput, memory, device-usage and MFU fields from the trackers."""
    s = clock.summary()
    thr = s.pop("throughput", {})
    record["data"]["wait_share"] = s.get("data_wait_share")
    for key in record["timing"]:
        if key in s:
            record["timing"][key] = s[key]
    if record["timing"]["first_step_s"] is not None and record["timing"]["step_time_s"] is not None:
        record["timing"]["compile_s"] = record["timing"]["first_step_s"] - record["timing"]["step_time_s"]
    for key in record["throughput"]:
        if key in thr:
            record["throughput"][key] = thr[key]
    mem = memory_now(device)
    for key in ("peak_allocated_gib", "peak_reserved_gib", "host_peak_rss_gib"):
        record["memory"][key] = mem[key]
    usage = sampler.summary(*clock.window(), steps=s["steps_measured"])
    record["memory"]["device_peak_used_gib"] = usage.pop("device_peak_used_gib")
    record["device_usage"].update(usage)
    peak = peak_tflops(record["provenance"]["device"]["name"] if device.type == "cuda" else None, precision)
    flops_per_s = thr.get("flops_per_s")
    record["flops"].update(per_step=thr.get("flops_per_step"), peak_tflops=peak,
                           achieved_tflops=flops_per_s / 1e12 if flops_per_s else None, mfu=mfu(flops_per_s, peak))


def end_step(ctx: RunContext, clock: StepClock, memory_log: list, device, step: int, log_fields=None,
             **fields) -> dict:
    """Close step `step` (0-based): the clock (`fields`), compiled-graph count (compiled variants), the
    profiler's schedule and the memory log (with `log_fields`) every `memory_log_every` steps."""
    row = clock.step_end(**fields)
    if ctx.variant.compile:
        row["compiled_graphs"] = compiled_graphs()
    if ctx.profiler is not None:
        ctx.profiler.step()
    if (step + 1) % ctx.settings.memory_log_every == 0 or step + 1 == ctx.settings.max_steps:
        memory_log.append(memory_log_row(step + 1, device, **(log_fields or {})))
    return row


def read_manifest(path) -> dict:
    return json.loads(Path(path).read_text())


def context_from_config(config: dict, wildcards: dict, model_manifest, train_path, eval_path, base_dir,
                        adapter_dir=None, cache_path=None) -> RunContext:
    """The RunContext of the run a job's wildcards name."""
    from .. import config as ftc

    spec = ftc.find_run(config, **wildcards)
    return RunContext(spec=spec, variant=Variant.from_config(spec.variant, ftc.variant_knobs(config, spec.study,
                                                                                             spec.variant)),
                      settings=ftc.train_settings(config, spec), manifest=read_manifest(model_manifest),
                      dataset=config["datasets"][spec.dataset], train_path=str(train_path),
                      eval_path=str(eval_path), base_dir=str(base_dir),
                      config_hash=ftc.config_hash(ftc.run_config(config, spec)), adapter_dir=adapter_dir,
                      cache_path=cache_path)
