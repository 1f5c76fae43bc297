"""The docs generated from the code are current: `python -m agent.reference --write` after any change to
agent run's options, results.json's model or the harness contract (CI runs this file)."""

import shutil
from pathlib import Path

from agent import reference
from agent.request import RunRequest

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_docs_are_current():
    assert reference.stale() == [], "stale docs: python -m agent.reference --write"


def test_every_run_option_is_in_the_manual_with_its_flag_and_help():
    manual = (ROOT / "docs" / "manual.md").read_text()
    for name in ("--budget", "--capacity", "--price-per-hour", "--slo-tpot-p99-ms", "--draft-model"):
        assert f"| `{name}`" in manual
    assert "| `--recheck` / `--no-recheck` | `True` |" in manual


def test_a_doc_left_behind_is_named(tmp_path, monkeypatch):
    for rel in ("docs/manual.md", "docs/ledger.md", "docs/architecture.md", "docs/results-v1.schema.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    assert reference.stale(tmp_path) == []
    field = next(f for f in RunRequest.__dataclass_fields__.values() if f.name == "repeats")
    monkeypatch.setattr(field, "metadata", dict(field.metadata, help="Measured repeats, said otherwise."))
    assert reference.stale(tmp_path) == ["docs/manual.md"]


def test_every_ledger_column_has_its_doc_and_its_row_in_the_ledger_page():
    from agent.ledger import Base

    page = (reference.ROOT / "docs" / "ledger.md").read_text()
    assert set(reference.TABLES) == set(Base.metadata.tables)
    for table in Base.metadata.sorted_tables:
        section = page.split(f"### {table.name}\n", 1)[1].split("\n### ", 1)[0].split("<!-- end", 1)[0]
        listed = [name.strip() for row in section.splitlines() if row.startswith("| ") and "---" not in row
                  for name in row.split("|")[1].split(",")]
        assert listed[1:] == [c.name for c in table.columns], table.name   # after the header's "column"
        assert all(c.doc and len(c.doc) > 3 for c in table.columns), table.name
