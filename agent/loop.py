"""The overnight loop: the defaults and the A/A check first, then ask Optuna, run, gate, decide,
record, propose, until the deadline.

Data flows one way: study (what to try) -> worker (a real server measures it) -> gate (no worse,
and faster on fresh instances and held-out prompts) -> ledger (every trial, failures included) ->
git (accepted, undominated configs only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from agent import budget, crew, gate, gitops, proposal, refusals, study as studies
from agent.budget import seconds_left
from agent.gate import Baseline, GateSettings, Instance, MeasureFailed
from agent.ledger import LearnedRule, Ledger, RangeChange, Repeat, Run, Trial, Worker, utcnow
from agent.planner import BuiltinPlanner, Planner
from agent.space import Space
from agent.stats import compare, interval
from sandbox.result import TrialResult

DRIFT_MIN = 0.02  # smallest move of the defaults' TPS that is corrected as drift
# After this many asks in a row that only repeat answered points, the space is spent.
MAX_REPEATS_IN_A_ROW = 200


class Engine(Protocol):
    def evaluate(self, spec: dict, trial_dir: Path, timeout_s: float,
                 on_phase: Callable[[str], None] = ...) -> TrialResult: ...

    def defaults(self, model: str, names: list[str]) -> dict[str, list | None]: ...


# Rows that are instances of the engine defaults; "device": one on each further device of the run.
DEFAULTS_SOURCES = ("baseline", "aa", "drift", "extra", "device")
CANDIDATES = ("planner", "sampler")


@dataclass
class Settings:
    model: str
    workload: str | dict   # a shipped profile's name, or the run's workload as a mapping (its traffic path in it)
    quality: str = "default"
    quality_text: str | None = None   # the user's perplexity text (--quality-text)
    gate: GateSettings = field(default_factory=GateSettings)
    baseline_instances: int = 2    # before the A/A; more follow on a noisy host (GateSettings.noisy)
    repeats: int = 2
    seed: int = 0
    sampler_per_planner: int = 1   # sampler trials between two planner trials
    sampler: str = "tpe"           # tpe, or random (the benchmark's control arm)
    max_trials: int | None = None  # stop after this many candidate trials, even with budget left
    recheck: bool = True           # re-measure an accepted config on a fresh server and held-out prompts
    drift_every: int = 10          # candidate trials between two re-measurements of the baseline (0: never)
    facts: dict = field(default_factory=dict)  # hardware and workload facts for the planner
    # What keeps a night on configs that can run and might win (off only for scripts/bench_search.py's
    # "before" arm): vLLM's pre-flight and learned refusals, pruning hopeless benchmarks. One-knob
    # changes in place of TPE's random start-up points are off by default: on the simulated engine
    # they took the search longer to its best (docs/results.md).
    preflight: bool = True
    prune: bool = True
    near_start: bool = False
    home: Path | None = None       # where trial folders go (default: the run's home; a worker on another host: its own)


class BaselineFailed(RuntimeError):
    pass


class BudgetTooShort(BaselineFailed):
    """The instances of the defaults measured so far say that no first decision fits the budget."""


class Superseded(RuntimeError):
    """Another process recorded this trial as interrupted while it ran: this worker had been declared
    lost (silent past the grace). Its result is dropped, so the trial stays recorded once."""


class DirtyMachine(RuntimeError):
    """A trial left processes, its port or device memory behind: the next trial would measure (or
    run out of memory) because of it, and blame its own config. The run stops instead."""


def say_nothing(event: str, **info) -> None:
    pass


@dataclass
class Step:
    """The run's state, read once per step: everything a step of either loop decides on."""
    history: list[Trial]
    rules: list[LearnedRule]
    base: Baseline
    left: float    # seconds to the deadline

    @classmethod
    def read(cls, run: Run, settings: Settings, ledger: Ledger) -> "Step":
        history = ledger.trials(run.id)
        return cls(history, ledger.learned_rules(run.id) if settings.preflight else [],
                   baseline_from(history, settings.gate), seconds_left(run.deadline_at))

    def over(self, settings: Settings) -> bool:
        """No time for one more trial, or the trial cap reached."""
        return self.left <= expected_trial_s(self.history) or spent(self.history, settings)


def run_search(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine,
               repo, storage, say: Callable = say_nothing, planner: Planner | None = None,
               me: Worker | None = None) -> Run:
    """The coordinator: search until the run's deadline; returns the finished run row. Workers on other
    devices (agent.crew) share its study; their candidates that pass on the search prompts are put
    forward, and only this loop re-checks them and commits."""
    planner = planner or BuiltinPlanner()
    defaults = engine_defaults(run, settings, space, ledger, engine)
    measure_baseline(run, settings, space, ledger, engine, defaults, say)
    preflight = preflight_for(run, settings, space, engine, say)
    study = studies.open(run.id, storage, settings.seed, settings.sampler)
    sampler_space = narrowed(space, ledger.narrowings(run.id))
    # One-knob changes stand in for TPE's random start-up points, as many as it would draw: more of them
    # delayed the best config on the simulated engine (docs/results.md, the search benchmark).
    near = space.near_defaults(defaults, settings.seed)[:studies.STARTUP_TRIALS] if settings.near_start else []
    repeats_in_a_row = 0
    while True:
        step = Step.read(run, settings, ledger)
        seen, since_planner = studies.told_so_far(study, settings.sampler_per_planner)
        if step.over(settings):
            break
        if crew.bury(ledger, run, study, home_of(run, settings), say):
            continue
        if drift_due(step.history, settings):
            check_drift(run, settings, space, ledger, engine, step.base, defaults, say)
            continue
        if forward := put_forward(step.history):
            decide(run, forward, settings, ledger, engine, step.base, step.history, repo, say)
            continue
        if since_planner >= settings.sampler_per_planner and not studies.waiting(study):
            studies.enqueue(study, planner.propose(space, run, step.history, facts_for(settings, step.rules), k=1))
            sampler_space = narrow(sampler_space, planner, step.history, ledger, run, say)
        if not studies.waiting(study) and (first := next_near(near, seen, sampler_space)):
            study.enqueue_trial(first, user_attrs={"source": "sampler", "knobs": list(first), "rationale":
                                                   "one knob changed from the engine's defaults"})
        ran = candidate(run, settings, space, ledger, engine, study, sampler_space, seen, step,
                        preflight, defaults, repo, say, coordinator=True)
        repeats_in_a_row = 0 if ran else repeats_in_a_row + 1
        if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            say("exhausted", asks=repeats_in_a_row)
            break
    wind_down(run, settings, ledger, engine, study, repo, me, say)
    return ledger.update(run, status="finished", finished_at=utcnow())


def work(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, storage, me: Worker,
         say: Callable = say_nothing, lost: Callable[[], bool] = lambda: False) -> None:
    """A worker on a further device (of this host or another): the defaults on its own device (their
    spread joins the baseline's noise), then candidates the shared study asks for, until the deadline
    or the run's end. What passes on the search prompts is put forward to the coordinator."""
    defaults = wait_for(ledger, run, lambda r: (r.calibration or {}).get("engine_defaults"), say, "the engine's defaults")
    if defaults is None:
        return
    if not any(t.source in ("baseline", "device") and t.worker_id == me.id and t.status == "ok"
               for t in ledger.trials(run.id)):
        run_defaults(run, settings, space, ledger, engine, defaults, say, "device",
                     f"the defaults on {me.device} of {me.host}: this device's instance of the baseline")
    if wait_for(ledger, run, lambda r: r.baseline_tps, say, "the baseline and the A/A check") is None:
        return
    preflight = preflight_for(run, settings, space, engine, say)
    study = studies.open(run.id, storage, settings.seed, settings.sampler)
    sampler_space = narrowed(space, ledger.narrowings(run.id))
    repeats_in_a_row = 0
    while not lost():
        if ledger.run(run.id).status != "running":
            break
        step = Step.read(run, settings, ledger)
        if step.over(settings):
            break
        crew.bury(ledger, run, study, home_of(run, settings), say)
        seen, _ = studies.told_so_far(study, settings.sampler_per_planner)
        sampler_space = narrowed(space, ledger.narrowings(run.id))   # the coordinator's planner narrows it
        ran = candidate(run, settings, space, ledger, engine, study, sampler_space, seen, step,
                        preflight, defaults, None, say, coordinator=False)
        repeats_in_a_row = 0 if ran else repeats_in_a_row + 1
        if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
            say("exhausted", asks=repeats_in_a_row)
            break


def candidate(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, study: studies.Study,
              sampler_space: Space, seen: dict, step: Step, preflight, defaults: dict, repo, say: Callable,
              coordinator: bool) -> bool:
    """Ask the study for one point and try it; False when the point was answered already (no server)."""
    trial = study.ask()
    source = trial.user_attrs.get("source", "sampler")
    # A planner's proposal or a first single-knob point is exactly its knobs (the rest stay at
    # engine defaults); the sampler's own trials walk the whole space, within any narrowed range.
    point = ({n: space.knobs[n].suggest(trial) for n in trial.user_attrs["knobs"]}
             if "knobs" in trial.user_attrs else sampler_space.sample(trial))
    key = repr(sorted(point.items()))
    if key in seen:  # TPE repeats itself near the end; a repeat costs nothing to answer
        studies.tell(study, trial, *seen[key])
        return False
    if other := next((t for t in step.history if t.status == "running" and repr(sorted(t.params.items())) == key), None):
        # Another worker measures this very point now: no second server for it, and nothing to learn.
        studies.fail(study, trial.number)
        say("duplicate", number=other.number)
        return False
    row = start_trial(run, ledger, space, defaults, point, source, trial.number, trial.user_attrs.get("rationale"))
    say("trial", number=row.number, source=row.source, params=point, left_s=step.left,
        best=best_ratio(step.history), rationale=row.rationale)
    if why := excluded(point, space, step.rules, preflight, row):
        finish(ledger, row, constraint=1.0, failure_class="invalid_config", **why)
        say("result", number=row.number, row=ledger.trial(run.id, row.number))
    else:
        try:
            evaluate(run, row, settings, ledger, engine, step.base, step.history, repo, step.left, say,
                     coordinator=coordinator)
        except Superseded as e:   # recorded and told FAIL by whoever declared us lost: nothing more to do
            say("superseded", line=str(e))
            return True
    row = ledger.trial(run.id, row.number)
    if settings.preflight:
        learn(run, row, point, space, defaults, preflight, ledger, say)
    studies.tell(study, trial, *studies.told(row), pruned=row.status == "pruned")
    if row.failure_class == "unclean_teardown":
        raise DirtyMachine(f"trial {row.number} left the machine dirty: {row.failure_message}")
    return True


def wait_for(ledger: Ledger, run: Run, ready: Callable[[Run], object], say: Callable, what: str):
    """Poll the run's row until ready(row) is truthy (returned), or None once the run is no longer going."""
    said = False
    while True:
        row = ledger.run(run.id)
        if (value := ready(row)) or row.status != "running" or seconds_left(row.deadline_at) <= 0:
            return value or None
        if not said:
            say("waiting", what=what)
            said = True
        time.sleep(min(crew.heartbeat_s(), 5.0))


def home_of(run: Run, settings: Settings) -> Path:
    return Path(settings.home or run.settings["home"])


def put_forward(history: list[Trial]) -> Trial | None:
    """The oldest candidate a worker put forward that no one has decided yet."""
    return next((t for t in history if t.decision == "put_forward" and t.status == "ok"), None)


def decide(run: Run, row: Trial, settings: Settings, ledger: Ledger, engine: Engine, base: Baseline,
           history: list[Trial], repo, say: Callable) -> None:
    """A worker's candidate that passed on the search prompts: the held-out decision and the branch,
    as for the coordinator's own (on the coordinator's device, against the defaults' instances)."""
    say("phase", number=row.number, phase=f"deciding trial {row.number} put forward by a worker")
    if by := slower_than_proposed(row, history, base, settings.gate):
        ledger.update(row, gate_passed=False, decision="dominated", gate_reasons=[*row.gate_reasons, by])
    else:
        ledger.update(row, decision="awaiting_recheck")
        accepted = held_out(run, row, settings, ledger, engine, base, history, say) if settings.recheck else \
            search_only(row, settings, ledger)
        if accepted:
            propose(run, row, settings, ledger, base, history, repo)
    say("result", number=row.number, row=ledger.trial(run.id, row.number))


def wind_down(run: Run, settings: Settings, ledger: Ledger, engine: Engine, study: studies.Study, repo,
              me: Worker | None, say: Callable) -> None:
    """At the deadline: wait for the workers' trials in flight (they end by the deadline too), then decide
    what they put forward while time is left; what cannot be re-checked in time is refused, and said so."""
    while True:
        history = ledger.trials(run.id)
        running = [t for t in history if t.status == "running" and (me is None or t.worker_id != me.id)]
        crew.bury(ledger, run, study, home_of(run, settings), say)
        if not running or seconds_left(run.deadline_at) < -crew.STOP_GRACE_S:
            break
        time.sleep(min(crew.heartbeat_s(), 5.0))
    while forward := put_forward(ledger.trials(run.id)):
        history = ledger.trials(run.id)
        decide(run, forward, settings, ledger, engine, baseline_from(history, settings.gate), history, repo, say)


# ---- Points vLLM refuses: the space's rules, the run's learned rules, the pre-flight ---------

Verdict = Callable[[dict], "str | None"]   # a point -> vLLM's refusal at pre-flight, or None


def preflight_for(run: Run, settings: Settings, space: Space, engine: Engine, say: Callable) -> Verdict | None:
    """vLLM's own config checks for points of this space, or None where they cannot be trusted: the
    engine has none, or they refuse the defaults themselves (which did just start), so a refusal
    would say more about the pre-flight than about the point."""
    if not settings.preflight or not hasattr(engine, "preflight"):
        return None
    flags, env = space.to_flags_env({})
    answer = engine.preflight(settings.model, flags, env)
    if not answer or not answer.get("ok"):
        say("preflight_off", reason=(answer or {}).get("message") or "the pre-flight did not answer")
        return None

    def refused(point: dict) -> str | None:
        if space.problems(point):
            return None   # not a point vLLM could be asked about; the space has its own say
        answer = engine.preflight(settings.model, *space.to_flags_env(point))
        return answer["message"] if answer and answer.get("ok") is False else None
    return refused


def excluded(point: dict, space: Space, rules: list[LearnedRule], preflight: Verdict | None, row: Trial) -> dict | None:
    """Why a point is not started (the row's final values), or None: it goes to a real server."""
    if broken := space.broken_rules(point):
        return dict(status="skipped", decision="skipped",
                    failure_message=f"excluded by the space's rules: {'; '.join(broken)}")
    if rule := refusals.matching(point, rules):
        return dict(status="skipped", decision="skipped",
                    failure_message=f"contains learned rule {rule.id} ({refusals.describe(rule.settings)}), which "
                                    f"vLLM refused at {rule.stage} in trial {rule.from_trial}: {rule.message}")
    started = time.monotonic()
    if preflight and (message := preflight(point)):
        return dict(status="failed", decision="failed", failure_message=f"refused at pre-flight: {message}",
                    failure_cause=message, failed_phase="preflight", timings={"preflight_s": round(time.monotonic() - started, 3)})
    return None


def learn(run: Run, row: Trial, point: dict, space: Space, defaults: dict, preflight: Verdict | None,
          ledger: Ledger, say: Callable) -> None:
    """A point vLLM refused (at pre-flight or at start) becomes a rule of the run: the smallest set of
    its changes still refused, so no later point that contains it is started."""
    cause = row.failure_cause or row.failure_message or ""
    if row.failure_class != "invalid_config" or row.status != "failed":
        return
    stage = "pre-flight" if row.failed_phase == "preflight" else "start"
    changes = {k: point[k] for k in space.changed(point, defaults)}
    if not changes:
        return
    replayed = preflight(point) if preflight and stage == "start" else None
    if stage == "pre-flight" or (replayed and refusals.same_cause(replayed, cause)):
        settings, checks = refusals.minimise(changes, cause, preflight)
        how = "minimised at pre-flight"
    else:
        settings, checks = refusals.named(changes, cause) or changes, 0
        how = "named in vLLM's message" if settings != changes else "the whole point"
    rule = ledger.add(LearnedRule(run_id=run.id, from_trial=row.number, settings=settings, message=cause[:600],
                                  stage=stage, how=how, checks=checks))
    say("learned", number=row.number, rule=rule.id, settings=refusals.describe(settings), how=how)


def facts_for(settings: Settings, rules: list[LearnedRule]) -> dict:
    """The planner's facts, with what vLLM refused in this run."""
    if not rules:
        return settings.facts
    return {**settings.facts, "refused_by_vllm_this_run": [f"{refusals.describe(r.settings)}: {r.message[:200]}"
                                                           for r in rules]}


def next_near(near: list[dict], seen: dict, space: Space) -> dict | None:
    """The next single-knob point not yet answered and inside any range a planner narrowed."""
    return next((p for p in near if repr(sorted(p.items())) not in seen and not space.problems(p)), None)


def spent(history: list[Trial], settings: Settings) -> bool:
    """--max-trials counts candidates that ran: a skipped point never started, and the first cut of a
    point by a crash (interrupted) is measured again after the resume, so neither uses up a trial; a
    point cut again counts, so a run whose trials keep being cut still stops."""
    if settings.max_trials is None:
        return False
    cut, count = set(), 0
    for t in history:
        if t.source not in CANDIDATES or t.status == "skipped":
            continue
        point = repr(sorted((t.params or {}).items()))
        if t.status == "interrupted" and point not in cut:
            cut.add(point)
            continue
        count += 1
    return count >= settings.max_trials


def narrowed(space: Space, changes: list[RangeChange]) -> Space:
    for c in changes:
        space = space.narrowed(c.knob, c.low, c.high)
    return space


def narrow(space: Space, planner: Planner, history: list[Trial], ledger: Ledger, run: Run, say: Callable) -> Space:
    """Apply and record the ranges the planner wants the sampler to keep to."""
    for n in getattr(planner, "narrow", lambda *a: [])(space, history):
        try:
            space = space.narrowed(n.knob, n.low, n.high)
        except ValueError as e:  # a planner's range is data like its proposals: refused, not trusted
            say("narrow_refused", planner=planner.name, reason=str(e))
            continue
        ledger.add(RangeChange(run_id=run.id, after_trial=max((t.number for t in history), default=-1),
                               planner=planner.name, knob=n.knob, low=n.low, high=n.high, rationale=n.rationale))
        say("narrow", knob=n.knob, low=n.low, high=n.high, rationale=n.rationale)
    return space


def expected_trial_s(history: list[Trial]) -> float:
    """The longest candidate trial so far with its first held-out instance (before any candidate, the
    latest instance of the defaults with one): no trial starts whose first decision the measured
    times say cannot finish. Before any held-out instance has run, one is counted as the trial's own
    start, warm-up and benchmark."""
    durations = [t.timings.get("total_s", 0) + t.timings.get("recheck_first_s", budget.heldout_instance_s(t.timings))
                 for t in history if t.status in ("ok", "failed") and t.source in CANDIDATES]
    if durations:
        return max(durations)
    defaults = [t for t in history if t.status == "ok" and t.source in DEFAULTS_SOURCES]
    return budget.plan(defaults[-1].timings, 0, False, 0, 0)["decided_in_s"] if defaults else 0.0


def spec_for(run: Run, settings: Settings, flags: dict, env: dict, **extra) -> dict:
    return {"model": settings.model, "flags": flags, "env": env, "workload": settings.workload,
            "quality": settings.quality, "repeats": settings.repeats,
            **({"quality_text": settings.quality_text} if settings.quality_text else {}), **extra}


def engine_defaults(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine) -> dict:
    """The engine's default for every knob, read once per run (and kept in the ledger for a resume)."""
    calibration = run.calibration or {}
    if "engine_defaults" not in calibration:
        found = engine.defaults(settings.model, list(space.knobs)) if hasattr(engine, "defaults") else {}
        ledger.update(run, calibration={**calibration, "engine_defaults": found})
    return run.calibration["engine_defaults"]


def start_trial(run: Run, ledger: Ledger, space: Space, defaults: dict, point: dict, source: str,
                optuna_number: int | None = None, rationale: str | None = None) -> Trial:
    flags, env = space.to_flags_env(point)
    return ledger.add_trial(Trial(run_id=run.id, source=source, optuna_number=optuna_number, params=point, flags=flags,
                                  env=env, lossless=space.lossless(point, defaults), rationale=rationale))


def best_ratio(history: list[Trial]) -> float | None:
    return max((t.claimed_ratio for t in history if t.branch), default=None)


def run_worker(run: Run, row: Trial, settings: Settings, engine: Engine, timeout_s: float, say: Callable,
               suffix: str = "", **extra) -> TrialResult:
    trial_dir = home_of(run, settings) / run.id / f"trial-{row.number:03d}{suffix}"
    t0 = time.monotonic()
    result = engine.evaluate(spec_for(run, settings, row.flags, row.env, **extra), trial_dir, timeout_s,
                             on_phase=lambda phase: say("phase", number=row.number, phase=phase))
    result.timings["total_s"] = round(time.monotonic() - t0, 1)
    return result


def record(ledger: Ledger, row: Trial, result: TrialResult) -> None:
    failure, bench, quality = result.failure, result.bench, result.quality
    values = dict(
        status=result.status, failure_class=failure and failure.klass,
        failure_message=failure and failure.message, failure_cause=failure and failure.cause,
        failed_phase=result.failed_phase, log_tail=(failure and failure.log_tail) or None,
        tps=bench.value if bench else None, ppl=quality.ppl if quality else None,
        heldout_tps=result.bench_heldout.value if result.bench_heldout else None,
        errors=bench.errors if bench else None,
        ttft_p99_ms=bench.ttft_ms.get("p99") if bench else None, itl_p99_ms=bench.itl_ms.get("p99") if bench else None,
        metrics=result.metrics or {}, greedy=(quality and quality.token_ids) or None,
        top_logprobs=(quality and quality.top_logprobs) or None,
        timings=result.timings, log_path=result.log_path,
        meter={**result.workload, "quality": result.quality_set}, finished_at=utcnow(),
        measured={**({"ttft_ms": bench.ttft_ms, "itl_ms": bench.itl_ms, "repeats_tps": bench.repeats_tps,
                      "finish": bench.finish, "tpot_ms": bench.tpot_ms, "goodput": bench.goodput} if bench else
                     dict.fromkeys(("ttft_ms", "itl_ms", "repeats_tps", "finish", "tpot_ms", "goodput"))),
                  "engine": result.engine, "hardware": result.hardware, "device": result.device})
    repeats = [x for x in (bench.repeats_tps if bench else []) if x and x > 0]
    if len(repeats) >= 2:  # within one server only: the noise between instances is the run's `noise`
        values["tps_interval"] = [round(x, 3) for x in interval(repeats)]
    # Only while the row is still running: a worker declared lost mid-trial finds it interrupted.
    if not ledger.claim(Trial, row.id, {"status": "running"}, **values):
        raise Superseded(f"trial {row.number}: recorded as interrupted by another process while it ran "
                         f"(this worker was silent past the grace); its result is dropped")
    for key, value in values.items():
        setattr(row, key, value)
    with ledger.session.begin() as s:
        for tps in bench.repeats_tps if bench else []:
            s.add(Repeat(trial_id=row.id, instance=0, tps=tps))


def finish(ledger: Ledger, row: Trial, **values) -> None:
    ledger.update(row, finished_at=utcnow(), **values)


# ---- The defaults: baseline instances, the A/A check, later instances -------------------------

def instance_of(t: Trial) -> Instance:
    return Instance(t.tps, t.heldout_tps, t.ppl, {"ids": t.greedy or [], "tops": t.top_logprobs})


def judged_aa(history: list[Trial], settings: GateSettings) -> tuple[Baseline, gate.AAVerdict | None]:
    """The baseline instances measured before the A/A check, and the A/A's verdict against them
    (None before the A/A ran): a pure function of the ledger, so a resume judges it the same way."""
    ok = [t for t in history if t.source in ("baseline", "aa") and t.status == "ok"]
    aa = next((t for t in ok if t.source == "aa"), None)
    first = gate.baseline_of([instance_of(t) for t in ok if t.source == "baseline"
                              and (aa is None or t.number < aa.number)], settings)
    return first, gate.judge_aa(instance_of(aa), first, settings) if aa is not None else None


def baseline_from(history: list[Trial], settings: GateSettings) -> Baseline:
    """The defaults as the ledger has them now: the baseline instances (the first one's greedy path is
    the reference), the A/A instance once judged, later baseline and drift instances (a drift the run
    corrected is left out of the noise: dividing it out leaves that instance no spread), and the
    held-out-only instances measured for decisions."""
    first, verdict = judged_aa(history, settings)
    ok = [t for t in history if t.source in DEFAULTS_SOURCES and t.status == "ok"]
    # A further device's instance is one more draw of the defaults: the spread between devices becomes
    # part of the noise every candidate is judged with, whichever device it ran on (docs/scale-out.md).
    instances = [t for t in ok if t.source in ("baseline", "device") or (t.source == "drift" and t.drift == 1.0)]
    aa = next((t for t in ok if t.source == "aa"), None)
    extras = [t.heldout_tps for t in ok if t.source == "extra" and t.heldout_tps]
    base = gate.baseline_of([instance_of(t) for t in instances], settings, extras=tuple(extras),
                            aa=instance_of(aa) if aa else None)
    drift = next((t.drift for t in reversed(ok) if t.source == "drift" and t.drift is not None), 1.0)
    return replace(base, reference=first.reference, drift=drift,
                   calibration=verdict.calibration if verdict else first.calibration)


def measure_baseline(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, defaults: dict,
                     say: Callable) -> Baseline:
    """The defaults (the space's fixed part only) on fresh server instances, then the A/A check: the
    defaults once more as if a candidate, which the gate must call no loss and no gain."""
    history = ledger.trials(run.id)
    done = sum(1 for t in history if t.source == "baseline" and t.status == "ok")
    for i in range(settings.baseline_instances - done):
        last = run_defaults(run, settings, space, ledger, engine, defaults, say, "baseline", "engine defaults")
        plan = fits_a_decision(run, last, settings.baseline_instances - done - i - 1, True, first=done + i == 0)
        if done + i == 0:   # the first instance says what the budget fits
            ledger.update(run, calibration={**(run.calibration or {}), "plan": plan})
            say("plan", **plan)
    history = ledger.trials(run.id)
    aa = next((t for t in history if t.source == "aa" and t.status == "ok"), None)
    if aa is None:
        aa = run_defaults(run, settings, space, ledger, engine, defaults, say, "aa",
                          "A/A check: the defaults again, judged as a candidate")
        history = ledger.trials(run.id)
    first, verdict = judged_aa(history, settings.gate)
    if aa.decision is None:
        ledger.update(aa, decision="aa-passed" if verdict.passed else "aa-failed", gate_passed=None,
                      gate_reasons=[verdict.line], tps_ratio=round(verdict.speed.ratio, 4),
                      search_interval=[round(verdict.speed.low, 4), round(verdict.speed.high, 4)],
                      flips=[f.as_dict() for f in verdict.flips], rule=verdict.calibration.rule, constraint=0.0,
                      agreement=gate.agreement(first.reference["ids"], aa.greedy or []))
        say("aa", line=verdict.line)
    base = baseline_from(history, settings.gate)
    while gate.more_defaults_wanted(base, verdict, sum(1 for t in history if t.source == "baseline"
                                                       and t.number > aa.number), settings.gate):
        if budget.plan(aa.timings, 1, False, seconds_left(run.deadline_at), 0)["fits"] != "decision":
            say("fewer_defaults", noise=base.measured_noise.sd, instances=len(base.search) + len(base.unscreened))
            break
        run_defaults(run, settings, space, ledger, engine, defaults, say, "baseline",
                     "more instances of the defaults: " + ("the A/A check called them faster or slower than "
                     "themselves" if verdict.add_instances else f"their noise is above {settings.gate.noisy:.0%}"))
        history = ledger.trials(run.id)
        base = baseline_from(history, settings.gate)
    if not any(t.source in CANDIDATES for t in history):   # before the first candidate (a resume may be past it)
        fits_a_decision(run, [t for t in history if t.source in ("baseline", "aa") and t.status == "ok"][-1],
                        0, False, first=False)
    for t in history:
        if t.source == "baseline" and t.status == "ok":
            ledger.update(t, tps_ratio=round(t.tps / base.tps, 4), ppl_change=round(t.ppl / base.ppl - 1, 5),
                          gate_passed=None, gate_reasons=["baseline"], decision="baseline", constraint=0.0)
    noise = base.measured_noise   # what this machine showed; the bounds add the space's prior (base.noise)
    ledger.update(run, baseline_tps=round(base.tps, 3), baseline_ppl=base.ppl, noise=round(noise.sd, 5),
                  noise_df=noise.df, calibration={**(run.calibration or {}), **base.calibration.as_dict(),
                                                  "aa": verdict.line})   # the prior is in run.settings
    say("baseline", tps=base.tps, ppl=base.ppl, noise=noise.sd, df=noise.df, instances=base.search,
        calibration=base.calibration.as_dict(), unit=gate.unit((run.settings or {}).get("traffic")),
        prior=(base.prior.sd, base.prior.df), bound_noise=base.noise.sd)
    return base


def fits_a_decision(run: Run, last: Trial, instances_left: int, aa_left: bool, first: bool) -> dict:
    """What the budget fits after this instance of the defaults; the run stops here, before spending
    the rest, when a first decision cannot finish, even with warm starts after a cold first one."""
    left = seconds_left(run.deadline_at)
    spent = (datetime.now(timezone.utc) - datetime.fromisoformat(run.started_at)).total_seconds()
    points = len(((last.measured or {}).get("goodput") or {}).get("points") or []) or None
    plan = budget.plan(last.timings, instances_left, aa_left, left, spent, points)
    hopeful = budget.plan(last.timings, instances_left, aa_left, left, spent, points,
                          start_scale=budget.WARM_START if first else 1.0)
    if hopeful["fits"] != "decision":
        raise BudgetTooShort(budget.plan_line(plan) + "; stopped here rather than spend the rest")
    return {**plan, "upper_bound": plan["fits"] != "decision"}


def run_defaults(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, defaults: dict,
                 say: Callable, source: str, rationale: str) -> Trial:
    """One fresh server with the engine defaults, measured on the search prompts; the A/A instance on
    the held-out prompts too (its figure there is what held-out decisions first compare with)."""
    row = start_trial(run, ledger, space, defaults, {}, source, rationale=rationale)
    say("trial", number=row.number, source=source, params={}, left_s=seconds_left(run.deadline_at), best=None)
    result = run_worker(run, row, settings, engine, max(seconds_left(run.deadline_at), 1), say,
                        heldout_bench=source == "aa")
    record(ledger, row, result)
    if not result.ok:
        failure = result.failure
        if seconds_left(run.deadline_at) <= 1:   # cut by the deadline: the budget, not the defaults, fell short
            took = [t.timings.get("total_s", 0) for t in ledger.trials(run.id)
                    if t.source in DEFAULTS_SOURCES and t.status == "ok"]
            per = f"; an instance took {max(took) / 60:.1f} min here" if took else ""
            raise BaselineFailed(f"the budget ended while the defaults were measured ({len(took)} instance(s) done{per}): "
                                 f"the baseline and the A/A check need {settings.baseline_instances + 1} before any "
                                 f"candidate; give a longer --budget")
        raise BaselineFailed(f"the defaults failed ({failure.klass}): {failure.message}")
    return ledger.trial(run.id, row.number)


def drift_due(history: list[Trial], settings: Settings) -> bool:
    if not settings.drift_every:
        return False
    since = 0
    for t in reversed(history):
        if t.source in ("baseline", "drift"):
            break
        since += t.source in CANDIDATES and t.status in ("ok", "failed")
    return since >= settings.drift_every


def check_drift(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, base: Baseline,
                defaults: dict, say: Callable) -> None:
    """Measure the defaults again; a move the prediction bounds exclude (and of at least DRIFT_MIN) is
    the machine's, and is divided out from now on. Otherwise the instance joins the defaults' noise."""
    row = run_defaults(run, settings, space, ledger, engine, defaults, say, "drift",
                       f"drift check after {settings.drift_every} candidate trials")
    c = compare([row.tps], base.search, base.noise, settings.gate.level)
    moved = (c.low > 1 or c.high < 1) and abs(c.ratio - 1) > DRIFT_MIN
    drift = round(c.ratio, 4) if moved else 1.0
    ledger.update(row, drift=drift, tps_corrected=round(row.tps / drift, 3), tps_ratio=round(c.ratio, 4),
                  search_interval=[round(c.low, 4), round(c.high, 4)], gate_passed=None, decision="drift",
                  constraint=0.0,
                  gate_reasons=[f"drift check: defaults now at {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] of the "
                                f"baseline; " + (f"correcting by {drift}" if moved else "within the noise, no correction")])
    say("drift", tps=row.tps, factor=round(c.ratio, 4), applied=drift)


# ---- A candidate: gate, held-out decision, branch ----------------------------------------------

def evaluate(run: Run, row: Trial, settings: Settings, ledger: Ledger, engine: Engine, base: Baseline,
             history: list[Trial], repo, timeout_s: float, say: Callable, coordinator: bool = True) -> None:
    """Run one candidate, gate it, decide it, propose it if accepted: all of it in its ledger row. A
    worker (coordinator False) stops at the gate: what passes is put forward to the coordinator."""
    result = run_worker(run, row, settings, engine, timeout_s, say,
                        prune_below_tps=gate.prune_below(base) if settings.prune else None,
                        quality_above_tps=gate.screen_tps(base, settings.gate) if settings.prune else None)
    record(ledger, row, result)
    if result.status == "pruned" or result.quality_skipped:
        cut_short(row, result, base, ledger, say)
        return
    verdict = gate.check(result, base, row.lossless, settings.gate)
    constraint = gate.constraint(verdict, result, settings.gate)
    rule = (base.calibration.rule + (f", tau {base.calibration.tau:.3f}" if base.calibration.rule == "calibrated"
                                     else "")) if row.lossless else "lossy: greedy outputs not required"
    ledger.update(row, gate_passed=verdict.passed if result.ok else False,
                  gate_reasons=verdict.reasons, tps_ratio=verdict.tps_ratio, ppl_change=verdict.ppl_change,
                  agreement=verdict.agreement, kl=verdict.kl, flips=[f.as_dict() for f in verdict.flips] or None,
                  rule=rule, drift=base.drift, constraint=constraint,
                  search_interval=[round(verdict.search.low, 4), round(verdict.search.high, 4)] if verdict.search else None,
                  tps_corrected=round(row.tps / base.drift, 3) if row.tps else None,
                  decision="failed" if not result.ok else
                  ("awaiting_recheck" if verdict.passed and settings.recheck else None if verdict.passed else "refused"))
    if not result.ok:
        say("result", number=row.number, row=row)
        return
    if verdict.passed and (by := slower_than_proposed(row, history, base, settings.gate)):
        ledger.update(row, gate_passed=False, decision="dominated", gate_reasons=[*verdict.reasons, by])
    elif verdict.passed and not coordinator:
        ledger.update(row, decision="put_forward")
    elif verdict.passed:
        accepted = held_out(run, row, settings, ledger, engine, base, history, say) if settings.recheck else \
            search_only(row, settings, ledger)
        if accepted:
            propose(run, row, settings, ledger, base, history, repo)
    say("result", number=row.number, row=ledger.trial(run.id, row.number))


def cut_short(row: Trial, result: TrialResult, base: Baseline, ledger: Ledger, say: Callable) -> None:
    """A candidate measured only for speed: its benchmark stopped because it could not reach the
    defaults (`pruned`; Optuna hears PRUNED with the partial ratio), or run to the end but not faster
    than them (`speed-only`: no quality verdict could change the outcome). Feasible for Optuna, no
    held-out decision."""
    ratio = round(result.bench.value / (base.tps * base.drift), 4)
    if p := result.pruned:
        decision = "pruned"
        why = (f"pruned after {p['after_requests']} of {p['of']} requests: at most {p['upper_tps']:.2f} tok/s, "
               f"below {p['below_tps']:.2f} (the defaults' {base.tps * base.drift:.2f} less the spread of one "
               f"instance at {gate.PRUNE_LEVEL:.1%})")
    else:
        decision = "speed-only"
        why = (f"not faster on the search prompts: {ratio:.3f}x the defaults; quality not measured "
               f"(speed only: {result.quality_skipped})")
    finish(ledger, row, tps_ratio=ratio, gate_passed=False, decision=decision, constraint=0.0, drift=base.drift,
           tps_corrected=round(row.tps / base.drift, 3), gate_reasons=[why])
    say("result", number=row.number, row=ledger.trial(row.run_id, row.number))


def search_only(row: Trial, settings: Settings, ledger: Ledger) -> bool:
    """With the held-out re-check off, the search instance alone must clear the bound."""
    need = 1 + settings.gate.min_gain
    low, high = row.search_interval
    accepted = low > need
    ledger.update(row, gate_passed=accepted, decision="accepted" if accepted else "refused",
                  gate_reasons=[f"search {row.tps_ratio:.3f}x [{low:.3f}, "
                                f"{high:.3f}] {'clears' if accepted else 'does not clear'} {need:.3f}"])
    return accepted


def held_out(run: Run, row: Trial, settings: Settings, ledger: Ledger, engine: Engine, base: Baseline,
             history: list[Trial], say: Callable) -> bool:
    """The decision: fresh instances of the candidate on prompts the search never saw, against the
    defaults' instances on the same prompts, as many as the sequential test needs."""
    from sandbox.workload import load_workload

    meter = load_workload(settings.workload).with_split("heldout")
    inline = {k: getattr(meter, k) for k in meter.__dataclass_fields__}
    times: list[float] = []
    measured: list[TrialResult] = []

    def instance(target: Trial, suffix: str, like: Trial = row) -> float:
        """One fresh server of `target` measured on the held-out prompts: its figure."""
        # As long as the slowest held-out instance so far, or as the config's own measured phases: an
        # instance of the defaults can be slower than the candidate's (a fresh clone's was killed at
        # its deadline when the candidate's held-out time stood for it).
        needed = max([*times, budget.heldout_instance_s(like.timings)])
        if seconds_left(run.deadline_at) < needed:
            raise MeasureFailed(f"the budget ends before another instance could finish (about {needed:.0f} s "
                                f"needed, {seconds_left(run.deadline_at):.0f} s left)")
        say("phase", number=row.number, phase=f"held-out instance {suffix}")
        result = run_worker(run, target, settings, engine, max(seconds_left(run.deadline_at), 1), say,
                            suffix=f"-heldout{suffix}", workload=inline, quality="none")
        times.append(result.timings["total_s"])
        if not result.ok:
            raise MeasureFailed(f"a held-out instance failed: {result.failure.klass}: {result.failure.message[:200]}")
        measured.append(result)
        return result.bench.value

    defaults_row = next(t for t in history if t.source == "baseline")

    def more_defaults() -> float:
        extra = ledger.add_trial(Trial(run_id=run.id, source="extra", params={},
                                 flags=defaults_row.flags, env=defaults_row.env, lossless=True,
                                 rationale=f"the defaults on held-out prompts, for trial {row.number}'s decision"))
        try:
            tps = instance(extra, "", like=max((t for t in history if t.source in ("baseline", "aa")
                                                and t.status == "ok"), key=lambda t: budget.heldout_instance_s(t.timings)))
        except MeasureFailed as e:
            finish(ledger, extra, status="failed", failure_class="recheck", failure_message=str(e), decision="failed")
            raise
        result = measured[-1]
        finish(ledger, extra, status="ok", heldout_tps=tps, decision="extra", constraint=0.0,
               meter=result.workload, timings=result.timings, log_path=result.log_path,
               gate_reasons=[f"extra instance of the defaults for trial {row.number}'s held-out decision"])
        return tps

    counter = iter(range(2, 1000))
    try:
        first = instance(row, "-1")
    except MeasureFailed as e:
        ledger.update(row, gate_passed=False, decision="refused", gate_reasons=[f"held-out re-check: {e}"])
        return False
    first_s = times[0]
    decision = gate.decide(first, base, settings.gate, lambda: instance(row, f"-{next(counter)}"),
                           more_defaults, row.tps_ratio)
    c = decision.comparison
    values = sorted(decision.candidate)
    ledger.update(row, heldout_instances=[round(x, 3) for x in decision.candidate],
                  heldout_tps=round(values[len(values) // 2], 3), heldout_ratio=round(c.ratio, 4),
                  heldout_interval=[round(c.low, 4), round(c.high, 4)], gate_passed=decision.accepted,
                  decision="accepted" if decision.accepted else "refused", gate_reasons=decision.reasons,
                  timings={**row.timings, "recheck_s": round(sum(times), 1), "recheck_first_s": first_s})
    return decision.accepted


def propose(run: Run, row: Trial, settings: Settings, ledger: Ledger, base: Baseline,
            history: list[Trial], repo) -> None:
    """A branch for an accepted config, unless a proposed one is as fast (within the noise) and no
    worse on the run's SLO latencies: a dominated config is recorded as such, not branched."""
    row = ledger.trial(run.id, row.number)
    if (by := dominated_by(row, history, base, settings.gate)) is not None:
        ledger.update(row, decision="dominated", gate_reasons=[*row.gate_reasons, by])
        return
    branch = f"agent/{run.id}/{row.number}"
    try:
        commit = gitops.propose(repo, branch, proposal.files(run, row), proposal.message(run, row))
        ledger.update(row, branch=branch, commit=commit)
    except gitops.RepoError as e:
        ledger.update(row, gate_reasons=[*row.gate_reasons, f"not committed: {e}"])


def slower_than_proposed(row: Trial, history: list[Trial], base: Baseline, settings: GateSettings) -> str | None:
    """A candidate slower than a branch already proposed, on the same search prompts and beyond the
    noise, cannot be branched whatever its held-out decision says: no fresh servers for it."""
    # Every config's repeated held-out instances are more evidence of the instance noise.
    noise = base.noise_with(*(t.heldout_instances for t in history if t.heldout_instances))
    for other in (t for t in history if t.branch and t.tps):
        c = compare([row.tps], [other.tps], noise, settings.level)
        if c.high < 1:
            return (f"dominated on the search prompts: {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] of {other.branch}, "
                    f"slower beyond the noise: no held-out decision, not branched")
    return None


def dominated_by(row: Trial, history: list[Trial], base: Baseline, settings: GateSettings) -> str | None:
    claim = lambda t: t.heldout_instances or ([t.tps] if t.tps else [])  # noqa: E731
    for other in (t for t in history if t.branch):
        noise = base.noise_with(claim(row), claim(other))
        c = compare(claim(row), claim(other), noise, settings.level)
        if c.low > 1:
            continue
        better_latency = any(bound is not None and mine is not None and theirs is not None and mine < theirs
                             for bound, mine, theirs in ((settings.ttft_p99_ms_max, row.ttft_p99_ms, other.ttft_p99_ms),
                                                         (settings.itl_p99_ms_max, row.itl_p99_ms, other.itl_p99_ms)))
        if not better_latency:
            return (f"dominated: {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] of {other.branch}, not faster beyond "
                    f"the noise and no better on the SLO latencies: not branched")
    return None
