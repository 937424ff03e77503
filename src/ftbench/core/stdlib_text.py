"""Real English text from the docstrings of the running Python's standard library (the quality study's data source
`python_docs`), parsed and never imported, held out by whole module; and how many rows each part holds, counted once
per Python and cached, so a config asking for more rows than this Python has is refused before any job. A leaf:
ftbench.data.datasets builds the datasets from it, ftbench.config.inputs checks a config's counts against it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PYTHON_DOCS_LICENSE = "PSF-2.0 (the Python Software Foundation License of the standard library's docstrings)"
HELD_OUT_MODULES = 5  # python_docs: one module in this many (by a digest of its name) is held out whole


def held_out_module(module: str) -> bool:
    """Whether a standard-library module is held out: its rows are never trained on (by a digest of its name, so
    the same on every machine and Python)."""
    import hashlib

    return int(hashlib.sha256(module.encode()).hexdigest(), 16) % HELD_OUT_MODULES == 0


def _stdlib_sources():
    """(module name, parsed source) of each public module of this Python's standard library, in name order
    (parsed, never imported: no module's side effects run; test suites and private modules left out)."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[0] in ("test", "idlelib", "lib2to3", "site-packages", "dist-packages") or any(
                p.startswith("_") and p != "__init__" or p in ("tests", "idle_test") for p in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        yield ".".join(p for p in parts if p != "__init__"), tree


def python_docs(kind: str) -> list[dict]:
    """Real English text from the docstrings of this Python's standard library. kind instruction: write a public
    function's docstring (40-600 characters) from its module and signature; kind wikipedia: a module's or public
    class's docstring (200-4000 characters) titled by its qualified name. Each row names its module."""
    import ast

    rows = []
    for module, tree in _stdlib_sources():
        if kind == "wikipedia":
            doc = ast.get_docstring(tree)
            if doc and 200 <= len(doc) <= 4000:
                rows.append({"module": module, "title": module, "text": doc})
            for node in tree.body:
                doc = ast.get_docstring(node) if isinstance(node, ast.ClassDef) else None
                if doc and not node.name.startswith("_") and 200 <= len(doc) <= 4000:
                    rows.append({"module": module, "title": f"{module}.{node.name}", "text": doc})
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and 40 <= len(doc) <= 600:
                    rows.append({"module": module, "input": f"def {node.name}({ast.unparse(node.args)}):",
                                 "instruction": f"Write the docstring of this function from Python's `{module}` "
                                                "module.", "output": doc})
    return rows


def python_docs_counts(kind: str) -> dict:
    """{"train": rows of the modules trained on, "held_out": rows of the held-out modules} for `kind`, from a cache
    (one file per Python version and standard-library folder, under $XDG_CACHE_HOME or ~/.cache/ftbench), else
    counted (parsing the library: about 10-20 s) and cached."""
    import hashlib
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    key = hashlib.sha256(f"{sys.version}|{stdlib}|{HELD_OUT_MODULES}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ftbench" / f"python_docs-{key}.json"
    try:
        counts = json.loads(cache.read_text())
    except (OSError, ValueError):
        counts = {}
    if kind not in counts:
        rows = python_docs(kind)
        held = sum(held_out_module(r["module"]) for r in rows)
        counts[kind] = {"train": len(rows) - held, "held_out": held}
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(counts))
        except OSError:
            pass  # (a read-only home: counted again next time)
    return counts[kind]
