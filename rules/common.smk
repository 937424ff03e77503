import os
import sys
from pathlib import Path

BASE_DIR = Path(workflow.basedir)
# The Snakefile imports the library from src/, and its jobs find it first on their PYTHONPATH: a job script's own
# folder (workflow/scripts, where a link to the library lies, for conda envs too) comes last on its path, behind an
# installed copy of the library or one a PYTHONPATH names, so a Snakefile run from another checkout would import that.
sys.path.insert(0, str(BASE_DIR / "src"))
from ftbench.harness.source import library_first  # noqa: E402

library_first(BASE_DIR / "src")

from ftbench.config import settings as ftc  # noqa: E402
from ftbench.harness.gpus import shares_gpu, visible_gpus  # noqa: E402

# `pick`: a name for the fastest variant of a list that this install can run (config/your_model.yaml), said first
for line in ftc.pick_variants(config):
    print(line, file=sys.stderr)
# the quality study's seeds (quality.seeds, integers): each technique that changes the numbers under each of them
ftc.expand_seeds(config)
# Cross-reference checks that a JSON schema cannot express; a bad config stops here, before any job.
ftc.check_config(config, BASE_DIR)
RUNS = ftc.expand_matrix(config)
# offline by construction: hub access off for every job when no source names the hub (telemetry is always off)
os.environ.update(ftc.offline_env(config))
STUDIES = ftc.active_studies(config)
PROFILED = ftc.profiled_runs(config)
MODEL_FAMILY = {m: ftc.model_family(config, m, BASE_DIR) for m in config["models"]}
# `cpu_parallel_jobs`: run locally on a host with no CUDA GPU, the jobs that would ask for a GPU ask for none,
# so `--cores N` runs N of them at once; each computes on one CPU thread, and its record says so
# (extra.host_changes). Never on a cluster (the jobs' nodes have their own GPUs) nor inside a cluster job.
LOCAL = workflow.local_exec and not workflow.remote_exec
GPUS = visible_gpus()  # once: without CUDA_VISIBLE_DEVICES it asks nvidia-smi
CPU_PARALLEL = bool(config.get("cpu_parallel_jobs") and LOCAL and not GPUS)
if CPU_PARALLEL:
    os.environ.update(FTBENCH_CPU_THREADS="1", OMP_NUM_THREADS="1")
# `fork_server`: run locally with no CUDA GPU, each job's child is forked from a warm server (ftbench.run.forkserver).
# Not on a GPU host (transformers' Trainer initializes CUDA as it imports, and a forked CUDA context is unusable)
# nor on a cluster (each job runs where the scheduler puts it)
if config.get("fork_server") and LOCAL and not GPUS:
    os.environ.update(FTBENCH_FORK_SERVER="1")
# `tiny_jobs_per_gpu`: run locally on a GPU host, training and profiling jobs at tiny scale (smoke tests of the
# code paths, not measurements of the GPU) ask for no `gpu` and share each GPU, up to this many at once (one of
# its slots each, ftbench.harness.gpus); a job at any other scale holds every slot of its GPUs. Records say so.
TINY_SHARE = int(config.get("tiny_jobs_per_gpu", 1)) if LOCAL and GPUS else 1
# read by ftbench.harness.gpus, here and in the jobs
os.environ.update(FTBENCH_GPU_SHARE=str(TINY_SHARE))


def gpus_asked(count, scale=None, losses_only=False):
    """The `gpu` resource a job asks for: none where CPU_PARALLEL holds, or for a tiny job (or one of a study whose
    losses alone matter) sharing its GPU."""
    if CPU_PARALLEL or shares_gpu(count, scale, losses_only):
        return 0
    return count


wildcard_constraints:
    study="|".join(config["studies"]),
    model="|".join(config["models"]),
    dataset="|".join(config["datasets"]),
    variant="|".join(ftc.all_variant_names(config)),
    scale="tiny|proxy|full",
    batch_size=r"\d+",


def model_manifest(model):
    return f"results/models/{model}/{ftc.model_scale(config, model)}/model.json"


def run_inputs(wildcards):
    inputs = {
        "model": model_manifest(wildcards.model),
        "train": f"results/data/{wildcards.dataset}/train.parquet",
        "eval": f"results/data/{wildcards.dataset}/eval.parquet",
    }
    if ftc.variant_knobs(config, wildcards.study, wildcards.variant).get(
        "cached_latents"
    ):
        inputs["cache"] = (
            f"results/cache/{wildcards.model}/{wildcards.scale}/{wildcards.dataset}/latents.pt"
        )
    return inputs


def diffusion_resolution(wildcards):
    """The training resolution of the (first) study that trains this model on this dataset."""
    for spec in RUNS:
        if spec.model == wildcards.model and spec.dataset == wildcards.dataset:
            return ftc.train_settings(config, spec).resolution
    return 512


def run_runtime_min(wildcards):
    """The job's runtime request (minutes; SLURM reads it): its time limit plus room for start-up and records."""
    limit, _ = ftc.run_limits(run_params(wildcards))
    return int((limit or 3600) // 60) + 10


def run_gpus(wildcards):
    """The GPUs a training job asks Snakemake (and SLURM) for: its variant's `gpus` (the job launches its ranks)."""
    params = run_params(wildcards)
    return gpus_asked(
        ftc.run_gpus(params), wildcards.scale, params["settings"].get("share_gpu")
    )


def run_params(wildcards):
    """What one training job needs from config (its hash among it: a changed knob, dataset or model reruns it)."""
    return ftc.run_params(config, ftc.find_run(config, **wildcards))


def study_metrics(wildcards):
    return [f"{s.run_dir}/metrics.json" for s in RUNS if s.study == wildcards.study]


def study_profiles(wildcards):
    return [
        f"results/profiles/{s.key}/summary.json"
        for s in PROFILED
        if s.study == wildcards.study
    ]


# profile summaries measured elsewhere (a merge_runs folder's profiles/), each rendered as a page of its own
# patterns expanded (check_config read their records already)
MERGE_RUNS = ftc.merge_sources(config, check=False)
MERGED_SOURCES = {Path(f).name: f for f in MERGE_RUNS}
# shown on the front page beside the user's runs (shipped_runs)
SHIPPED_RUNS = ftc.shipped_sources(config)


def merged_profile_pages():
    pages = []
    for name, folder in MERGED_SOURCES.items():
        for summary in ftc.merged_profile_summaries(folder):
            key = summary.parent.relative_to(Path(folder) / "profiles")
            if key.parts and key.parts[0] in STUDIES:
                pages.append(f"results/merged_profiles/{name}/{key}/summary.html")
    return pages


def merged_profile_summary(wildcards):
    return f"{MERGED_SOURCES[wildcards.source]}/profiles/{wildcards.study}/{wildcards.key}/summary.json"


def token_stats_inputs(wildcards):
    return [
        f"results/token_stats/{e['dataset']}/{e['model']}.json"
        for e in config.get("token_stats", [])
    ]


def wildcard_model_manifest(wildcards):
    return model_manifest(wildcards.model)


def study_title(wildcards):
    return config["studies"][wildcards.study].get("title", wildcards.study)


def run_env(wildcards):
    """Unsloth patches transformers on import, NeMo AutoModel pins its own and Transformer Engine builds against
    CUDA: own envs."""
    knobs = ftc.variant_knobs(config, wildcards.study, wildcards.variant)
    if knobs.get("framework") == "unsloth":
        return "../envs/unsloth.yaml"
    if knobs.get("framework") == "nemo":  # NeMo AutoModel pins its own transformers
        return "../envs/nemo.yaml"
    if knobs.get("precision") == "fp8" and knobs.get("fp8_backend") == "te":
        return "../envs/te.yaml"
    if MODEL_FAMILY[wildcards.model] == "diffusion":
        return "../envs/diffusion.yaml"
    return "../envs/train.yaml"


def generate_inputs(wildcards):
    run = ftc.RUN_DIR.format(**wildcards)
    return {
        "model": model_manifest(wildcards.model),
        "adapter": f"{run}/adapter",
        "metrics": f"{run}/metrics.json",
        "eval": f"results/data/{wildcards.dataset}/eval.parquet",
    }


def dataset_kind(wildcards):
    return config["datasets"][wildcards.dataset]["kind"]


def generation_settings(wildcards):
    return config["studies"][wildcards.study]["generate"]


def generated(study):
    gen = config["studies"][study].get("generate")
    if not gen:
        return []
    runs = [
        s
        for s in RUNS
        if s.study == study and any(ftc.matches(s, sel) for sel in gen["runs"])
    ]
    return [f"results/generate/{s.key}/answers.html" for s in runs]


def published_file(wildcards):
    name = config["studies"][wildcards.study].get("published")
    return [str(BASE_DIR / "config" / "published" / name)] if name else []


def study_variant_table(wildcards):
    return ftc.study_variants(config, wildcards.study)


def study_variant_pool(wildcards):
    """The study's variants as config writes them (each rung's base and what it adds), for pages' legends."""
    return ftc.variant_pool(config, wildcards.study)


def study_comparisons(wildcards):
    return config["studies"][wildcards.study].get("compare", {})


def quality_verdicts_beside(comparisons):
    """The quality study's verdicts, for a page that shows a ladder or a frontier (speed beside quality)."""
    shows = any(comparisons.get(k) for k in ("ladder", "frontier"))
    return ["results/quality/verdicts.csv"] if QUALITY_STUDY and shows else []


def study_quality_verdicts(wildcards):
    return quality_verdicts_beside(
        config["studies"][wildcards.study].get("compare", {})
    )


def front_quality_verdicts(wildcards):
    """The front page's fastest-LoRA line reads Study B's frontier."""
    return quality_verdicts_beside({"frontier": llm_frontier()})


def coverage_tables():
    """Every study's published tables for the coverage table (ftbench.config.sources.coverage_tables)."""
    return ftc.coverage_tables(config)


def study_pages():
    """Each published table's study letter -> its study's comparison page in the report (active studies only)."""
    return {
        t["table"]
        .removeprefix("study_")
        .upper(): f"results/studies/{t['study']}/comparison.html"
        for t in coverage_tables()
        if t["study"] in STUDIES
    }


def llm_frontier():
    """Study B's frontier (config compare.frontier of the llm study), for the front page's fastest-LoRA line."""
    llm = (config.get("studies") or {}).get("llm") or {}
    return llm.get("compare", {}).get("frontier")


def coverage_published(wildcards):
    return sorted(
        {
            str(BASE_DIR / "config" / "published" / t["published"])
            for t in coverage_tables()
        }
    )


def coverage_runs(wildcards):
    return [f"results/studies/{s}/runs.parquet" for s in STUDIES]


# the quality study (ftbench.judge.quality): the one active study with `quality:` settings, if any
QUALITY_STUDY = next((s for s, d in STUDIES.items() if d.get("quality")), None)


def quality_metrics(wildcards):
    return [f"{s.run_dir}/metrics.json" for s in RUNS if s.study == QUALITY_STUDY]


def quality_answers(wildcards):
    """This run's answers before and after, then those shipped from GPU leases (measurements/*/generate/)."""
    ours = (
        [p.replace(".html", ".json") for p in generated(QUALITY_STUDY)]
        if QUALITY_STUDY
        else []
    )
    return ours + shipped_files(f"generate/{QUALITY_STUDY}/**/answers.json")


def shipped_files(pattern):
    """Files under each shipped measurements folder (config shipped_runs) matching `pattern`, in folder order."""
    return [str(p) for f in SHIPPED_RUNS for p in sorted(Path(f).glob(pattern))]


def fp8_gemm_errors(wildcards):
    """Each shipped FP8 GEMM error check (bench/fp8_gemm_error.py) of a GPU lease."""
    return shipped_files("fp8_gemm_error.json")


def quality_settings(wildcards):
    return config["studies"][QUALITY_STUDY]["quality"]


def quality_variants(wildcards):
    return ftc.study_variants(config, QUALITY_STUDY)


def quality_lineage(wildcards):
    return ftc.study_lineage(config, QUALITY_STUDY)


def quality_pool(wildcards):
    """The quality study's variants as config writes them, for its page's legend."""
    return ftc.variant_pool(config, QUALITY_STUDY)


def quality_title(wildcards):
    return config["studies"][QUALITY_STUDY].get("title", QUALITY_STUDY)


def all_targets():
    targets = [
        f"results/studies/{study}/{name}"
        for study in STUDIES
        for name in (
            "runs.html",
            "step_time.svg",
            "memory.svg",
            "throughput.svg",
            "first_step.svg",
        )
    ]
    targets += [
        f"results/studies/{s}/comparison.html"
        for s, d in STUDIES.items()
        if d.get("compare")
    ]
    targets += [path for study in STUDIES for path in generated(study)]
    targets += [
        f"results/profiles/{s.key}/summary.html" for s in PROFILED if s.study in STUDIES
    ]
    targets += merged_profile_pages()
    if coverage_tables():
        targets.append("results/coverage/coverage.html")
    targets += [model_manifest(m) for m in config.get("materialize", [])]
    if QUALITY_STUDY:
        targets.append("results/quality/quality.html")
    if config.get("token_stats"):
        targets += [
            "results/token_stats/token_stats.html",
            "results/token_stats/token_stats.svg",
        ]
    return targets


def dataset_def(wildcards):
    return config["datasets"][wildcards.dataset]


def model_def(wildcards):
    return config["models"][wildcards.model]


def architecture_file(wildcards):
    """The architecture file, or "" for a local checkpoint or GGUF file (it brings its own config)."""
    if ftc.brings_own_config(config, wildcards.model):
        return ""
    return str(ftc.architecture_path(config, wildcards.model, BASE_DIR))
