"""Issue 81: the library's folders show its architecture. src/ftbench is a few packages by concern, each saying its
job in one line; their layering is an import-linter contract (pyproject.toml) that this test runs, so an import that
runs back up fails the suite; docs/layout.md names every module."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SRC = ROOT / "src" / "ftbench"


def test_the_library_is_a_few_packages_each_saying_its_job():
    entries = sorted(p.name for p in SRC.iterdir() if p.name != "__pycache__")
    assert len(entries) <= 10, entries
    packages = [p for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert not [p.name for p in SRC.glob("*.py") if p.name != "__init__.py"]  # every module in a package
    for pkg in packages:
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
        assert doc and "\n" not in doc.strip(), f"{pkg.name}: a one-line docstring saying its job"


def test_no_import_runs_back_up_the_layers():
    """lint-imports reads the contract in pyproject.toml ([tool.importlinter]) and checks every import, those inside
    functions too."""
    tool = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    run = subprocess.run([tool], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT / "src")})
    assert run.returncode == 0 and "1 kept, 0 broken" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]


def test_the_layout_page_names_every_module():
    page = (ROOT / "docs" / "layout.md").read_text()
    modules = [".".join(p.relative_to(ROOT / "src").with_suffix("").parts).removesuffix(".__init__")
               for p in SRC.rglob("*.py") if "__pycache__" not in p.parts]
    missing = [m for m in modules if m.count(".") > 1 and f"`{m}`" not in page]
    assert not missing, f"docs/layout.md does not name {missing}"
