"""The budget: a wall-clock deadline fixed when a run starts."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)")
_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> float:
    """Seconds in '24h', '90m', '1h30m', '45s' or a bare number of seconds; ValueError otherwise."""
    cleaned = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", cleaned):
        seconds = float(cleaned)
    elif cleaned and re.fullmatch(rf"(?:{_PART.pattern}\s*)+", cleaned):
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(cleaned))
    else:
        raise ValueError(f"{text!r} is not a duration like 24h, 90m, 1h30m or 45s")
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return seconds


def deadline_after(seconds: float, now: datetime | None = None) -> datetime:
    return (now or datetime.now(timezone.utc)) + timedelta(seconds=seconds)


def seconds_left(deadline_iso: str, now: datetime | None = None) -> float:
    return (datetime.fromisoformat(deadline_iso) - (now or datetime.now(timezone.utc))).total_seconds()
