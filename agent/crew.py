"""The processes that run one run's trials: the coordinator (`agent run`) and its workers, on this
host (`--workers N`) or on others (`agent worker --run ID`).

Every one of them is a row of the ledger's `workers` table and writes its heartbeat there. One that
falls silent for longer than the grace (killed, its host gone) is declared lost by whichever
process notices first; its trial in flight is recorded as interrupted and its Optuna trial told
FAIL, once: the update only succeeds for the process that still finds the row running.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from agent import states
from agent import study as studies
from agent.devices import Slot
from agent.engine import reap, worker_env
from agent.ledger import Ledger, Run, Trial, Worker, utcnow
from agent.states import Decision, Status, WorkerRole, WorkerStatus
from sandbox.contract import FailureClass

STOP_GRACE_S = 120.0   # a local worker's trial in flight gets this long to end and be recorded


def heartbeat_s() -> float:
    return float(os.environ.get("AGENT_HEARTBEAT_S") or 5.0)


def grace_s() -> float:
    """Silence longer than this is a lost worker: several missed heartbeats, not one slow write."""
    return 12 * heartbeat_s()


def token() -> str:
    """This process, as a run's owner: host, pid and a random part (pids are reused)."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


def join(ledger: Ledger, run: Run, slot: Slot, role: WorkerRole) -> Worker:
    host = socket.gethostname()
    me = ledger.add(Worker(run_id=run.id, name=f"{host}/{slot.index}", host=host, pid=os.getpid(),
                           slot=slot.index, device=slot.device, role=role, heartbeat_at=ledger.now()))
    return me


class Heartbeat:
    """Writes the worker's heartbeat from a thread while the process works. `lost` is set when the
    row was declared lost meanwhile (the process was silent too long): it must stop, its trial was
    recorded as interrupted. With `parent`, the process ends itself when that process is gone (a
    local worker outlives neither its coordinator nor a SIGKILL of it)."""

    def __init__(self, ledger: Ledger, me: Worker, parent: int | None = None):
        self.ledger, self.me, self.parent = ledger, me, parent
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        try:
            now = self.ledger.now()
            self.ledger.claim(Worker, self.me.id, {"status": WorkerStatus.RUNNING}, status=WorkerStatus.STOPPED,
                              stopped_at=now,
                              heartbeat_at=now)
        except Exception:  # noqa: BLE001 - the database may be the reason we stop; the others will notice
            pass

    def _beat(self) -> None:
        while not self._stop.wait(heartbeat_s()):
            if self.parent and not psutil.pid_exists(self.parent):
                os.kill(os.getpid(), signal.SIGTERM)   # ends the trial in flight cleanly, as Ctrl-C does
                return
            try:
                if not self.ledger.claim(Worker, self.me.id, {"status": WorkerStatus.RUNNING},
                                         heartbeat_at=self.ledger.now()):
                    self.lost.set()
            except Exception:  # noqa: BLE001 - a database away for a while: the main loop stops on its next write
                continue


def age_s(stamp: str, now: str | None = None) -> float:
    """Seconds since `stamp`, on the database's clock (`now`, from Ledger.now: heartbeats are written
    on it) wherever a decision rests on the age; this host's clock only for what is shown."""
    at = datetime.fromisoformat(now) if now else datetime.now(UTC)
    return (at - datetime.fromisoformat(stamp)).total_seconds()


def coordinator(workers: list[Worker], now: str) -> Worker | None:
    """The run's coordinator if it is alive: its heartbeat fresh, and on this host its process there."""
    for w in workers:
        if w.role == "coordinator" and w.status == "running" and age_s(w.heartbeat_at, now) < grace_s() and \
                (w.host != socket.gethostname() or psutil.pid_exists(w.pid)):
            return w
    return None


def bury(ledger: Ledger, run: Run, study: studies.Study | None, home: Path, say) -> list[str]:
    """Declare silent workers lost; their trials in flight become interrupted and their Optuna trials
    FAIL. Returns one line per thing done (nothing when another process did it first)."""
    done, now = [], ledger.now()
    for w in ledger.workers(run.id):
        # The coordinator is never buried by others: its own resume repairs what it leaves, and a
        # coordinator that was only slow must not find its trial recorded for it.
        if w.status != "running" or w.role == "coordinator" or age_s(w.heartbeat_at, now) < grace_s():
            continue
        if not ledger.claim(Worker, w.id, {"status": WorkerStatus.RUNNING, "heartbeat_at": w.heartbeat_at},
                            status=WorkerStatus.LOST,
                            stopped_at=now, note=f"no heartbeat since {w.heartbeat_at}"):
            continue
        done.append(f"worker {w.name} ({w.device}) lost: no heartbeat since {w.heartbeat_at}")
        for t in ledger.trials(run.id, status=Status.RUNNING):
            if t.worker_id == w.id:
                done += interrupt(ledger, t, study, home if w.host == socket.gethostname() else None,
                                  f"its worker {w.name} fell silent (no heartbeat since {w.heartbeat_at})")
    for line in done:
        say("lost", line=line)
    return done


def interrupt(ledger: Ledger, t: Trial, study: studies.Study | None, home: Path | None, why: str) -> list[str]:
    """Record a trial in flight whose worker is gone as interrupted (once), tell its Optuna trial FAIL
    and, on this host, end whatever processes the trial left."""
    if not ledger.claim(Trial, t.id, {"status": Status.RUNNING}, status=Status.INTERRUPTED,
                        failure_class=FailureClass.INTERRUPTED,
                        failure_message=why, finished_at=utcnow()):
        return []
    done = [f"trial {t.number}: interrupted ({why})"]
    if study is not None and t.optuna_number is not None:
        studies.fail(study, t.optuna_number)   # False: told by its worker just before it fell silent
    if home is not None:
        for progress in sorted((home / t.run_id).glob(f"trial-{t.number:03d}*/progress.json")):
            if killed := reap(progress):
                done.append(f"trial {t.number}: ended processes {killed} it left")
    return done




def tell_recorded(ledger: Ledger, run: Run, study: studies.Study | None, me: Worker) -> list[str]:
    """A stopping worker's finished rows whose Optuna trials are still RUNNING: told as recorded, with
    the value, state and constraint the loop would have told (the study as `studies.recorded` loads it).
    A candidate measured but not gated is left to whoever judges it (agent.loop.judge_cut)."""
    if study is None:
        return []
    done = []
    running = {ft.number for ft in studies.running(study)}
    for t in ledger.trials(run.id):
        ungated = t.source in states.CANDIDATES and t.status in (states.Status.OK, states.Status.PRUNED) \
            and t.decision is None
        if ungated:   # told once judged (agent.loop.judge_cut), never as an ungated 0.0
            continue
        if t.worker_id == me.id and t.optuna_number in running and t.status in states.FINISHED:
            studies.tell_row(study, t.optuna_number, t)
            done.append(f"optuna trial {t.optuna_number}: told what trial {t.number} recorded")
    return done


def refuse_leftovers(ledger: Ledger, run_id: str, worker_id: int | None = None) -> list[str]:
    """Candidates put forward that no coordinator will decide any more (the run ended first): refused,
    once each, and said so in their rows."""
    done = []
    for t in ledger.trials(run_id):
        if t.decision == Decision.PUT_FORWARD and worker_id in (None, t.worker_id) and ledger.claim(
                Trial, t.id, {"decision": Decision.PUT_FORWARD}, decision=Decision.REFUSED, gate_passed=False,
                gate_reasons=[*(t.gate_reasons or []), "put forward after the coordinator's last decision "
                              "(the run had ended): not re-checked, not committed"]):
            done.append(f"trial {t.number}: put forward after the run ended, refused without a re-check")
    return done


# How a local worker is started: `python -m agent.cli worker ...`. A program built on agent.cli
# (tests/agent_with_seam_engine.py) sets its own, so that its workers run it too.
PROGRAM = ["-m", "agent.cli"]


def spawn(run_id: str, slots: list[Slot], storage: str | None, log_dir: Path) -> list[subprocess.Popen]:
    """Start one local `agent worker` per slot, each in its own process group, logging to log_dir."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for slot in slots:
        argv = [sys.executable, *PROGRAM, "worker", "--run", run_id, "--slot", str(slot.index),
                "--of", str(max(s.index for s in slots) + 1), "--parent", str(os.getpid())]
        env = {**worker_env(), **({"AGENT_STORAGE": storage} if storage else {})}
        with open(log_dir / f"worker-{slot.index}.log", "ab") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True,
                                          cwd=Path(__file__).resolve().parents[1]))
    return procs


def stop(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each worker's group (it ends its trial and records it), then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
