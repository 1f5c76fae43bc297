"""Re-measure a proposed branch against the defaults, interleaved on fresh server instances, until
the evidence decides whether its claim holds.

The branch's own serving/results.json says what was served (flags, environment, model, meter)
and what it claims (the held-out ratio); the run's first baseline row says what the defaults were.
Each round starts a fresh server for the defaults, then one for the candidate, so drift of the
machine hits both alike. After each round the ratio's two-sided 95% interval (Student t on
server instances, the noise pooled with the run's own instances of the defaults) is compared with
the claim's tolerance band, claim x (1 +- tolerance):
- inside the band: the claim holds;
- clear of the band: it does not;
- otherwise another round, up to max_rounds; then it says it cannot decide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import git

from agent import hub, morning, objective, results_file
from agent.context import Settings, settings_of
from agent.ledger import Ledger, Run, Trial
from agent.states import Source, Status
from agent.stats import compare, pooled_noise

HOLDS, FAILS, UNDECIDED = "holds", "does not hold", "cannot decide"


class VerifyError(ValueError):
    pass


@dataclass(frozen=True)
class Rounds:
    """How a claim is re-measured: up to max_rounds pairs of fresh servers on the split's prompts, and
    the share of the claim within which it holds."""
    max_rounds: int = 4
    tolerance: float = 0.05
    split: str = "heldout"


def verify(ledger: Ledger, repo: git.Repo, branch: str, engine, out_dir: Path, rounds: Rounds = Rounds(),
           say: Callable[[str], None] = print) -> dict:
    max_rounds, tolerance, split = rounds.max_rounds, rounds.tolerance, rounds.split
    found, run, base_row = _claim(ledger, repo, branch)
    used = settings_of(run)
    specs = {"defaults": _spec(run, used, base_row.flags, base_row.env, split, branch),
             "candidate": _spec(run, used, found.serving.flags, found.serving.env, split, branch)}
    if (rules := getattr(engine, "rules", None)) is not None:   # the branch's files are data, not the space
        from sandbox.contract import SpecError, check_allowed

        try:
            check_allowed(rules, found.serving.flags, found.serving.env, f"{branch}:serving/results.json")
        except SpecError as e:
            raise VerifyError(f"{e}: the run's space does not allow it; nothing was started") from None
    claimed = (found.claim.heldout_ratio if split == "heldout" else None) or found.claim.search_ratio or 0.0
    band = (claimed * (1 - tolerance), claimed * (1 + tolerance))
    # The run's own instances of the defaults measured the noise: their spread joins this one's.
    run_defaults = [t.figure for t in ledger.trials(run.id)
                    if t.source in (Source.BASELINE, Source.AA) and t.status == Status.OK and t.figure is not None]
    prior = used.gate.noise_prior   # the one the run's gate used
    figures: dict[str, list[float]] = {"defaults": [], "candidate": []}
    verdict = UNDECIDED
    for i in range(max_rounds):
        for name, spec in specs.items():
            say(f"round {i + 1}/{max_rounds}: {name} on a fresh server ({split} prompts)")
            result = engine.evaluate(spec, out_dir / f"round{i + 1}-{name}", timeout_s=1800)
            if not result.ok or result.bench is None:
                raise VerifyError(f"{name} failed in round {i + 1}: {result.why()}")
            figures[name].append(result.bench.value)
        noise = pooled_noise([run_defaults, figures["defaults"], figures["candidate"]], prior)
        c = compare(figures["candidate"], figures["defaults"], noise, level=0.975)
        if band[0] <= c.low and c.high <= band[1]:
            verdict = HOLDS
        elif c.high < band[0] or c.low > band[1]:
            verdict = FAILS
        else:
            continue
        break
    return {
        "branch": branch, "split": split, "verdict": verdict, "claimed_ratio": claimed,
        "band": [round(band[0], 4), round(band[1], 4)], "ratio": round(c.ratio, 4),
        "interval": [round(c.low, 4), round(c.high, 4)], "rounds": len(figures["candidate"]),
        "recorded_ratio": found.claim.search_ratio, "unit": objective.of_run(run).unit,
        "defaults_figures": figures["defaults"], "candidate_figures": figures["candidate"],
        "noise_log_sd": round(noise.sd, 5), "noise_df": noise.df,
    }


def _claim(ledger: Ledger, repo: git.Repo, branch: str) -> tuple[results_file.Results, Run, Trial]:
    """The branch's results (any version this agent wrote), its run and the run's defaults."""
    try:
        found = morning.read(repo, branch)
    except morning.BranchError as e:
        raise VerifyError(str(e)) from None
    run = ledger.run(found.run)
    if run is None:
        raise VerifyError(f"{branch}: run {found.run} is not in the ledger")
    if not found.claim.search_ratio:
        raise VerifyError(f"{branch}: serving/results.json claims no ratio to re-measure")
    base_row = next((t for t in ledger.trials(run.id) if t.source == Source.BASELINE), None)
    if base_row is None:
        raise VerifyError(f"{branch}: run {run.id} has no measurement of the defaults to compare with")
    return found, run, base_row


def _spec(run: Run, used: Settings, flags: dict, env: dict, split: str, branch: str) -> dict:
    """One config on the run's meter and split, speed only: the branch's quality was measured through its
    own server and is in its results."""
    from sandbox.contract import SpecFile, load_workload

    meter = load_workload(used.workload).with_split(split)
    try:   # the commit the branch was measured with, for a model given by Hub id
        model = hub.served(run.model, run.model_revision)
    except hub.ModelUnavailable as e:
        raise VerifyError(f"{branch}: {e}") from None
    return SpecFile.speed_only(model, flags, env, meter, used.repeats).as_dict()


def checked_claim(ledger: Ledger, branch: str, rounds: Rounds, say: Callable[[str], None]) -> tuple[list[str], int]:
    """`agent verify`: the branch re-measured on fresh servers of the real engine, serving only what its
    run's space allows (a branch's flags are data). The lines to print and the exit status: 0 the claim
    holds, 1 it does not, 3 the rounds allowed could not decide. A RunError where it cannot be measured."""
    from agent import gitops, paths
    from agent.engine import WorkerEngine
    from agent.recording import allowed
    from agent.request import RunError, run_space

    parts = branch.split("/")
    run_row = ledger.run(parts[1]) if len(parts) == 3 and parts[0] == "agent" else None
    if run_row is None:
        raise RunError(f"{branch!r} is not a branch agent/<run-id>/<trial> of a run in the ledger")
    try:
        repo = gitops.open_repo(Path(run_row.repo))
        engine = WorkerEngine()
        engine.allow(allowed(run_space(run_row), settings_of(run_row), hub.served(run_row.model,
                                                                                  run_row.model_revision)))
        r = verify(ledger, repo, branch, engine, paths.home() / run_row.id / "verify", rounds, say=say)
    except (VerifyError, gitops.RepoError, hub.ModelUnavailable) as e:
        raise RunError(str(e), 1) from None
    low, high = r["interval"]
    band = f"{r['band'][0]:.3f}x to {r['band'][1]:.3f}x"
    measured = (f"{branch}: claimed {r['claimed_ratio']:.3f}x; re-measured {r['ratio']:.3f}x, 95% interval "
                f"{low:.3f}x to {high:.3f}x after {r['rounds']} round(s) on {rounds.split} prompts (defaults "
                f"{r['defaults_figures']}, candidate {r['candidate_figures']} {r['unit']}; noise "
                f"±{r['noise_log_sd']:.1%}, {r['noise_df']} df)")
    if r["verdict"] == HOLDS:
        return [measured, f"the claim holds: the interval lies within {band}"], 0
    if r["verdict"] == UNDECIDED:
        return [measured, f"cannot decide: the interval overlaps {band} without lying within it; more rounds "
                          f"(--rounds) or a looser --tolerance would decide"], 3
    return [measured, f"the claim does not hold: the interval is clear of {band}"], 1
