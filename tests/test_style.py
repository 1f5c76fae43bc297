"""The product's code stays readable top to bottom: no function in agent/ or sandbox/ over 60 lines
(ruff's C901 holds their complexity at 15: pyproject.toml)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def long_functions(source: str) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_in_the_product_is_over_60_lines():
    found = [f"{path.relative_to(ROOT)}: {name} ({lines} lines)"
             for path in sorted([*(ROOT / "agent").glob("*.py"), *(ROOT / "sandbox").glob("*.py")])
             for name, lines in long_functions(path.read_text())]
    assert found == []


def test_the_check_finds_a_long_function_nested_or_not():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_LINES + 1)]
    assert long_functions(f"class C:\n    def g(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n") == [
        ("g", MAX_LINES + 1)]
    assert long_functions("def short():\n    return 1\n") == []


def test_the_command_line_stays_a_thin_adapter():
    """cli.py holds the commands' flags and hands each to its module: under 400 lines."""
    assert len((ROOT / "agent" / "cli.py").read_text().splitlines()) < 400
