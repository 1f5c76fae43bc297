"""A point of the space: the knobs a trial sets, as one value the loop, the study and the planner key on,
and the one rule for points a crash cut: a point interrupted once was not measured and is measured
again; interrupted a second time it counts as tried (a point that takes the agent down with it must
not do so all night).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agent.states import Status


class Row(Protocol):
    """What a point is read from: a ledger row, a planner's frozen view of one."""
    @property
    def params(self) -> Any: ...

    @property
    def status(self) -> Any: ...


@dataclass(frozen=True, order=True)
class Point:
    """Knob values, whatever their order or type: equal where the knobs and values are."""
    key: str

    @classmethod
    def of(cls, params: Mapping[str, Any] | None) -> Point:
        return cls(repr(sorted((params or {}).items())))

    @classmethod
    def of_row(cls, row: Row) -> Point:
        return cls.of(row.params)


def interruptions(rows: Iterable[Row]) -> Counter[Point]:
    """How often each point's trial was cut (interrupted) among `rows`."""
    return Counter(Point.of_row(t) for t in rows if t.status == Status.INTERRUPTED)


def tried(rows: Iterable[Row]) -> set[Point]:
    """Points measured, refused or skipped, and those cut twice: none is proposed again."""
    rows = list(rows)
    twice = {p for p, n in interruptions(rows).items() if n > 1}
    return {Point.of_row(t) for t in rows if t.status != Status.INTERRUPTED} | twice


def counted(rows: Iterable[Row]) -> int:
    """Trials that count against a cap: every one but a point's first cut (it is measured again)."""
    rows = list(rows)
    return sum(1 for t in rows if t.status != Status.INTERRUPTED) + sum(
        n - 1 for n in interruptions(rows).values())
