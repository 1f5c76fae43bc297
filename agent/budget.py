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


def first_plan(instance_s: float, before_candidate: int, left_s: float, points: int | None = None) -> dict:
    """What the budget fits, from the first instance of the defaults: `before_candidate` more instances
    (the baseline's rest and the A/A check) before the first candidate, which costs about one more,
    and its held-out decision at least one fresh instance after that. A cold first start makes this
    an upper bound."""
    candidate_in = before_candidate * instance_s
    decided_in = candidate_in + 2 * instance_s
    return {"instance_s": round(instance_s, 1), "before_candidate": before_candidate, "points": points,
            "candidate_in_s": round(candidate_in), "decided_in_s": round(decided_in), "left_s": round(left_s),
            "fits": "decision" if decided_in <= left_s else "candidate" if candidate_in + instance_s <= left_s
            else "nothing"}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plan_line(p: dict) -> str:
    """What the budget fits, said after the first instance of the defaults (agent.budget.first_plan)."""
    points = f", {p['points']} goodput rate points" if p.get("points") else ""
    head = (f"plan: an instance of the defaults took {minutes(p['instance_s'])} here{points}; "
            f"{p['before_candidate']} more before the first candidate (in about {minutes(p['candidate_in_s'])}), "
            f"its first decision in about {minutes(p['decided_in_s'])}; {minutes(p['left_s'])} left")
    if p["fits"] == "decision":
        return head
    need = p["decided_in_s"] + p["instance_s"]   # from the run's start: the first instance too
    if p["fits"] == "candidate":
        return head + f": a first candidate fits, its decision likely not (a --budget of about {minutes(need)} would)"
    return head + f": no candidate fits (a --budget of about {minutes(need)} would reach a first decision)"
