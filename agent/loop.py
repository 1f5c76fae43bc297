"""The overnight loop: baseline first, then ask Optuna, run, gate, record, propose, until the deadline.

Data flows one way: study (what to try) -> worker (a real server measures it) -> gate (is it
better and no worse) -> ledger (every trial, failures included) -> git (accepted ones only).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import optuna

from agent import gitops, proposal
from agent.budget import seconds_left
from agent.gate import Baseline, GateSettings, check, heldout_check, interval, slo_excess
from agent.ledger import Ledger, RangeChange, Repeat, Run, Trial, utcnow
from agent.planner import BuiltinPlanner, Planner
from agent.recovery import AWAITING_RECHECK
from agent.space import Space

DRIFT_MIN = 0.02  # smallest move of the defaults' TPS that is corrected as drift
# After this many asks in a row that only repeat answered points, the space is spent.
MAX_REPEATS_IN_A_ROW = 200


# multivariate/group/constraints TPE are marked experimental; they are what this loop needs.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)


class Engine(Protocol):
    def evaluate(self, spec: dict, trial_dir: Path, timeout_s: float,
                 on_phase: Callable[[str], None] = ...) -> dict: ...


@dataclass
class Settings:
    model: str
    workload: str
    quality: str = "default"
    gate: GateSettings = field(default_factory=GateSettings)
    baseline_instances: int = 2
    repeats: int = 3
    seed: int = 0
    sampler_per_planner: int = 1   # sampler trials between two planner trials
    sampler: str = "tpe"           # tpe, or random (the benchmark's control arm)
    max_trials: int | None = None  # stop after this many candidate trials, even with budget left
    recheck: bool = True           # re-measure an accepted config on a fresh server and held-out prompts
    drift_every: int = 10          # candidate trials between two re-measurements of the baseline (0: never)
    facts: dict = field(default_factory=dict)  # hardware and workload facts for the planner


class BaselineFailed(RuntimeError):
    pass


class DirtyMachine(RuntimeError):
    """A trial left processes, its port or device memory behind: the next trial would measure (or
    run out of memory) because of it, and blame its own config. The run stops instead."""


def say_nothing(event: str, **info) -> None:
    pass


def run_search(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine,
               repo, storage: str, say: Callable = say_nothing, planner: Planner | None = None) -> Run:
    """Search until the run's deadline; returns the finished run row."""
    planner = planner or BuiltinPlanner()
    base = measure_baseline(run, settings, space, ledger, engine, say)
    study = optuna.create_study(study_name=run.id, storage=storage, direction="maximize", load_if_exists=True,
                                sampler=make_sampler(settings))
    sampler_space = narrowed(space, ledger.narrowings(run.id))
    seen, since_planner = told_so_far(study, settings)
    repeats_in_a_row = 0
    while (left := seconds_left(run.deadline_at)) > expected_trial_s(ledger, run) and not spent(ledger, run, settings):
        if drift_due(ledger, run, settings):
            base = check_drift(run, settings, space, ledger, engine, base, say)
            continue
        if since_planner >= settings.sampler_per_planner and not waiting(study):
            history = ledger.trials(run.id)
            enqueue(study, planner.propose(space, run, history, settings.facts, k=1))
            sampler_space = narrow(sampler_space, planner, history, ledger, run, say)
        trial = study.ask()
        source = trial.user_attrs.get("source", "sampler")
        # A planner's proposal is exactly its knobs (the rest stay at engine defaults); the
        # sampler's own trials walk the whole space, within any range a planner narrowed.
        point = ({n: space.knobs[n].suggest(trial) for n in trial.user_attrs["knobs"]}
                 if source == "planner" else sampler_space.sample(trial))
        since_planner = 0 if source == "planner" else since_planner + 1
        key = repr(sorted(point.items()))
        if key in seen:  # TPE repeats itself near the end; a repeat costs nothing to answer
            trial.set_user_attr("constraint", [seen[key][1]])
            study.tell(trial, seen[key][0])
            repeats_in_a_row += 1
            if repeats_in_a_row >= MAX_REPEATS_IN_A_ROW:
                say("exhausted", asks=repeats_in_a_row)
                break
            continue
        repeats_in_a_row = 0
        row = start_trial(run, ledger, space, point, source, trial.number, trial.user_attrs.get("rationale"))
        say("trial", number=row.number, source=row.source, params=point, left_s=left,
            best=best_ratio(ledger, run), rationale=row.rationale)
        if broken := space.broken_rules(point):
            value, constraint = 0.0, 1.0
            finish(ledger, row, status="skipped", failure_class="invalid_config",
                   failure_message=f"excluded by the space's rules: {'; '.join(broken)}")
        else:
            value, constraint = evaluate(run, row, settings, space, ledger, engine, base, repo, left, say)
        seen[key] = (value, constraint)
        trial.set_user_attr("constraint", [constraint])
        study.tell(trial, value)
        if row.failure_class == "unclean_teardown":
            raise DirtyMachine(f"trial {row.number} left the machine dirty: {row.failure_message}")
    return ledger.update(run, status="finished", finished_at=utcnow())


def told_so_far(study: optuna.Study, settings: Settings) -> tuple[dict[str, tuple[float, float]], int]:
    """What the study already knows, so a resumed or repeated call goes on where the last one stopped.

    Returns each told point's (value, constraint) and how many sampler trials followed the last
    planner trial (the planner goes first when there is none).
    """
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    seen = {repr(sorted(t.params.items())): (t.value, t.user_attrs.get("constraint", [1.0])[0]) for t in done}
    since = 0
    for t in reversed(done):
        if t.user_attrs.get("source") == "planner":
            return seen, since
        since += 1
    return seen, settings.sampler_per_planner


def make_sampler(settings: Settings) -> optuna.samplers.BaseSampler:
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    # Failures are told as infeasible through the constraint, so TPE learns which regions do not run.
    # A narrowed knob is sampled on its own (Optuna's documented fallback), hence no warning for it.
    return optuna.samplers.TPESampler(seed=settings.seed, multivariate=True, group=True, n_startup_trials=4,
                                      warn_independent_sampling=False,
                                      constraints_func=lambda t: t.user_attrs.get("constraint", [1.0]))


def spent(ledger: Ledger, run: Run, settings: Settings) -> bool:
    if settings.max_trials is None:
        return False
    ran = [t for t in ledger.trials(run.id) if t.source in ("planner", "sampler") and t.status != "skipped"]
    return len(ran) >= settings.max_trials


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


def waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def enqueue(study: optuna.Study, proposals: list) -> None:
    for p in proposals:
        study.enqueue_trial(p.params, user_attrs={"source": "planner", "rationale": p.rationale,
                                                  "expected": p.expected, "knobs": list(p.params)})


def expected_trial_s(ledger: Ledger, run: Run) -> float:
    """The longest trial so far: no trial starts that the measured times say cannot finish."""
    durations = [t.timings.get("total_s", 0) + t.timings.get("recheck_s", 0)
                 for t in ledger.trials(run.id) if t.status in ("ok", "failed")]
    return max(durations, default=0.0)


def spec_for(run: Run, settings: Settings, flags: dict, env: dict, **extra) -> dict:
    return {"model": settings.model, "flags": flags, "env": env, "workload": settings.workload,
            "quality": settings.quality, "repeats": settings.repeats, **extra}


def start_trial(run: Run, ledger: Ledger, space: Space, point: dict, source: str,
                optuna_number: int | None = None, rationale: str | None = None) -> Trial:
    flags, env = space.to_flags_env(point)
    return ledger.add(Trial(run_id=run.id, number=ledger.next_number(run.id), source=source,
                            optuna_number=optuna_number, params=point, flags=flags, env=env,
                            lossless=space.lossless(point), rationale=rationale))


def best_ratio(ledger: Ledger, run: Run) -> float | None:
    return max((t.tps_ratio for t in ledger.trials(run.id) if t.gate_passed), default=None)


def run_worker(run: Run, row: Trial, settings: Settings, engine: Engine, timeout_s: float, say: Callable,
               suffix: str = "", **extra) -> dict:
    trial_dir = Path(run.settings["home"]) / run.id / f"trial-{row.number:03d}{suffix}"
    started = utcnow()
    t0 = time.monotonic()
    result = engine.evaluate(spec_for(run, settings, row.flags, row.env, **extra), trial_dir, timeout_s,
                             on_phase=lambda phase: say("phase", number=row.number, phase=phase))
    result.setdefault("timings", {})["total_s"] = round(time.monotonic() - t0, 1)
    result["started_at"] = started
    return result


def record(ledger: Ledger, row: Trial, result: dict) -> None:
    failure = result.get("failure") or {}
    bench, quality = result.get("bench") or {}, result.get("quality") or {}
    values = dict(
        status=result.get("status", "failed"), failure_class=failure.get("class"),
        failure_message=failure.get("message"), log_tail=failure.get("log_tail") or None,
        tps=bench.get("tps"), ppl=quality.get("ppl"), heldout_tps=(result.get("bench_heldout") or {}).get("tps"), errors=bench.get("errors"),
        ttft_p99_ms=(bench.get("ttft_ms") or {}).get("p99"), itl_p99_ms=(bench.get("itl_ms") or {}).get("p99"),
        metrics=result.get("metrics") or {}, greedy=[g["token_ids"] for g in quality.get("greedy") or []] or None,
        top_logprobs=[g.get("top_logprobs") for g in quality.get("greedy") or []] or None,
        timings=result.get("timings") or {}, log_path=result.get("log_path"),
        meter={**(result.get("workload") or {}), "quality": result.get("quality_set")}, finished_at=utcnow())
    repeats = [x for x in bench.get("repeats_tps") or [] if x and x > 0]
    if len(repeats) >= 2:  # within one server only: the instance-to-instance noise is the run's `noise`
        values["tps_interval"] = [round(x, 3) for x in interval(repeats, 0.0)]
    ledger.update(row, **values)
    with ledger.session.begin() as s:
        for tps in bench.get("repeats_tps") or []:
            s.add(Repeat(trial_id=row.id, instance=0, tps=tps))


def finish(ledger: Ledger, row: Trial, **values) -> None:
    ledger.update(row, finished_at=utcnow(), **values)


def measure_baseline(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine,
                     say: Callable) -> Baseline:
    """Engine defaults (the space's fixed part only) on several server instances: this gives the noise."""
    rows = [t for t in ledger.trials(run.id) if t.source == "baseline" and t.status == "ok"]
    for _ in range(settings.baseline_instances - len(rows)):
        run_baseline(run, settings, space, ledger, engine, say, "baseline", "engine defaults")
    rows = [t for t in ledger.trials(run.id) if t.source == "baseline" and t.status == "ok"]
    instance_tps = [r.tps for r in rows]
    tps = statistics.median(instance_tps)
    within = [ledger.repeats(r.id) for r in rows]
    spread_between = max(abs(x - tps) for x in instance_tps) / tps
    spread_within = max(((max(x.tps for x in reps) - min(x.tps for x in reps)) / 2 / tps for reps in within if reps),
                        default=0.0)
    noise = round(max(spread_between, spread_within), 4)
    ppl = statistics.fmean(r.ppl for r in rows)
    greedy = rows[0].greedy
    for row in rows:
        ledger.update(row, tps_ratio=round(row.tps / tps, 4), ppl_change=round(row.ppl / ppl - 1, 5),
                      gate_passed=None, gate_reasons=["baseline"])
    ledger.update(run, baseline_tps=tps, baseline_ppl=ppl, noise=noise)
    say("baseline", tps=tps, ppl=ppl, noise=noise, instances=instance_tps)
    heldout = [r.heldout_tps for r in rows if r.heldout_tps]
    base = Baseline(tps=tps, ppl=ppl, greedy=greedy, noise=noise, top_logprobs=rows[0].top_logprobs,
                    heldout_tps=statistics.median(heldout) if heldout else None)
    # A resumed run keeps its drift (a check killed before its factor was written does not count).
    checks = [t for t in ledger.trials(run.id) if t.source == "drift" and t.drift is not None]
    return replace(base, drift=checks[-1].drift) if checks else base


def run_baseline(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, say: Callable,
                 source: str, rationale: str) -> Trial:
    """One fresh server with the engine defaults, measured on the search and the held-out prompts."""
    row = start_trial(run, ledger, space, {}, source, rationale=rationale)
    say("trial", number=row.number, source=source, params={}, left_s=seconds_left(run.deadline_at), best=None)
    result = run_worker(run, row, settings, engine, max(seconds_left(run.deadline_at), 1), say, heldout_bench=True)
    record(ledger, row, result)
    if result.get("status") != "ok":
        failure = result.get("failure") or {}
        raise BaselineFailed(f"the baseline config failed ({failure.get('class')}): {failure.get('message')}")
    return ledger.trial(run.id, row.number)


def drift_due(ledger: Ledger, run: Run, settings: Settings) -> bool:
    if not settings.drift_every:
        return False
    since = 0
    for t in reversed(ledger.trials(run.id)):
        if t.source in ("baseline", "drift"):
            break
        since += t.status in ("ok", "failed")
    return since >= settings.drift_every


def check_drift(run: Run, settings: Settings, space: Space, ledger: Ledger, engine: Engine, base: Baseline,
                say: Callable) -> Baseline:
    """Measure the defaults again; a move well beyond the noise is the machine's, and is divided out from now on.

    The check is one fresh instance against the baseline's median, two measurements each carrying
    the noise, so only a move beyond twice the noise (and at least DRIFT_MIN, since two or three
    baseline instances can underestimate it) is called drift: correcting by less would only add
    one instance's noise to every later figure.
    """
    row = run_baseline(run, settings, space, ledger, engine, say, "drift",
                       f"drift check after {settings.drift_every} candidate trials")
    factor = row.tps / base.tps
    drift = round(factor, 4) if abs(factor - 1) > max(2 * base.noise, DRIFT_MIN) else 1.0
    ledger.update(row, drift=drift, tps_corrected=row.tps, tps_ratio=round(factor, 4), gate_passed=None,
                  gate_reasons=[f"drift check: defaults now at {factor:.3f}x of the baseline; "
                                f"{'correcting by ' + str(drift) if drift != 1.0 else 'within the noise, no correction'}"])
    say("drift", tps=row.tps, factor=round(factor, 4), applied=drift)
    return replace(base, drift=drift)


def evaluate(run: Run, row: Trial, settings: Settings, space: Space, ledger: Ledger, engine: Engine,
             base: Baseline, repo, timeout_s: float, say: Callable) -> tuple[float, float]:
    """Run one candidate, gate it, record it, propose it if accepted; returns (value, constraint)."""
    result = run_worker(run, row, settings, engine, timeout_s, say)
    record(ledger, row, result)
    verdict = check(result, base, row.lossless, settings.gate)
    ledger.update(row, gate_passed=verdict.passed, gate_reasons=verdict.reasons, tps_ratio=verdict.tps_ratio,
                  ppl_change=verdict.ppl_change, agreement=verdict.agreement, kl=verdict.kl, drift=base.drift,
                  tps_corrected=round(row.tps / base.drift, 3) if row.tps else None)
    if result.get("status") != "ok":
        say("result", number=row.number, row=row)
        return 0.0, 1.0
    if verdict.passed and settings.recheck:
        ledger.update(row, gate_passed=None, gate_reasons=[AWAITING_RECHECK])  # undecided if we die now
        verdict = recheck(run, row, settings, ledger, engine, base, verdict, say)
    if verdict.passed:
        branch = f"agent/{run.id}/{row.number}"
        try:
            commit = gitops.propose(repo, branch, proposal.files(run, row, result), proposal.message(run, row))
            ledger.update(row, branch=branch, commit=commit)
        except gitops.RepoError as e:
            ledger.update(row, gate_reasons=[*verdict.reasons, f"not committed: {e}"])
    say("result", number=row.number, row=row)
    tol = settings.gate.ppl_tolerance
    excess = max(verdict.ppl_change - tol, (1 - verdict.agreement) if row.lossless else 0.0,
                 slo_excess(result["bench"], settings.gate))
    return verdict.tps_ratio, excess


def recheck(run: Run, row: Trial, settings: Settings, ledger: Ledger, engine: Engine, base: Baseline,
            verdict, say: Callable):
    """Before a commit: the same config on a fresh server, on prompts the search never saw.

    Speed only (quality was measured through the candidate's own server); compared with the
    baseline's held-out figure from its own instances, corrected for drift.
    """
    if base.heldout_tps is None:
        return verdict
    say("phase", number=row.number, phase="held-out re-check")
    from sandbox.workload import load_workload

    meter = load_workload(settings.workload).with_split("heldout")
    inline = {k: getattr(meter, k) for k in meter.__dataclass_fields__}
    result = run_worker(run, row, settings, engine, max(seconds_left(run.deadline_at), 1), say, suffix="-heldout",
                        workload=inline, quality="none")
    timings = {**row.timings, "recheck_s": result["timings"]["total_s"]}
    if result.get("status") != "ok":
        failure = result.get("failure") or {}
        reasons = [f"held-out re-check failed: {failure.get('class')}: {(failure.get('message') or '')[:200]}"]
        ledger.update(row, gate_passed=False, gate_reasons=[*verdict.reasons, *reasons], timings=timings)
        return replace(verdict, passed=False, reasons=reasons)
    ratio, reasons = heldout_check(verdict.tps_ratio, result["bench"]["tps"], base, settings.gate)
    ledger.update(row, heldout_tps=result["bench"]["tps"], heldout_ratio=ratio, gate_passed=not reasons,
                  gate_reasons=[*verdict.reasons, *reasons], timings=timings)
    return replace(verdict, passed=not reasons, reasons=reasons)
