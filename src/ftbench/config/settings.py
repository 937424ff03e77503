"""Config: the run matrix, variant knobs and the checks a schema cannot express."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ftbench.config.inputs import (DATA_SUFFIXES, REQUIRED_COLUMNS, check_columns, check_dataset_source,  # noqa: F401
                     check_gguf_source, check_records, local_path_like)
from ftbench.core.knobs import ConfigError, Variant, knob_problems  # noqa: F401  (re-exported: the names callers use)
from ftbench.config.pool import (all_variant_names, all_variants, expand_seeds, pick_variants, study_lineage, study_variants,  # noqa: F401
                   variant_knobs, variant_pool)  # (re-exported: ftbench.config.settings is where callers find them)
from ftbench.config.resources import (alloc_conf, run_alloc_conf, run_gpus, run_limits, run_nodes,  # noqa: F401
                                      stall_limit)  # (re-exported: the names callers use)
from ftbench.config.sources import (brings_own_config, campaign_of, campaign_owners, checkpoint_family,  # noqa: F401
                                    coverage_tables, expand_sources, local_checkpoint, merge_sources,
                                    merged_profile_summaries, shipped_sources)  # (re-exported: the names callers use)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # models, datasets, variants, studies: path- and regex-safe
RUN_KEY = "{study}/{model}/{scale}/{dataset}/{variant}/bs{batch_size}"
RUN_DIR = "results/runs/" + RUN_KEY


@dataclass(frozen=True)
class RunSpec:
    """One training job: the identity of a run and everything it needs to know."""

    study: str
    model: str
    scale: str
    dataset: str
    variant: str
    batch_size: int

    @property
    def key(self) -> str:
        """The run's path below results/runs, results/profiles and results/generate."""
        return RUN_KEY.format(**dataclasses.asdict(self))

    @property
    def run_dir(self) -> str:
        return f"results/runs/{self.key}"

    @property
    def wildcards(self) -> dict:
        return {k: str(v) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class MeasureSettings:
    """The measured window: warm-up steps first, then `repeats` windows, each closing once it holds at least
    `steps` steps and `min_seconds` of wall time (at most `max_window_steps` steps). `cv_target`: stop before
    `repeats` once at least `min_repeats` windows agree, their throughputs' coefficient of variation at most this
    (a campaign's windows end when their noise is low enough; `repeats` stays the most it takes)."""

    warmup_steps: int = 2
    steps: int = 3
    min_seconds: float = 0.0
    repeats: int = 1
    max_window_steps: int | None = None  # default: `steps`, or 20x `steps` when min_seconds extends a window
    outlier_factor: float = 3.0  # a step slower than this many medians is an outlier
    cv_target: float | None = None  # None: always `repeats` windows
    min_repeats: int = 2

    @property
    def window_cap(self) -> int:
        if self.max_window_steps:
            return max(self.steps, self.max_window_steps)
        return self.steps * 20 if self.min_seconds else self.steps

    @property
    def max_steps(self) -> int:
        """The most training steps a run can take (a Trainer needs it up front)."""
        return self.warmup_steps + self.repeats * self.window_cap


@dataclass
class TrainSettings:
    """Everything a runner needs besides the model, data and variant, resolved from config."""

    measure: MeasureSettings = None  # the measured window
    max_seq_length: int = 2048
    resolution: int = 512  # diffusion: training image size
    fixed_length: int = 2048  # shape_policy fixed: every sequence padded to this length
    bucket_multiple: int = 256  # shape_policy bucketed: sequences padded up to a multiple of this
    learning_rate: float = 2e-4
    max_grad_norm: float = 0.3
    gradient_accumulation_steps: int = 1
    logging_steps: int = 1
    memory_log_every: int = 10
    # the held-out loss every this many optimizer steps, and before the first and after the last (None: only the
    # trainer's evaluation at the end): the quality study's curve (ftbench.data.heldout, ftbench.judge.quality)
    held_out_every_steps: int | None = None
    held_out_last_steps: int = 0  # ... and after each of the last this many: a short run read a step apart from them
    # the study's jobs share each GPU as tiny ones do (tiny_jobs_per_gpu slots): runs whose losses alone matter
    # (the quality study), never runs whose speed is measured; their records say the GPU was shared
    share_gpu: bool = False
    profile_active_steps: int | None = None  # profiled steps of a profile job (None: ftbench.run.profiling.SCHEDULE's 3)
    seed: int = 42
    lora: dict = field(default_factory=dict)
    optim: str = "adamw_torch"
    time_limit_s: float | None = None  # a run still going after this long is killed: a `timeout` record
    host_memory_limit_gib: float | None = None  # a run whose processes hold more is killed: a `crashed` record
    # a run that has stepped and then reports no progress for this long is killed: a `timeout` record naming each
    # rank's last step (ftbench.run.supervise)
    stall_limit_s: float | None = None
    cpu_precision: str | None = None  # no CUDA GPU: bf16/fp16 compute (and nf4's dequantization) in this instead
    cpu_compile_backend: str | None = None  # no CUDA GPU: compiled variants use this torch.compile backend instead
    # fault injection for tests: {kill_at_step: N}, {hang_at_step: N} (with fault_rank: R, on that rank alone),
    # {raise_at_step: N[, raise_rank: R]}
    inject: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.measure is None:
            self.measure = MeasureSettings()
        elif isinstance(self.measure, dict):
            self.measure = MeasureSettings(**self.measure)

    @property
    def max_steps(self) -> int:
        return self.measure.max_steps


def load_yaml(path) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def model_scale(config: dict, model: str) -> str:
    """A model's scale; a local checkpoint or GGUF file trains at its own size, which the run records as `full`."""
    if brings_own_config(config, model):
        return "full"
    return config["models"][model].get("scale", config["scale"])


def active_studies(config: dict) -> dict:
    """The studies this config runs: all, or those `only_studies` names (a --configfile merges over the
    default config, so a full reproduction selects its studies this way)."""
    only = config.get("only_studies") or list(config["studies"])
    return {name: config["studies"][name] for name in only}


def expand_matrix(config: dict) -> list[RunSpec]:
    """Every run of every active study: the union over each study's matrix blocks of their products."""
    runs = []
    for study, sdef in active_studies(config).items():
        for block in sdef["matrix"]:
            for model, dataset, variant, bs in itertools.product(
                block["models"], block["datasets"], block["variants"], block["batch_sizes"]
            ):
                spec = RunSpec(study, model, model_scale(config, model), dataset, variant, int(bs))
                if spec not in runs:
                    runs.append(spec)
    return runs


def find_run(config: dict, **wildcards) -> RunSpec:
    for spec in expand_matrix(config):
        if spec.wildcards == {k: str(v) for k, v in wildcards.items() if k in spec.wildcards}:
            return spec
    raise ConfigError(f"no run in the config matrix matches {wildcards}")


def architecture_path(config: dict, model: str, base_dir) -> Path:
    return Path(base_dir) / "config" / "architectures" / config["models"][model]["architecture"]


def check_names(config: dict) -> None:
    """Names become folders, file names and wildcard patterns: one safe pattern for all of them."""
    pools = {"studies": config["studies"], "models": config["models"], "datasets": config["datasets"],
             "variants": config.get("variants", {})}
    pools.update({f"studies.{s}.variants": d.get("variants") or {} for s, d in config["studies"].items()})
    for where, pool in pools.items():
        for name in pool:
            if not NAME.match(str(name)):
                raise ConfigError(f"{where}: name {name!r} is not allowed: use letters, digits, '.', '_' and '-', "
                                  "starting with a letter or digit")


ARCHITECTURE_SCHEMA = Path(__file__).resolve().parents[3] / "config" / "schema" / "architecture.schema.yaml"
SMALL_SCALES = ("tiny", "proxy")


def check_architecture(path) -> dict:
    """An architecture file against its family's schema (config/schema/architecture.schema.yaml), then what a schema
    cannot say: tiny and proxy each have overrides or a stated reason for none, and every override changes a key
    the published config has. One line naming the file and the key; a YAML syntax error by file, line and column."""
    errors = yaml_errors([path])
    if errors:
        raise ConfigError(errors[0])
    arch = load_yaml(path)
    if not isinstance(arch, dict):
        raise ConfigError(f"{path}: not an architecture file (a mapping with family, hub_id, config and scales)")
    try:
        validate_config(arch, ARCHITECTURE_SCHEMA, root="")
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    scales, absent = arch.get("scales") or {}, arch.get("scales_absent") or {}
    for scale in SMALL_SCALES:
        if scale in scales and scale in absent:
            raise ConfigError(f"{path}: scales.{scale} and scales_absent.{scale}: give one, not both")
        if scale not in scales and scale not in absent:
            raise ConfigError(f"{path}: scales.{scale}: missing (its overrides of the published config, or why "
                              f"there are none under scales_absent.{scale})")
    base = arch["config"] if arch["family"] != "diffusion" else {
        name: comp.get("config") or {} for name, comp in arch["components"].items()}
    for scale, overrides in scales.items():
        if bad := _unknown_override(overrides, base, f"scales.{scale}"):
            raise ConfigError(f"{path}: {bad}: not a key of the published "
                              f"{'components' if arch['family'] == 'diffusion' else 'config'} (an override changes one)")
    return arch


def _unknown_override(overrides: dict, base: dict, where: str) -> str | None:
    for key, value in overrides.items():
        if key not in base:
            return f"{where}.{key}"
        if isinstance(value, dict) and isinstance(base[key], dict):
            if bad := _unknown_override(value, base[key], f"{where}.{key}"):
                return bad
    return None


def config_schema(schema_path) -> dict:
    """The config's JSON schema: the file, with each variant knob's schema and words from the knob table
    (ftbench.core.knob_table) and the techniques a variant may add (ftbench.config.techniques.TECHNIQUES), where they
    are declared once."""
    from ftbench.config.techniques import TECHNIQUES
    from ftbench.core.knob_table import schema_properties

    schema = load_yaml(schema_path)
    variants = schema.get("$defs", {}).get("variants")  # the config's schema (not another file's, as architectures')
    if variants:
        properties = variants["additionalProperties"]["properties"]
        properties.update(schema_properties())
        properties["adds"]["items"]["enum"] = list(TECHNIQUES)
    return schema


def validate_config(config: dict, schema_path, root: str = "config") -> None:
    """JSON-schema validation with one short line naming the key (Snakemake's own prints schema and config)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(config_schema(schema_path))
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = (root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)).lstrip(".")
        if error.validator == "required":  # name the missing key itself: "config.vocab_size: missing"
            missing = [k for k in error.validator_value if k not in error.instance]
            raise ConfigError(f"{where + '.' if where else ''}{missing[0]}: missing (required)")
        where = where or "top level"
        message = error.message if len(error.message) < 300 else error.message[:300] + " ..."
        raise ConfigError(f"{where}: {message}")


def check_config(config: dict, base_dir) -> None:
    """Cross-reference checks, run after schema validation and before any job: name the key."""
    check_names(config)
    merge_sources(config)
    if config.get("only_studies") is not None and not config["only_studies"]:
        raise ConfigError("only_studies: empty list; leave it out to run every study, or name the studies to run")
    for study in config["studies"]:  # every variant resolves (its base and techniques) to known knobs
        for name, knobs in study_variants(config, study).items():
            Variant.from_config(name if name in config.get("variants", {}) else f"{study}.{name}", knobs)
    for name in config.get("only_studies") or []:
        if name not in config["studies"]:
            raise ConfigError(f"only_studies: unknown study '{name}' (defined: {sorted(config['studies'])})")
    for model, mdef in config["models"].items():
        if mdef["source"] == "gguf":
            check_gguf_source(model, mdef.get("gguf") or {}, base_dir)
            continue
        if local_checkpoint(config, model) is not None:
            checkpoint_family(local_checkpoint(config, model))
            continue
        if local_path_like(mdef["source"]):
            raise ConfigError(f"models.{model}.source: {Path(mdef['source']).expanduser()} is not a checkpoint "
                              "folder (config.json or model_index.json)")
        if not mdef.get("architecture"):
            if mdef["source"] != "random" and "/" in mdef["source"]:  # a folder that is not there (or a hub id)
                where = (Path(base_dir) / mdef["source"]).resolve()
                raise ConfigError(f"models.{model}.source: no checkpoint folder at {where} (missing); put a Hugging "
                                  "Face checkpoint folder there (config.json and its weights), or give "
                                  f"models.{model}.architecture (a file under config/architectures/) to build it")
            raise ConfigError(f"models.{model}.architecture: required unless the source is a local checkpoint folder")
        path = architecture_path(config, model, base_dir)
        shipped = (Path(base_dir) / "config" / "architectures").resolve()
        if not Path(mdef["architecture"]).is_absolute() and shipped not in path.resolve().parents:
            raise ConfigError(f"models.{model}.architecture: {mdef['architecture']!r} leaves config/architectures/; "
                              "name a file under it, or your own file by its absolute path")
        if not path.is_file():
            raise ConfigError(f"models.{model}.architecture: file not found: {path}")
        arch = check_architecture(path)
        scale = model_scale(config, model)
        if scale != "full" and scale not in arch.get("scales", {}):
            raise ConfigError(f"models.{model}.scale: {path} has no {scale} scale: {arch['scales_absent'][scale]}")
    for name, ddef in config["datasets"].items():
        check_dataset_source(name, ddef)
    for study, sdef in config["studies"].items():
        for i, block in enumerate(sdef["matrix"]):
            where = f"studies.{study}.matrix[{i}]"
            pools = {"models": config["models"], "datasets": config["datasets"],
                     "variants": study_variants(config, study)}
            for key, pool in pools.items():
                for name in block[key]:
                    if name not in pool:
                        raise ConfigError(f"{where}.{key}: unknown {key[:-1]} '{name}' (defined: {sorted(pool)})")
    check_knobs(config, base_dir)
    check_dataset_kinds(config, base_dir)
    for i, entry in enumerate(config.get("token_stats", [])):
        for key, pool in (("model", "models"), ("dataset", "datasets")):
            if entry[key] not in config[pool]:
                raise ConfigError(f"token_stats[{i}].{key}: unknown {key} '{entry[key]}'")
    runs = expand_matrix(config)
    for study, sdef in active_studies(config).items():
        for i, sel in enumerate((sdef.get("generate") or {}).get("runs", [])):
            if not any(matches(spec, dict(sel, study=study)) for spec in runs):
                raise ConfigError(f"studies.{study}.generate.runs[{i}]: selects no run of the matrix: {sel}")
        if sdef.get("published") and not (Path(base_dir) / "config" / "published" / sdef["published"]).is_file():
            raise ConfigError(f"studies.{study}.published: file not found under config/published/: {sdef['published']}")
    for i, sel in enumerate(config.get("profile", [])):
        if not any(matches(spec, sel) for spec in runs):
            raise ConfigError(f"profile[{i}]: selects no run of the matrix: {sel}")


# the dataset kinds each model family's runner trains on
FAMILY_KINDS = {"causal_lm": ("instruction", "wikipedia"), "lmm": ("image_classification",),
                "diffusion": ("image_caption",)}


def check_dataset_kinds(config: dict, base_dir) -> None:
    """Every model of a matrix block is matrixed only with datasets of a kind its family's runner trains on (a LLaVA
    model on text data failed in its job with KeyError: 'image'; SD 1.5 on it with PEFT's "target modules not
    found"): refused before any job, in one line."""
    for study, sdef in config["studies"].items():
        for i, block in enumerate(sdef["matrix"]):
            for model in block["models"]:
                family = model_family(config, model, base_dir)
                kinds = FAMILY_KINDS.get(family)
                for name in block["datasets"]:
                    kind = config["datasets"][name]["kind"]
                    if kinds is not None and kind not in kinds:
                        raise ConfigError(f"studies.{study}.matrix[{i}]: model {model} ({family}) cannot train on "
                                          f"dataset {name} (kind {kind}); its runner trains on {', '.join(kinds)}")


# sources made on the machine itself: random weights, a GGUF file, synthetic data, text from Python's own library
OFFLINE_SOURCES = ("random", "gguf", "synthetic", "python_docs")


def names_hub(source: str) -> bool:
    """Whether a model or dataset source is a hub id (not random weights, synthetic data or a local path)."""
    return source not in OFFLINE_SOURCES and not Path(source).exists() and not local_path_like(source)


def offline_env(config: dict) -> dict:
    """Environment for every job: hub access off when no source of the active studies names the hub."""
    runs = expand_matrix(config)
    sources = [config["models"][m]["source"] for m in {r.model for r in runs}]
    sources += [config["datasets"][d]["source"] for d in {r.dataset for r in runs}]
    sources += [config["datasets"][e["dataset"]]["source"] for e in config.get("token_stats", [])]
    if any(names_hub(s) for s in sources):
        return {}
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def model_family(config: dict, model: str, base_dir) -> str:
    if config["models"][model]["source"] == "gguf":  # transformers' GGUF loader builds causal LMs
        return "causal_lm"
    local = local_checkpoint(config, model)
    if local is not None:
        return checkpoint_family(local)
    return _architecture_family(str(architecture_path(config, model, base_dir)))


@functools.lru_cache(maxsize=None)
def _architecture_family(path: str) -> str:
    return load_yaml(path)["family"]


def check_knobs(config: dict, base_dir) -> None:
    """Every variant a study trains on a model is one that model's runner honours, knob by knob."""
    for study, sdef in config["studies"].items():
        for i, block in enumerate(sdef["matrix"]):
            for model, name in itertools.product(block["models"], block["variants"]):
                family = model_family(config, model, base_dir)
                problems = knob_problems(family, Variant.from_config(name, variant_knobs(config, study, name)))
                if problems:
                    raise ConfigError(f"studies.{study}.matrix[{i}]: variant '{name}' on {model} ({family} runner): "
                                      + "; ".join(problems))


def matches(spec: RunSpec, selector: dict) -> bool:
    return all(str(getattr(spec, k)) == str(v) for k, v in selector.items())


def profiled_runs(config: dict) -> list[RunSpec]:
    runs = expand_matrix(config)
    return [s for s in runs if any(matches(s, sel) for sel in config.get("profile", []))]


def run_config(config: dict, spec: RunSpec) -> dict:
    """The slice of config that determines one run; its hash is part of the run's provenance."""
    study = config["studies"][spec.study]
    return {
        "run": dataclasses.asdict(spec),
        "model": config["models"][spec.model],
        "dataset": config["datasets"][spec.dataset],
        "variant": variant_knobs(config, spec.study, spec.variant),
        "training": config["training"],
        # what the study trains with, not how it is reported: a new comparison or title reruns nothing
        "study": {k: v for k, v in study.items() if k not in ("matrix", "compare", "generate", "published", "title")},
        "seed": config["seed"],
    }


def config_hash(obj) -> str:
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def run_params(config: dict, spec: RunSpec) -> dict:
    """What one job needs from config, as plain data for its rule's params (the job expands no matrix)."""
    settings = dataclasses.asdict(train_settings(config, spec))
    return {"run": dataclasses.asdict(spec), "variant": variant_knobs(config, spec.study, spec.variant),
            "settings": settings, "dataset": config["datasets"][spec.dataset],
            "config_hash": config_hash(run_config(config, spec))}


def train_settings(config: dict, spec: RunSpec) -> TrainSettings:
    study = config["studies"][spec.study]
    merged = {**config["training"], **study.get("training", {})}
    merged["measure"] = {**config["training"].get("measure", {}), **study.get("training", {}).get("measure", {})}
    known = {f.name for f in dataclasses.fields(TrainSettings)} - {"seed"}
    knobs = variant_knobs(config, spec.study, spec.variant)
    seed = knobs.get("seed")  # a variant's own seed, else config's
    if knobs.get("steps_scale"):  # a longer arm: every step count times the scale, the schedule stretched with them
        scale = knobs["steps_scale"]
        merged["measure"] = {**merged["measure"], **{k: max(1, round(merged["measure"].get(k, d) * scale)) for k, d in
                                                     (("warmup_steps", MeasureSettings.warmup_steps),
                                                      ("steps", MeasureSettings.steps))}}
    return TrainSettings(seed=config["seed"] if seed is None else seed,
                         **{k: v for k, v in merged.items() if k in known})


def yaml_errors(paths) -> list[str]:
    """Each file's YAML syntax error as `file:line:column: problem` (Snakemake's own message for a bad
    --configfile names neither the file nor the line)."""
    out = []
    for path in paths:
        try:
            yaml.safe_load(Path(path).read_text())
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            out.append(f"{where}: {e.problem or e.context}" + (f" ({e.context})" if e.context and e.problem else ""))
        except OSError as e:
            out.append(f"{path}: {e.strerror}")
    return out


def main(argv: list[str]) -> int:
    """`python -m ftbench.config.settings [FILE ...]`: the checks a run makes before any job, for config files merged over
    config/config.yaml as `--configfile` would, with YAML syntax errors named by file and line."""
    from snakemake.utils import update_config

    root = Path(__file__).resolve().parents[3]
    files = [root / "config/config.yaml", *argv]
    errors = yaml_errors(files)
    if errors:
        print("\n".join(errors))
        return 1
    config = {}
    for path in files:
        update_config(config, load_yaml(path) or {})
    try:
        validate_config(config, root / "config/schema/config.schema.yaml")
        for line in pick_variants(config):
            print(line)
        check_config(config, root)
        expand_matrix(config)
    except ConfigError as e:
        print(e)
        return 1
    print(f"ok: {', '.join(map(str, argv)) or 'config/config.yaml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
