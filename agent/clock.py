"""The run's clock, one seam: the loop's modules read time here, so bench/budget_sim.py can run
them unchanged on a simulated clock."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now() -> datetime:
    return datetime.now(UTC)


def monotonic() -> float:
    return time.monotonic()


def seconds_left(deadline_iso: str) -> float:
    return (datetime.fromisoformat(deadline_iso) - now()).total_seconds()


def seconds_since(start_iso: str) -> float:
    return (now() - datetime.fromisoformat(start_iso)).total_seconds()
