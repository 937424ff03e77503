"""The house stays readable (issue 72): no function in src/ over 120 lines, no module over 700."""

import ast

from conftest import ROOT


def test_no_function_over_120_lines_and_no_module_over_700():
    long_functions, long_modules = [], []
    for path in sorted((ROOT / "src").rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 700:
            long_modules.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 120:
                long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: "
                                      f"{node.end_lineno - node.lineno + 1} lines")
    assert not long_functions and not long_modules, long_functions + long_modules
