"""Frozen views of a run and its trials for the readers that must never write them (the planners, the
reports and `agent status`):
each column's value as the row holds it, copied, on a frozen dataclass, as Optuna hands a sampler a
FrozenTrial rather than its storage's row. A trial's greedy outputs and top logprobs (most of a
row's bytes, read only on the defaults' rows, for the gate) are not in its view."""

from __future__ import annotations

import copy
from dataclasses import make_dataclass
from typing import TYPE_CHECKING, TypeAlias

from agent.ledger import Base, Run, Trial

BULK = {"greedy", "top_logprobs"}


def _columns(model: type[Base]) -> list[str]:
    return [c for c in model.__table__.columns.keys() if c not in BULK]


def _frozen(model: type[Base], name: str, **derived) -> type:
    return make_dataclass(name, [(c, object) for c in _columns(model)], frozen=True,
                          namespace={"__doc__": f"A {model.__name__} row as it was read: no write reaches the ledger.",
                                     **derived})


if TYPE_CHECKING:   # a view reads as its row does: a type checker checks its readers against the row's columns
    TrialView: TypeAlias = Trial
    RunView: TypeAlias = Run
else:   # what the row derives from its columns reads the same on its view
    TrialView = _frozen(Trial, "TrialView", claimed_ratio=Trial.claimed_ratio, held_out_claim=Trial.held_out_claim)
    RunView = _frozen(Run, "RunView")


def _view(kind: type, row: Base):
    return kind(**{c: copy.deepcopy(getattr(row, c)) for c in _columns(type(row))})


def trials(rows: list[Trial]) -> list:
    return [_view(TrialView, t) for t in rows]


def run(row: Run):
    return _view(RunView, row)


def of_run(ledger, run_id: str) -> tuple:
    """A run and its trials as a report reads them: (RunView, [TrialView])."""
    return run(ledger.run(run_id)), trials(ledger.trials(run_id))


# The columns `agent ledger` lists: the latencies beside the ratio, since a faster config may have bought
# its figure with latency (the defaults' own rows, source baseline/aa, show theirs).
LISTED = ("run_id", "number", "source", "status", "failure_class", "figure", "drift", "search_ratio",
          "heldout_ratio", "ttft_p99_ms", "itl_p99_ms", "ppl", "ppl_change", "agreement", "decision", "branch",
          "worker_id")
