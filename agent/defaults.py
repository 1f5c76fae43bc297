"""The engine's defaults: the baseline instances, the A/A check, later instances (drift, held-out
figures for decisions), and what the budget fits after the first of them."""

from __future__ import annotations

import math
from dataclasses import replace

from agent import budget, clock, gate, greedy, objective
from agent.context import RunContext, Seams, inputs_of
from agent.gate import Baseline, GateSettings, Instance
from agent.ledger import Trial
from agent.recording import measure, open_trial, record
from agent.states import CANDIDATES, DEFAULTS, Decision, Source, Status
from agent.stats import compare
from sandbox.contract import StopRules, goodput_lower_bound

DRIFT_MIN = 0.02  # smallest move of the defaults' TPS that is corrected as drift
# More instances of a noisy host's defaults narrow every bound, but a run that spends its budget on
# them tries little (a short GPU run once spent over a third of its time on them and had room for
# one held-out look at one candidate: docs/history.md). Past this share
# of the budget (the baseline's and the A/A's instances included) no more are measured; the bounds
# stay as wide as the noise measured says, and a night's run (6 instances in minutes) never meets it.
DEFAULTS_SHARE = 1 / 3


class BaselineFailed(RuntimeError):
    pass


class BudgetTooShort(BaselineFailed):
    """The instances of the defaults measured so far say that no first decision fits the budget."""


def engine_defaults(ctx: RunContext, seams: Seams) -> dict:
    """The engine's default for every knob, read once per run (and kept in the ledger for a resume)."""
    calibration = ctx.run.calibration or {}
    if "engine_defaults" not in calibration:
        engine = seams.engine
        found = engine.defaults(ctx.settings.model, list(ctx.space.knobs)) if hasattr(engine, "defaults") else {}
        seams.ledger.update(ctx.run, calibration={**calibration, "engine_defaults": found})
    return (ctx.run.calibration or {})["engine_defaults"]


def instance_of(t: Trial) -> Instance:
    assert t.figure is not None, f"trial {t.number} measured no figure"
    measured = t.measured or {}
    return Instance(t.figure, t.heldout_figure, t.ppl, {"ids": t.greedy or [], "tops": t.top_logprobs},
                    t.ttft_p99_ms, t.itl_p99_ms, p99_of(measured, "tpot_ms"), p99_of(measured, "latency_ms"))


def p99_of(measured: dict, key: str) -> float | None:
    """A latency's p99 as the row's measured figures keep it (a row from before it was kept: None)."""
    return (measured.get(key) or {}).get("p99")


def judged_aa(history: list[Trial], settings: GateSettings) -> tuple[Baseline, gate.AAVerdict | None]:
    """The baseline instances measured before the A/A check, and the A/A's verdict against them
    (None before the A/A ran): a pure function of the ledger, so a resume judges it the same way."""
    ok = [t for t in history if t.source in (Source.BASELINE, Source.AA) and t.status == Status.OK]
    aa = next((t for t in ok if t.source == Source.AA), None)
    first = gate.baseline_of([instance_of(t) for t in ok if t.source == Source.BASELINE
                              and (aa is None or t.number < aa.number)], settings)
    return first, gate.judge_aa(instance_of(aa), first, settings) if aa is not None else None


def baseline_from(history: list[Trial], settings: GateSettings) -> Baseline:
    """The defaults as the ledger has them now: the baseline instances (the first one's greedy path is
    the reference), the A/A instance once judged, later baseline and drift instances (a drift the run
    corrected is left out of the noise: dividing it out leaves that instance no spread), and the
    held-out-only instances measured for decisions."""
    first, verdict = judged_aa(history, settings)
    ok = [t for t in history if t.source in DEFAULTS and t.status == Status.OK]
    # A further device's instance is one more draw of the defaults: the spread between devices becomes
    # part of the noise every candidate is judged with, whichever device it ran on (docs/scale-out.md).
    instances = [t for t in ok
                 if t.source in (Source.BASELINE, Source.DEVICE) or (t.source == Source.DRIFT and t.drift == 1.0)]
    aa = next((t for t in ok if t.source == Source.AA), None)
    extras = [t.heldout_figure for t in ok if t.source == Source.EXTRA and t.heldout_figure]
    base = gate.baseline_of([instance_of(t) for t in instances], settings, extras=tuple(extras),
                            aa=instance_of(aa) if aa else None)
    drift = next((t.drift for t in reversed(ok) if t.source == Source.DRIFT and t.drift is not None), 1.0)
    return replace(base, reference=first.reference, drift=drift,
                   calibration=verdict.calibration if verdict else first.calibration)


def measure_baseline(ctx: RunContext, seams: Seams) -> Baseline:
    """The defaults (the space's fixed part only) on fresh server instances, then the A/A check: the
    defaults once more as if a candidate, which the gate must call no loss and no gain."""
    run, settings, ledger, say = ctx.run, ctx.settings, seams.ledger, seams.say
    history = ledger.trials(run.id)
    done = sum(1 for t in history if t.source == Source.BASELINE and t.status == Status.OK)
    for i in range(settings.baseline_instances - done):
        last = run_defaults(ctx, seams, Source.BASELINE, "engine defaults")
        measured = [t for t in ledger.trials(run.id) if t.source == Source.BASELINE and t.status == Status.OK]
        planned = fits_a_decision(ctx, last, settings.baseline_instances - done - i - 1, True, first=done + i == 0,
                                  instances=measured)
        if done + i == 0:   # the first instance says what the budget fits
            ledger.update(run, calibration={**(run.calibration or {}), "plan": planned})
            say("plan", **planned)
    history = ledger.trials(run.id)
    aa = next((t for t in history if t.source == Source.AA and t.status == Status.OK), None)
    if aa is None:
        aa = run_defaults(ctx, seams, Source.AA, "A/A check: the defaults again, judged as a candidate")
        history = ledger.trials(run.id)   # with any further device's instance that landed meanwhile
    first, verdict = judged_aa(history, settings.gate)
    assert verdict is not None   # the A/A instance is measured: it has a verdict
    if aa.decision is None:
        ledger.transition(aa, decision=Decision.AA_PASSED if verdict.passed else Decision.AA_FAILED, gate_passed=None,
                      gate_reasons=[verdict.line], search_ratio=round(verdict.speed.ratio, 4),
                      search_interval=[round(verdict.speed.low, 4), round(verdict.speed.high, 4)],
                      flips=[f.as_dict() for f in verdict.flips], rule=verdict.calibration.rule, constraint=0.0,
                      agreement=greedy.agreement(first.reference["ids"], aa.greedy or []))
        say("aa", line=verdict.line)
    base = baseline_from(history, settings.gate)
    while gate.more_defaults_wanted(base, verdict, sum(1 for t in history if t.source == Source.BASELINE
                                                       and t.number > aa.number), settings.gate):
        refused = no_more_defaults(run, aa)
        if refused:
            say("fewer_defaults", noise=base.measured_noise.sd, instances=len(base.search) + len(base.unscreened),
                why=refused)
            break
        run_defaults(ctx, seams, Source.BASELINE, "more instances of the defaults: " + (
            "the A/A check called them faster or slower than themselves" if verdict.add_instances
            else f"their noise is above {settings.gate.noisy:.0%}"))
        history = ledger.trials(run.id)
        base = baseline_from(history, settings.gate)
    if not any(t.source in CANDIDATES for t in history):   # before the first candidate (a resume may be past it)
        measured = [t for t in history if t.source in (Source.BASELINE, Source.AA) and t.status == Status.OK]
        plan = fits_a_decision(ctx, measured[-1], 0, False, first=False, instances=measured)
    else:
        plan = None
    for t in history:
        if t.source == Source.BASELINE and t.status == Status.OK and t.figure is not None and t.ppl is not None:
            ledger.transition(t, search_ratio=round(t.figure / base.figure, 4),
                          ppl_change=round(t.ppl / base.ppl - 1, 5),
                          gate_passed=None, gate_reasons=["baseline"], decision=Decision.BASELINE,
                              constraint=0.0)
    record_baseline(ctx, seams, base, verdict)
    if plan:   # at the noise measured now: how many looks a gain near it takes
        say("plan", **plan)
    return base


def record_baseline(ctx: RunContext, seams: Seams, base: Baseline, verdict: gate.AAVerdict) -> None:
    """The baseline's figure, perplexity, noise and calibration on the run's row, and said."""
    run, ledger, say = ctx.run, seams.ledger, seams.say
    noise = base.measured_noise   # what this machine showed; the bounds add the space's prior (base.noise)
    ledger.update(run, baseline_figure=round(base.figure, 3), baseline_ppl=base.ppl, noise=round(noise.sd, 5),
                  noise_df=noise.df, calibration={**(run.calibration or {}), **base.calibration.as_dict(),
                                                  "aa": verdict.line})   # the prior is in run.settings
    say("baseline", figure=base.figure, ppl=base.ppl, noise=noise.sd, df=noise.df, instances=base.search,
        calibration=base.calibration.as_dict(), unit=objective.of_run(run).unit,
        prior=(base.prior.sd, base.prior.df), bound_noise=base.noise.sd)


def no_more_defaults(run, aa: Trial) -> str | None:
    """Why one more instance of the defaults should not be measured now (None: it may be): no first
    decision would fit after it, or the defaults would pass their share of the budget."""
    plan = budget.plan(aa.timings, 1, False, clock.seconds_left(run.deadline_at), 0)
    if plan["fits"] != "decision":
        return "then no first decision would fit the budget"
    whole = clock.seconds_since(run.started_at) + clock.seconds_left(run.deadline_at)
    if clock.seconds_since(run.started_at) + plan["instance_s"] > DEFAULTS_SHARE * whole:
        return f"they would then have taken more than {DEFAULTS_SHARE:.0%} of the budget, which is the candidates'"
    return None


def fits_a_decision(ctx: RunContext, last: Trial, instances_left: int, aa_left: bool, first: bool,
                    instances: list[Trial]) -> dict:
    """What the budget fits after this instance of the defaults; the run stops here, before spending
    the rest, when a first decision cannot finish, even with warm starts after a cold first one (a
    gain well above the noise decides in one look). The plan also says how many looks a gain near
    the noise of `instances` (the defaults' so far, with the space's prior) takes (gate.looks_needed)."""
    left = clock.seconds_left(ctx.run.deadline_at)
    spent = clock.seconds_since(ctx.run.started_at)
    points = len(((last.measured or {}).get("goodput") or {}).get("points") or []) or None
    share = budget.heldout_share(last.measured, ctx.heldout_points)
    plan = budget.plan(last.timings, instances_left, aa_left, left, spent, points, heldout_share=share)
    noise = gate.pooled_noise([[t.figure for t in instances if t.figure]], ctx.settings.gate.noise_prior)
    near = gate.sized_gain(ctx.settings.gate, noise)
    plan = budget.decision_looks(plan, last.timings, gate.looks_needed(near, noise, ctx.settings.gate), near,
                                 noise.sd, share)
    hopeful = budget.plan(last.timings, instances_left, aa_left, left, spent, points,
                          start_scale=budget.WARM_START if first else 1.0, heldout_share=share,
                          candidate_share=min(1.0, budget.CANDIDATE_POINTS / points) if points else 1.0)
    if hopeful["fits"] != "decision":
        raise BudgetTooShort(budget.plan_line(plan) + "; stopped here rather than spend the rest")
    return {**plan, "upper_bound": plan["fits"] != "decision", **capacity_cost(ctx, last)}


def capacity_cost(ctx: RunContext, last: Trial) -> dict:
    """--capacity's cost from this instance of the defaults (agent.capacity.estimate_s), for the plan line."""
    from agent import capacity

    given = inputs_of(ctx.run).capacity
    if not given:
        return {}
    ladder = capacity.ladder_of(given)
    low, high = capacity.estimate_s(last.timings, ctx.meter, ctx.settings.repeats, ladder)
    return {"capacity_of": f"{ladder.kind} {','.join(f'{x:g}' for x in ladder.loads)}",
            "capacity_s": [round(low), round(high)]}


def goodput_start(history: list[Trial]) -> float | None:
    """Where a later goodput search starts (sandbox.goodput.first_step): the defaults' goodput as their
    instances measured it so far, the geometric mean of their search figures. None before the first
    instance, or when the objective is not goodput (the spec then leaves the start to the profile)."""
    found = [t.figure for t in history if t.source in DEFAULTS and t.status == Status.OK and t.figure
             and (t.measured or {}).get("goodput")]
    return round(math.exp(sum(map(math.log, found)) / len(found)), 6) if found else None


def run_defaults(ctx: RunContext, seams: Seams, source: Source, rationale: str) -> Trial:
    """One fresh server with the engine defaults, measured on the search prompts; the A/A instance on
    the held-out prompts too (its figure there is what held-out decisions first compare with). Under
    goodput every instance after the first starts its search at the defaults' figure so far, as
    candidates do: the same search for every config but the first."""
    run, ledger = ctx.run, seams.ledger
    start = goodput_start(ledger.trials(run.id))
    row = open_trial(ctx, ledger, {}, source, rationale=rationale)
    best = max((t.claimed_ratio for t in ledger.trials(run.id) if t.branch), default=None)   # a drift check's too
    seams.say("trial", number=row.number, source=source, params={}, left_s=clock.seconds_left(run.deadline_at),
              best=best)
    result = measure(ctx, seams, row, max(clock.seconds_left(run.deadline_at), 1),
                     StopRules(goodput_start=start or None), heldout_bench=source == Source.AA)
    row = record(ledger, row, result)
    if not result.ok:
        failure = result.failure
        assert failure is not None   # a result that is not ok says why
        if clock.seconds_left(run.deadline_at) <= 1:   # cut by the deadline: the budget, not the defaults, fell short
            took = [t.timings.get("total_s", 0) for t in ledger.trials(run.id)
                    if t.source in DEFAULTS and t.status == Status.OK]
            per = f"; an instance took {max(took) / 60:.1f} min here" if took else ""
            raise BaselineFailed(f"the budget ended while the defaults were measured "
                                 f"({len(took)} instance(s) done{per}): "
                                 f"the baseline and the A/A check need "
                                 f"{ctx.settings.baseline_instances + 1} before any "
                                 f"candidate; give a longer --budget")
        raise BaselineFailed(f"the defaults failed ({failure.klass}): {failure.message}")
    for figures in (result.bench, result.bench_heldout):
        found = figures.goodput if figures else None
        if found and goodput_lower_bound(found):   # sandbox.worker.goodput_on keeps a candidate's, not the defaults'
            why = found.get("burst") or f"the last of the {len(found.get('points') or [])} points a split allows"
            raise BaselineFailed(f"the defaults held the SLOs at every load measured, up to {found['rate']:g} "
                                 f"requests/s ({why}): their goodput is only a lower bound, which candidates cannot "
                                 f"be judged against; tighten the SLOs, start nearer the server's capacity (a higher "
                                 f"rate:R or a faster trace:SCALE) or measure more requests a point (--num-prompts)")
    return row


def drift_due(history: list[Trial], drift_every: int) -> bool:
    if not drift_every:
        return False
    since = 0
    for t in reversed(history):
        if t.source in (Source.BASELINE, Source.DRIFT):
            break
        since += t.source in CANDIDATES and t.status in (Status.OK, Status.FAILED)
    return since >= drift_every


def check_drift(ctx: RunContext, seams: Seams, base: Baseline) -> None:
    """Measure the defaults again; a move the prediction bounds exclude (and of at least DRIFT_MIN) is
    the machine's, and is divided out from now on. Otherwise the instance joins the defaults' noise."""
    row = run_defaults(ctx, seams, Source.DRIFT, f"drift check after {ctx.settings.drift_every} candidate trials")
    assert row.figure is not None   # run_defaults raised where the defaults measured nothing
    c = compare([row.figure], base.search, base.noise, ctx.settings.gate.level)
    moved = (c.low > 1 or c.high < 1) and abs(c.ratio - 1) > DRIFT_MIN
    drift = round(c.ratio, 4) if moved else 1.0
    seams.ledger.transition(row, drift=drift, figure_corrected=round(row.figure / drift, 3),
                        search_ratio=round(c.ratio, 4),
                        search_interval=[round(c.low, 4), round(c.high, 4)], gate_passed=None,
                            decision=Decision.DRIFT,
                        constraint=0.0,
                        gate_reasons=[f"drift check: defaults now at {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] of "
                                      f"the baseline; " + (f"correcting by {drift}" if moved else
                                                           "within the noise, no correction")])
    seams.say("drift", figure=row.figure, factor=round(c.ratio, 4), applied=drift)
