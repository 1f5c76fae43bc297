"""The overnight loop: the defaults and the A/A check first, then ask Optuna, run, gate, decide,
record, branch, until the deadline.

Data flows one way: study (what to try) -> worker (a real server measures it) -> gate (no worse,
and faster on fresh instances and held-out prompts) -> ledger (every trial, failures included) ->
git (accepted, undominated configs only). Each step reads the run's rows once (Snapshot); what a
step measures flows on in memory and is written to its row once. The steps: agent.defaults (the
baseline, the A/A, drift), agent.screening (points not started), agent.recording (a trial's row),
agent.judging (gate, held-out decision, branch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from agent import branch_worth, budget, clock, crew, points, views
from agent import study as studies
from agent.context import RunContext, Seams
from agent.defaults import (
    baseline_from,
    check_drift,
    drift_due,
    engine_defaults,
    measure_baseline,
    run_defaults,
)
from agent.gate import Baseline
from agent.judging import (
    branch,
    judge_again,
    judge_candidate,
    judge_put_forward,
    put_forward,
    unbranched,
    unjudged,
)
from agent.ledger import LearnedRule, Ledger, RangeChange, Run, Trial, Worker, utcnow
from agent.planner import BuiltinPlanner, Planner
from agent.points import Point
from agent.recording import Superseded, finish, open_trial
from agent.screening import excluded, facts_for, learn, refusal_check
from agent.space import Space
from agent.states import CANDIDATES, DEFAULTS, RunStatus, Source, Status, WorkerRole
from sandbox.contract import FailureClass

# After this many asks in a row that only repeat answered points, the space is spent.
MAX_REPEATS_IN_A_ROW = 200


class DirtyMachine(RuntimeError):
    """A trial left processes, its port or device memory behind: the next trial would measure (or
    run out of memory) because of it, and blame its own config. The run stops instead."""


@dataclass
class Snapshot:
    """The run's rows as one step reads them, once: everything a step of either loop decides on."""
    history: list[Trial]
    rules: list[LearnedRule]
    base: Baseline
    left: float    # seconds to the deadline

    @classmethod
    def read(cls, ctx: RunContext, ledger: Ledger) -> Snapshot:
        history = ledger.history(ctx.run.id, whole=DEFAULTS)
        return cls(history, ledger.learned_rules(ctx.run.id) if ctx.settings.preflight else [],
                   baseline_from(history, ctx.settings.gate), clock.seconds_left(ctx.run.deadline_at))

    def over(self, ctx: RunContext) -> bool:
        """No time for one more trial, or the trial cap reached."""
        return (self.left <= expected_trial_s(self.history, ctx.heldout_points)
                or spent(self.history, ctx.settings.max_trials))


def run_search(ctx: RunContext, seams: Seams, storage, planner: Planner | None = None,
               me: Worker | None = None) -> Run:
    """The coordinator: search until the run's deadline; returns the finished run row. Workers on other
    devices (agent.crew) share its study; their candidates that pass on the search prompts are put
    forward, and only this loop re-checks them and branches."""
    planner, settings, ledger = planner or BuiltinPlanner(), ctx.settings, seams.ledger
    ctx = replace(ctx, defaults=engine_defaults(ctx, seams))
    measure_baseline(ctx, seams)
    ctx = replace(ctx, refusal_check=refusal_check(ctx, seams))
    study = studies.open(ctx.run.id, storage, settings.seed, settings.sampler)
    catch_up(ctx, seams, study)
    sampler_space = narrowed(ctx.space, ledger.narrowings(ctx.run.id))
    # One-knob changes stand in for TPE's random start-up points, as many as it would draw: more of them
    # delayed the best config on the simulated engine (docs/results.md, the search benchmark).
    near = (ctx.space.near_defaults(ctx.defaults, settings.seed)[:studies.STARTUP_TRIALS]
            if settings.one_knob_start else [])
    repeats_in_a_row = 0
    while True:
        now = Snapshot.read(ctx, ledger)
        seen, since_planner = studies.told_so_far(study, settings.sampler_per_planner)
        if worth_it := branch_worth.due(ctx, seams, now.history):   # --capacity: what the first branch is worth
            branch_worth.measure_into(ctx, seams, worth_it)
            continue
        if now.over(ctx):
            break
        if crew.bury(ledger, ctx.run, study, ctx.home, seams.say):
            continue
        if drift_due(now.history, settings.drift_every):
            check_drift(ctx, seams, now.base)
            continue
        if forward := put_forward(now.history):
            judge_put_forward(ctx, seams, forward, now.base, now.history)
            continue
        if not studies.waiting(study) and (cut := cut_once(now.history, seen)):
            study.enqueue_trial(cut.params, user_attrs={"source": cut.source, "knobs": list(cut.params), "rationale":
                                                        f"trial {cut.number} was cut by a crash "
                                                        f"before it was measured"})
        if since_planner >= settings.sampler_per_planner and not studies.waiting(study):
            seen_by_planner = views.trials(now.history)   # frozen copies: a planner reads, never writes
            studies.enqueue(study, planner.propose(ctx.space, views.run(ctx.run), seen_by_planner,
                                                   facts_for(settings.facts, now.rules), k=1))
            sampler_space = narrow(sampler_space, planner, seen_by_planner, ctx.run, seams)
        if not studies.waiting(study) and (first := next_near(near, seen, sampler_space)):
            study.enqueue_trial(first, user_attrs={"source": Source.SAMPLER, "knobs": list(first), "rationale":
                                                   "one knob changed from the engine's defaults"})
        ran = candidate(ctx, seams, study, sampler_space, seen, now, WorkerRole.COORDINATOR)
        repeats_in_a_row = 0 if ran else repeats_in_a_row + 1
        if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            seams.say("exhausted", asks=repeats_in_a_row)
            break
    wind_down(ctx, seams, study, me)
    return ledger.update(ctx.run, status=RunStatus.FINISHED, finished_at=utcnow())


def work(ctx: RunContext, seams: Seams, storage, me: Worker, lost: Callable[[], bool] = lambda: False) -> None:
    """A worker on a further device (of this host or another): the defaults on its own device (their
    spread joins the baseline's noise), then candidates the shared study asks for, until the deadline
    or the run's end. What passes on the search prompts is put forward to the coordinator."""
    run, ledger, say = ctx.run, seams.ledger, seams.say
    defaults = wait_for(ledger, run, lambda r: (r.calibration or {}).get("engine_defaults"), say,
                        "the engine's defaults")
    if defaults is None:
        return
    ctx = replace(ctx, defaults=defaults)
    if not any(t.source in (Source.BASELINE, Source.DEVICE) and t.worker_id == me.id and t.status == Status.OK
               for t in ledger.trials(run.id)):
        run_defaults(ctx, seams, Source.DEVICE, f"the defaults on {me.device} of {me.host}: this device's instance of "
                                           f"the baseline")
    if wait_for(ledger, run, lambda r: r.baseline_figure, say, "the baseline and the A/A check") is None:
        return
    ctx = replace(ctx, refusal_check=refusal_check(ctx, seams))
    study = studies.open(run.id, storage, ctx.settings.seed, ctx.settings.sampler)
    repeats_in_a_row = 0
    while not lost():
        if ledger.run_now(run).status != "running":
            break
        now = Snapshot.read(ctx, ledger)
        if now.over(ctx):
            break
        crew.bury(ledger, run, study, ctx.home, say)
        seen, _ = studies.told_so_far(study, ctx.settings.sampler_per_planner)
        sampler_space = narrowed(ctx.space, ledger.narrowings(run.id))   # the coordinator's planner narrows it
        ran = candidate(ctx, replace(seams, repo=None), study, sampler_space, seen, now, WorkerRole.WORKER)
        repeats_in_a_row = 0 if ran else repeats_in_a_row + 1
        if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            say("exhausted", asks=repeats_in_a_row)
            break


def candidate(ctx: RunContext, seams: Seams, study: studies.Study, sampler_space: Space, seen: dict,
              now: Snapshot, role: WorkerRole) -> bool:
    """Ask the study for one point and try it; False when the point was answered already (no server)."""
    ledger, say = seams.ledger, seams.say
    trial = study.ask()
    source = Source(trial.user_attrs.get("source", Source.SAMPLER))
    # A planner's proposal or a first single-knob point is exactly its knobs (the rest stay at
    # engine defaults); the sampler's own trials walk the whole space, within any narrowed range.
    point = ({n: ctx.space.knobs[n].suggest(trial) for n in trial.user_attrs["knobs"]}
             if "knobs" in trial.user_attrs else sampler_space.sample(trial))
    key = Point.of(point)
    if key in seen:  # TPE repeats itself near the end; a repeat costs nothing to answer
        studies.tell(study, trial, *seen[key])
        return False
    if other := next((t for t in now.history
                      if t.status == Status.RUNNING and Point.of_row(t) == key), None):
        # Another worker measures this very point now: no second server for it, and nothing to learn.
        studies.fail(study, trial.number)
        say("duplicate", number=other.number)
        return False
    row = open_trial(ctx, ledger, point, source, trial.number, trial.user_attrs.get("rationale"))
    say("trial", number=row.number, source=row.source, params=point, left_s=now.left,
        best=best_ratio(now.history), rationale=row.rationale)
    if why := excluded(ctx, point, now.rules):
        why["constraint"], why["failure_class"] = 1.0, FailureClass.INVALID_CONFIG
        row = finish(ledger, row, **why)
        say("result", number=row.number, row=row)
    else:
        try:
            row = judge_candidate(ctx, seams, row, now.base, now.history, role)
        except Superseded as e:   # recorded and told FAIL by whoever declared us lost: nothing more to do
            say("superseded", line=str(e))
            return True
    if ctx.settings.preflight:
        learn(ctx, seams, row)
    studies.tell(study, trial, *studies.told(row), pruned=row.status == Status.PRUNED)
    if row.failure_class == "unclean_teardown":
        raise DirtyMachine(f"trial {row.number} left the machine dirty: {row.failure_message}")
    return True


def catch_up(ctx: RunContext, seams: Seams, study: studies.Study) -> None:
    """After a crash (recovery.repair names them): a candidate measured but never gated is judged from
    its worker's result and told to Optuna, and an accepted one with no branch is branched."""
    ledger = seams.ledger
    trials = ledger.trials(ctx.run.id)
    cut = unjudged(trials)
    if not cut and not unbranched(trials):
        return   # a run not cut in either window: nothing more read at its start
    judge_cut(ctx, seams, study, cut)
    now = Snapshot.read(ctx, ledger)
    for row in unbranched(ledger.trials(ctx.run.id)):
        branch(ctx, seams, row, now.base, now.history)


def judge_cut(ctx: RunContext, seams: Seams, study: studies.Study, cut: list[Trial],
              role: WorkerRole = WorkerRole.COORDINATOR) -> None:
    """Candidates measured but never gated (window 1), judged from their workers' results and only then
    told to Optuna: the same rule for the coordinator at a resume, a worker at its stop and a finished
    run's resume (role WORKER: one that passes is put forward, not decided)."""
    running, now = {ft.number for ft in studies.running(study)}, Snapshot.read(ctx, seams.ledger)
    for row in cut:
        row = judge_again(ctx, seams, row, now.base, now.history, role)
        if row.optuna_number in running and row.status == Status.INTERRUPTED:
            studies.fail(study, row.optuna_number)
        elif row.optuna_number in running:
            studies.tell_row(study, row.optuna_number, row)


def wait_for(ledger: Ledger, run: Run, ready: Callable[[Run], object], say: Callable, what: str):
    """Poll the run's row until ready(row) is truthy (returned), or None once the run is no longer going."""
    said = False
    while True:
        row = ledger.run_now(run)
        if (value := ready(row)) or row.status != "running" or clock.seconds_left(row.deadline_at) <= 0:
            return value or None
        if not said:
            say("waiting", what=what)
            said = True
        time.sleep(min(crew.heartbeat_s(), 5.0))


def wind_down(ctx: RunContext, seams: Seams, study: studies.Study, me: Worker | None) -> None:
    """At the deadline: wait for the workers' trials in flight (they end by the deadline too), then decide
    what they put forward while time is left; what cannot be re-checked in time is refused, and said so."""
    run, ledger = ctx.run, seams.ledger
    while True:
        history = ledger.trials(run.id)
        running = [t for t in history if t.status == Status.RUNNING and (me is None or t.worker_id != me.id)]
        crew.bury(ledger, run, study, ctx.home, seams.say)
        if not running or clock.seconds_left(run.deadline_at) < -crew.STOP_GRACE_S:
            break
        time.sleep(min(crew.heartbeat_s(), 5.0))
    while forward := put_forward(history := ledger.trials(run.id)):
        judge_put_forward(ctx, seams, forward, baseline_from(history, ctx.settings.gate), history)


def cut_once(history: list[Trial], seen: dict) -> Trial | None:
    """A candidate a crash cut before it was measured, cut once and not measured since: measured again
    (a crash costs no candidate; the sampler would not draw it again). Cut twice, it is left alone: a
    point that takes the agent down with it must not do so all night."""
    cuts = [t for t in history if t.source in CANDIDATES and t.status == Status.INTERRUPTED]
    times = points.interruptions(cuts)
    for t in cuts:
        point = Point.of_row(t)
        again = any(u.number > t.number and Point.of_row(u) == point for u in history)
        if point not in seen and not again and times[point] == 1:
            return t
    return None


def next_near(near: list[dict], seen: dict, space: Space) -> dict | None:
    """The next single-knob point not yet answered and inside any range a planner narrowed."""
    return next((p for p in near if Point.of(p) not in seen and not space.problems(p)), None)


def spent(history: list[Trial], max_trials: int | None) -> bool:
    """--max-trials counts candidates that ran: a skipped point never started, and the first cut of a
    point by a crash (interrupted) is measured again after the resume, so neither uses up a trial; a
    point cut again counts, so a run whose trials keep being cut still stops."""
    if max_trials is None:
        return False
    return points.counted(t for t in history if t.source in CANDIDATES and t.status != Status.SKIPPED) >= max_trials


def narrowed(space: Space, changes: list[RangeChange]) -> Space:
    for c in changes:
        space = space.narrowed(c.knob, c.low, c.high)
    return space


def narrow(space: Space, planner: Planner, history: list[views.TrialView], run: Run, seams: Seams) -> Space:
    """Apply and record the ranges the planner wants the sampler to keep to."""
    for n in getattr(planner, "narrow", lambda *a: [])(space, history):
        try:
            space = space.narrowed(n.knob, n.low, n.high)
        except ValueError as e:  # a planner's range is data like its proposals: refused, not trusted
            seams.say("narrow_refused", planner=planner.name, reason=str(e))
            continue
        seams.ledger.add(RangeChange(run_id=run.id, after_trial=max((t.number for t in history), default=-1),
                                     planner=planner.name, knob=n.knob, low=n.low, high=n.high, rationale=n.rationale))
        seams.say("narrow", knob=n.knob, low=n.low, high=n.high, rationale=n.rationale)
    return space


def expected_trial_s(history: list[Trial], heldout_points: int = 0) -> float:
    """The longest candidate trial so far with its first held-out instance (before any candidate, the
    latest instance of the defaults with one): no trial starts whose first decision the measured
    times say cannot finish. Before any held-out instance has run, one is counted as the trial's own
    start, warm-up and benchmark."""
    share = lambda t: budget.heldout_share(t.measured, heldout_points)  # noqa: E731
    durations = [t.timings.get("total_s", 0) + t.timings.get("recheck_first_s",
                                                             budget.heldout_instance_s(t.timings, share(t)))
                 for t in history if t.status in (Status.OK, Status.FAILED) and t.source in CANDIDATES]
    if durations:
        return max(durations)
    defaults = [t for t in history if t.status == Status.OK and t.source in DEFAULTS]
    return budget.plan(defaults[-1].timings, 0, False, 0, 0,
                       heldout_share=share(defaults[-1]))["decided_in_s"] if defaults else 0.0


def best_ratio(history: list[Trial]) -> float | None:
    return max((t.claimed_ratio for t in history if t.branch), default=None)
