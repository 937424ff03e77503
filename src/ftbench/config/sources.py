"""Where records come from beside a run's own: the shipped measurement folders and merged campaigns a config
names (shipped_runs, merge_runs), their published tables, and the checkpoints a model brings."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from ftbench.config.inputs import check_records
from ftbench.core.knobs import ConfigError


def local_checkpoint(config: dict, model: str) -> Path | None:
    """The folder of a model whose source is a local checkpoint (config.json or model_index.json), else None."""
    return _checkpoint_dir(config["models"][model]["source"])


@functools.lru_cache(maxsize=None)
def _checkpoint_dir(source: str) -> Path | None:
    """Looked up once per source: the matrix asks for every run's scale, and Snakemake expands it per job."""
    if source == "random":
        return None
    path = Path(source).expanduser()
    return path if path.is_dir() and ((path / "config.json").is_file() or (path / "model_index.json").is_file()) \
        else None


@functools.lru_cache(maxsize=None)
def checkpoint_family(path: Path) -> str:
    """A local checkpoint's runner family, from its own files (a diffusers pipeline has model_index.json)."""
    if (path / "model_index.json").is_file():
        return "diffusion"
    cfg = json.loads((path / "config.json").read_text())
    names = " ".join(cfg.get("architectures") or []) + " " + cfg.get("model_type", "")
    if "Llava" in names or "llava" in names:
        return "lmm"
    if "ForCausalLM" in names:
        return "causal_lm"
    raise ConfigError(f"{path}/config.json: architectures {cfg.get('architectures')} is not a causal LM, "
                      "a LLaVA model or a diffusers pipeline")


def brings_own_config(config: dict, model: str) -> bool:
    """Whether a model brings its own architecture (a local checkpoint folder or a GGUF file): no architecture file,
    trained at its own size."""
    return config["models"][model]["source"] == "gguf" or local_checkpoint(config, model) is not None


def coverage_tables(config: dict) -> list[dict]:
    """Every study's published tables for the coverage table, active in this config or not (a study not run here
    still lists its cells, as not measured, unless merged records fill them): each coverage entry of a study with
    its `study` and its `published` file's name (under config/published/)."""
    return [{**t, "study": s, "published": d["published"]}
            for s, d in config["studies"].items() for t in d.get("coverage", []) if d.get("published")]


def expand_sources(entry: str) -> list[str]:
    """A `merge_runs` or `shipped_runs` entry: a pattern's folders, runs tables and records in name order, or the
    path itself where it exists; [] where it names nothing. Of the same run the latest measured copy wins (its
    record's timestamp: ftbench.judge.analysis.oldest_first), whatever the folders' names."""
    import glob

    if not glob.has_magic(entry):
        return [entry] if Path(entry).exists() else []
    return [f for f in sorted(glob.glob(entry)) if Path(f).is_dir() or f.endswith((".parquet", ".json"))]


def merge_sources(config: dict, check: bool = True) -> list[str]:
    """`merge_runs` with its patterns expanded (`measurements/*`: every folder, runs table or record there, in name
    order; of the same run the latest measured copy wins); an entry that names nothing is refused; with `check`,
    every record they hold read (`check_records`), before any job: a caller that checked already passes False."""
    sources = []
    for entry in config.get("merge_runs") or []:
        found = expand_sources(entry)
        if not found:
            raise ConfigError(f"merge_runs: '{entry}' names no runs table or folder (from {Path.cwd()})")
        sources += [f for f in found if f not in sources]
    for source in sources if check else []:
        check_records(source)
    return sources


def shipped_sources(config: dict) -> list[str]:
    """`shipped_runs` with its patterns expanded (in name order), or nothing while `merge_runs` merges records into
    the report itself (the user's own merge replaces what ships); a pattern that names nothing adds nothing (a clone
    whose measurements/ was removed). A campaign's folder among them stands for its studies (`campaign_owners`)."""
    if config.get("merge_runs"):
        return []
    found = []
    for entry in config.get("shipped_runs") or []:
        found += [f for f in expand_sources(entry) if Path(f).is_dir() and f not in found]
    return found


def campaign_of(folder) -> str | None:
    """The campaign a folder holds (its campaign.json's `campaign`, bench/campaign.py), or None: not a campaign's."""
    state = Path(folder) / "campaign.json"
    if not state.is_file():
        return None
    return (json.loads(state.read_text() or "{}") or {}).get("campaign") or ""


def campaign_owners(folders) -> dict[str, str]:
    """study (the records' top folder: lmm, llm, diffusion) -> the campaign folder (its campaign.json: one commit on
    one host, bench/campaign.py) that stands for it among `folders`, the last by name where several measured it:
    that study's records are read from it alone, the other studies' from every folder."""
    owners = {}
    for f in sorted(folders):
        if campaign_of(f) is not None:
            for study in sorted(d.name for d in Path(f).iterdir() if d.is_dir() and any(d.rglob("metrics.json"))):
                owners[study] = f
    return owners


def merged_profile_summaries(folder) -> list[Path]:
    """The profile summaries a merged folder holds (its profiles/**/summary.json), in name order."""
    return sorted(Path(folder).glob("profiles/**/summary.json"))
