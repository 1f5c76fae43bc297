"""Heartbeats across hosts: written and aged on the database's clock, so a host whose own clock is
off by twice the grace neither buries a live worker nor takes a live coordinator's run; the other-host
paths (no pid to look at, no local processes to end) run with a second hostname."""

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent import crew, recovery
from agent.ledger import Ledger, Worker

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent


class Skewed(datetime):
    """This host's clock, twice the grace ahead of the database's (and of the other host's)."""

    @classmethod
    def now(cls, tz=None):
        return datetime.now(tz) + timedelta(seconds=2 * crew.grace_s())


def test_a_host_whose_clock_is_off_by_twice_the_grace_buries_nothing_live_and_takes_no_live_run(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    assert subprocess.run([sys.executable, str(HERE / "crash_run.py"), str(tmp_path), "s", "4"],
                          capture_output=True, timeout=120).returncode == 0
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run = ledger.update(ledger.run("s"), status="running", finished_at=None)   # going, on host b
    fresh = ledger.now()
    # Host "b": its coordinator and a worker, alive, their heartbeats just written on the database's clock.
    boss = ledger.add(Worker(run_id="s", name="host-b/0", host="host-b", pid=1, slot=0, device="cpu",
                             role="coordinator", heartbeat_at=fresh))
    helper = ledger.add(Worker(run_id="s", name="host-b/1", host="host-b", pid=1, slot=1, device="cpu",
                               role="worker", heartbeat_at=fresh))
    monkeypatch.setattr(crew, "datetime", Skewed)   # this host ("a") reads its own clock wrong
    assert crew.bury(ledger, run, None, tmp_path, lambda *a, **k: None) == []
    assert {w.id: w.status for w in ledger.workers("s")}[helper.id] == "running"
    assert recovery.worker_problems(ledger, run, ledger.trials("s")) == []
    result = CliRunner().invoke(__import__("agent.cli", fromlist=["app"]).app, ["run", "--resume", "s"])
    said = " ".join(result.stderr.split())
    assert result.exit_code == 1 and "is going: its coordinator, pid 1 on host-b" in said, said
    # Silent for real (its last heartbeat three graces old on the database's clock): buried once, by whoever
    # notices first; another host's trial processes are not this host's to end.
    old = (datetime.fromisoformat(fresh) - timedelta(seconds=3 * crew.grace_s())).isoformat(timespec="seconds")
    ledger.update(next(w for w in ledger.workers("s") if w.id == helper.id), heartbeat_at=old)
    lines = crew.bury(ledger, run, None, tmp_path, lambda *a, **k: None)
    assert lines == [f"worker host-b/1 (cpu) lost: no heartbeat since {old}"]
    assert crew.bury(ledger, run, None, tmp_path, lambda *a, **k: None) == []
    assert {w.id: w.status for w in ledger.workers("s")}[boss.id] == "running"   # a coordinator is never buried


def test_the_claim_a_resume_makes_on_a_silent_coordinators_heartbeat_has_one_winner(tmp_path):
    """Two resumes read the same silent coordinator row: the first claim on its heartbeat wins, the second
    finds it taken (agent.part.reopen refuses then; before, both passed the age check)."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert subprocess.run([sys.executable, str(HERE / "crash_run.py"), str(tmp_path), "s", "4"],
                          capture_output=True, timeout=120).returncode == 0
    old = (datetime.now(UTC) - timedelta(hours=1)).isoformat(timespec="seconds")
    gone = ledger.add(Worker(run_id="s", name="host-b/0", host="host-b", pid=1, slot=0, device="cpu",
                             role="coordinator", heartbeat_at=old))
    assert crew.coordinator(ledger.workers("s"), ledger.now()) is None
    first = ledger.claim(Worker, gone.id, {"status": "running", "heartbeat_at": old}, status="lost")
    second = ledger.claim(Worker, gone.id, {"status": "running", "heartbeat_at": old}, status="lost")
    assert (first, second) == (True, False)


def test_of_two_hosts_resuming_a_cleanly_stopped_run_at_once_one_goes_on(tmp_path, monkeypatch):
    """A run stopped cleanly has no running coordinator row to claim: both hosts pass the heartbeat
    check. The run's owner is swapped only where it still reads what the resume read, so the host whose
    read came before the other's swap is refused (before, both went on)."""

    from agent import part
    from agent.request import RunError

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    assert subprocess.run([sys.executable, str(HERE / "crash_run.py"), str(tmp_path), "s", "4"],
                          capture_output=True, timeout=120).returncode == 0
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.update(ledger.run("s"), status="stopped")
    assert not [w for w in ledger.workers("s") if w.status == "running"]
    read_by_b = ledger.run("s")                    # host b reads the run ...
    taken = part.reopen(ledger, "s")               # ... host a resumes it meanwhile ...
    assert taken.status == "running"
    monkeypatch.setattr(ledger, "run", lambda run_id: read_by_b)   # ... and host b goes on from its read
    with pytest.raises(RunError) as refused:
        part.reopen(ledger, "s")
    assert refused.value.code == 1
    assert Ledger(tmp_path / "ledger.sqlite").run("s").owner == taken.owner
