"""The ledger's named migrations (agent.migrations) on ledgers written by every commit that changed
its schema (tests/data/ledgers, from scripts/ledger_fixtures.py): each opens under today's code, gains
what it lacks once, and reads as today's runs do."""

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent import migrations, report_text
from agent.context import from_flat, settings_of
from agent.ledger import Base, Ledger

FIXTURES = sorted((Path(__file__).parent / "data" / "ledgers").glob("*.sqlite"))
NAMES = [fn.__name__ for fn in migrations.MIGRATIONS]


def test_there_is_a_ledger_from_every_schema_the_agent_has_written():
    assert len(FIXTURES) >= 12 and FIXTURES[0].name.startswith("2026-11-29-018002f")


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_an_old_ledger_opens_migrates_once_and_reads_as_a_new_one(tmp_path, fixture):
    path = tmp_path / "ledger.sqlite"
    shutil.copy(fixture, path)
    before = sqlite3.connect(path).execute("SELECT settings, workload FROM runs").fetchone()
    ledger = Ledger(path)
    assert ledger.migrated == NAMES   # none recorded in a ledger older than the names
    db = sqlite3.connect(path)
    for table in Base.metadata.sorted_tables:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table.name})")}
        assert set(table.columns.keys()) <= have, (table.name, set(table.columns.keys()) - have)
    assert [row[0] for row in db.execute("SELECT name FROM migrations ORDER BY name")] == NAMES
    (run,) = ledger.runs()
    settings = settings_of(run)
    assert "gate" in run.settings and (settings.model, settings.workload) == ("m", "smoke")
    old = json.loads(before[0])
    if "gate" not in old:   # the flat options: read after the rewrite as the reader of flat options read them
        assert settings == from_flat(old, before[1])
    trials = ledger.trials("old")
    assert [(t.source, t.status, t.branch) for t in trials] == [
        ("baseline", "ok", None), ("planner", "ok", "agent/old/1"), ("sampler", "failed", None)]
    assert [t.decision for t in trials] in ([None] * 3, ["baseline", "accepted", "failed"])   # before its column: none
    assert any("agent/old/1" in line for line in report_text.summary(run, trials))
    assert Ledger(path).migrated == []   # opened again: nothing to do


def test_a_new_ledger_has_every_migration_recorded_and_none_run(tmp_path):
    assert Ledger(tmp_path / "l.sqlite").migrated == NAMES
    assert Ledger(tmp_path / "l.sqlite").migrated == []


def test_processes_opening_one_old_ledger_at_once_apply_each_migration_once(tmp_path):
    path = tmp_path / "ledger.sqlite"
    shutil.copy(FIXTURES[0], path)
    code = "import sys; from agent.ledger import Ledger; print(','.join(Ledger(sys.argv[1]).migrated))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[1]) for _ in range(4)]
    applied = [name for p in procs for name in p.communicate(timeout=120)[0].strip().split(",") if name]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(applied) == sorted(NAMES)   # each by exactly one of them
