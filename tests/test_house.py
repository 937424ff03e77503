"""The house stays readable (issues 72, 81): in src/, bench/ and the workflow's scripts no function over 80 lines, no
class over 150, no module over 500."""

import ast

import pytest

from conftest import ROOT

LIMITS = {"function": 80, "class": 150, "module": 500}
FOLDERS = ("src", "bench", "workflow/scripts")


def too_long(text: str, name: str, limits: dict = LIMITS) -> list[str]:
    """Each function, class or the module itself over its limit, as `name:line kind name: N lines`."""
    out = [f"{name}: module of {n} lines"] if (n := len(text.splitlines())) > limits["module"] else []
    for node in ast.walk(ast.parse(text)):
        kind = ("function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                else "class" if isinstance(node, ast.ClassDef) else None)
        if kind and (n := node.end_lineno - node.lineno + 1) > limits[kind]:
            out.append(f"{name}:{node.lineno} {kind} {node.name}: {n} lines")
    return out


def test_no_function_over_80_lines_no_class_over_150_no_module_over_500():
    found = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "__pycache__" not in p.parts]
    assert len(found) > 100  # the walk reaches the library, the bench scripts and the workflow's scripts
    problems = [x for p in found for x in too_long(p.read_text(), str(p.relative_to(ROOT)))]
    assert not problems, problems


@pytest.mark.parametrize("kind, source", [
    ("function", "def f():\n" + "    x = 1\n" * 80),
    ("class", "class C:\n" + "    x = 1\n" * 150),
    ("module", "x = 1\n" * 501)])
def test_the_size_check_finds_each_kind_over_its_limit(kind, source):
    assert [x for x in too_long(source, "m.py") if kind in x], source[:40]
    assert not too_long("def f():\n    return 1\n", "m.py")
