"""`agent run --capacity`: what the night's first branch is worth under load, measured once it exists
and written into it (issue 58).

Once the first held-out decision has committed a branch, the defaults and that config are each measured
on a fresh server up the ladder of loads --capacity gives, on the run's whole traffic pool, as `agent
capacity` measures them (agent.capacity_run.measure), judged (agent.capacity) and stored in the ledger's
`capacity` table as SOURCE. Then the branch gets a second commit whose serving/results.json holds
`capacity` and whose README says what each config serves at its operating point; the ledger's row of
the trial names that commit. The rows come before the commit: a crash between them commits from the
rows at the resume, measuring nothing again. Where it cannot be done (too little time left, a server
that fails, a git error) the run's calibration keeps why, and the night goes on.

Its cost is said in the plan line (agent.capacity.estimate_s): two server starts and every rung's requests.
"""

from __future__ import annotations

import functools
import math
import shlex

import git

from agent import capacity, capacity_run, clock, gitops, proposal
from agent.capacity import Curve, Worth
from agent.capacity_run import Ask, CapacityError, Subject
from agent.context import RunContext, Seams, inputs_of
from agent.ledger import Run, Trial
from agent.results_file import CapacityCurve, CapacityFigures, CapacityRung
from agent.states import Source

SOURCE = "agent run --capacity"
TRAILER = "Agent-Capacity"


def ask_of(run: Run) -> Ask | None:
    """What --capacity asked, with the run's SLOs as the ladder's bounds; None where it was not given."""
    given = inputs_of(run)
    if not given.capacity:
        return None
    ladder = capacity.ladder_of(given.capacity)
    return Ask(ladder.kind, ladder.loads, 1, capacity_run.slo_of(run), given.price_per_hour, given.target_rate, 1)


def due(ctx: RunContext, seams: Seams, history: list[Trial]) -> Trial | None:
    """The night's first branch, where --capacity was given and its worth is not in it yet (nor was it
    given up on: the run's calibration says why)."""
    if seams.repo is None or not inputs_of(ctx.run).capacity or (ctx.run.calibration or {}).get("capacity"):
        return None
    first = min((t for t in history if t.branch and t.commit), key=lambda t: t.number, default=None)
    if first is None or _has_worth(seams.repo.git_dir, first.commit):
        return None
    return first


@functools.lru_cache(maxsize=64)
def _has_worth(git_dir: str, sha: str) -> bool:
    """Whether a commit carries the branch's worth (its trailer): read from git once per commit, which
    never changes, though the loop asks after every trial."""
    return f"{TRAILER}:" in git.Repo(git_dir).commit(sha).message


def measure_into(ctx: RunContext, seams: Seams, trial: Trial) -> None:
    """The defaults' and the trial's ladders, measured (or read back from the ledger after a crash),
    stored, and committed into the trial's branch; where that cannot be done, why is kept and said."""
    run, ledger, say = ctx.run, seams.ledger, seams.say
    ask = ask_of(run)
    assert ask is not None   # due() found --capacity
    kept = {c.subject: c for c in ledger.capacities(run.id) if c.source == SOURCE}
    subjects = [_defaults(ledger.trials(run.id)), Subject(trial.branch or "", trial.number, dict(trial.flags),
                                                          {k: str(v) for k, v in trial.env.items()})]
    curves: list[Curve] = []
    worths: list[Worth] = []
    try:
        for subject in subjects:
            if subject.name in kept:
                curves.append(capacity.from_dict(kept[subject.name].curve))
                worths.append(judged(curves[-1], ask))
                continue
            left = clock.seconds_left(run.deadline_at)
            if left < 120:
                raise CapacityError(f"{left / 60:.0f} min left before the deadline: not measured")
            say("capacity", line=f"capacity: {subject.name} on a fresh server, {ask.kind} "
                                 f"{', '.join(f'{x:g}' for x in ask.loads)} ({left / 60:.0f} min left)")
            curve = capacity_run.measure(run, subject, ask, seams.engine, ctx.home / run.id / "capacity",
                                         lambda line: say("capacity", line=f"capacity: {line}"), timeout_s=left)
            curves.append(curve)
            worths.append(judged(curve, ask))
            capacity_run.store(ledger, run, curve, worths[-1], ask, subject.trial, SOURCE)
        figures = figures_of(ask, curves, worths, again(run, trial, ask))
        files = proposal.files(run, trial, figures)
        commit = gitops.add_commit(seams.repo, trial.branch or "", trial.commit or "", files,
                                   message(run, trial, figures))
    except (CapacityError, gitops.RepoError, OSError, ValueError) as e:
        why = f"not written into {trial.branch}: {e}"
        ledger.update(run, calibration={**(run.calibration or {}), "capacity": why})
        say("capacity", line=f"capacity: {why}; the night goes on")
        return
    ledger.set_branch(trial, commit)
    say("capacity", line=f"capacity: written into {trial.branch} at {commit[:10]}: {summary(figures)}")


def _defaults(history: list[Trial]) -> Subject:
    base = next(t for t in history if t.source == Source.BASELINE)   # the loop measured them before any branch
    return Subject("defaults", None, dict(base.flags), {k: str(v) for k, v in base.env.items()})


def judged(curve: Curve, ask: Ask) -> Worth:
    return capacity.worth(curve, ask.slo, ask.price_per_hour, ask.target_rate)


def figures_of(ask: Ask, curves: list[Curve], worths: list[Worth], command: str) -> CapacityFigures:
    """The defaults' and the config's curves with what each is worth, as the branch's results.json keeps them."""
    base, mine = worths
    ratio = (round(mine.tokens_per_device_hour / base.tokens_per_device_hour, 4)
             if base.tokens_per_device_hour and mine.tokens_per_device_hour else None)
    defaults, config = (_curve(c, w) for c, w in zip(curves, worths, strict=True))
    return CapacityFigures(kind="rate" if ask.kind == "rate" else "concurrency", loads=list(ask.loads),
                           slo=dict(ask.slo), price_per_hour=ask.price_per_hour, target_rate=ask.target_rate,
                           devices=ask.devices, defaults=defaults, config=config, tokens_per_device_hour_ratio=ratio,
                           again=command)


def _curve(curve: Curve, worth: Worth) -> CapacityCurve:
    def rung(r: capacity.Rung) -> CapacityRung:
        m, (low, high) = r.median, r.spread
        return CapacityRung(load=r.load, output_tps=m.output_tps, output_tps_range=[low, high],
                            total_tps=m.total_tps, request_rate=m.request_rate, ttft_p99_ms=m.ttft_ms.get("p99"),
                            itl_p99_ms=m.itl_ms.get("p99"), e2e_p99_ms=m.latency_ms.get("p99"),
                            requests=m.requests, repeats=len(r.repeats))

    rounded = lambda x: None if x is None or not math.isfinite(x) else round(x, 4)  # noqa: E731
    return CapacityCurve(
        rungs=[rung(r) for r in curve.rungs], stopped=curve.stopped,
        knee=worth.knee.load if worth.knee else None, slo_limit=worth.slo_limit.load if worth.slo_limit else None,
        point=worth.point.load if worth.point else None, point_is=worth.point_is,
        tokens_per_device_hour=rounded(worth.tokens_per_device_hour),
        cost_per_m_output=rounded(worth.cost_per_m_output), cost_per_m_input=rounded(worth.cost_per_m_input),
        servers=worth.servers)


def again(run: Run, trial: Trial, ask: Ask) -> str:
    loads = ",".join(f"{x:g}" for x in ask.loads)
    words = ["agent", "capacity", trial.branch or "", "--run", run.id,
             "--concurrency" if ask.kind == "concurrency" else "--rates", loads]
    words += ["--price-per-hour", f"{ask.price_per_hour:g}"] if ask.price_per_hour is not None else []
    words += ["--target-rate", f"{ask.target_rate:g}"] if ask.target_rate is not None else []
    return shlex.join(words)


def summary(figures: CapacityFigures) -> str:
    parts = []
    for name, c in (("defaults", figures.defaults), ("branch", figures.config)):
        parts.append(f"{name} {c.tokens_per_device_hour:,.0f} output tokens a device-hour at its {c.point_is}"
                     if c.tokens_per_device_hour else f"{name}: no operating point")
    ratio = figures.tokens_per_device_hour_ratio
    return "; ".join(parts) + (f" ({ratio:.2f}x)" if ratio else "")


def message(run: Run, trial: Trial, figures: CapacityFigures) -> str:
    return (f"trial {trial.number}: what it is worth under load\n\n{summary(figures)}\n"
            f"Measured again with: {figures.again}\n"
            f"\nAgent-Run: {run.id}\nAgent-Trial: {trial.number}\n{TRAILER}: {figures.kind} "
            f"{','.join(f'{x:g}' for x in figures.loads)}\n")
