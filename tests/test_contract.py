"""The harness boundary: agent/ imports from sandbox/ only the names sandbox.contract exports, at
module level, inside functions and through importlib alike (docs/architecture.md lists them)."""

import ast
from pathlib import Path

import sandbox.contract

ROOT = Path(__file__).parent.parent


def sandbox_imports(source: str) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import of sandbox in a module's source: `import sandbox.x`,
    `from sandbox[.x] import y` and importlib.import_module / __import__ calls naming sandbox."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "sandbox"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sandbox":
            found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) and \
                str(node.args[0].value).split(".")[0] == "sandbox":
            found.append((node.lineno, node.args[0].value, None))
    return found


def test_the_agent_imports_only_the_contracts_names():
    allowed = set(sandbox.contract.__all__)
    wrong = [f"{p.relative_to(ROOT)}:{line}: {module} {name or ''}".strip()
             for p in sorted((ROOT / "agent").glob("*.py"))
             for line, module, name in sandbox_imports(p.read_text())
             if module != "sandbox.contract" or name not in allowed]
    assert wrong == []
    assert all(hasattr(sandbox.contract, n) for n in allowed) and len(allowed) <= 44   # narrow: a new name is a choice


def test_the_check_finds_each_way_round_it():
    source = ("import sandbox.host\nfrom sandbox import model\nfrom sandbox.contract import gpus\n"
              "def f():\n    from sandbox.result import read\n    importlib.import_module('sandbox.spec')\n"
              "    __import__('sandbox.traffic')\n    importlib.import_module('json')\n")
    assert [(line, module) for line, module, _ in sandbox_imports(source)] == [
        (1, "sandbox.host"), (2, "sandbox"), (3, "sandbox.contract"), (5, "sandbox.result"), (6, "sandbox.spec"),
        (7, "sandbox.traffic")]


def test_the_harness_never_imports_the_agent():
    wrong = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "sandbox").glob("*.py"))
             for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, (ast.Import, ast.ImportFrom))
             for line, module in [(node.lineno,
                                   node.module if isinstance(node, ast.ImportFrom) else node.names[0].name)]
             if (module or "").split(".")[0] == "agent"]
    assert wrong == []


def imports_within(package: str) -> dict[str, set[str]]:
    """Each module of a package and the modules of that package it imports anywhere: at the top, in a
    function, under `if TYPE_CHECKING`."""
    graph = {}
    for p in (ROOT / package).glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package:
                deps |= {f"{package}.{a.name}" for a in node.names} if node.module == package else {node.module}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.split(".")[0] == package}
        graph[f"{package}.{p.stem}"] = deps - {f"{package}.{p.stem}"}
    return graph


def a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            if state.get(other) == 1:
                return path[path.index(other):] + [module, other] if other in path else [module, other]
            if not state.get(other) and (found := visit(other, path + [module])):
                return found
        state[module] = 2
        return None

    return next((c for m in sorted(graph) if not state.get(m) and (c := visit(m, []))), None)


def test_no_module_imports_itself_round_a_circle():
    assert a_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None   # the check finds one
    assert a_circle(imports_within("sandbox")) is None
    assert a_circle(imports_within("agent")) is None
