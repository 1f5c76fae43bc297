"""Re-measure a proposed branch against the defaults, interleaved on fresh server instances.

The branch's own serving/results.json says what was served (flags, environment, model, meter);
the run's baseline row says what the defaults were. Each round starts a fresh server for the
defaults, then one for the candidate, so drift of the machine hits both alike.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import git

from agent.gate import interval
from agent.ledger import Ledger


class VerifyError(ValueError):
    pass


def verify(ledger: Ledger, repo: git.Repo, branch: str, engine, out_dir: Path, rounds: int = 1,
           split: str = "heldout", say: Callable[[str], None] = print) -> dict:
    try:
        claim = json.loads(repo.git.show(f"{branch}:serving/results.json"))
    except git.GitCommandError:
        raise VerifyError(f"{branch}: no serving/results.json on that branch in {repo.working_dir}") from None
    run = ledger.run(claim["run"])
    if run is None:
        raise VerifyError(f"{branch}: run {claim['run']} is not in the ledger")
    base_row = next((t for t in ledger.trials(run.id) if t.source == "baseline"), None)
    workload = json.loads(json.dumps(claim["meter"]))  # name, version, hash of the meter used
    from sandbox.workload import load_workload

    meter = load_workload(workload["name"]).with_split(split)
    # Speed only: the branch's quality was measured through its own server and is in its results;
    # what a reviewer needs re-done on fresh servers and unseen prompts is the speed claim.
    quality = "none"
    inline = {k: getattr(meter, k) for k in meter.__dataclass_fields__}
    specs = {
        "defaults": {"model": run.model, "flags": base_row.flags, "env": base_row.env, "workload": inline,
                     "quality": quality, "repeats": run.settings.get("repeats", 2)},
        "candidate": {"model": claim["model"], "flags": claim["flags"], "env": claim["env"], "workload": inline,
                      "quality": quality, "repeats": run.settings.get("repeats", 2)},
    }
    figures: dict[str, list[float]] = {"defaults": [], "candidate": []}
    for i in range(rounds):
        for name, spec in specs.items():
            say(f"round {i + 1}/{rounds}: {name} on a fresh server ({split} prompts)")
            result = engine.evaluate(spec, out_dir / f"round{i + 1}-{name}", timeout_s=1800)
            if result.get("status") != "ok":
                failure = result.get("failure") or {}
                raise VerifyError(f"{name} failed in round {i + 1}: {failure.get('class')}: {failure.get('message')}")
            figures[name].append(result["bench"]["tps"])
    ratios = [c / d for c, d in zip(figures["candidate"], figures["defaults"])]
    ratio = math.exp(statistics.fmean(math.log(r) for r in ratios))  # geometric mean of the rounds
    noise = run.noise or 0.0
    low, high = interval(ratios, noise)
    # On held-out prompts the claim to reproduce is the branch's held-out figure, where it has one.
    claimed = (claim.get("heldout_ratio") if split == "heldout" else None) or claim["tps_ratio"]
    return {
        "claimed_ratio": claimed, "interval": [round(low, 4), round(high, 4)],
        "within_interval": low <= claimed <= high,
        "branch": branch, "split": split, "rounds": rounds, "recorded_ratio": claim["tps_ratio"],
        "ratio": round(ratio, 4), "ratios": [round(r, 4) for r in ratios],
        "defaults_tps": figures["defaults"], "candidate_tps": figures["candidate"], "noise": noise,
    }
