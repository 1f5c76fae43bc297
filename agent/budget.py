"""The budget: a wall-clock deadline fixed when a run starts."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

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
    return (now or datetime.now(UTC)) + timedelta(seconds=seconds)


def seconds_left(deadline_iso: str, now: datetime | None = None) -> float:
    return (datetime.fromisoformat(deadline_iso) - (now or datetime.now(UTC))).total_seconds()


# A first start compiles what later starts find cached, and takes several times a warm one's time
# (docs/results.md). Before a warm start has been seen, a plan from the first instance alone is
# an upper bound, and the run stops early only if even starts this much cheaper would not fit.
WARM_START = 0.25


def heldout_instance_s(timings: dict, heldout_share: float = 1.0) -> float:
    """A held-out instance: a fresh server measured on the held-out prompts, without the quality phase.
    Its measuring is the held-out phase this server measured (an A/A's), else its search benchmark
    times heldout_share (under goodput the held-out split allows fewer rate points: the shipped
    trace's 2 against 5, 78-113 s against 300 on 2 cores)."""
    measuring = timings.get("heldout_s") or timings.get("benchmark_s", 0) * heldout_share
    return sum(timings.get(f"{phase}_s", 0) for phase in ("start", "warmup", "teardown")) + measuring


def heldout_share(measured: dict | None, heldout_points: int) -> float:
    """A held-out phase as a share of this trial's search benchmark: under goodput the held-out split's
    rate points for the ones its search measured (`measured`, the trial's; the shipped trace: 2 of 5),
    otherwise one (the same requests a phase). heldout_points 0: not goodput."""
    points = len(((measured or {}).get("goodput") or {}).get("points") or [])
    return min(1.0, heldout_points / points) if points and heldout_points else 1.0


# A candidate's goodput search decides in as few as two rate points (one that holds, one that breaks
# or a burst; a hopeless one is pruned at its first that breaks low), where the defaults' first bracket
# takes all of theirs: on 2 cores core binding took 2 points (2.6 min) against the defaults' 5 (7.3 min).
CANDIDATE_POINTS = 2


def plan(timings: dict, instances_left: int, aa_left: bool, left_s: float, spent_s: float,
         points: int | None = None, start_scale: float = 1.0, heldout_share: float = 1.0,
         candidate_share: float = 1.0) -> dict:
    # start_scale: later starts as a fraction of this instance's (WARM_START after a cold first one);
    # candidate_share: the candidate's search benchmark as a share of this instance's
    """What the budget fits, from an instance of the defaults (its phases' `timings`): the baseline's
    `instances_left` and the A/A (which measures the held-out prompts too) before the first
    candidate, which costs about one instance; its held-out decision's first look one fresh instance
    of it without the quality phase, against the A/A's held-out figure. `spent_s`: the run so far;
    heldout_share: a held-out phase as a share of the search benchmark (heldout_instance_s)."""
    start = timings.get("start_s", 0) * (1 - start_scale)
    instance_s = max(timings.get("total_s", 0) - timings.get("heldout_s", 0) - start, 0)   # an A/A's held-out phase out
    heldout_phase = timings.get("heldout_s") or timings.get("benchmark_s", 0) * heldout_share
    candidate_in = instances_left * instance_s + (instance_s + heldout_phase if aa_left else 0)
    candidate_s = instance_s - timings.get("benchmark_s", 0) * (1 - candidate_share)
    decided_in = candidate_in + candidate_s + max(heldout_instance_s(timings, heldout_share) - start, 0)
    return {"instance_s": round(instance_s, 1), "before_candidate": instances_left + aa_left, "points": points,
            "candidate_in_s": round(candidate_in), "decided_in_s": round(decided_in), "left_s": round(left_s),
            "need_s": round(spent_s + decided_in),
            "fits": "decision" if decided_in <= left_s else "candidate" if candidate_in + candidate_s <= left_s
            else "nothing"}


def decision_looks(p: dict, timings: dict, looks: int | None, gain: float, noise_sd: float,
                   heldout_share: float = 1.0) -> dict:
    """The plan with what a decision on a gain near the noise costs: `looks` fresh held-out instances
    of the candidate (agent.gate.looks_needed) and one fewer further instances of the defaults, each
    a held-out instance; the plan's own first decision is one look (a gain well above the noise)."""
    one = heldout_instance_s(timings, heldout_share)
    near = None if looks is None else round(p["decided_in_s"] + (2 * looks - 2) * one)
    return {**p, "near_gain": round(gain, 3), "near_noise": round(noise_sd, 4), "near_looks": looks,
            "near_decided_in_s": near}


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def plan_line(p: dict) -> str:
    """What the budget fits, said after the first instance of the defaults (agent.budget.plan)."""
    points = f", {p['points']} goodput rate points" if p.get("points") else ""
    head = (f"plan: an instance of the defaults took {minutes(p['instance_s'])} here{points}; "
            f"{p['before_candidate']} more before the first candidate (in about {minutes(p['candidate_in_s'])}), "
            f"its first decision in about {minutes(p['decided_in_s'])}"
            + (" (one held-out look: a gain well above the noise)" if p.get("near_gain") else "")
            + f"; {minutes(p['left_s'])} left")
    if p.get("near_gain"):
        looks = p.get("near_looks")
        head += (f"; a {p['near_gain']:.2f}x gain at ±{p['near_noise']:.1%} noise takes about {looks} held-out "
                 f"instances of the candidate and {looks - 1} more of the defaults "
                 f"(first decision in about {minutes(p['near_decided_in_s'])})" if looks else
                 f"; a {p['near_gain']:.2f}x gain at ±{p['near_noise']:.1%} noise cannot be decided within the "
                 f"held-out instances allowed")
    if p.get("capacity_s"):
        low, high = (minutes(x) for x in p["capacity_s"])
        head += (f"; --capacity then measures the defaults and the first branch up {p['capacity_of']}: about "
                 + (low if low == high else f"{low} to {high}"))
    if p["fits"] == "decision":
        return head
    need = p.get("need_s", p["decided_in_s"] + p["instance_s"])   # from the run's start
    if p.get("upper_bound"):
        quicker = (" and the candidate's goodput search needs fewer of them than the defaults' first"
                   if p.get("points") else "")
        return head + (f": a first decision fits only if later starts are quicker than this first one, which "
                       f"compiled what they reuse{quicker} (else a --budget of about {minutes(need)} would); going on")
    if p["fits"] == "candidate":
        return head + f": a first candidate fits, its decision likely not (a --budget of about {minutes(need)} would)"
    return head + f": no candidate fits (a --budget of about {minutes(need)} would reach a first decision)"
