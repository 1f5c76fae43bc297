"""After a crash: put the ledger, the Optuna study and git back in agreement, and check that they are.

The loop writes in one order (ledger row, worker, ledger figures, branch, ledger branch, study
tell), so a crash at any point leaves one of a few known states, each repaired here:
- a trial row still `running`: its server died with the worker; it becomes `interrupted`;
- an Optuna trial still RUNNING: told FAIL, so the study never waits on it;
- a config that passed on search prompts, cut inside its held-out decision: put forward, so the
  resumed coordinator decides it again (a crash costs no candidate);
- a study lost, or told otherwise than the ledger says: rebuilt from the ledger (study.rebuild);
- a branch created just before the crash whose row does not name it yet: the row is completed
  from the commit's trailers (Agent-Run, Agent-Trial), since only the gate creates branches;
- a ref lock git left under our own prefix: removed (we hold the run lock, so it is stale);
- a candidate measured but not gated, or accepted but not branched: named here, left for the
  resumed loop, which judges or branches it (agent.loop.catch_up).
`problems` is the read-only check behind `agent doctor`.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git
import psutil

from agent import crew, gitops, judging, states
from agent import space as spaces
from agent import study as studies
from agent.engine import reap, trial_processes
from agent.ledger import Ledger, Run, Trial, Worker, utcnow
from agent.states import Decision, Status, WorkerStatus
from sandbox.contract import FailureClass


class Busy(RuntimeError):
    pass


def lock_holder(home: Path) -> int | None:
    """The pid of the live `agent run` holding this home's run lock, read without taking the lock
    (taking it, even for a moment, would refuse an `agent run` starting in that moment)."""
    try:
        text = (home / "run.lock").read_text()
    except OSError:
        return None
    if not text.startswith(RUN + ","):   # `agent doctor` holds it for a moment: no run is going
        return None
    pid = text.rsplit("pid ", 1)[-1].strip() if "pid " in text else ""
    if not pid.isdigit():
        return None
    try:
        process = psutil.Process(int(pid))
        return int(pid) if process.is_running() and process.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


RUN = "agent run"
DOCTOR = "agent doctor (checking for stray trial processes; it lets go in seconds)"


@contextmanager
def run_lock(home: Path, holder: str = RUN) -> Iterator[None]:
    """One `agent run` per ledger at a time. The kernel drops the lock when the process dies,
    so a crashed run never blocks its own resume. holder is who the lock file names: a run, or
    `agent doctor` for the moment it looks for strays (an `agent run` refused then is told so)."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / "run.lock"
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            held = handle.read().strip() or "another process"
            raise Busy(f"{path} is held by {held}: one agent run per ledger at a time") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{holder}, pid {os.getpid()}")
        handle.flush()
        yield


def _our_branches(repo: git.Repo | None, run: Run) -> dict[int, str]:
    if repo is None:
        return {}
    prefix = f"{gitops.PREFIX}{run.id}/"
    return {int(b[len(prefix):]): repo.heads[b].commit.hexsha for b in gitops.branches(repo)
            if b.startswith(prefix) and b[len(prefix):].isdigit()}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def repair(ledger: Ledger, run: Run, storage: str, repo: git.Repo | None) -> list[str]:
    """Bring a crashed run back to a consistent state; returns what was done, one line each."""
    done = _lost_workers(ledger, run)
    going = {w.id for w in ledger.workers(run.id) if w.status == "running"}
    home = run.settings.get("home") if run.settings else None
    for progress in sorted((Path(home) / run.id).glob("trial-*/progress.json")) if home else []:
        # The worker runs in its own session, so it and its server outlive a SIGKILLed agent.
        if killed := reap(progress):
            done.append(f"{progress.parent.name}: ended processes {killed} left running by the crash")
    done += _trials_in_flight(ledger, run, going)
    done += _study(ledger, run, storage, going)
    if repo is not None:
        done += _branches(ledger, run, repo)
    done += [f"trial {t.number}: accepted but not branched at the crash: branched after the resume"
             for t in judging.unbranched(ledger.trials(run.id))]
    return done


def _lost_workers(ledger: Ledger, run: Run) -> list[str]:
    """This host's workers died with the run (a local worker ends when its coordinator is gone); a
    worker on another host may still be going, and keeps its trial in flight."""
    done, host = [], socket.gethostname()
    for w in ledger.workers(run.id):
        if w.status == WorkerStatus.RUNNING and w.host == host and not _alive(w.pid) and \
                ledger.claim(Worker, w.id, {"status": WorkerStatus.RUNNING}, status=WorkerStatus.LOST,
                             stopped_at=utcnow(), note="gone at the resume"):
            done.append(f"worker {w.name}: gone, recorded as lost")
    return done


def _trials_in_flight(ledger: Ledger, run: Run, going: set[int]) -> list[str]:
    done = []
    for t in ledger.trials(run.id):
        if t.status == Status.RUNNING and t.worker_id in going:
            continue   # a worker on another host measures it now
        if t.status == Status.RUNNING:
            ledger.transition(t, status=Status.INTERRUPTED, failure_class=FailureClass.INTERRUPTED,
                              finished_at=utcnow(), failure_message="the agent stopped while this trial was in flight")
            done.append(f"trial {t.number}: in flight at the crash, recorded as interrupted")
        elif t.decision == Decision.AWAITING_RECHECK and not t.branch:
            # Passed on the search prompts, cut inside its held-out decision: not lost, but put forward
            # as a worker's candidate is, so the resumed coordinator decides it (a crash costs no candidate).
            ledger.transition(t, gate_passed=None, decision=Decision.PUT_FORWARD, gate_reasons=[
                *(t.gate_reasons or []), "interrupted during its held-out decision: decided again after the resume"])
            done.append(f"trial {t.number}: stopped during its held-out decision, put forward to be decided again")
    return done


def _study(ledger: Ledger, run: Run, storage: str, going: set[int]) -> list[str]:
    """The study told what the ledger's finished rows say; Optuna trials running at the crash told FAIL."""
    trials = ledger.trials(run.id)
    # Measured but never gated (window 1): the resumed loop judges it from its worker's result and
    # tells Optuna then (loop.catch_up); told now, it would be a 0.0 with an infeasible constraint.
    cut = [t for t in judging.unjudged(trials) if t.worker_id not in going]
    later = {t.optuna_number for t in cut}
    done = [f"trial {t.number}: measured but not judged at the crash: judged from its recorded result "
            f"after the resume" for t in cut]
    finished = {t.optuna_number: t for t in trials
                if t.optuna_number is not None and t.status in states.FINISHED and t.optuna_number not in later}
    # A live worker on another host still measures these: their Optuna trials are its to tell.
    theirs = {t.optuna_number for t in trials if t.status == Status.RUNNING and t.worker_id in going}
    # The constraint Optuna records is the one the loop computed and stored in the ledger.
    study = studies.recorded(run.id, storage, list(finished.values()))
    if study is not None:
        done += _told(study, finished, theirs | later)
    return done + _rebuild_if_it_disagrees(ledger, run, storage, busy=bool(going) or bool(later))


def _told(study: studies.Study, finished: dict[int, Trial], not_ours: set) -> list[str]:
    """Optuna trials running at the crash: told what their finished ledger row says, else FAIL."""
    done = []
    for ft in studies.running(study):
        if ft.number in not_ours:
            continue
        row = finished.get(ft.number)
        if row is None:
            studies.fail(study, ft.number)
            done.append(f"optuna trial {ft.number}: running at the crash, told FAIL")
            continue
        # Killed after the ledger row was finished but before the tell: tell what the row says.
        studies.tell_row(study, ft.number, row)
        done.append(f"optuna trial {ft.number}: finished in the ledger (trial {row.number}), told its result")
    return done


def _branches(ledger: Ledger, run: Run, repo: git.Repo) -> list[str]:
    """Git's side: stale ref locks under our prefix removed, and a commit made just before the crash
    (a branch, or a branch's worth under load) recorded in the ledger."""
    done = []
    refs = Path(repo.git_dir) / "refs" / "heads" / "agent" / run.id
    for lock in sorted(refs.glob("*.lock")) if refs.is_dir() else []:
        lock.unlink()
        done.append(f"removed the stale ref lock {lock.name} git left under our prefix")
    rows = {t.number: t for t in ledger.trials(run.id)}
    for number, sha in _our_branches(repo, run).items():
        row = rows.get(number)
        if row is not None and row.branch is None and f"Agent-Trial: {number}" in repo.commit(sha).message:
            ledger.set_branch(row, sha, f"{gitops.PREFIX}{run.id}/{number}")
            done.append(f"trial {number}: branch created just before the crash, recorded in the ledger")
        elif row is not None and row.commit and sha != row.commit and _worth_on(repo.commit(sha), row.commit):
            ledger.set_branch(row, sha)
            done.append(f"trial {number}: its worth under load was committed just before the crash, recorded "
                        f"in the ledger")
    return done


def _worth_on(commit: git.Commit, parent: str) -> bool:
    """Whether commit is agent run --capacity's, made on parent (agent.branch_worth)."""
    from agent.branch_worth import TRAILER

    return [p.hexsha for p in commit.parents] == [parent] and f"{TRAILER}:" in str(commit.message)


def _rebuild_if_it_disagrees(ledger: Ledger, run: Run, storage: str, busy: bool) -> list[str]:
    """The ledger is the record and the study is derived from it: where they still disagree (a study
    lost, or one told otherwise than its rows say), the study is made again from the ledger. Not while
    a worker elsewhere or the resumed loop has yet to tell trials of its own."""
    rows = ledger.trials(run.id)
    study = studies.read(run.id, storage)
    found = studies.disagreements(study, rows) if study is not None else \
        ([f"the study {run.id} is missing"] if any(t.optuna_number is not None for t in rows) else [])
    if not found or busy:
        return []
    try:
        knobs = list(spaces.load(run.space_path).knobs.values())
    except spaces.SpaceError:   # a space file gone: each trial keeps the distributions the old study had
        knobs = []
    studies.rebuild(run.id, storage, rows, {k.name: k.distribution() for k in knobs})
    return [f"the study disagreed with the ledger ({found[0]}{f'; {len(found) - 1} more' if len(found) > 1 else ''}):"
            f" rebuilt from the ledger"]


def problems(ledger: Ledger, run: Run, storage: str, repo: git.Repo | None) -> list[str]:
    """Every disagreement between the ledger, the study and git for one run (empty: consistent)."""
    out = []
    trials = ledger.trials(run.id)
    if run.status != "running":
        out += [f"trial {t.number}: still 'running' in a run that is {run.status}" for t in trials
                if t.status == Status.RUNNING]
    numbers = [t.number for t in trials]
    if len(numbers) != len(set(numbers)):
        out.append("trial numbers repeat")
    study = studies.read(run.id, storage)
    candidates = [t for t in trials if t.optuna_number is not None]
    if study is not None:
        told = {ft.number: ft for ft in study.get_trials(deepcopy=False)}
        told_numbers = [t.optuna_number for t in candidates if t.optuna_number is not None]
        out += [f"Optuna trial {n} is counted twice"
                for n in sorted({n for n in told_numbers if told_numbers.count(n) > 1})]
        out += studies.disagreements(study, trials)
        if run.status != "running":
            out += [f"optuna trial {ft.number}: still RUNNING" for ft in told.values()
                    if ft.state == studies.State.RUNNING]
    elif candidates:
        out.append(f"the study {run.id} is missing while the ledger has {len(candidates)} candidate trials")
    branches = _our_branches(repo, run)
    for t in trials:
        if t.branch and branches.get(t.number) != t.commit:
            out.append(f"trial {t.number}: the ledger names {t.branch} at {(t.commit or '')[:10]}, git has "
                       f"{(branches.get(t.number) or 'no such branch')[:10]}")
        if t.branch and not t.gate_passed:
            out.append(f"trial {t.number}: has a branch but did not pass the gate")
    rows = {t.number: t for t in trials}
    out += [f"branch {gitops.PREFIX}{run.id}/{n}: no ledger row names it" for n in branches
            if n not in rows or rows[n].branch is None]
    home = (run.settings or {}).get("home")
    if run.status != "running" or not (home and lock_holder(Path(home))):   # no agent run is deciding them now
        out += [f"trial {t.number}: measured ({t.status}) but never judged by the gate: `agent run --resume "
                f"{run.id}` judges it from its recorded result"
                + (" and measures nothing (the run is finished)" if run.status == "finished" else "")
                for t in judging.unjudged(trials)]
        out += [f"trial {t.number}: accepted but no branch was committed: `agent run --resume {run.id}` "
                f"commits it" + (" and does nothing else (the run is finished)" if run.status == "finished" else "")
                for t in judging.unbranched(trials)]
    return out + worker_problems(ledger, run, trials)


def worker_problems(ledger: Ledger, run: Run, trials: list) -> list[str]:
    """A distributed run's own disagreements: workers and the trials they hold."""
    out, now = [], ledger.now()
    workers = {w.id: w for w in ledger.workers(run.id)}
    for w in workers.values():
        if w.status == "running" and crew.age_s(w.heartbeat_at, now) > crew.grace_s() and w.role == "coordinator":
            out.append(f"the coordinator {w.name}: silent since {w.heartbeat_at}; on {w.host}: "
                       f"agent run --resume {run.id}")
        elif w.status == "running" and crew.age_s(w.heartbeat_at, now) > crew.grace_s():
            out.append(f"worker {w.name} ({w.device}): silent since {w.heartbeat_at} but not declared lost")
        elif w.status == "running" and run.status != "running":
            out.append(f"worker {w.name} ({w.device}): still going in a run that is {run.status}")
    for t in trials:
        holder = workers.get(t.worker_id)
        if t.status == Status.RUNNING and holder is not None and holder.status != "running":
            out.append(f"trial {t.number}: still 'running' but its worker {holder.name} is {holder.status}")
        if t.decision == Decision.PUT_FORWARD and run.status == "finished":   # a stopped run decides it on resume
            out.append(f"trial {t.number}: put forward but never decided")
    return out


def stray_servers(run_dir: Path) -> list[str]:
    """Processes of this run's trials (the worker, its server's session, anything with the trial's
    marker) still alive."""
    return [f"process {p.pid} of {progress.parent.name} is still running"
            for progress in sorted(run_dir.glob("trial-*/progress.json")) for p in trial_processes(progress)]


def checkup(ledger: Ledger, run: Run, storage: str, home: Path) -> tuple[list[str], int]:
    """`agent doctor` on one run: the lines to print, and how many problems they name. That the ledger,
    the study and the branches agree, and, when no run is going, that no trial process is left.
    gitops.RepoError where the run's repository is gone."""
    repo = gitops.open_repo(Path(run.repo)) if run.repo else None
    found, lines = problems(ledger, run, storage, repo), []
    try:
        with run_lock(home, DOCTOR):  # only when no run is going can a trial process be a stray
            found += stray_servers(Path(run.settings.get("home") or home) / run.id)
    except Busy as e:
        lines.append(f"  a run is in progress ({e}); trial processes not checked")
    trials = ledger.trials(run.id)
    lines.append(f"run {run.id} ({run.status}): {len(trials)} trials, {sum(1 for t in trials if t.branch)} branches")
    lines += [f"  problem: {line}" for line in found]
    return lines, len(found)
