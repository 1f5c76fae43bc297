"""Frozen views of a run and its trials for the readers that must never write them (the planners):
each column's value as the row holds it, copied, on a frozen dataclass, as Optuna hands a sampler a
FrozenTrial rather than its storage's row. A column the row did not load (a trial's greedy outputs,
read only on the defaults' rows) is None in its view."""

from __future__ import annotations

import copy
from dataclasses import make_dataclass

from sqlalchemy import inspect

from agent.ledger import Base, Run, Trial


def _frozen(model: type[Base], name: str) -> type:
    return make_dataclass(name, [(c, object, None) for c in model.__table__.columns.keys()], frozen=True,
                          namespace={"__doc__": f"A {model.__name__} row as it was read: no write reaches the ledger."})


TrialView = _frozen(Trial, "TrialView")
RunView = _frozen(Run, "RunView")


def _view(kind: type, row: Base):
    unloaded = inspect(row).unloaded
    return kind(**{c: copy.deepcopy(getattr(row, c)) for c in row.__table__.columns.keys() if c not in unloaded})


def trials(rows: list[Trial]) -> list:
    return [_view(TrialView, t) for t in rows]


def run(row: Run):
    return _view(RunView, row)
