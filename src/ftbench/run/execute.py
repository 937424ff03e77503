"""One training job: the run resolved from the rule's params, dispatched to its family's runner in one hop
(the RUNNERS table), measured by the harness's Meter, recorded whatever happens."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path

from ftbench.harness import ranks
from ftbench.config.settings import RunSpec, TrainSettings
from ftbench.core.knobs import Variant
from ftbench.harness.flops import peak_precision, peak_tflops
from ftbench.core.records import COMPILE_CACHE_NOTES, SHARED_GPU, compile_cache_kind, host_change, write_json_first
from ftbench.harness.meter import (Meter, Unsupported, guarded, job_dir, new_record, pick_device, provenance, write_csv,
                      write_record)
from ftbench.harness.summary import summarize

RUNNERS = {"causal_lm": "ftbench.run.runners.causal_lm", "diffusion": "ftbench.run.runners.diffusion",
           "lmm": "ftbench.run.runners.lmm"}


@dataclass
class RunContext:
    """Everything one training job needs, resolved from config by the Snakemake rule's params."""

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


def host_sharing(device) -> list[str]:
    """With no CUDA GPU and `cpu_parallel_jobs` (the Snakefile sets FTBENCH_CPU_THREADS where jobs run side by
    side), compute on that many threads; on a GPU shared by tiny jobs (`tiny_jobs_per_gpu`: the supervisor sets
    FTBENCH_GPU_SHARED), say so. The change, for the record."""
    if device.type == "cuda":
        shared = os.environ.get("FTBENCH_GPU_SHARED")
        return [host_change(f"GPU shared with up to {int(shared) - 1} other job(s): {SHARED_GPU}",
                            "tiny_jobs_per_gpu", "tiny scale, or training.share_gpu (runs whose losses alone matter)")] \
            if shared else []
    threads = os.environ.get("FTBENCH_CPU_THREADS")
    if not threads:
        return []
    import torch

    torch.set_num_threads(int(threads))
    return [host_change(f"{threads} CPU thread(s), jobs side by side", "cpu_parallel_jobs")]


@contextmanager
def compile_cache(v: Variant, record: dict):
    """A compiled run compiles into an empty Inductor cache of its own (FX graphs, AOTAutograd, Triton kernels:
    torch's `temporary_cache_dir`), so its compile time and first step are what a fresh machine pays, as the
    studies timed them, not what an earlier run on this host left behind. FTBENCH_COMPILE_CACHE=warm keeps the
    host's cache. The record says which (`extra.compile_cache`; its Inductor cache hits and misses are in
    `compile`). Under the supervisor the folder lies in the job's own temporary folder, which goes even where the
    child is killed. A cold run that ends leaves what it compiled in the host's cache, so a second, warm run of the
    same cell on this host starts from it (the warm first step)."""
    kind = compile_cache_kind(v.compile)
    if kind:
        record["extra"]["compile_cache"] = COMPILE_CACHE_NOTES[kind]
    if kind != "cold":
        yield
        return
    from torch._inductor.runtime.cache_dir_utils import cache_dir, temporary_cache_dir  # torch 2.11 and 2.13

    host = cache_dir()
    with tempfile.TemporaryDirectory(prefix="inductor-", dir=job_dir()) as folder:
        with temporary_cache_dir(folder):
            yield
        shutil.copytree(folder, host, dirs_exist_ok=True)


def execute(ctx: RunContext, metrics_path, steps_path, memory_path) -> dict:
    """Run one job in this process and write its record, whatever happens: ok, oom, unsupported, error."""
    from ftbench.core.knobs import knob_problems
    from ftbench.build.variants import attention_backend, check_supported, host_variant

    device = pick_device()
    v = ctx.variant
    record = new_record(dataclasses.asdict(ctx.spec), dataclasses.asdict(v))
    record["provenance"] = provenance(device, ctx.base_dir, ctx.config_hash, ctx.manifest.get("weights_source"),
                                      ctx.dataset["source"], ctx.spec.scale)
    record["precision"]["requested"] = v.precision
    record["model"]["gguf"] = ctx.manifest.get("gguf")  # a real model from a GGUF file: package, digest, quantization
    if ctx.dataset["source"] == "python_docs":  # real text: its license, and the Python whose library it came from
        import platform

        from ftbench.data.datasets import PYTHON_DOCS_LICENSE

        record["provenance"].update(data_license=PYTHON_DOCS_LICENSE, data_python=platform.python_version())
    record["data"].update(workers=v.dataloader_workers, persistent_workers=v.dataloader_workers > 0,
                          pin_memory=v.pin_memory)
    family = ctx.manifest.get("family")
    meter = Meter(device, ctx.settings.measure, profiler=ctx.profiler,
                  memory_log_every=ctx.settings.memory_log_every, count_graphs=v.compile is not None,
                  inject=ctx.settings.inject, gc_freeze=v.gc_freeze)
    if ranks.world_size() > 1:  # launched by the supervisor with torchrun (variant knob gpus > 1)
        meter.rule.agree = ranks.agree_max(device)
    with guarded(record, device):
        if ctx.manifest.get("status") == "unsupported":  # refused before building (too large for this host)
            raise Unsupported(f"the model was not materialized: {ctx.manifest.get('reason')}")
        if ctx.manifest.get("status") not in (None, "ok"):  # its materialize job crashed or ran out of time
            raise RuntimeError(f"the model was not materialized: {ctx.manifest['status']}: {ctx.manifest.get('reason')}")
        problems = knob_problems(family, v)
        if problems:
            raise Unsupported(f"the {family} runner does not honour " + "; ".join(problems))
        check_supported(v, device, ctx.manifest)
        ctx.variant, changes = host_variant(v, ctx.settings, device)  # the record's `variant` stays as asked
        changes += host_sharing(device)
        record["extra"]["host_changes"] = changes or None
        record["compile"]["backend"] = ctx.variant.compile_backend if v.compile else None
        runner = importlib.import_module(RUNNERS[family])
        with compile_cache(v, record), meter, (ctx.profiler or nullcontext()), attention_backend(v):
            runner.train(ctx, record, device, meter)
    if record["status"] != "ok":  # a failed rank agrees nothing more with its peers (ftbench.harness.ranks)
        meter.rule.agree = None
    with suppress(Exception):  # a failed run may leave steps open: close them if the device still allows it
        meter.finish()
    if ctx.adapter_dir is not None:
        Path(ctx.adapter_dir).mkdir(parents=True, exist_ok=True)
        (Path(ctx.adapter_dir) / "status.txt").write_text(f"{record['status']} {record['reason'] or ''}\n")
    gemm = record["precision"]["gemm"]
    peak = peak_tflops(record["provenance"]["device"]["name"] if device.type == "cuda" else None, gemm)
    summarize(meter, record, peak, peak_precision(gemm) if peak else None)
    if ranks.world_size() > 1 and record["status"] != "ok":  # it joins no collective; it writes and leaves
        record = ranks.alone(record, v.parallel)
        if not write_json_first(metrics_path, record):  # a peer failed first (this may be its echo): that stands
            return record
        meter.write_steps(steps_path)
        write_csv(memory_path, meter.memory_log)
        return record
    if ranks.world_size() > 1:
        record = ranks.gather(record, v.parallel)
        if ranks.rank() != 0:  # rank 0 writes the job's record, with every rank's figures in it
            return record
    meter.write_steps(steps_path)
    write_csv(memory_path, meter.memory_log)
    write_record(metrics_path, record)  # last: a record on disk means the run's outputs are complete
    return record


def read_manifest(path) -> dict:
    return json.loads(Path(path).read_text())


def context_from_params(params: dict, model_manifest, train_path, eval_path, base_dir, adapter_dir=None,
                        cache_path=None) -> RunContext:
    """The RunContext of one job from what its rule passes in `params.run` (ftbench.config.settings.run_params)."""
    spec = RunSpec(**params["run"])
    return RunContext(spec=spec, variant=Variant.from_config(spec.variant, params["variant"]),
                      settings=TrainSettings(**params["settings"]), manifest=read_manifest(model_manifest),
                      dataset=params["dataset"], train_path=str(train_path), eval_path=str(eval_path),
                      base_dir=str(base_dir), config_hash=params["config_hash"], adapter_dir=adapter_dir,
                      cache_path=cache_path)
