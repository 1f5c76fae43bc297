"""Crash consistency: the agent SIGKILLed at random moments, resumed, and found consistent.

The agent here is the real loop, ledger, study and git in a child process (tests/crash_run.py)
with the deterministic engine at the worker seam, so a kill can land anywhere: inside SQLite
writes, between a branch and its ledger row, between a ledger row and Optuna's tell.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from agent import gitops, recovery
from agent import study as studies
from agent.ledger import Ledger, Run, Trial, Worker
from sandbox.result import failed

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent


def start(home, run_id, seconds, kill_at=None):
    env = {k: v for k, v in os.environ.items() if k != "KILL_AT"}
    if kill_at:
        env["KILL_AT"] = kill_at
    return subprocess.Popen([sys.executable, str(HERE / "crash_run.py"), str(home), run_id, str(seconds)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


# What the resume after a kill in each window must say it repaired (tests/crash_run.py names them).
REPAIRED = {"baseline": "in flight at the crash, recorded as interrupted",
            "candidate": "in flight at the crash, recorded as interrupted",
            "heldout": "stopped during its held-out decision, put forward to be decided again",
            "judge": "measured but not judged at the crash: judged from its recorded result after the resume",
            "accepted": "accepted but not branched at the crash: branched after the resume",
            "branch": "branch created just before the crash, recorded in the ledger",
            "tell": "told its result"}


@pytest.mark.parametrize("seed", [1])   # 2 passed as well (46 s each); one holds CI's time
def test_sigkill_in_every_window_of_a_seeded_schedule_then_resume_ends_on_the_deadline_consistent(tmp_path, seed):
    """Seven SIGKILLs, one in each named window, in an order and at occurrences drawn from the seed
    (the defaults first: they are measured once; the first acceptance and its branch next: later
    candidates may all be dominated), each resumed by the same command; the last process runs to
    the deadline."""
    rng = random.Random(seed)
    later = ["candidate", "heldout", "tell", "judge"]
    rng.shuffle(later)
    schedule = [("baseline", rng.randint(1, 2)), ("accepted", 1), ("branch", 1),
                *((w, rng.randint(1, 3)) for w in later)]
    outputs = []
    for window, k in [*schedule, (None, 0)]:   # the last process resumes and runs to the deadline
        proc = start(tmp_path, "crash", 60, kill_at=f"{window}:{k}" if window else None)
        try:
            out, _ = proc.communicate(timeout=180)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == (-signal.SIGKILL if window else 0), f"{window}:{k} was never reached:\n{out[-2000:]}"
        outputs.append(out)
    # Every kill hit its window, in the schedule's order, and each resume repaired what that window left.
    assert (tmp_path / "kills.txt").read_text().split() == [w for w, _ in schedule]
    for (window, _), resumed in zip(schedule, outputs[1:], strict=False):
        assert REPAIRED[window] in resumed, (window, resumed[-2000:])
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run = ledger.run("crash")
    repo = gitops.open_repo(tmp_path / "proposals")
    storage = f"sqlite:///{tmp_path / 'optuna.sqlite'}"
    assert recovery.problems(ledger, run, storage, repo) == []
    assert run.status == "finished"
    assert datetime.fromisoformat(run.finished_at) <= datetime.fromisoformat(run.deadline_at) + timedelta(seconds=5)
    trials = ledger.trials("crash")
    assert [t.number for t in trials] == list(range(len(trials)))   # none lost, none counted twice
    # Before the A/A: the instance cut by the first kill stays interrupted, and two count, measured once;
    # any later instance of the defaults is one the gate asked for, and says so.
    aa = next(t.number for t in trials if t.source == "aa")
    before = [t.status for t in trials if t.source == "baseline" and t.number < aa]
    assert sorted(before) == ["interrupted", "ok", "ok"]
    assert all(t.rationale.startswith("more instances of the defaults") for t in trials
               if t.source == "baseline" and t.number > aa)
    assert sum(t.status == "interrupted" for t in trials) >= 2      # the defaults' and a candidate's
    assert all(t.status in ("ok", "failed", "skipped", "interrupted", "pruned") for t in trials)
    assert sorted(t.branch for t in trials if t.branch) == gitops.branches(repo)
    # The candidate cut inside its held-out decision was not lost: the resume decided it again.
    said = outputs[1 + [w for w, _ in schedule].index("heldout")]
    number = int(re.search(r"trial (\d+): stopped during its held-out decision", said).group(1))
    assert trials[number].decision in ("accepted", "refused", "dominated"), trials[number].decision
    # Window 1: the candidate cut between its record and its gate was judged from its result, not lost.
    said = outputs[1 + [w for w, _ in schedule].index("judge")]
    number = int(re.search(r"trial (\d+): measured but not judged at the crash", said).group(1))
    assert trials[number].status in ("ok", "pruned") and trials[number].decision is not None
    assert trials[number].decision != "failed" and trials[number].constraint is not None
    # Window 2: the candidate accepted just before the kill has its branch.
    said = outputs[1 + [w for w, _ in schedule].index("accepted")]
    number = int(re.search(r"trial (\d+): accepted but not branched at the crash", said).group(1))
    assert trials[number].decision == "accepted" and trials[number].branch == f"agent/crash/{number}"


def test_a_candidate_cut_between_its_record_and_its_gate_gets_the_decision_an_uncut_run_gives_it(tmp_path):
    """Window 1: SIGKILLed after its figures were recorded and before the gate's verdict was, the first
    candidate is judged on resume from the result its worker wrote, and reaches the decision (and the
    Optuna value) the same seed's uncut run reaches for it; before, it stayed `ok` with no decision and
    Optuna was told 0.0, infeasible."""
    cut_home, whole_home = tmp_path / "cut", tmp_path / "whole"
    whole = start(whole_home, "r", 20)
    cut = start(cut_home, "r", 20, kill_at="judge:1")
    try:
        cut_out, _ = cut.communicate(timeout=180)
        assert cut.returncode == -signal.SIGKILL, cut_out[-2000:]
        resumed = start(cut_home, "r", 20)
        resumed_out, _ = resumed.communicate(timeout=180)
        whole_out, _ = whole.communicate(timeout=180)
    finally:
        for p in (whole, cut):
            p.kill()
            p.wait()
    assert resumed.returncode == 0 and whole.returncode == 0, (resumed_out[-2000:], whole_out[-2000:])
    number = int(re.search(r"trial (\d+): measured but not judged at the crash", resumed_out).group(1))
    mine = Ledger(cut_home / "ledger.sqlite").trials("r")[number]
    theirs = Ledger(whole_home / "ledger.sqlite").trials("r")[number]
    assert mine.params == theirs.params and mine.figure == theirs.figure
    assert (mine.decision, mine.gate_passed, mine.search_ratio, mine.constraint) == \
        (theirs.decision, theirs.gate_passed, theirs.search_ratio, theirs.constraint)
    told = {ft.number: ft for ft in optuna.load_study(study_name="r", storage=f"sqlite:///{cut_home / 'optuna.sqlite'}")
            .get_trials()}[mine.optuna_number]
    value = told.value if told.value is not None else told.intermediate_values[0]   # PRUNED: its partial ratio
    assert told.state.name in ("COMPLETE", "PRUNED") and value == pytest.approx(studies.told(mine)[0])
    assert told.user_attrs["constraint"] == [mine.constraint]


def test_a_candidate_cut_before_its_gate_whose_result_is_gone_is_measured_again(tmp_path):
    """Window 1 with the worker's result.json removed: the candidate counts as cut in flight (interrupted,
    its Optuna trial FAIL) and the same point is measured again, not judged from nothing."""
    proc = start(tmp_path, "g", 15, kill_at="judge:1")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, out[-2000:]
    cut = next(t for t in Ledger(tmp_path / "ledger.sqlite").trials("g") if t.source in ("planner", "sampler"))
    (Path(cut.log_path).parent / "result.json").unlink()
    proc = start(tmp_path, "g", 15)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-2000:]
    trials = Ledger(tmp_path / "ledger.sqlite").trials("g")
    row = trials[cut.number]
    assert row.status == "interrupted" and "its result cannot be read" in row.failure_message, row.failure_message
    again = [t for t in trials if t.number > cut.number and t.params == cut.params]
    assert again and again[0].status in ("ok", "pruned") and again[0].decision is not None
    study = optuna.load_study(study_name="g", storage=f"sqlite:///{tmp_path / 'optuna.sqlite'}")
    assert {ft.number: ft.state.name for ft in study.get_trials()}[cut.optuna_number] == "FAIL"


def test_repair_puts_each_crash_state_back_in_agreement(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    repo = gitops.open_repo(tmp_path / "proposals", create=True)
    storage = f"sqlite:///{tmp_path / 'optuna.sqlite'}"
    run = ledger.add(Run(id="r", deadline_at="2100-01-01T00:00:00+00:00", model="m", space_path="s",
                         space_hash="h", workload="smoke", repo=str(repo.working_dir), settings={}))
    study = optuna.create_study(study_name="r", storage=storage, direction="maximize")
    in_flight = study.ask()
    ledger.add(Trial(run_id="r", number=0, source="sampler", optuna_number=in_flight.number, status="running"))
    # A branch created just before the crash, its row not yet naming it.
    done = study.ask()
    ledger.add(Trial(run_id="r", number=1, source="sampler", optuna_number=done.number, status="ok", figure=2.0,
                     gate_passed=True, search_ratio=2.0, constraint=0.0, decision="accepted"))
    sha = gitops.commit_branch(repo, "agent/r/1", {"a.txt": ("x", False)}, "trial 1\n\nAgent-Run: r\nAgent-Trial: 1\n")
    # A config that passed on search prompts and was killed during its re-check.
    ledger.add(Trial(run_id="r", number=2, source="planner", status="ok", gate_passed=None,
                     decision="awaiting_recheck", gate_reasons=["passed on the search prompts"]))
    # A ref lock git left when it was killed under our prefix.
    lock = Path(repo.git_dir) / "refs" / "heads" / "agent" / "r" / "3.lock"
    lock.write_text("")
    ledger.update(run, status="stopped")
    before = recovery.problems(ledger, ledger.run("r"), storage, repo)
    assert any("still 'running'" in p for p in before) and any("no ledger row names it" in p for p in before)

    fixed = recovery.repair(ledger, ledger.run("r"), storage, repo)
    assert len(fixed) == 6 and not lock.exists()
    rows = {t.number: t for t in ledger.trials("r")}
    assert rows[0].status == "interrupted" and rows[1].branch == "agent/r/1" and rows[1].commit == sha
    # Not lost: put forward, so the resumed coordinator decides it (a crash costs no candidate).
    assert rows[2].gate_passed is None and rows[2].decision == "put_forward"
    assert "decided again after the resume" in rows[2].gate_reasons[-1]
    told = {t.number: t for t in study.get_trials()}
    assert told[in_flight.number].state == optuna.trial.TrialState.FAIL
    # Optuna is told the constraint the loop stored in the ledger (through the sampler's constraints
    # function, as the loop's own tells are), not one re-derived from the reasons.
    assert told[done.number].value == 2.0 and told[done.number].system_attrs["constraints"] == [0.0]
    assert recovery.problems(ledger, ledger.run("r"), storage, repo) == []


def test_a_study_lost_or_told_otherwise_is_rebuilt_from_the_ledger_and_the_run_goes_on(tmp_path):
    """The ledger is the record and the study is derived from it: a study deleted, or one whose
    values were changed behind the agent's back, is made again from the ledger by the repair, under
    the same numbers, with the values and constraints the rows say; the resumed search goes on."""
    from fake_engine import FakeEngine

    from agent import space as spaces
    from agent.context import RunContext, Seams, Settings
    from agent.loop import run_search

    ledger, space = Ledger(tmp_path / "l.sqlite"), spaces.load("vllm-cpu")
    storage, repo = f"sqlite:///{tmp_path / 'o.sqlite'}", gitops.open_repo(tmp_path / "p", create=True)
    run = ledger.add(Run(id="x", deadline_at=(datetime.now() + timedelta(hours=1)).astimezone().isoformat(),
                         model="m", space_path=space.path, space_hash=space.hash, workload="smoke", repo="",
                         settings={"home": str(tmp_path)}))
    settings = Settings(model="m", workload="smoke", max_trials=5, facts={"cpus": 2, "concurrency": 1})
    run_search(RunContext(run, settings, space), Seams(ledger, FakeEngine(), repo), storage)
    rows = [t for t in ledger.trials("x") if t.optuna_number is not None]

    def held() -> dict:
        return {ft.number: (ft.state.name, ft.value, ft.system_attrs.get("constraints"), ft.params)
                for ft in studies.read("x", storage).get_trials() if ft.number in {t.optuna_number for t in rows}}

    want = held()
    assert len(want) == len(rows) >= 5 and any(v[0] == "COMPLETE" and v[1] > 1 for v in want.values())
    optuna.delete_study(study_name="x", storage=storage)
    assert any("missing" in p for p in recovery.problems(ledger, ledger.run("x"), storage, repo))
    assert any("rebuilt from the ledger" in line for line in recovery.repair(ledger, ledger.run("x"), storage, repo))
    assert held() == want and recovery.problems(ledger, ledger.run("x"), storage, repo) == []

    best = max(rows, key=lambda t: t.claimed_ratio)
    import sqlite3
    db = sqlite3.connect(tmp_path / "o.sqlite")
    db.execute("UPDATE trial_values SET value = 0.01 WHERE trial_id = (SELECT trial_id FROM trials WHERE number = ?)",
               (best.optuna_number,))
    db.commit()
    db.close()
    (found,) = recovery.problems(ledger, ledger.run("x"), storage, repo)
    assert f"trial {best.number}: the study holds 0.01" in found
    recovery.repair(ledger, ledger.run("x"), storage, repo)
    assert held() == want and recovery.problems(ledger, ledger.run("x"), storage, repo) == []
    settings.max_trials = 7   # the resumed search asks the rebuilt study for more
    run_search(RunContext(ledger.update(ledger.run("x"), status="running"), settings, space),
               Seams(ledger, FakeEngine(), repo), storage)
    numbers = [t.optuna_number for t in ledger.trials("x") if t.optuna_number is not None]
    assert len(numbers) > len(rows) and len(set(numbers)) == len(numbers)
    assert recovery.problems(ledger, ledger.run("x"), storage, repo) == []


def test_a_worker_stopped_between_its_record_and_its_tell_tells_optuna_what_the_loop_would(tmp_path, monkeypatch):
    """The stop path (a worker stopped by a signal after recording a trial, before telling Optuna):
    each finished row is told its value, its constraint and, when pruned, its partial ratio, exactly
    as the loop tells a twin it measured itself. Before, the study was loaded without the run's
    sampler: TPE got no constraint and ranked the trial below every other (Optuna: "does not have
    constraint values"), and a pruned one had no intermediate value."""
    from agent import part
    from agent import study as studies

    storage = f"sqlite:///{tmp_path / 'optuna.sqlite'}"
    monkeypatch.setattr(part, "study_storage", lambda: storage)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    run = ledger.add(Run(id="r", deadline_at="2100-01-01T00:00:00+00:00", model="m", space_path="s",
                         space_hash="h", workload="smoke", repo="", settings={}))
    me = ledger.add(Worker(run_id="r", name="h/1", host="h", pid=os.getpid(), slot=1, device="cores 1", role="worker"))
    study = studies.open("r", storage, seed=0)
    recorded = [dict(status="ok", search_ratio=1.42, constraint=0.0, decision="put_forward", gate_passed=True),
                dict(status="pruned", search_ratio=0.61, constraint=0.0, decision="pruned", gate_passed=False),
                dict(status="failed", failure_class="oom", constraint=1.0, decision="failed")]   # gated, not told
    twins = {}
    for n, fields in enumerate(recorded):
        stopped, twin = study.ask(), study.ask()
        row = ledger.add(Trial(run_id="r", number=n, source="sampler", optuna_number=stopped.number,
                               worker_id=me.id, **fields))
        studies.tell(study, twin, *studies.told(row), pruned=row.status == "pruned")   # the loop's own tell
        twins[stopped.number] = twin.number
    part.interrupt_mine(ledger, run, me, tmp_path, "its worker was stopped")
    trials = {ft.number: ft for ft in optuna.load_study(study_name="r", storage=storage).trials}
    for number, twin in twins.items():
        got, want = trials[number], trials[twin]
        assert (got.state, got.value, got.intermediate_values, got.user_attrs, got.system_attrs.get("constraints")) == \
               (want.state, want.value, want.intermediate_values, want.user_attrs, want.system_attrs.get("constraints"))
        assert got.system_attrs.get("constraints") in ([0.0], [1.0])
    assert [trials[n].state for n in twins] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
                                                optuna.trial.TrialState.COMPLETE]
    assert trials[list(twins)[1]].intermediate_values == {0: 0.61}


def test_a_second_run_on_the_same_ledger_is_refused_at_once(tmp_path, monkeypatch):
    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    with recovery.run_lock(tmp_path):
        result = CliRunner().invoke(app, ["run", "--budget", "1m"])
    assert result.exit_code == 1 and "one agent run per ledger" in result.stderr
    assert "pid" in result.stderr
    assert not (tmp_path / "ledger.sqlite").exists() or Ledger(tmp_path / "ledger.sqlite").runs() == []


def test_doctor_holds_the_run_lock_as_the_doctor_and_a_run_refused_then_is_told_so(tmp_path, monkeypatch):
    """`agent doctor` takes the run lock for the moment it looks for stray trial processes. Before, it
    wrote "agent run, pid <doctor>" in it: an `agent run` started then was refused naming the doctor's
    pid as a run, and `agent status` read a run going."""
    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    proc = start(tmp_path, "checked", 4)
    assert proc.wait(timeout=120) == 0
    seen = []

    def strays(run_dir):   # called with the lock held: what a run starting now would meet
        try:
            with recovery.run_lock(tmp_path):
                seen.append("not held")
        except recovery.Busy as e:
            seen.append(str(e))
        seen.append(recovery.lock_holder(tmp_path))
        return []

    monkeypatch.setattr(recovery, "stray_servers", strays)
    result = CliRunner().invoke(app, ["doctor", "--run", "checked"])
    assert result.exit_code == 0, result.stdout
    busy, holder = seen
    assert f"is held by agent doctor (checking for stray trial processes; it lets go in seconds), pid {os.getpid()}" \
        in busy and "agent run, pid" not in busy
    assert holder is None   # `agent status` and the doctor's own check read no run going


def test_resume_refuses_unknown_and_finished_runs_an_edited_space_and_doctor_reports(tmp_path, monkeypatch):
    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    runner = CliRunner()
    result = runner.invoke(app, ["run", "--resume", "nope"])
    assert result.exit_code == 2 and "no run 'nope'" in result.stderr
    proc = start(tmp_path, "done", 6)
    assert proc.wait(timeout=120) == 0
    result = runner.invoke(app, ["run", "--resume", "done"])
    assert result.exit_code == 2 and "already finished" in result.stderr
    result = runner.invoke(app, ["doctor", "--run", "done"])
    assert result.exit_code == 0 and "consistent" in result.stdout
    ledger = Ledger(tmp_path / "ledger.sqlite")
    accepted = next(t for t in ledger.trials("done") if t.branch)
    ledger.transition(accepted, commit="0" * 40)   # the ledger and git disagree
    result = runner.invoke(app, ["doctor", "--run", "done"])
    assert result.exit_code == 1 and f"trial {accepted.number}: the ledger names" in result.stdout
    # A stopped run whose space file (the user's own --space copy) was edited since it started.
    edited = tmp_path / "my-space.yaml"
    edited.write_text((Path(ledger.run("done").space_path)).read_text())
    ledger.update(ledger.run("done"), status="stopped", space_path=str(edited))
    edited.write_text(edited.read_text().replace("high: 256", "high: 512", 1))
    result = runner.invoke(app, ["run", "--resume", "done"])
    assert result.exit_code == 2 and f"{edited} changed since run done started" in result.stderr
    assert result.stderr.strip().count("\n") == 0 and ledger.run("done").status == "stopped"


def test_doctor_finds_a_trial_server_that_outlived_its_trial(tmp_path, monkeypatch):
    import json

    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    proc = start(tmp_path, "s", 4)
    assert proc.wait(timeout=120) == 0
    stray = subprocess.Popen(["sleep", "60"], env={"AGENT_TRIAL_TOKEN": "t0k", "PATH": os.environ["PATH"]},
                             start_new_session=True)
    try:
        (tmp_path / "s" / "trial-000").mkdir(parents=True, exist_ok=True)
        (tmp_path / "s" / "trial-000" / "progress.json").write_text(json.dumps({"server_pid": stray.pid,
                                                                                "token": "t0k"}))
        result = CliRunner().invoke(app, ["doctor", "--run", "s"])
        assert result.exit_code == 1 and f"process {stray.pid} of trial-000 is still running" in result.stdout
    finally:
        stray.kill()
        stray.wait()
    assert CliRunner().invoke(app, ["doctor", "--run", "s"]).exit_code == 0


class DiskFullLedger(Ledger):
    """Every write after the n-th fails as SQLite does when the disk is full (row claims, transitions,
    results and updates: every way a trial's figures and its gate's verdict are written); `gate_write` becomes
    the number of the
    first write of a gate's verdict (judging.judge), for a test to fill the disk exactly there."""

    def __init__(self, path, n):
        super().__init__(path)
        self.writes, self.n, self.gate_write = 0, n, None

    def _fail_past_n(self):
        import inspect
        import sqlite3

        from sqlalchemy.exc import OperationalError

        self.writes += 1
        if self.gate_write is None and any(f.function == "judge" for f in inspect.stack()[2:7]):
            self.gate_write = self.writes
        if self.writes > self.n:
            raise OperationalError("UPDATE trials", {}, sqlite3.OperationalError("database or disk is full"))

    def _write(self, row, values):
        self._fail_past_n()
        return super()._write(row, values)

    def transition(self, row, **values):
        self._fail_past_n()
        return super().transition(row, **values)

    def record_result(self, row, repeats, **values):
        self._fail_past_n()
        return super().record_result(row, repeats, **values)

    def claim(self, model, id_, expect, **values):
        self._fail_past_n()
        return super().claim(model, id_, expect, **values)


def run_agent(home, *args, file_limit=None):
    """A real `agent` process (the deterministic engine at its seam), every file it writes bounded to
    file_limit bytes as a full disk bounds it: past it a write fails (EFBIG; Python ignores SIGXFSZ)."""
    import resource

    def bound():
        if file_limit:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.05", "COLUMNS": "300"}
    return subprocess.run([sys.executable, str(HERE / "agent_with_seam_engine.py"), *args], env=env, cwd=HERE.parent,
                          capture_output=True, text=True, timeout=300, preexec_fn=bound)


@pytest.mark.parametrize("where", ["opening the ledger", "in the search"])
def test_a_real_full_disk_ends_agent_run_with_one_line_and_the_next_command_goes_on(tmp_path, embedded_model, where):
    """`agent run` whose files cannot grow past a limit (the ledger's write-ahead log fills first): 40 kB
    fills it while the ledger opens; in the search, the smallest of a few larger limits that stops the
    run after a candidate was measured (where the disk fills moves with what a run writes). It exits 1
    with one error line naming what could not be written and what to run next, never a traceback;
    with the space back, the resume (or the run again, where no run's row was written) finishes and
    `agent doctor` finds ledger, study and branches agreeing."""
    import shutil

    home = tmp_path / "home"
    for limit in ([40_000] if where == "opening the ledger" else [130_000, 170_000, 220_000, 280_000, 360_000]):
        shutil.rmtree(home, ignore_errors=True)
        cut = run_agent(home, "run", "--budget", "60s", "--model", str(embedded_model), "--max-trials", "4",
                        file_limit=limit)
        runs = Ledger(home / "ledger.sqlite").runs() if cut.returncode == 1 else []
        if where == "opening the ledger" or (runs and [t for t in Ledger(home / "ledger.sqlite").trials(runs[0].id)
                                                   if t.figure and t.source in ("planner", "sampler")]):
            break
    lines = cut.stderr.strip().splitlines()
    assert cut.returncode == 1 and "Traceback" not in cut.stderr and "╭" not in cut.stderr, cut.stderr[-3000:]
    assert lines[-1].startswith("error: the ledger") and "could not be written (" in lines[-1], lines[-1]
    assert sum(line.startswith("error:") for line in lines) == 1
    runs = Ledger(home / "ledger.sqlite").runs()
    if where == "opening the ledger":
        assert runs == [] and lines[-1].endswith("then run the command again")
        again = run_agent(home, "run", "--budget", "60s", "--model", str(embedded_model), "--max-trials", "4")
    else:
        (run,) = runs
        measured = [t for t in Ledger(home / "ledger.sqlite").trials(run.id)
                    if t.figure and t.source in ("planner", "sampler")]
        assert measured and lines[-1].endswith(f"then: agent run --resume {run.id}"), (limit, measured, lines[-1])
        again = run_agent(home, "run", "--resume", run.id)
    assert again.returncode == 0, again.stderr[-3000:]
    (run,) = Ledger(home / "ledger.sqlite").runs()
    trials = Ledger(home / "ledger.sqlite").trials(run.id)
    assert run.status == "finished" and [t.number for t in trials] == list(range(len(trials)))
    doctor = run_agent(home, "doctor", "--run", run.id)
    assert doctor.returncode == 0 and "consistent: ledger, study and branches agree" in doctor.stdout, doctor.stdout


@pytest.mark.parametrize("at", ["gate", "later"])
def test_a_full_disk_stops_the_run_and_a_resume_after_freeing_it_ends_consistent(tmp_path, at):
    """The disk fills at the gate's first verdict (window 1: the candidate's figures written, its verdict
    not), or some writes later; after space is freed the resume judges what was cut and ends with
    no disagreement (agent doctor's check) and every candidate decided."""

    from fake_engine import FakeEngine
    from sqlalchemy.exc import OperationalError

    from agent import space as spaces
    from agent.context import RunContext, Seams, Settings
    from agent.loop import run_search

    space = spaces.load("vllm-cpu")
    settings = Settings(model="m", workload="smoke", facts={"cpus": 2, "concurrency": 1})
    probe = DiskFullLedger(tmp_path / "probe.sqlite", n=10**6)   # where the gate's first write falls
    probe_run = probe.add(Run(id="d", deadline_at=(datetime.now(UTC) + timedelta(seconds=3)).isoformat(),
                              model="m", space_path=space.path, space_hash=space.hash, workload="smoke",
                              repo="", settings={"home": str(tmp_path / "probe")}))
    run_search(RunContext(probe_run, settings, space), Seams(probe, FakeEngine(), gitops.open_repo(
        tmp_path / "probe-p", create=True)), f"sqlite:///{tmp_path / 'probe-o.sqlite'}")
    n = probe.gate_write - 1 if at == "gate" else probe.gate_write + 5
    repo = gitops.open_repo(tmp_path / "p", create=True)
    storage = f"sqlite:///{tmp_path / 'o.sqlite'}"
    full = DiskFullLedger(tmp_path / "ledger.sqlite", n=n)
    deadline = (datetime.now(UTC) + timedelta(seconds=6)).isoformat()
    run = full.add(Run(id="d", deadline_at=deadline, model="m", space_path=space.path, space_hash=space.hash,
                       workload="smoke", repo=str(repo.working_dir), settings={"home": str(tmp_path)}))
    with pytest.raises(OperationalError, match="disk is full"):
        run_search(RunContext(run, settings, space), Seams(full, FakeEngine(), repo), storage)
    ledger = Ledger(tmp_path / "ledger.sqlite")   # space freed: the same file, written normally again
    cut = [t.number for t in ledger.trials("d") if t.source in ("planner", "sampler") and t.status == "ok"
           and t.decision is None]
    assert bool(cut) == (at == "gate"), [(t.number, t.status, t.decision) for t in ledger.trials("d")]
    said = recovery.repair(ledger, ledger.run("d"), storage, repo)
    assert all(f"trial {number}: measured but not judged at the crash" in " ".join(said) for number in cut)
    run_search(RunContext(ledger.run("d"), settings, space), Seams(ledger, FakeEngine(), repo), storage)
    assert recovery.problems(ledger, ledger.run("d"), storage, repo) == []
    trials = ledger.trials("d")
    assert [t.number for t in trials] == list(range(len(trials))) and len(trials) > 4
    assert all(trials[number].decision not in (None, "failed") for number in cut)


def test_device_memory_must_come_back_before_a_trial_counts_as_torn_down():
    from sandbox.host import wait_device_memory

    readings = iter([[30000], [9000], [1200]])   # the driver frees a dead server's memory late
    assert wait_device_memory([1000], read=lambda: next(readings), sleep=lambda s: None) is None
    held = wait_device_memory([1000], wait_s=4, read=lambda: [30000], sleep=lambda s: None)
    assert "30000" in held and "1000" in held
    assert wait_device_memory(None, read=lambda: [30000]) is None   # no GPU: nothing to check


class DirtyAfter(__import__("fake_engine").FakeEngine):
    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        result = super().evaluate(spec, trial_dir, timeout_s, on_phase)
        if self.calls == 4:
            return failed("unclean_teardown", "GPU memory not released after the trial")
        return result


def test_a_trial_that_leaves_the_machine_dirty_stops_the_run_instead_of_blaming_the_next(tmp_path):

    from agent import space as spaces
    from agent.context import RunContext, Seams, Settings
    from agent.loop import DirtyMachine, run_search

    ledger, space = Ledger(tmp_path / "l.sqlite"), spaces.load("vllm-cpu")
    deadline = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    run = ledger.add(Run(id="x", deadline_at=deadline, model="m", space_path=space.path, space_hash=space.hash,
                         workload="smoke", repo="", settings={"home": str(tmp_path)}))
    with pytest.raises(DirtyMachine, match="GPU memory not released"):
        run_search(RunContext(run, Settings(model="m", workload="smoke", recheck=False), space),
                   Seams(ledger, DirtyAfter(), gitops.open_repo(tmp_path / "p", create=True)),
                   f"sqlite:///{tmp_path / 'o.sqlite'}")
    last = ledger.trials("x")[-1]
    assert last.status == "failed" and last.failure_class == "unclean_teardown"
    assert len([t for t in ledger.trials("x") if t.source != "baseline"]) == 2   # no trial after it


def test_repair_leaves_a_live_remote_workers_trial_to_it(tmp_path):
    """A coordinator resumed (or stopped) while a worker on another host measures a trial: that row
    and its Optuna trial stay running, to be recorded and told by their worker."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    storage = f"sqlite:///{tmp_path / 'optuna.sqlite'}"
    ledger.add(Run(id="r", deadline_at="2100-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="smoke", repo="", settings={}))
    study = optuna.create_study(study_name="r", storage=storage, direction="maximize")
    theirs, ours = study.ask(), study.ask()
    remote = ledger.add(Worker(run_id="r", name="gpu-b/0", host="gpu-b", pid=1, slot=0, device="GPU 0",
                               role="worker"))
    ledger.add(Trial(run_id="r", number=0, source="sampler", optuna_number=theirs.number, status="running",
                     worker_id=remote.id))
    ledger.add(Trial(run_id="r", number=1, source="sampler", optuna_number=ours.number, status="running"))
    fixed = recovery.repair(ledger, ledger.run("r"), storage, None)
    rows = {t.number: t for t in ledger.trials("r")}
    assert rows[0].status == "running" and rows[1].status == "interrupted", fixed
    told = {t.number: t.state for t in study.get_trials()}
    assert told[theirs.number] == optuna.trial.TrialState.RUNNING
    assert told[ours.number] == optuna.trial.TrialState.FAIL


def test_a_resume_is_refused_while_the_runs_coordinator_lives_on_another_host(tmp_path, monkeypatch):
    """The run lock is per host: with a shared database, a second coordinator could otherwise resume a
    run that is going elsewhere and branch the same candidates twice."""
    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add(Run(id="r", deadline_at="2100-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="smoke", repo="", settings={}, status="stopped"))
    away = ledger.add(Worker(run_id="r", name="gpu-a/0", host="gpu-a", pid=4242, slot=0, device="GPU 0",
                             role="coordinator"))
    result = CliRunner().invoke(app, ["run", "--resume", "r"])
    assert result.exit_code == 1, result.output
    assert "its coordinator, pid 4242 on gpu-a, wrote its heartbeat" in result.stderr.replace("\n", " ")
    # Silent past the grace, it is no longer evidence of a live run: the resume goes past this check.
    ledger.update(away, heartbeat_at="2026-01-01T00:00:00+00:00")
    result = CliRunner().invoke(app, ["run", "--resume", "r"])
    assert "its coordinator" not in result.stderr
    # It went on to load the run's space (a name this stand-in row makes up), and said that instead.
    assert result.exit_code == 2 and "s.yaml: cannot read" in result.stderr, result.output


def test_readers_while_a_run_writes_never_fail_and_never_block_it(tmp_path, monkeypatch):
    """`agent ledger` (and its read-only SQL) in a tight loop beside a run that writes every few
    milliseconds: every read answers, and the run still ends on its deadline with every trial."""
    from agent.cli import app

    monkeypatch.setenv("AGENT_HOME", str(tmp_path))
    runner = CliRunner()
    Ledger(tmp_path / "ledger.sqlite")   # its tables made here, not by two processes at once
    proc = start(tmp_path, "busy", 8)
    reads, seen = 0, set()
    try:
        while proc.poll() is None:
            if Ledger(tmp_path / "ledger.sqlite").run("busy") is None:
                time.sleep(0.05)
                continue
            listed = runner.invoke(app, ["ledger", "--run", "busy", "--csv"])
            counted = runner.invoke(app, ["ledger", "sql", "select count(*) as n from trials"])
            assert listed.exit_code == 0 and counted.exit_code == 0, (listed.stderr, counted.stderr)
            seen.add(listed.stdout.count("\n"))
            reads += 1
    finally:
        try:
            out, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    run, trials = Ledger(tmp_path / "ledger.sqlite").run("busy"), Ledger(tmp_path / "ledger.sqlite").trials("busy")
    # Reads happened while the ledger grew, and the writer was not held up past its deadline.
    assert reads >= 10 and len(seen) >= 3
    assert run.status == "finished" and [t.number for t in trials] == list(range(len(trials)))
    assert datetime.fromisoformat(run.finished_at) <= datetime.fromisoformat(run.deadline_at) + timedelta(seconds=10)
