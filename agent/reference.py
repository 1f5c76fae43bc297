"""The docs that come from the code, written by one command and checked in CI (tests/test_reference.py),
so they cannot drift from what the agent does:

- docs/manual.md: `agent run`'s options, from agent.request.RunRequest (flag, default, help);
- docs/ledger.md: the ledger's tables, from agent.ledger's ORM (each column's type and `doc`), and the
  results.json fields, from agent.results_file's model;
- docs/results-v1.schema.json: the JSON Schema of results.json;
- docs/architecture.md: the harness contract, the names agent/ may import from sandbox/.

    .venv/bin/python -m agent.reference --write    # after changing any of them
    .venv/bin/python -m agent.reference --check    # what CI runs: exit 1 naming the stale file
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python -m agent.reference --write"


def run_options() -> str:
    """`agent run`'s options as a table: each flag as the command line takes it, its default, its help."""
    from agent.request import RunRequest

    rows = ["| option | default | what it does |", "|---|---|---|"]
    for f in fields(RunRequest):
        flags = f.metadata.get("flags") or ("--" + f.name.replace("_", "-"),)
        default = "" if f.default is MISSING or f.default is None else f"`{f.default}`"
        shown = " ".join(f"`{flag}`" for flag in flags)
        if isinstance(f.default, bool):
            shown += f" / `--no-{flags[0].removeprefix('--')}`"
        bounds = [f"{k} {f.metadata[k]}" for k in ("min", "max") if k in f.metadata]
        text = " ".join(str(f.metadata["help"]).split()) + (f" ({', '.join(bounds)})" if bounds else "")
        rows.append(f"| {shown} | {default} | {text.replace('|', '/')} |")
    return "\n".join(rows)


def results_fields() -> str:
    from agent import results_file

    return "\n".join(["| field | type | what it holds |", "|---|---|---|", *results_file.field_table()])


TABLES = ("runs", "trials", "repeats", "workers", "planner_calls", "narrowings", "learned_rules", "capacity",
          "migrations")


def ledger_tables() -> str:
    """Each table of the ledger: what a row is (its class's docstring) and its columns, each with its type
    (a state: its kind's values) and what it holds; consecutive columns that share one text share a row
    (their types in order where they differ)."""
    import inspect
    from enum import Enum

    from sqlalchemy import Enum as SqlEnum

    from agent.ledger import Base

    classes = {m.class_.__tablename__: m.class_ for m in Base.registry.mappers}
    out: list[str] = []
    for name in TABLES:
        cls = classes[name]
        out += [f"### {name}", ""]
        if cls.__doc__:
            out += [" ".join(inspect.cleandoc(cls.__doc__).split("\n\n")[0].split()), ""]
        rows: list[tuple[list[str], list[str], str]] = []
        for column in cls.__table__.columns:
            kind = cls.__annotations__[column.name].removeprefix("Mapped[")[:-1].replace(" | None", " or null")
            if isinstance(column.type, SqlEnum) and isinstance(column.type.enum_class, type) and \
                    issubclass(column.type.enum_class, Enum):
                kind += ": " + ", ".join(column.type.enums)
            text = " ".join(str(column.doc).split()).replace("|", "/")
            if rows and rows[-1][2] == text:
                rows[-1][0].append(column.name)
                rows[-1][1].append(kind)
            else:
                rows.append(([column.name], [kind], text))
        out += ["| column | type | what it holds |", "|---|---|---|"]
        out += [f"| {', '.join(names)} | {kinds[0] if len(set(kinds)) == 1 else '; '.join(kinds)} | {text} |"
                for names, kinds, text in rows] + [""]
    return "\n".join(out).rstrip()


def contract() -> str:
    """sandbox.contract's names, grouped as its __all__ groups them: all agent/ may import from sandbox/."""
    source = (ROOT / "sandbox" / "contract.py").read_text()
    block = source[source.index("__all__ = ["):]
    block = block[:block.index("\n]") + 2]
    groups: list[tuple[str, list[str]]] = []
    for line in block.splitlines()[1:-1]:
        line = line.strip()
        if line.startswith("#"):
            groups.append((line.lstrip("# "), []))
        elif line and groups:
            groups[-1][1].extend(n.strip().strip('"') for n in line.rstrip(",").split(",") if n.strip())
    rows = ["| what | names |", "|---|---|"]
    rows += [f"| {what} | {', '.join(f'`{n}`' for n in names)} |" for what, names in groups]
    return "\n".join(rows)


# (file, section name, generator): each section sits between its two markers in the file.
SECTIONS: list[tuple[str, str, Callable[[], str]]] = [
    ("docs/manual.md", "agent run options", run_options),
    ("docs/ledger.md", "ledger tables", ledger_tables),
    ("docs/ledger.md", "results-v1 fields", results_fields),
    ("docs/architecture.md", "harness contract", contract),
]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: generated by {COMMAND} -->", f"<!-- end of {name} -->"


def rendered(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file's text as it should be now."""
    from agent import results_file

    texts: dict[Path, str] = {}
    for rel, name, make in SECTIONS:
        path = root / rel
        text = texts.get(path) or path.read_text()
        start, end = markers(name)
        if start not in text or end not in text:
            raise ValueError(f"{rel}: the markers of {name!r} are missing ({start} ... {end})")
        head, _, rest = text.partition(start)
        _, _, tail = rest.partition(end)
        texts[path] = f"{head}{start}\n{make()}\n{end}{tail}"
    texts[root / "docs" / "results-v1.schema.json"] = json.dumps(results_file.schema(), indent=2, sort_keys=True) + "\n"
    return texts


def stale(root: Path = ROOT) -> list[str]:
    return [str(path.relative_to(root)) for path, text in rendered(root).items()
            if not path.exists() or path.read_text() != text]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path, text in rendered().items():
            path.write_text(text)
        return 0
    if argv == ["--check"]:
        found = stale()
        for rel in found:
            print(f"{rel} is stale: {COMMAND}")
        return 1 if found else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
