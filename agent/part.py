"""One process's part in a run, from taking it to closing it: the coordinator's (`agent run`: the
search) and each worker's (`agent worker`, or a local worker `--workers N` starts: trials asked of
the shared study).

A part reads the run's settings and space as the run's row has them, on this host (its model,
home and facts), joins the run's workers, and ends whatever happens with what was in flight
recorded: a stop, a failed baseline, a dirty machine, a database or disk gone, git or the study
failing. Each ending is a RunError whose line says what to do next (agent.request).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from git import GitCommandError
from sqlalchemy.exc import OperationalError

from agent import crew, devices, gitops, paths, recording, recovery, report_text, views
from agent import ledger as ledgers
from agent import space as spaces
from agent import storage as storages
from agent import study as studies
from agent.context import Inputs, RunContext, Seams, Settings, inputs_of, settings_of
from agent.log import event_logger
from agent.request import RunError, Stopped, choices, facts, run_space, served_model
from agent.states import Decision, RunStatus, Status, WorkerRole, WorkerStatus
from agent.terminal import console, say
from sandbox.contract import prepare_model


def gpu_count() -> int:
    from sandbox.contract import gpus

    return len(gpus())


def where() -> storages.Storage:
    """The run's storage: AGENT_STORAGE (or --storage, which sets it), else SQLite files under the home."""
    try:
        return storages.resolve(None, paths.home())
    except storages.StorageError as e:
        raise RunError(str(e)) from None


def study_storage():
    return where().study()


def make_engine(slot: devices.Slot | None):
    """The engine: the real worker, in a process of its own for each trial. The one seam to it; the
    tests' own executable (tests/agent_with_seam_engine.py) puts the deterministic engine here."""
    from agent.engine import WorkerEngine

    return WorkerEngine(slot)


@dataclass
class Part:
    """One process's part in a run: the run's settings and space on this host, the seams (a worker has
    no repository: it never branches), its row among the run's workers. close() whatever happens."""
    ctx: RunContext
    seams: Seams
    me: ledgers.Worker

    def close(self) -> None:
        getattr(self.seams.say, "close", lambda: None)()         # the live phase line, on a terminal
        getattr(self.seams.engine, "close", lambda: None)()      # the pre-flight's process


def take_part(ledger: ledgers.Ledger, row: ledgers.Run, slot: devices.Slot, engine_slot: devices.Slot | None,
              home: Path | None = None) -> Part:
    """The coordinator's part (home None: the run's own), or a worker's on this host's home."""
    settings, space = run_settings(row, home=home)
    engine = make_engine(engine_slot)
    engine.allow(recording.allowed(space, settings))   # what a trial may set and serve: checked by the worker
    me = crew.join(ledger, row, slot, WorkerRole.WORKER if home else WorkerRole.COORDINATOR)
    events = (home / row.id / f"events-worker-{me.id}.jsonl" if home
              else Path(row.settings["home"]) / row.id / "events.jsonl")
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    signal.signal(signal.SIGHUP, _hung_up)
    repo = None if home else gitops.open_repo(Path(row.repo))
    seams = Seams(ledger, engine, repo, event_logger(events, console))
    return Part(RunContext(row, settings, space, worker_id=me.id), seams, me)


def coordinate(ledger: ledgers.Ledger, row: ledgers.Run) -> None:
    """The run's search, on this host's devices, until its deadline; what a stop leaves is recorded."""
    from agent.defaults import BaselineFailed, BudgetTooShort
    from agent.loop import DirtyMachine, run_search

    home = Path(row.settings["home"])
    slots = slots_here(inputs_of(row).workers, home)
    part = take_part(ledger, row, slots[0], slots[0] if len(slots) > 1 else None)
    say_event = part.seams.say
    say_event("run", id=row.id, budget=inputs_of(row).budget, deadline=row.deadline_at,
              space=part.ctx.space.path, workload=row.workload)
    planner = planner_for(inputs_of(row), ledger, row.id, say_event)
    try:
        with crew.Heartbeat(ledger, part.me):
            procs = crew.spawn(row.id, slots[1:], os.environ.get("AGENT_STORAGE"), home / row.id)
            if procs:
                say_event("workers", count=len(slots), devices=[s.device for s in slots])
            try:
                run_search(part.ctx, part.seams, study_storage(), planner=planner, me=part.me)
            finally:
                crew.stop(procs)   # each ends its trial in flight and records it
    except KeyboardInterrupt:
        close_interrupted(ledger, row.id, RunStatus.STOPPED)
        raise Stopped(f"stopped: run {row.id}; the trial in flight was ended and recorded "
                      f"(continue with: agent run --resume {row.id})") from None
    except BudgetTooShort as e:   # said before the budget was spent: nothing failed, the run is over
        close_interrupted(ledger, row.id, RunStatus.FINISHED)
        raise RunError(str(e), 1) from None
    except BaselineFailed as e:
        close_interrupted(ledger, row.id, RunStatus.FAILED)
        raise RunError(str(e), 1) from None
    except DirtyMachine as e:
        close_interrupted(ledger, row.id, RunStatus.STOPPED)
        raise RunError(f"{e}. Stopped rather than blame the next config; once `agent doctor --run {row.id}` "
                       f"finds nothing left: agent run --resume {row.id}", 1) from None
    except OperationalError as e:  # the database's transactions leave it consistent; only this run stops
        raise ledger_gone(ledger, row.id, e) from None
    except OSError as e:   # a disk full under the run's folder (events.jsonl, a trial's files): stopped, resumable
        close_interrupted(ledger, row.id, RunStatus.STOPPED)
        raise RunError(f"run {row.id} stopped: {e}; the trial in flight was ended and recorded. Free the space, "
                       f"then: agent run --resume {row.id}", 1) from None
    except (GitCommandError, studies.StorageError) as e:
        # A branch not written, or the study not told: the ledger row of the trial in flight says what
        # was measured; a resume repairs the study from the ledger and re-proposes what is missing.
        try:
            close_interrupted(ledger, row.id, RunStatus.STOPPED)
        except OperationalError as gone:   # the study failed because the database itself went away
            raise ledger_gone(ledger, row.id, gone) from None
        what = "git" if isinstance(e, GitCommandError) else "the Optuna study"
        raise RunError(f"{what} failed during run {row.id}: {str(e).strip().splitlines()[0][:200]}; the run "
                       f"stopped with its ledger consistent. Fix the cause, then: agent run --resume {row.id}",
                       1) from None
    finally:
        part.close()
    for line in report_text.summary(*views.of_run(ledger, row.id)):
        say(line)


def run_worker(ledger: ledgers.Ledger, row: ledgers.Run, slot: devices.Slot, parent: int | None) -> None:
    """A worker's trials in the run, until its deadline or its end; what a stop leaves is recorded."""
    from agent.defaults import BaselineFailed
    from agent.loop import DirtyMachine
    from agent.loop import work as take_trials
    from agent.recording import Superseded

    home = paths.home()
    part = take_part(ledger, row, slot, slot if slot.env else None, home=home)
    me = part.me
    hint = (f"agent worker --run {row.id}" + (" --storage URL" if where().shared else ""))
    lost = (f"worker {me.name} was silent too long and was declared lost (its trial was recorded as "
            f"interrupted); start it again: {hint}")
    try:
        with crew.Heartbeat(ledger, me, parent) as beat:
            take_trials(part.ctx, part.seams, study_storage(), me, lost=beat.lost.is_set)
        if beat.lost.is_set():
            raise RunError(lost, 1)
    except Superseded:
        raise RunError(lost, 1) from None
    except KeyboardInterrupt:
        interrupt_mine(ledger, row, me, home, "its worker was stopped", part)
        raise Stopped(f"stopped: worker {me.name} of run {row.id}; its trial in flight was ended and "
                      f"recorded") from None
    except BaselineFailed as e:   # this device cannot serve the defaults: it takes no candidate either
        raise RunError(f"worker {me.name} ({slot.device}): {e}; this device stays out of run {row.id}", 1) from None
    except DirtyMachine as e:
        interrupt_mine(ledger, row, me, home, "its worker stopped on a dirty machine", part)
        raise RunError(f"{e}. This worker stopped rather than blame the next config; check with agent doctor, "
                       f"then: {hint}", 1) from None
    except (OperationalError, studies.StorageError) as e:
        raise RunError(f"the database {ledger.where} went away ({storages.first_line(e)}); worker {me.name} "
                       f"stopped and its trial in flight was ended (recorded as interrupted when the database "
                       f"is back). Then: {hint}", 1) from None
    finally:
        part.close()
    if ledger.run_now(row).status != "running":   # what it put forward at the very end, nobody decides
        for line in crew.refuse_leftovers(ledger, row.id, me.id):
            say(line)
    mine = [t for t in ledger.trials(row.id) if t.worker_id == me.id]
    say(f"worker {me.name} ({slot.device}) done: {len(mine)} trials, {sum(1 for t in mine if t.branch)} "
        f"accepted so far, {sum(1 for t in mine if t.decision == 'put_forward')} put forward for the "
        f"coordinator to decide")


def interrupt_mine(ledger: ledgers.Ledger, row: ledgers.Run, me, home: Path, why: str,
                   part: Part | None = None) -> None:
    """A stopping worker's rows: its trial in flight interrupted; one measured but not yet gated (a stop,
    at the deadline, between its record and its gate) judged from its result as the worker would have,
    then told; every finished row told to Optuna as recorded."""
    from agent.judging import unjudged
    from agent.loop import judge_cut

    study = studies.recorded(row.id, study_storage(), ledger.trials(row.id))   # loaded once, for all three
    for t in ledger.trials(row.id, status=Status.RUNNING):
        if t.worker_id == me.id:
            crew.interrupt(ledger, t, study, home, why)
    if part is not None and study is not None:
        judge_cut(part.ctx, part.seams, study, [t for t in unjudged(ledger.trials(row.id)) if t.worker_id == me.id],
                  WorkerRole.WORKER)
    crew.tell_recorded(ledger, row, study, me)   # stopped between a record and its tell
    if ledger.run_now(row).status != "running":
        crew.refuse_leftovers(ledger, row.id, me.id)


def close_interrupted(ledger: ledgers.Ledger, run_id: str, status: RunStatus) -> None:
    run_row = ledger.run(run_id)
    if run_row is None:
        raise RunError(f"run {run_id} is not in {ledger.where}", 1)
    recovery.repair(ledger, run_row, study_storage(), gitops.open_repo(Path(run_row.repo)) if run_row.repo else None)
    ledger.update(run_row, status=status, finished_at=ledgers.utcnow())


def ledger_gone(ledger: ledgers.Ledger, run_id: str, e: Exception) -> RunError:
    return RunError(f"the ledger {ledger.where} could not be written ({storages.first_line(e)}); the run stopped. "
                    f"Free the disk or bring the database back, then: agent run --resume {run_id}", 1)


def planner_for(inputs: Inputs, ledger: ledgers.Ledger, run_id: str, say_event: Callable[..., None]):
    """The run's planner: None for the built-in one, the sampler alone ('off'), or an LLM's through
    litellm with the built-in one behind it (every call a ledger row)."""
    if inputs.planner == "off":
        from agent.planner import NoPlanner

        return NoPlanner()
    if inputs.planner == "builtin":
        return None
    from agent.llm_planner import FallbackPlanner, LLMPlanner

    def record(call) -> None:
        ledger.add(ledgers.PlannerCall(run_id=run_id, **vars(call)))

    return FallbackPlanner(LLMPlanner(inputs.planner, inputs.planner_base_url, record=record), say_event)


def reopen(ledger: ledgers.Ledger, run_id: str) -> ledgers.Run:
    """The interrupted run, repaired: what was in flight is recorded, the study and git agree with the ledger."""
    row = ledger.run(run_id)
    if row is None:
        raise RunError(f"--resume: no run {run_id!r} in {ledger.where}")
    if row.status == "finished":
        raise RunError(f"--resume: run {run_id} already finished at {row.finished_at}")
    repo = proposals_repo(row)   # before anything is written: a repository no branch can go into stops here
    now = ledger.now()   # the database's clock: the one every host's heartbeats were written on
    if live := crew.coordinator(ledger.workers(run_id), now):   # on another host: this host's lock cannot see it
        raise RunError(f"--resume: run {run_id} is going: its coordinator, pid {live.pid} on {live.host}, wrote "
                       f"its heartbeat {crew.age_s(live.heartbeat_at, now):.0f} s ago; one coordinator per run", 1)
    for w in ledger.workers(run_id):   # one resume wins: each silent coordinator row claimed on the heartbeat read
        if w.role == "coordinator" and w.status == "running" and not ledger.claim(
                ledgers.Worker, w.id, {"status": WorkerStatus.RUNNING, "heartbeat_at": w.heartbeat_at},
                status=WorkerStatus.LOST,
                stopped_at=now, note="silent at a resume"):
            raise RunError(f"--resume: run {run_id}'s coordinator {w.name} wrote a heartbeat, or another resume "
                           f"took it over, just now; one coordinator per run", 1)
    owner = crew.token()   # a run stopped cleanly has no running coordinator row: this claim is its one winner
    if not ledger.claim(ledgers.Run, run_id, {"owner": row.owner}, owner=owner):
        raise RunError(f"--resume: another resume took run {run_id} up just now; one coordinator per run", 1)
    space = run_space(row)
    if space.hash != row.space_hash:
        raise RunError(f"--resume: {row.space_path} changed since run {run_id} started; a resumed run keeps its "
                       f"space")
    if changed := _inputs_changed(row):
        raise RunError(f"--resume: {changed} changed since run {run_id} started; a resumed run measures what it "
                       f"started with")
    for line in recovery.repair(ledger, row, study_storage(), repo):
        say(f"  repaired: {line}")
    return ledger.update(row, status=RunStatus.RUNNING, finished_at=None, owner=owner)


def settle_finished(ledger: ledgers.Ledger, run_id: str) -> bool:
    """`agent run --resume` of a finished run: what the night left unsettled, settled without measuring
    anything. A candidate a stopping worker measured but never gated is judged from its result as a
    worker judges it and told to Optuna (one that passes was put forward after the last decision, and
    is refused as such); an accepted config a git error left without a branch is committed, as the
    night would have (one a committed branch dominates is recorded so). False where the run is not
    finished (reopen takes it up); a RunError where nothing is left, or a branch still cannot be written."""
    from agent.judging import branch, unbranched, unjudged
    from agent.loop import Snapshot, judge_cut

    row = ledger.run(run_id)
    if row is None or row.status != "finished":
        return False
    cut, pending = unjudged(ledger.trials(run_id)), unbranched(ledger.trials(run_id))
    if not cut and not pending:
        raise RunError(f"--resume: run {run_id} already finished at {row.finished_at}; no accepted config of "
                       f"it is waiting for its branch and every measured candidate was judged")
    repo = proposals_repo(row)
    settings, space = run_settings(row)
    ctx, why = RunContext(row, settings, space), []
    seams = Seams(ledger, make_engine(None), repo, lambda event, **info: why.append(str(info.get("phase", ""))))
    if cut and (study := studies.recorded(row.id, study_storage(), ledger.trials(row.id))) is not None:
        judge_cut(ctx, seams, study, cut, WorkerRole.WORKER)
        for t in cut:
            say(f"trial {t.number}: judged from its recorded result: {t.decision or t.status}"
                + (f" ({t.search_ratio:.3f}x search)" if t.search_ratio else ""))
        for line in crew.refuse_leftovers(ledger, row.id):
            say(line)
    for t in pending:   # in trial order, as the night met them
        now = Snapshot.read(ctx, ledger)
        branch(ctx, seams, t, now.base, now.history)
        if t.branch:
            say(f"trial {t.number}: committed {t.branch} at {(t.commit or '')[:10]} "
                f"({report_text.claim(t)})")
        elif t.decision != Decision.ACCEPTED:
            say(f"trial {t.number}: {t.gate_reasons[-1]}")   # dominated by one committed before it
        else:
            raise RunError(f"--resume: run {run_id}, trial {t.number}: {why[-1] if why else 'not committed'}; "
                           f"fix the cause, then: agent run --resume {run_id}", 1)
    return True


def proposals_repo(row: ledgers.Run):
    """The run's repository, checked that its branches can be created there (RunError if not)."""
    try:
        repo = gitops.open_repo(Path(row.repo))
    except gitops.RepoError as e:
        raise RunError(f"--resume: {e}") from None
    if clash := gitops.namespace_clash(repo, row.id):
        raise RunError(f"--resume: {clash}")
    return repo


def _inputs_changed(row: ledgers.Run) -> str | None:
    """What of the run's own inputs (its traffic copy, chat template, perplexity text) is no longer what
    it measured with, or None."""
    from sandbox.contract import file_digest, load_workload

    settings = settings_of(row)
    if not isinstance(settings.workload, dict):   # a run written before 2026-12-03: its workload by name
        return None
    try:
        if load_workload(settings.workload).hash != row.workload_hash:
            given = settings.workload.get("traffic") or settings.workload.get("chat_template")
            return f"its traffic or chat template ({given})"
        kept = inputs_of(row).quality_text_hash
        if kept and settings.quality_text and file_digest(settings.quality_text) != kept:
            return f"its perplexity text ({settings.quality_text})"
    except (OSError, ValueError) as e:
        return f"a file it reads ({e})"
    return None


def run_settings(row: ledgers.Run, home: Path | None = None) -> tuple[Settings, spaces.Space]:
    """The run's settings and space as its row has them (a resume and every worker read the same), the
    model, home and facts this host's."""
    from sandbox.contract import hardware, load_workload

    inputs, settings = inputs_of(row), settings_of(row)
    meter = load_workload(settings.workload)
    settings = replace(settings, model=_model_here(row, inputs), home=home,
                       facts=facts(hardware(), meter, settings.gate))
    space = run_space(row)
    if space.hash != row.space_hash:
        raise RunError(f"{row.space_path} on this host is not the space run {row.id} searches (hash {space.hash}, "
                       f"the run's {row.space_hash})")
    for name, expanded in choices(space).items():
        if name in inputs.choices and inputs.choices[name] != expanded:
            raise RunError(f"{name}: this host's choices {expanded} are not run {row.id}'s {inputs.choices[name]} "
                           f"(a CPU host joins a run with the coordinator's number of cores)")
    return settings, space


def _model_here(row: ledgers.Run, inputs: Inputs) -> str:
    """The run's model on this host: the embedded one is prepared here if this host lacks it (a worker
    on another host); a folder must be at the same path; a Hub id loads the run's revision."""
    if inputs.model_given == "embedded" and not Path(row.model).is_dir():
        return str(prepare_model(say=lambda s: say(f"  {s}")))
    return served_model(row.model, row.model_revision)


def _stop_like_ctrl_c(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the trial in flight and stops cleanly, as Ctrl-C does


def _hung_up(signum, frame) -> None:
    """SIGHUP (the SSH session dropped): stop as SIGTERM does, and write nothing more to the terminal
    that is gone (a write there would raise EIO or EPIPE half-way through the stop)."""
    console.file = open(os.devnull, "w")   # for the rest of the process
    raise KeyboardInterrupt


def joinable(ledger: ledgers.Ledger, run_id: str) -> ledgers.Run:
    """The run `agent worker --run` joins: one in the ledger that is going."""
    row = ledger.run(run_id)
    if row is None:
        raise RunError(f"--run: no run {run_id!r} in {ledger.where}")
    if row.status != "running":
        raise RunError(f"--run: run {run_id} is {row.status}; a worker joins a run that is going", 1)
    return row


def slots_here(workers: int, home: Path | None = None) -> list[devices.Slot]:
    """This host's slots for `workers` workers under home (default: this host's)."""
    try:
        return devices.slots(workers, gpu_count(), home or paths.home())
    except devices.DeviceError as e:
        raise RunError(str(e)) from None


def slot_of(slots: list[devices.Slot], slot: int | None) -> devices.Slot:
    if slot is not None and not 0 <= slot < len(slots):
        raise RunError(f"--slot: {slot} is not one of {len(slots)} slots")
    return slots[slot or 0]


def workers_here(run_id: str, slots: list[devices.Slot]) -> int:
    """A worker process for each slot of this host, each as if started alone; the worst exit status."""
    home = paths.home()
    procs = crew.spawn(run_id, slots, os.environ.get("AGENT_STORAGE"), home / run_id)
    say(f"{len(procs)} workers for run {run_id} on {', '.join(s.device for s in slots)}; logs "
        f"{home / run_id}/worker-*.log")
    try:
        return max(p.wait() for p in procs)
    except KeyboardInterrupt:
        crew.stop(procs)
        return 130
