"""The ledger's named migrations (agent.migrations) on ledgers written by every commit that changed
its schema (tests/data/ledgers, from tests/ledger_fixtures.py): each opens under today's code, gains
what it lacks once, and reads as today's runs do."""

import json
import shutil
import sqlite3
from dataclasses import fields, replace
from pathlib import Path

import pytest

from agent import migrations, report_text
from agent.context import Settings, settings_of
from agent.gate import GateSettings
from agent.ledger import Base, Ledger
from agent.stats import Noise

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

FIXTURES = sorted((Path(__file__).parent / "data" / "ledgers").glob("*.sqlite"))
NAMES = [fn.__name__ for fn in migrations.MIGRATIONS]


def from_flat(o: dict, workload: str) -> Settings:
    """How agents before 2026-12-03 read the options they kept flat (the workload under `workload_spec`,
    the prior as [sd, df]): the oracle m003's rewrite must agree with."""
    gate = GateSettings(**{f.name: o[f.name] for f in fields(GateSettings) if f.name in o and f.name != "noise_prior"},
                        **({"noise_prior": Noise(*o["noise_prior"])} if "noise_prior" in o else {}))
    kept = {f.name: o[f.name] for f in fields(Settings) if f.name in o and f.name not in ("model", "workload", "gate",
                                                                                           "home", "facts")}
    return Settings(model=o.get("model", ""), workload=o.get("workload_spec") or workload, gate=gate,
                    home=Path(o["home"]) if o.get("home") else None, **kept)


def test_there_is_a_ledger_from_every_schema_the_agent_has_written():
    assert len(FIXTURES) >= 12 and FIXTURES[0].name.startswith("2026-11-29-018002f")


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_an_old_ledger_opens_migrates_once_and_reads_as_a_new_one(tmp_path, fixture):
    path = tmp_path / "ledger.sqlite"
    shutil.copy(fixture, path)
    db = sqlite3.connect(path)
    before = db.execute("SELECT settings, workload FROM runs").fetchone()
    had = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE name = 'migrations'")} and \
        {row[0] for row in db.execute("SELECT name FROM migrations")}
    named = [c for c in ("source", "status", "decision", "failure_class")
             if c in {row[1] for row in db.execute("PRAGMA table_info(trials)")}]
    states = _states(db, named)
    db.close()
    ledger = Ledger(path)
    assert ledger.migrated == [n for n in NAMES if n not in (had or set())]   # each one it lacked, in order
    assert _states(sqlite3.connect(path), named) == states   # typed columns, the same stored strings
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
        assert settings == replace(from_flat(old, before[1]), model="m")   # the run's model, where the options had none
    trials = ledger.trials("old")
    assert [(t.source, t.status, t.branch) for t in trials] == [
        ("baseline", "ok", None), ("planner", "ok", "agent/old/1"), ("sampler", "failed", None)]
    assert [t.decision for t in trials] in ([None] * 3, ["baseline", "accepted", "failed"])   # before its column: none
    assert any("agent/old/1" in line for line in report_text.summary(run, trials))
    # The figures under the names they have now, and under their old ones for saved SQL (aliases).
    assert ([t.figure for t in trials], trials[1].search_ratio, run.baseline_figure) == (
        [18.0, 22.0, None], 1.222, 18.0)
    old = db.execute("SELECT tps, tps_ratio FROM trials ORDER BY number").fetchall()
    assert old == [(18.0, None), (22.0, 1.222), (None, None)]
    assert db.execute("SELECT baseline_tps FROM runs").fetchall() == [(18.0,)]
    assert Ledger(path).migrated == []   # opened again: nothing to do


def _states(db: sqlite3.Connection, named: list[str]) -> list:
    return db.execute(f"SELECT {', '.join(named)} FROM trials ORDER BY number").fetchall() + \
        db.execute("SELECT status FROM runs").fetchall()


def test_a_failure_class_no_member_has_is_renamed_keeping_its_name_and_other_unknown_states_stop_the_opening(
        tmp_path):
    path = tmp_path / "ledger.sqlite"
    shutil.copy(FIXTURES[-1], path)
    db = sqlite3.connect(path)
    db.execute("UPDATE trials SET failure_class = 'cuda_gone', failure_message = 'lost' WHERE status = 'failed'")
    db.commit()
    ledger = Ledger(path)
    assert "m007_states_typed" in ledger.migrated
    (failed,) = [t for t in ledger.trials("old") if t.status == "failed"]
    assert (failed.failure_class, failed.failure_message) == ("worker_error", "(failure class cuda_gone) lost")
    db.execute("UPDATE trials SET status = 'half_done' WHERE number = 0")
    db.execute("DELETE FROM migrations WHERE name = 'm007_states_typed'")
    db.commit()
    with pytest.raises(migrations.UnknownState, match=f"{path}: trials.status holds 'half_done'"):
        Ledger(path)


def test_a_new_ledger_has_every_migration_recorded_and_runs_only_what_create_all_cannot_make(tmp_path):
    assert Ledger(tmp_path / "l.sqlite").migrated == NAMES
    assert migrations.FRESH_TOO == {"m004_figures_named_by_unit"}   # the old names' aliases
    assert Ledger(tmp_path / "l.sqlite").migrated == []


def test_openers_of_one_old_ledger_at_once_all_open_and_apply_each_migration_once(tmp_path):
    """Six openers released together (each its own engine, as separate processes have), five times:
    every one opens (the new tables created by whichever comes first) and each name is applied once."""
    from at_once import at_once

    for round_ in range(5):
        path = tmp_path / f"ledger-{round_}.sqlite"
        shutil.copy(FIXTURES[0], path)
        # In WAL mode, as the agent leaves a ledger (the fixtures are folded into one file each): six
        # openers switching a file's journal mode at once can meet "database is locked".
        sqlite3.connect(path).execute("PRAGMA journal_mode=WAL").fetchone()
        applied = []
        errors = at_once(6, lambda path=path, applied=applied: applied.extend(Ledger(path).migrated))
        assert errors == [] and sorted(applied) == sorted(NAMES), (round_, errors, applied)


def test_postgresql_gets_the_migrations_an_older_schema_lacks(postgres_server, tmp_path):
    """A PostgreSQL ledger as an agent before named migrations left it (no migrations table, no
    runs.owner, a run's options flat): opened, it gains the column and its run reads as a new one."""
    from sqlalchemy import create_engine, text

    from agent import storage

    url = storage.resolve(postgres_server.new_database(), tmp_path).ledger_url
    Ledger(url).add(__import__("agent.ledger", fromlist=["Run"]).Run(
        id="old", deadline_at="2026-11-30T00:00:00+00:00", model="m", space_path="vllm-cpu", space_hash="h",
        workload="smoke", repo="", settings={"home": "/old", "workload_spec": "smoke", "ppl_tolerance": 0.02,
                                             "noise_prior": [0.05, 12], "repeats": 3}))
    engine = create_engine(url)
    with engine.begin() as conn:   # back to the schema of 2026-12-05
        conn.execute(text("DROP TABLE migrations"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN owner"))
    engine.dispose()
    ledger = Ledger(url)
    assert ledger.migrated == NAMES
    run = ledger.run("old")
    settings = settings_of(run)
    assert run.owner is None and "gate" in run.settings and settings.repeats == 3
    assert (settings.gate.ppl_tolerance, settings.gate.noise_prior.sd, settings.gate.noise_prior.df) == (0.02, 0.05, 12)
    assert Ledger(url).migrated == []
