"""A candidate measured but never gated, on a worker's path (issue 57 item 2): a real night of the
deterministic engine through the command line (real SQLite, real git, a real Optuna study), then one
of its candidates put back into the state a worker stopped at the deadline leaves it in: recorded,
not judged, its Optuna trial RUNNING. Before, the stopping worker told Optuna 0.0 with constraint
1.0 and nobody judged the row; now the worker judges it from its result first, and on a finished
run `agent doctor` names it and `agent run --resume` judges it, measuring nothing."""

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from agent.ledger import Ledger, Worker

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent
ROOT = HERE.parent


@pytest.fixture()
def night(tmp_path, embedded_model):
    home = tmp_path / "home"
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.02", "COLUMNS": "300"}
    done = seam_agent(env, "run", "--budget", "10m", "--model", str(embedded_model), "--max-trials", "8")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = Ledger(home / "ledger.sqlite").runs()
    return home, env, run.id


def seam_agent(env, *args):
    return subprocess.run([sys.executable, str(HERE / "agent_with_seam_engine.py"), *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def ungate(home: Path, run_id: str) -> tuple[int, str, float, int, int]:
    """One refused (or pruned) candidate made as a worker stopped between its record and its gate leaves
    it: no decision, held by a worker that is gone, its Optuna trial a fresh RUNNING one. Returns its
    number, the decision and ratio the night gave it, its new Optuna number and the worker's id."""
    ledger = Ledger(home / "ledger.sqlite")
    row = next(t for t in ledger.trials(run_id) if t.source in ("sampler", "planner") and t.status in ("ok", "pruned")
               and t.decision in ("refused", "pruned", "speed-only") and not t.branch)
    me = ledger.add(Worker(run_id=run_id, name="host-b/1", host="host-b", pid=1, slot=1, device="cores 1",
                           role="worker", status="lost"))
    study = optuna.load_study(study_name=run_id, storage=f"sqlite:///{home / 'optuna.sqlite'}")
    fresh = study.ask().number
    db = sqlite3.connect(home / "ledger.sqlite")
    db.execute("UPDATE trials SET decision = NULL, gate_passed = NULL, \"constraint\" = NULL, optuna_number = ?, "
               "worker_id = ? WHERE id = ?", (fresh, me.id, row.id))
    db.commit()
    db.close()
    return row.number, row.decision, row.claimed_ratio, fresh, me.id


def told(home: Path, run_id: str, number: int) -> optuna.trial.FrozenTrial:
    study = optuna.load_study(study_name=run_id, storage=f"sqlite:///{home / 'optuna.sqlite'}")
    return next(ft for ft in study.trials if ft.number == number)


def test_a_worker_stopped_between_record_and_gate_judges_its_row_before_it_tells_optuna(night):
    from fake_engine import FakeEngine

    from agent import part
    from agent.context import RunContext, Seams

    home, env, run_id = night
    number, decided, ratio, fresh, worker_id = ungate(home, run_id)
    ledger = Ledger(home / "ledger.sqlite")
    row, me = ledger.run(run_id), next(w for w in ledger.workers(run_id) if w.id == worker_id)
    ledger.update(row, status="running")   # the night still going, as at the deadline's SIGTERM
    os.environ["AGENT_HOME"] = str(home)
    try:
        settings, space = part.run_settings(row, home=home)
        stopping = part.Part(RunContext(row, settings, space, worker_id=me.id), Seams(ledger, FakeEngine()), me)
        part.interrupt_mine(ledger, row, me, home, "its worker was stopped", stopping)
    finally:
        os.environ.pop("AGENT_HOME")
    judged = next(t for t in Ledger(home / "ledger.sqlite").trials(run_id) if t.number == number)
    assert judged.decision == decided and judged.claimed_ratio == pytest.approx(ratio)
    ft = told(home, run_id, fresh)
    assert ft.state != optuna.trial.TrialState.RUNNING
    assert (ft.value if ft.state == optuna.trial.TrialState.COMPLETE else ft.intermediate_values[0]) == \
        pytest.approx(judged.claimed_ratio) and ft.system_attrs["constraints"] == [judged.constraint]


def test_a_finished_runs_ungated_row_is_named_by_doctor_and_judged_by_its_resume_measuring_nothing(night):
    home, env, run_id = night
    number, decided, ratio, fresh, _ = ungate(home, run_id)
    doctor = subprocess.run([sys.executable, "-m", "agent.cli", "doctor"], env=env, capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert doctor.returncode == 1
    status = "pruned" if decided == "pruned" else "ok"
    assert (f"trial {number}: measured ({status}) but never judged by the gate: `agent run --resume {run_id}` "
            f"judges it from its recorded result and measures nothing (the run is finished)") in doctor.stdout, \
        doctor.stdout
    trials_before = len(Ledger(home / "ledger.sqlite").trials(run_id))
    resumed = seam_agent({**env, "AGENT_TEST_SPECS": str(home / "specs.jsonl")}, "run", "--resume", run_id)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"trial {number}: judged from its recorded result: {decided}" in resumed.stderr
    assert not (home / "specs.jsonl").exists()   # no server of any config was asked for
    after = Ledger(home / "ledger.sqlite")
    judged = next(t for t in after.trials(run_id) if t.number == number)
    assert len(after.trials(run_id)) == trials_before and after.run(run_id).status == "finished"
    assert judged.decision == decided and judged.claimed_ratio == pytest.approx(ratio)
    assert told(home, run_id, fresh).state != optuna.trial.TrialState.RUNNING
    doctor = subprocess.run([sys.executable, "-m", "agent.cli", "doctor"], env=env, capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert doctor.returncode == 0 and "consistent" in doctor.stdout, doctor.stdout
