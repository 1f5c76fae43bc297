"""Several workers on one run: real `agent run` and `agent worker` processes, a real PostgreSQL server
(or SQLite with several local writers), real git; the deterministic engine at the CLI's engine seam.

What must hold: every Optuna trial the study finished has exactly one ledger row and no row is
counted twice; a worker SIGKILLed mid-trial leaves its trial interrupted, recorded once, and the run
goes on; `agent doctor` finds the run consistent; branch names are unique; the database's password
appears in no log, no ledger row and no commit.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import psutil
import pytest
from postgres import PASSWORD

from agent import storage as storages
from agent.ledger import Ledger

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]
# `agent` with the deterministic engine at its engine seam (a test-only executable; its workers run it too).
AGENT = [sys.executable, str(ROOT / "tests" / "agent_with_seam_engine.py")]


@pytest.fixture
def postgres(postgres_server):
    """The session's PostgreSQL server (tests/conftest.py): one for the ledger suite and these."""
    return postgres_server


def env_for(home: Path, trial_s: float = 0.6) -> dict:
    return {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": str(trial_s), "AGENT_HEARTBEAT_S": "0.5",
            "PYTHONUNBUFFERED": "1"}


def agent(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([*AGENT, *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kw)


def start_run(home: Path, env: dict, *extra: str) -> subprocess.Popen:
    (home / "model").mkdir(parents=True, exist_ok=True)
    return agent("run", "--model", str(home / "model"), "--planner", "off", "--drift-every", "0", *extra, env=env)


def wait_until(check, timeout_s: float = 120, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s} s")


def the_run(ledger: Ledger):
    return wait_until(lambda: next(iter(ledger.runs()), None))


@dataclass
class Shared:
    """A coordinator on host "a" and a worker joining from host "b" (its own home, as on another
    machine), through one PostgreSQL database."""
    url: str
    home_a: Path
    home_b: Path
    env_a: dict
    run: subprocess.Popen
    joined: subprocess.Popen
    found: storages.Storage
    ledger: Ledger
    run_id: str


def share(postgres, tmp_path: Path, budget: str, trial_s: float = 0.6) -> Shared:
    url = postgres.new_database()
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    env_a, env_b = env_for(home_a, trial_s), env_for(home_b, trial_s)
    run = start_run(home_a, env_a, "--budget", budget, "--storage", url)
    found = storages.resolve(url, home_a)
    ledger = Ledger(found.ledger_url)
    run_id = the_run(ledger).id
    joined = agent("worker", "--run", run_id, env={**env_b, "AGENT_STORAGE": url})
    return Shared(url, home_a, home_b, {**env_a, "AGENT_STORAGE": url}, run, joined, found, ledger, run_id)


def consistent(ledger: Ledger, run_id: str, study_storage) -> list:
    """The properties every scale-out test checks; returns the run's trials."""
    trials = ledger.trials(run_id)
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)), "trial numbers repeat"
    told = [t.optuna_number for t in trials if t.optuna_number is not None]
    assert len(told) == len(set(told)), f"an Optuna trial has two ledger rows: {Counter(told).most_common(3)}"
    study = optuna.load_study(study_name=run_id, storage=study_storage)
    by_number = {t.optuna_number: t for t in trials if t.optuna_number is not None}
    for ft in study.get_trials(deepcopy=False):
        assert ft.state != optuna.trial.TrialState.RUNNING, f"Optuna trial {ft.number} still RUNNING"
        if ft.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED) and \
                ft.number not in by_number:
            # A point answered from an earlier identical one is told without a server: it must repeat one.
            assert any(t.params == ft.params for t in trials), f"Optuna trial {ft.number} has no ledger row"
    branches = [t.branch for t in trials if t.branch]
    assert len(branches) == len(set(branches))
    assert not [t for t in trials if t.status == "running"]
    return trials


def doctor(env: dict, run_id: str) -> str:
    done = subprocess.run([*AGENT, "doctor", "--run", run_id], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if "problem: " in line and "engine" not in line
             and "transformers" not in line and "disk" not in line and "GPU" not in line]
    assert not lines, done.stdout
    return done.stdout


def no_secret_anywhere(home: Path, ledger_text: str, repo: Path) -> None:
    assert PASSWORD not in ledger_text
    for path in home.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".jsonl", ".json", ".yaml"):
            assert PASSWORD not in path.read_text(errors="replace"), path
    log = subprocess.run(["git", "-C", str(repo), "log", "--all", "-p"], capture_output=True, text=True).stdout
    assert PASSWORD not in log


def test_two_hosts_share_one_run_through_postgresql(postgres, tmp_path):
    """The coordinator on one host, a worker joining from another (its own home, as on another machine):
    both run candidates from the one study, the coordinator alone commits, nothing lost or counted twice."""
    x = share(postgres, tmp_path, "75s")
    run, joined, ledger, run_id, found = x.run, x.joined, x.ledger, x.run_id, x.found
    # `agent status` on the joining host (no run lock there) reads the run from the database.
    wait_until(lambda: sum(1 for t in ledger.trials(run_id) if t.source == "sampler") >= 2)
    seen = subprocess.run([*AGENT, "status"], cwd=ROOT, capture_output=True, text=True,
                          env={**env_for(x.home_b), "AGENT_STORAGE": x.url}, timeout=120).stdout
    assert f"run {run_id} (running, agent run pid {run.pid}" in seen, seen
    assert "  coordinator " in seen and "  worker " in seen and "(cores " not in seen, seen
    if len(os.sched_getaffinity(0)) > 1:   # a CPU host with fewer cores is refused at once, not left to crash
        fewer = subprocess.run([*AGENT, "worker", "--run", run_id], cwd=ROOT,
                               env={**env_for(tmp_path / "c"), "AGENT_STORAGE": x.url}, capture_output=True,
                               text=True, timeout=120, preexec_fn=lambda: os.sched_setaffinity(0, {0}))
        assert fewer.returncode == 2 and "VLLM_CPU_OMP_THREADS_BIND: this host's choices" in fewer.stderr, fewer
    out_a, _ = run.communicate(timeout=300)
    out_b, _ = joined.communicate(timeout=120)
    assert run.returncode == 0, out_a
    assert joined.returncode == 0, out_b
    assert f"finished: run {run_id}" in out_a and "done:" in out_b
    trials = consistent(ledger, run_id, found.study())
    workers = {w.id: w for w in ledger.workers(run_id)}
    assert {t.worker_id for t in trials} == set(workers)   # every row says which process ran it
    assert sorted(w.role for w in workers.values()) == ["coordinator", "worker"]   # the refused host never joined
    assert all(w.status == "stopped" for w in workers.values())
    joiner = next(w for w in workers.values() if w.role == "worker")
    theirs = [t for t in trials if t.worker_id == joiner.id]
    # The joining worker measured the defaults on its own device first, then candidates from the study.
    assert theirs[0].source == "device" and theirs[0].status == "ok"
    assert sum(1 for t in theirs if t.source in ("planner", "sampler")) >= 5
    assert sum(1 for t in trials if t.source in ("planner", "sampler") and t.worker_id != joiner.id) >= 5
    assert all((x.home_b / run_id / f"trial-{t.number:03d}").is_dir() for t in theirs if t.status == "ok")
    # Their winners were put forward and decided by the coordinator: branches come only from it.
    assert not [t for t in trials if t.decision == "put_forward"]
    repo = x.home_a / "proposals"
    heads = subprocess.run(["git", "-C", str(repo), "branch", "--list", "agent/*"], capture_output=True,
                           text=True).stdout.split()
    assert sorted(heads) == sorted(t.branch for t in trials if t.branch) and heads
    assert not (x.home_b / "proposals").exists()   # the joining host never touches git
    # The defaults measured on both devices are all in the baseline (device spread is part of the noise).
    assert {t.worker_id for t in trials if t.source == "device"} == {joiner.id}
    # agent ledger sql stays read-only on PostgreSQL; its reads work.
    refused = subprocess.run([*AGENT, "ledger", "sql", "delete from trials"], cwd=ROOT,
                             env=x.env_a, capture_output=True, text=True)
    assert refused.returncode == 2 and "read-only" in refused.stderr.replace("\n", " "), refused.stderr
    sneaked = subprocess.run([*AGENT, "ledger", "sql", "commit; delete from trials"],
                             cwd=ROOT, env=x.env_a, capture_output=True, text=True)
    assert sneaked.returncode == 2 and "one statement at a time" in sneaked.stderr, sneaked.stderr
    assert len(ledger.trials(run_id)) == len(trials)
    counted = subprocess.run([*AGENT, "ledger", "sql", "select count(*) from trials"],
                             cwd=ROOT, env=x.env_a, capture_output=True, text=True)
    assert str(len(trials)) in counted.stdout
    doctor(x.env_a, run_id)
    ledger_text = subprocess.run([*AGENT, "ledger", "--json"], cwd=ROOT, env=x.env_a,
                                 capture_output=True, text=True).stdout
    no_secret_anywhere(tmp_path, ledger_text + out_a + out_b, repo)


def test_a_worker_killed_mid_trial_is_recorded_once_and_the_run_goes_on(postgres, tmp_path):
    x = share(postgres, tmp_path, "80s", trial_s=1.5)
    run, joined, ledger, run_id, found = x.run, x.joined, x.ledger, x.run_id, x.found
    me = wait_until(lambda: next((w for w in ledger.workers(run_id) if w.role == "worker"), None))

    def measuring():
        """A trial of that worker still running a moment after it was seen: being measured (1.5 s),
        not one a space rule skips as soon as its row is opened."""
        seen = next((t for t in ledger.trials(run_id, status="running")
                     if t.worker_id == me.id and t.optuna_number is not None), None)
        time.sleep(0.3)
        return seen if seen and ledger.trial(run_id, seen.number).status == "running" else None

    victim = wait_until(measuring)
    os.killpg(joined.pid, signal.SIGKILL)
    joined.wait()
    out_a, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out_a
    row = ledger.trial(run_id, victim.number)
    assert row.status == "interrupted" and "fell silent" in row.failure_message
    assert next(w for w in ledger.workers(run_id) if w.id == me.id).status == "lost"
    study = optuna.load_study(study_name=run_id, storage=found.study())
    assert study.trials[victim.optuna_number].state == optuna.trial.TrialState.FAIL
    # Recorded once: one row for it, one line saying so in the coordinator's events.
    trials = consistent(ledger, run_id, found.study())
    assert sum(1 for t in trials if t.optuna_number == victim.optuna_number) == 1
    events = (x.home_a / run_id / "events.jsonl").read_text()
    assert events.count(f"trial {victim.number}: interrupted") == 1
    after = [t for t in trials if t.number > victim.number and t.source in ("planner", "sampler")
             and t.status in ("ok", "failed", "pruned")]
    assert len(after) >= 3, "the run did not go on after the worker was killed"
    doctor(x.env_a, run_id)


def test_the_database_going_away_stops_workers_cleanly_with_a_resume_hint(postgres, tmp_path):
    x = share(postgres, tmp_path, "80s")
    run, joined, ledger, run_id, found = x.run, x.joined, x.ledger, x.run_id, x.found
    wait_until(lambda: sum(1 for t in ledger.trials(run_id) if t.source == "sampler") >= 4)
    ledger.engine.dispose()
    postgres.stop()
    try:
        out_b, _ = joined.communicate(timeout=120)
        out_a, _ = run.communicate(timeout=120)
    finally:
        postgres.start()
    assert joined.returncode == 1, out_b
    assert "went away" in out_b and f"agent worker --run {run_id} --storage URL" in out_b.replace("\n", " "), out_b
    assert PASSWORD not in out_b + out_a
    assert run.returncode == 1 and f"agent run --resume {run_id}" in out_a.replace("\n", " "), out_a
    # Nothing of either is left running, and the resumed run repairs what the outage left.
    for p in (run, joined):
        with pytest.raises(ProcessLookupError):
            os.killpg(p.pid, 0)
    resumed = subprocess.run([*AGENT, "run", "--resume", run_id], cwd=ROOT,
                             env=x.env_a, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    consistent(ledger, run_id, found.study())
    doctor(x.env_a, run_id)


def test_several_local_workers_share_sqlite(tmp_path):
    """--workers 2 on one host with the default SQLite files: a share of the cores each, its own ports
    and caches; the local writers wait for each other (WAL, busy timeout) and nothing is lost."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores for two workers")
    home = tmp_path / "home"
    env = env_for(home)
    run = start_run(home, env, "--budget", "60s", "--workers", "2")
    out, _ = run.communicate(timeout=300)
    assert run.returncode == 0, out
    ledger = Ledger(home / "ledger.sqlite")
    run_id = ledger.runs()[0].id
    trials = consistent(ledger, run_id, storages.resolve(None, home).study())
    workers = ledger.workers(run_id)
    assert len(workers) == 2 and len({w.device for w in workers}) == 2, [w.device for w in workers]
    by_worker = Counter(t.worker_id for t in trials if t.source in ("planner", "sampler"))
    assert len(by_worker) == 2 and min(by_worker.values()) >= 5, by_worker
    assert (home / run_id / "worker-1.log").exists()
    doctor(env, run_id)
    # The ledger opened read-only still refuses writes.
    with pytest.raises(sqlite3.OperationalError):
        ledger.sql("delete from trials")


def test_the_coordinator_killed_takes_its_local_workers_with_it(tmp_path):
    """SIGKILL of `agent run --workers 2`: its local worker notices within a heartbeat, ends its trial
    and records it; nothing is left running; the resume goes on to the deadline, consistent."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores for two workers")
    home = tmp_path / "home"
    env = env_for(home, trial_s=1.5)
    run = start_run(home, env, "--budget", "75s", "--workers", "2")
    ledger = Ledger(home / "ledger.sqlite")
    run_id = the_run(ledger).id
    helper = wait_until(lambda: next((w for w in ledger.workers(run_id) if w.role == "worker"), None))
    wait_until(lambda: next((t for t in ledger.trials(run_id, status="running")
                             if t.worker_id == helper.id and t.optuna_number is not None), None))
    os.killpg(run.pid, signal.SIGKILL)
    run.communicate()
    # The worker outlives its coordinator by a heartbeat or so, not more.
    wait_until(lambda: not psutil.pid_exists(helper.pid) or psutil.Process(helper.pid).status() == "zombie",
               timeout_s=30)
    row = wait_until(lambda: next(w for w in ledger.workers(run_id) if w.id == helper.id))
    assert row.status == "stopped", row.status
    assert not [t for t in ledger.trials(run_id, status="running") if t.worker_id == helper.id]
    resumed = subprocess.run([*AGENT, "run", "--resume", run_id], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    trials = consistent(ledger, run_id, storages.resolve(None, home).study())
    assert ledger.run(run_id).status == "finished"
    # The resumed run starts its workers again: the helper's slot ran candidates after the kill too.
    again = [w for w in ledger.workers(run_id) if w.role == "worker" and w.id != helper.id]
    assert again and any(t.worker_id == again[-1].id and t.source in ("planner", "sampler") for t in trials)
    doctor(env, run_id)
