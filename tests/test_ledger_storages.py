"""One ledger suite on both databases the agent writes to: SQLite (a run on one host) and PostgreSQL
(a run shared by hosts), as Optuna runs its storage tests on each of its storages. Every behaviour
the loop counts on from the ledger: numbering under contention, the one-winner claim, the
lifecycle's moves, the database's clock, JSON columns, the bulk columns read on demand, migrations."""

import re

import pytest
from at_once import at_once
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.orm.exc import DetachedInstanceError

from agent import migrations, storage
from agent.ledger import Ledger, Run, Trial, Worker
from agent.states import BadMove


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        url = tmp_path / "ledger.sqlite"
    else:
        url = storage.resolve(request.getfixturevalue("postgres_server").new_database(), tmp_path).ledger_url
    ledger = Ledger(url)
    ledger.add(Run(id="r", deadline_at="2099-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="w", repo="", settings={"home": "/h", "nested": {"a": [1, 2.5, None]}}))
    return ledger


def test_a_fresh_ledger_has_every_migration_and_reopening_applies_none(ledger):
    again = Ledger(ledger.path if ledger.sqlite else ledger.engine.url.render_as_string(hide_password=False))
    assert again.migrated == [] and len(migrations.MIGRATIONS) >= 3


def test_json_columns_and_the_run_read_back_as_written(ledger):
    run = ledger.run("r")
    assert run.settings == {"home": "/h", "nested": {"a": [1, 2.5, None]}} and run.status == "running"


def test_trial_numbers_stay_unique_when_several_writers_take_them_at_once(ledger):
    numbers = []

    def take():
        for _ in range(5):
            numbers.append(ledger.add_trial(Trial(run_id="r", source="sampler", params={})).number)

    errors = at_once(4, take)
    assert errors == [] and sorted(numbers) == list(range(20))


def test_a_claim_has_one_winner_and_a_null_is_matched_as_null(ledger):
    w = ledger.add(Worker(run_id="r", name="h/0", host="h", pid=1, slot=0, device="cpu", role="worker",
                          heartbeat_at=ledger.now()))
    assert [ledger.claim(Worker, w.id, {"status": "running"}, status="lost") for _ in range(2)] == [True, False]
    assert ledger.claim(Run, "r", {"owner": None}, owner="a") and not ledger.claim(Run, "r", {"owner": None}, owner="b")
    assert ledger.run("r").owner == "a"


def test_the_lifecycle_and_the_columns_are_checked_on_both(ledger):
    row = ledger.add_trial(Trial(run_id="r", source="planner", params={}))
    ledger.transition(row, status="ok", figure=12.5, measured={"ttft_ms": {"p99": 80.0}})
    with pytest.raises(BadMove):
        ledger.transition(row, status="running")
    with pytest.raises(ValueError, match="no column"):
        ledger.transition(row, tsp=1.0)
    (back,) = ledger.trials("r")
    assert (back.status, back.figure, back.measured) == ("ok", 12.5, {"ttft_ms": {"p99": 80.0}})


def test_the_figures_read_under_their_old_names_too_for_saved_sql(ledger):
    """tps, tps_ratio, baseline_tps, ... were renamed for what they hold (agent.migrations.RENAMED); a
    query written against the old names reads the same values, on a ledger created today too."""
    row = ledger.add_trial(Trial(run_id="r", source="planner", params={}))
    ledger.transition(row, status="ok", figure=12.5, search_ratio=1.25, figure_corrected=12.0, heldout_figure=11.0)
    ledger.update(ledger.run("r"), baseline_figure=10.0)
    ledger.add_repeats(row.id, 0, [12.0, 13.0])
    old = ledger.sql("SELECT tps, tps_ratio, tps_corrected, heldout_tps FROM trials")
    assert old == (["tps", "tps_ratio", "tps_corrected", "heldout_tps"], [(12.5, 1.25, 12.0, 11.0)])
    assert ledger.sql("SELECT baseline_tps FROM runs")[1] == [(10.0,)]
    assert ledger.sql("SELECT tps FROM repeats ORDER BY id")[1] == [(12.0,), (13.0,)]


def test_the_clock_is_the_databases_in_one_form(ledger):
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", ledger.now())


def test_history_reads_the_bulk_columns_only_where_asked(ledger):
    for source in ("baseline", "planner"):
        row = ledger.add_trial(Trial(run_id="r", source=source, params={}))
        ledger.transition(row, status="ok", greedy=[[1, 2, 3]])
    base, cand = ledger.history("r", whole={"baseline"})
    assert base.greedy == [[1, 2, 3]]
    with pytest.raises((InvalidRequestError, DetachedInstanceError)):   # never a silent second query
        _ = cand.greedy


def test_ledger_sql_reads_and_writes_no_file_on_either_database(ledger, tmp_path):
    """SQLite opened read-only still ran VACUUM INTO (a full copy of the ledger anywhere) and ATTACH (a new
    file, with CREATE TABLE in it); PostgreSQL runs the query in a read-only transaction, rolled back."""
    assert ledger.sql("select id from runs")[1] == [("r",)]
    tries = ["delete from trials", "create table sneaked (x int)"]
    if ledger.sqlite:
        tries += [f"vacuum into '{tmp_path / 'copy.sqlite'}'", f"attach database '{tmp_path / 'new.sqlite'}' as x"]
    for query in tries:
        with pytest.raises(Exception) as e:
            ledger.sql(query)
        assert not ledger.sqlite or "\n" not in str(e.value).strip(), query   # the CLI's line: test_scale_out
    assert not (tmp_path / "copy.sqlite").exists() and not (tmp_path / "new.sqlite").exists()
    assert ledger.sql("select count(*) from trials")[1] == [(0,)] and ledger.run("r") is not None
