"""Frozen views of a run and its trials for the readers that must never write them (the planners, the
reports and `agent status`):
each column's value as the row holds it, copied, on a frozen dataclass, as Optuna hands a sampler a
FrozenTrial rather than its storage's row. A trial's greedy outputs and top logprobs (most of a
row's bytes, read only on the defaults' rows, for the gate) are not in its view."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeVar

from agent.ledger import Base, Claims, Run, Trial
from agent.states import Decision, RunStatus, Source, Status
from sandbox.contract import FailureClass

ViewT = TypeVar("ViewT", "TrialView", "RunView")

BULK = {"greedy", "top_logprobs"}


def _columns(model: type[Base]) -> list[str]:
    return [c for c in model.__table__.columns.keys() if c not in BULK]


@dataclass(frozen=True)
class TrialView(Claims):
    """A trial's row as it was read (agent.ledger.Trial's columns, less greedy and top_logprobs): no write
    reaches the ledger. tests/test_views.py holds its fields to the table's columns."""
    id: int
    run_id: str
    number: int
    source: Source
    optuna_number: int | None
    params: dict[str, Any]
    flags: dict[str, Any]
    env: dict[str, Any]
    lossless: bool | None
    status: Status
    failure_class: FailureClass | None
    failure_message: str | None
    failure_cause: str | None
    failed_phase: str | None
    log_tail: str | None
    figure: float | None
    figure_interval: list[Any] | None
    search_ratio: float | None
    drift: float | None
    figure_corrected: float | None
    heldout_figure: float | None
    heldout_ratio: float | None
    heldout_instances: list[Any] | None
    heldout_interval: list[Any] | None
    search_interval: list[Any] | None
    ppl: float | None
    ppl_change: float | None
    agreement: float | None
    ttft_p99_ms: float | None
    itl_p99_ms: float | None
    errors: int | None
    metrics: dict[str, Any]
    kl: float | None
    flips: list[Any] | None
    rule: str | None
    decision: Decision | None
    constraint: float | None
    gate_passed: bool | None
    gate_reasons: list[Any]
    branch: str | None
    commit: str | None
    timings: dict[str, Any]
    log_path: str | None
    rationale: str | None
    meter: dict[str, Any]
    measured: dict[str, Any] | None
    worker_id: int | None
    started_at: str
    finished_at: str | None


@dataclass(frozen=True)
class RunView:
    """A run's row as it was read (agent.ledger.Run's columns): no write reaches the ledger."""
    id: str
    started_at: str
    deadline_at: str
    finished_at: str | None
    status: RunStatus
    model: str
    model_revision: str | None
    engine: str | None
    engine_version: str | None
    hardware: dict[str, Any]
    space_path: str
    space_hash: str
    workload: str
    workload_hash: str | None
    repo: str
    settings: dict[str, Any]
    baseline_figure: float | None
    baseline_ppl: float | None
    noise: float | None
    noise_df: int | None
    calibration: dict[str, Any] | None
    owner: str | None


def _view(kind: type[ViewT], row: Base) -> ViewT:
    return kind(**{c: copy.deepcopy(getattr(row, c)) for c in _columns(type(row))})


def trials(rows: list[Trial]) -> list[TrialView]:
    return [_view(TrialView, t) for t in rows]


def run(row: Run) -> RunView:
    return _view(RunView, row)


def of_run(ledger, run_id: str) -> tuple[RunView, list[TrialView]]:
    """A run and its trials as a report reads them: (RunView, [TrialView])."""
    return run(ledger.run(run_id)), trials(ledger.trials(run_id))


# The columns `agent ledger` lists: the latencies beside the ratio, since a faster config may have bought
# its figure with latency (the defaults' own rows, source baseline/aa, show theirs).
LISTED = ("run_id", "number", "source", "status", "failure_class", "figure", "drift", "search_ratio",
          "heldout_ratio", "ttft_p99_ms", "itl_p99_ms", "ppl", "ppl_change", "agreement", "decision", "branch",
          "worker_id")
