"""Trials per hour, from real ledgers: what a run spent its wall time on.

    .venv/bin/python bench/trials_per_hour.py runs/ledger.sqlite [other/ledger.sqlite ...]

For each run in each ledger: its wall time (start to finish), the server instances it started (the
defaults', the candidates' and the held-out instances of decisions), the candidate trials that
started a server (a point the pre-flight or a learned rule refused starts none), those per hour,
when the first candidate started and when the first held-out decision ended, and the agent's own
overhead: the share of the wall time no worker was measuring (planning, the study, the gate, git).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.ledger import Ledger  # noqa: E402
from agent.states import CANDIDATES  # noqa: E402


def at(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def row(run, trials) -> dict:
    start, end = at(run.started_at), at(run.finished_at) or max(at(t.finished_at) for t in trials if t.finished_at)
    wall = (end - start).total_seconds()
    served = [t for t in trials if "start_s" in (t.timings or {})]
    candidates = [t for t in served if t.source in CANDIDATES]
    rechecks = sum(len(t.heldout_instances or []) for t in candidates)
    # An `extra` instance of the defaults is timed twice: in its own row and in the recheck_s of the
    # candidate whose decision it served (which sums every held-out instance); counted once, there.
    measuring = sum((t.timings or {}).get("total_s", 0) + (t.timings or {}).get("recheck_s", 0)
                    for t in served if t.source != "extra")
    first = min((at(t.started_at) for t in candidates), default=None)
    # A held-out verdict by the bounds, not a refusal because the budget or an instance ran out.
    # A candidate's row is finished when its own server is measured; its held-out servers follow.
    decided = min((at(t.finished_at) + timedelta(seconds=(t.timings or {}).get("recheck_s", 0))
                   for t in candidates if t.heldout_instances and not any(
        "budget ends" in r or "instance failed" in r for r in t.gate_reasons or [])), default=None)
    minutes = lambda when: f"{(when - start).total_seconds() / 60:.1f}" if when else "-"  # noqa: E731
    return {"run": run.id, "wall_min": round(wall / 60, 1), "instances": len(served) + rechecks,
            "candidates": len(candidates), "per_hour": round(len(candidates) / (wall / 3600), 2),
            "first_candidate_min": minutes(first), "first_decision_min": minutes(decided),
            "accepted": sum(1 for t in candidates if t.branch), "overhead": f"{1 - measuring / wall:.1%}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledgers", nargs="+", type=Path)
    args = parser.parse_args()
    head = ["run", "wall_min", "instances", "candidates", "per_hour", "first_candidate_min", "first_decision_min",
            "accepted", "overhead"]
    print("| ledger | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 1) + "|")
    for path in args.ledgers:
        ledger = Ledger(path)
        for run in ledger.runs():
            trials = ledger.trials(run.id)
            if trials:
                r = row(run, trials)
                print(f"| {path} | " + " | ".join(str(r[k]) for k in head) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
