"""A candidate after its server ran: the gate, the held-out decision on fresh instances, the branch."""

from __future__ import annotations

from pathlib import Path

import git

from agent import budget, clock, gate, gitops, objective, proposal
from agent.context import RunContext, Seams
from agent.defaults import goodput_start
from agent.gate import Baseline, GateSettings, MeasureFailed
from agent.ledger import Trial
from agent.recording import finish, measure, record
from agent.states import CANDIDATES, Decision, Source, Status, WorkerRole, branch_pending
from agent.stats import compare
from sandbox.contract import FailureClass, ResultError, StopRules, TrialResult, read_result


def judge_candidate(ctx: RunContext, seams: Seams, row: Trial, base: Baseline, history: list[Trial],
                    role: WorkerRole = WorkerRole.COORDINATOR) -> Trial:
    """Run one candidate, gate it, decide it, branch it if accepted: all of it in its ledger row, which
    is returned as written. A worker (role WORKER) stops at the gate: what passes is put forward
    to the coordinator."""
    settings, ledger = ctx.settings, seams.ledger
    start = goodput_start(history)   # under goodput: the search starts at the defaults' figure
    result = measure(ctx, seams, row, max(clock.seconds_left(ctx.run.deadline_at), 1), StopRules(
        prune_below=gate.prune_below(base) if settings.prune else None,
        quality_above=gate.screen_floor(base, settings.gate) if settings.prune else None,
        goodput_start=start or None))
    row = record(ledger, row, result)
    return judge(ctx, seams, row, result, base, history, role)


def judge(ctx: RunContext, seams: Seams, row: Trial, result: TrialResult, base: Baseline, history: list[Trial],
          role: WorkerRole = WorkerRole.COORDINATOR) -> Trial:
    """A recorded candidate through the gate and on to its decision (after a crash between the two
    writes, from the result its worker wrote: judge_again)."""
    settings, ledger = ctx.settings, seams.ledger
    if result.status == "pruned" or result.quality_skipped:
        return cut_short(seams, row, result, base)
    verdict = gate.check(result, base, bool(row.lossless), settings.gate)
    constraint = gate.constraint(verdict, result, settings.gate)
    rule = (base.calibration.rule + (f", tau {base.calibration.tau:.3f}" if base.calibration.rule == "calibrated"
                                     else "")) if row.lossless else "lossy: greedy outputs not required"
    ledger.transition(row, gate_passed=verdict.passed if result.ok else False,
                  gate_reasons=verdict.reasons, search_ratio=verdict.search_ratio, ppl_change=verdict.ppl_change,
                  agreement=verdict.agreement, kl=verdict.kl, flips=[f.as_dict() for f in verdict.flips] or None,
                  rule=rule, drift=base.drift, constraint=constraint,
                  search_interval=[round(verdict.search.low, 4),
                                   round(verdict.search.high, 4)] if verdict.search else None,
                  figure_corrected=round(row.figure / base.drift, 3) if row.figure else None,
                  decision=Decision.FAILED if not result.ok else
                  (Decision.AWAITING_RECHECK if verdict.passed and settings.recheck
                   else None if verdict.passed else Decision.REFUSED))
    if result.ok and verdict.passed:
        past_the_gate(ctx, seams, row, base, history, role)
    seams.say("result", number=row.number, row=row)
    return row


def unjudged(history: list[Trial]) -> list[Trial]:
    """Candidates measured and recorded but never gated: a crash between the two writes (window 1 of
    docs/RELIABILITY.md). Every candidate the gate saw has a decision."""
    return [t for t in history
            if t.source in CANDIDATES and t.status in (Status.OK, Status.PRUNED) and t.decision is None]


def unbranched(history: list[Trial]) -> list[Trial]:
    """Accepted but with no branch: a crash, or a git error, between the decision and the commit (window 2)."""
    return [t for t in history if branch_pending(t)]


def judge_again(ctx: RunContext, seams: Seams, row: Trial, base: Baseline, history: list[Trial],
                role: WorkerRole = WorkerRole.COORDINATOR) -> Trial:
    """Window 1 after the resume: the candidate judged from the result its worker wrote, as the cut run
    would have; with that file gone it counts as cut in flight, and is measured again (loop.cut_once).
    role WORKER: judged as a worker judges (one that passes is put forward, not decided)."""
    path = Path(row.log_path or "").parent / "result.json"
    try:
        result = read_result(path) if row.log_path else None
    except (OSError, ResultError) as e:
        result, why = None, f"{path}: {e}"
    else:
        why = "no trial folder recorded"
    if result is None:
        return finish(seams.ledger, row, status=Status.INTERRUPTED, failure_class=FailureClass.INTERRUPTED,
                      gate_passed=None,
                      failure_message=f"cut between its measurement and its gate, and its result cannot be "
                                      f"read ({why}): measured again")
    seams.say("phase", number=row.number, phase="judged from its recorded result after a crash cut its gate")
    return judge(ctx, seams, row, result, base, history, role)


def put_forward(history: list[Trial]) -> Trial | None:
    """The oldest candidate a worker put forward that no one has decided yet."""
    return next((t for t in history if t.decision == Decision.PUT_FORWARD and t.status == Status.OK), None)


def judge_put_forward(ctx: RunContext, seams: Seams, row: Trial, base: Baseline, history: list[Trial]) -> None:
    """A worker's candidate that passed on the search prompts: the held-out decision and the branch,
    as for the coordinator's own (on the coordinator's device, against the defaults' instances)."""
    seams.say("phase", number=row.number, phase=f"deciding trial {row.number}, put forward "
              + ("again after a crash cut its decision" if any("decided again after the resume" in r for r in
                                                                row.gate_reasons or []) else "by a worker"))
    past_the_gate(ctx, seams, row, base, history)
    seams.say("result", number=row.number, row=row)


def past_the_gate(ctx: RunContext, seams: Seams, row: Trial, base: Baseline, history: list[Trial],
                  role: WorkerRole = WorkerRole.COORDINATOR) -> None:
    """What a candidate that passed on the search prompts becomes: dominated by a branch already made,
    put forward (a worker's), or, on the coordinator, decided on held-out prompts and branched."""
    settings, ledger = ctx.settings, seams.ledger
    if by := slower_than_branched(row, history, base, settings.gate):
        ledger.set_decision(row, Decision.DOMINATED, by, passed=False)
    elif role == WorkerRole.WORKER:
        ledger.set_decision(row, Decision.PUT_FORWARD)
    else:
        if settings.recheck and row.decision != Decision.AWAITING_RECHECK:   # a worker's, put forward
            ledger.set_decision(row, Decision.AWAITING_RECHECK)
        if held_out(ctx, seams, row, base, history) if settings.recheck else search_only(seams, row, settings.gate):
            branch(ctx, seams, row, base, history)


def heldout_s(t: Trial, heldout_points: int) -> float:
    """How long a held-out instance like trial t's server takes (agent.budget.heldout_instance_s)."""
    return budget.heldout_instance_s(t.timings, budget.heldout_share(t.measured, heldout_points))


def defaults_like(history: list[Trial], heldout_points: int = 0) -> Trial:
    """The instance of the defaults whose phases stand for an extra one's: the slowest but the cold
    first one where others ran (a host's first start compiles what later ones reuse, several times
    as long: standing for an extra instance it once refused a look that fitted, docs/history.md);
    an A/A counts by its own held-out phase."""
    ran = [t for t in history if t.source in (Source.BASELINE, Source.AA) and t.status == Status.OK]
    return max(ran[1:] or ran, key=lambda t: heldout_s(t, heldout_points))


def cut_short(seams: Seams, row: Trial, result: TrialResult, base: Baseline) -> Trial:
    """A candidate measured only for speed: its benchmark stopped because it could not reach the
    defaults (`pruned`; Optuna hears PRUNED with the partial ratio), or run to the end but not faster
    than them (`speed-only`: no quality verdict could change the outcome). Feasible for Optuna, no
    held-out decision."""
    assert result.bench is not None and row.figure is not None   # measured, if only in part
    ratio = round(result.bench.value / (base.figure * base.drift), 4)
    if p := result.pruned:
        decision = Decision.PRUNED
        why = (f"pruned after {p['after_requests']} of {p['of']} requests: at most {p['upper']:.2f} "
               f"{objective.of(row.meter).unit}, below {p['below']:.2f} "
               f"(the defaults' {base.figure * base.drift:.2f} less the "
               f"spread of one instance at {gate.PRUNE_LEVEL:.1%})")
    else:
        decision = Decision.SPEED_ONLY
        why = (f"not faster on the search prompts: {ratio:.3f}x the defaults; quality not measured "
               f"(speed only: {result.quality_skipped})")
    row = finish(seams.ledger, row, search_ratio=ratio, gate_passed=False, decision=decision, constraint=0.0,
                 drift=base.drift, figure_corrected=round(row.figure / base.drift, 3), gate_reasons=[why])
    seams.say("result", number=row.number, row=row)
    return row


def search_only(seams: Seams, row: Trial, settings: GateSettings) -> bool:
    """With the held-out re-check off, the search instance alone must clear the bound."""
    need = 1 + settings.min_gain
    assert row.search_interval is not None   # the gate compared it on the search prompts
    low, high = row.search_interval
    accepted = low > need
    seams.ledger.transition(row, gate_passed=accepted, decision=Decision.ACCEPTED if accepted else Decision.REFUSED,
                            gate_reasons=[f"search {row.search_ratio:.3f}x [{low:.3f}, "
                                      f"{high:.3f}] {'clears' if accepted else 'does not clear'} {need:.3f}"])
    return accepted


def held_out(ctx: RunContext, seams: Seams, row: Trial, base: Baseline, history: list[Trial]) -> bool:
    """The decision: fresh instances of the candidate on prompts the search never saw, against the
    defaults' instances on the same prompts, as many as the sequential test needs (gate.sequential_test asks
    for each next one)."""
    servers = HeldOutServers(ctx, seams, row, history)
    try:
        first = servers.candidate()
    except MeasureFailed as e:
        seams.ledger.transition(row, gate_passed=False, decision=Decision.REFUSED,
                                gate_reasons=[f"held-out re-check: {e}"])
        return False
    outcome = gate.sequential_test(first, base, ctx.settings.gate, servers.candidate, servers.defaults,
                                    row.search_ratio)
    c = outcome.comparison
    values = sorted(outcome.candidate)
    seams.ledger.transition(
        row, heldout_instances=[round(x, 3) for x in outcome.candidate],
        heldout_figure=round(values[len(values) // 2], 3), heldout_ratio=round(c.ratio, 4),
        heldout_interval=[round(c.low, 4), round(c.high, 4)], gate_passed=outcome.accepted,
        decision=Decision.ACCEPTED if outcome.accepted else Decision.REFUSED, gate_reasons=outcome.reasons,
        timings={**row.timings, "recheck_s": round(sum(servers.times), 1), "recheck_first_s": servers.times[0]})
    return outcome.accepted


class HeldOutServers:
    """The fresh servers of one held-out decision, each measured on the held-out prompts: the candidate's
    next instance, or an extra instance of the defaults (a row of its own); every one's time kept."""

    def __init__(self, ctx: RunContext, seams: Seams, row: Trial, history: list[Trial]):
        self.ctx, self.seams, self.row, self.history = ctx, seams, row, history
        self.meter = ctx.meter.with_split("heldout")
        self.times: list[float] = []
        self.count = 0   # the candidate's instances so far

    def candidate(self) -> float:
        self.count += 1
        return self._instance(self.row, self.count, self.row)[1]

    def defaults(self) -> float:
        """An extra instance of the defaults, recorded as its own row (source extra)."""
        ledger, row = self.seams.ledger, self.row
        base = next(t for t in self.history if t.source == Source.BASELINE)
        extra = ledger.add_trial(Trial(
            run_id=self.ctx.run.id, source=Source.EXTRA, params={}, worker_id=self.ctx.worker_id, flags=base.flags,
            env=base.env, lossless=True,
            rationale=f"the defaults on held-out prompts, for trial {row.number}'s decision"))
        try:
            like = defaults_like(self.history, self.ctx.heldout_points)
            result, figure = self._instance(extra, 1, like)
        except MeasureFailed as e:
            finish(ledger, extra, status=Status.FAILED, failure_class=FailureClass.RECHECK, failure_message=str(e),
                   decision=Decision.FAILED)
            raise
        finish(ledger, extra, status=Status.OK, heldout_figure=figure, decision=Decision.EXTRA, constraint=0.0,
               meter=result.workload, timings=result.timings, log_path=result.log_path,
               gate_reasons=[f"extra instance of the defaults for trial {row.number}'s held-out decision"])
        return figure

    def _instance(self, target: Trial, n: int, like: Trial) -> tuple[TrialResult, float]:
        """The n-th fresh server of `target` measured on the held-out prompts: its result and figure. Under
        goodput its search starts where the config's search figure is, as the A/A's held-out phase does
        on its own server: the candidate's own, or the defaults' for an extra instance of them."""
        ctx, row, run = self.ctx, self.row, self.ctx.run
        suffix = f"-{n}" if target is row else ""   # an extra instance of the defaults is its row's only one
        # As long as the slowest held-out instance so far, or as the config's own measured phases: an
        # instance of the defaults can be slower than the candidate's (a fresh clone's was killed at
        # its deadline when the candidate's held-out time stood for it).
        needed = max([*self.times, heldout_s(like, ctx.heldout_points)])
        if clock.seconds_left(run.deadline_at) < needed:
            raise MeasureFailed(f"the budget ends before another instance could finish (about {needed:.0f} s "
                                f"needed, {clock.seconds_left(run.deadline_at):.0f} s left)")
        self.seams.say("phase", number=row.number, phase=f"held-out instance {suffix}")
        known = goodput_start(self.history)
        start = (row.figure if target is row else known) if known else None
        result = measure(ctx, self.seams, target, max(clock.seconds_left(run.deadline_at), 1),
                         StopRules(goodput_start=start or None), suffix=f"-heldout{suffix}",
                         heldout_meter=self.meter)
        self.times.append(result.timings["total_s"])
        if not result.ok or result.bench is None:
            raise MeasureFailed(f"a held-out instance failed: {result.why()[:300]}")
        self.seams.ledger.add_repeats(target.id, n, result.bench.repeat_figures)
        return result, result.bench.value


def branch(ctx: RunContext, seams: Seams, row: Trial, base: Baseline, history: list[Trial]) -> None:
    """A branch for an accepted config, unless a branched one is as fast (within the noise) and no
    worse on the run's SLO latencies: a dominated config is recorded as such, not branched."""
    ledger = seams.ledger
    if (by := dominated_by(row, history, base, ctx.settings.gate)) is not None:
        ledger.set_decision(row, Decision.DOMINATED, by)
        return
    name = f"agent/{ctx.run.id}/{row.number}"
    try:
        commit = gitops.commit_branch(seams.repo, name, proposal.files(ctx.run, row), proposal.message(ctx.run, row))
        ledger.set_branch(row, commit, name)
    except (gitops.RepoError, git.GitError, OSError, ValueError) as e:
        # Stays accepted with no branch: `agent doctor` names it and the resume commits it (loop.catch_up).
        # ValueError: files it could not write (deploy.DeployError, a results.json the schema refuses).
        ledger.add_reason(row, f"not committed: {e}")
        seams.say("phase", number=row.number, phase=f"accepted, but its branch was not committed: {e}")


def slower_than_branched(row: Trial, history: list[Trial], base: Baseline, settings: GateSettings) -> str | None:
    """A candidate slower than a branch already made, on the same search prompts and beyond the
    noise, cannot be branched whatever its held-out decision says: no fresh servers for it."""
    # Every config's repeated held-out instances are more evidence of the instance noise.
    noise = base.noise_with(*(t.heldout_instances for t in history if t.heldout_instances))
    for other in (t for t in history if t.branch and t.figure and row.figure):
        c = compare([row.figure or 0.0], [other.figure or 0.0], noise, settings.level)
        if c.high < 1:
            return (f"dominated on the search prompts: {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] of {other.branch}, "
                    f"slower beyond the noise: no held-out decision, not branched")
    return None


def dominated_by(row: Trial, history: list[Trial], base: Baseline, settings: GateSettings) -> str | None:
    claim = lambda t: t.heldout_instances or ([t.figure] if t.figure else [])  # noqa: E731
    for other in (t for t in history if t.branch):
        noise = base.noise_with(claim(row), claim(other))
        c = compare(claim(row), claim(other), noise, settings.level)
        if c.low > 1:
            continue
        better_latency = any(bound is not None and mine is not None and theirs is not None and mine < theirs
                             for bound, mine, theirs in ((settings.slo_ttft_p99_ms, row.ttft_p99_ms, other.ttft_p99_ms),
                                                         (settings.slo_itl_p99_ms, row.itl_p99_ms, other.itl_p99_ms)))
        if not better_latency:
            return (f"dominated: {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] of {other.branch}, not faster beyond "
                    f"the noise and no better on the SLO latencies: not branched")
    return None
