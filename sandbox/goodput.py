"""Goodput: the highest request rate at which the user's latency SLOs still hold.

Under an open-loop rate below saturation a server's tokens/s is the offered load, whatever the
config, so tokens/s cannot rank configs there. What can: how far the rate can rise before p99
TTFT, p99 inter-token latency or p99 end-to-end latency break their bounds. The search measures
rate points (each a fresh draw of requests on the same seeded arrival pattern, scaled to the rate),
doubling or halving from a start until one point holds and one breaks (from a figure measured
before, in steps that start at twice the tolerance: first_step), then bisects between them until
the two are within `tolerance` of the upper one. The figure is where, between the last rate
that held and the first that broke, the binding p99 crosses its bound (linearly).

Not `vllm bench serve --goodput`: that is the share of requests meeting per-request SLOs, per
second, at the one rate it was given (docs/arrivals.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from sandbox.bench import BenchResult
from sandbox.workload import Slo

P99_MIN_REQUESTS = 100   # below this a point's "p99" is its worst request, and it is named so
SUSTAIN = 3              # a point's requests must arrive over at least 3 of their median latencies


class Unsustained(Exception):
    """A rate point that held, but whose requests all arrived within a few of their own latencies: a
    burst, not a sustained load, so holding it says nothing about the rate (4 requests a point once let
    a trace "hold" 462 requests/s on 2 cores: docs/history.md). The search
    stops there: what held and broke below it stands; above it, points of this size cannot judge."""


class Hopeless(Exception):
    """A point broke at or below the rate the search was told to give up under: the goodput lies below it."""


MAX_HALVINGS = 6         # no lower than start / 64: below it a point's requests span 64 times longer


def misses(slo: Slo, result: BenchResult) -> list[str]:
    """The SLOs this point broke, each with its figure; failed requests break it too."""
    found = {"ttft_p99_ms": result.ttft_ms.get("p99"), "itl_p99_ms": result.itl_ms.get("p99"),
             "e2e_p99_ms": result.latency_ms.get("p99")}
    out = [f"{result.errors} of {result.requests} requests failed"] if result.errors else []
    for name, bound in slo.bounds().items():
        value = found[name]
        if value is not None and value > bound:
            out.append(f"{name} {value:g} > {bound:g}")
    return out


@dataclass
class Point:
    rate: float
    held: bool
    requests: int
    percentile: str           # "p99", or "max of N" where N < 100 requests
    ttft_p99_ms: float | None
    itl_p99_ms: float | None
    e2e_p99_ms: float | None
    tpot_p99_ms: float | None
    tps: float
    misses: list[str]


@dataclass
class Goodput:
    rate: float               # requests a second: where the p99 meets its bound between the bounds (0: none held)
    bounds: tuple[float, float | None]   # it held at the first, broke at the second (None: never broke)
    converged: bool           # the bounds are within the tolerance
    slo: dict[str, float]
    points: list[Point] = field(default_factory=list)
    burst: str | None = None  # why the search stopped short: a point that held only as a burst
    pruned_at: float | None = None   # a rate at or below give_up_below broke there: the goodput is at most it

    def as_dict(self) -> dict:
        return {**asdict(self), "bounds": list(self.bounds)}


def lower_bound(found: dict | None) -> bool:
    """Whether a goodput (Goodput.as_dict, as a trial records it) is only a lower bound: no load broke."""
    return found is not None and bool(found) and (found.get("bounds") or [0, 0])[-1] is None


def point(rate: float, result: BenchResult, slo: Slo) -> Point:
    n = result.requests - result.errors
    return Point(rate=round(rate, 6), held=not misses(slo, result), requests=result.requests,
                 percentile="p99" if n >= P99_MIN_REQUESTS else f"max of {n}",
                 ttft_p99_ms=result.ttft_ms.get("p99"), itl_p99_ms=result.itl_ms.get("p99"),
                 e2e_p99_ms=result.latency_ms.get("p99"), tpot_p99_ms=result.tpot_ms.get("p99"),
                 tps=result.tps, misses=misses(slo, result))


def first_step(near: bool, max_points: int, tolerance: float) -> float:
    """The factor of the search's first step from its start. From a figure this run already measured
    (`near`: the defaults' goodput, for their later instances and for candidates), twice the
    tolerance, so that a config close to it is bracketed and settled in three points where doubling
    takes five or more (the shipped trace on 2 cores: each later instance of the defaults bisected
    all five of its points again from the trace's pace, about a minute each). Each further step
    squares the factor, up to doubling, so a config far from the start is still reached in a few.
    With fewer than four points (the shipped trace's held-out split allows two), doubling: two
    narrow steps that both hold leave only a lower bound."""
    return 1 + 2 * tolerance if near and max_points >= 4 else 2.0


def search(measure: Callable[[float], BenchResult], slo: Slo, start: float, tolerance: float = 0.05,
           max_points: int = 12, give_up_below: float | None = None, near: bool = False) -> Goodput:
    """Bracket, then bisect; at most max_points measurements (the split bounds how many fresh draws
    a server gets), and no lower than start / 64 (goodput 0 below it). Unconverged when the points
    ran out first: the bounds say how far it got. give_up_below: a point that breaks at or below this
    rate ends the search (`pruned_at`): the goodput is below it, and the points under it would only
    say how far below (a candidate that cannot reach the defaults' goodput, at 24 requests a point
    and a fifth of the defaults' rate, spends 2 minutes a point there). near: the start is a figure
    measured before, so the bracket grows from a small first step (first_step)."""
    if not slo.bounds():
        raise ValueError("goodput needs at least one SLO (TTFT, ITL or end-to-end p99)")
    points: list[Point] = []
    factor = first_step(near, max_points, tolerance)

    def step() -> float:   # this step's factor; the next one's is its square, at most 2
        nonlocal factor
        now, factor = factor, min(factor * factor, 2.0)
        return now

    def holds(rate: float) -> bool:
        result = measure(rate)
        points.append(point(rate, result, slo))
        span, typical = result.requests / rate, (result.latency_ms.get("p50") or 0) / 1000
        if points[-1].held and span < SUSTAIN * typical:
            raise Unsustained(f"at {rate:.3g} requests/s the point's {result.requests} requests arrived over "
                              f"{span:.1f} s, less than {SUSTAIN} of their median latencies ({typical:.1f} s): a "
                              f"burst, not a load; measure about {math.ceil(SUSTAIN * typical * rate * 2)} or more "
                              f"requests a point (--num-prompts, or num_prompts: in a workload file) "
                              f"and a traffic file "
                              f"with room for them")
        if not points[-1].held and give_up_below is not None and rate <= give_up_below:
            raise Hopeless()
        return points[-1].held

    lo, hi, rate, burst, pruned_at = None, None, start, None, None
    try:
        if holds(rate):
            lo = rate
            while hi is None and len(points) < max_points:
                rate *= step()
                lo, hi = (rate, None) if holds(rate) else (lo, rate)
        else:
            hi = rate
            while lo is None and len(points) < max_points and rate > start / 2 ** MAX_HALVINGS * (1 + 1e-9):
                rate /= step()
                lo, hi = (rate, hi) if holds(rate) else (None, rate)
        while lo is not None and hi is not None and (hi - lo) / hi > tolerance and len(points) < max_points:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    except Unsustained as e:   # the burst point is neither bound: lo and hi are what loads said
        burst = str(e)
    except Hopeless:
        hi = pruned_at = points[-1].rate
    converged = lo is not None and hi is not None and (hi - lo) / hi <= tolerance
    return Goodput(rate=round(crossing(points, lo, hi, slo), 6),
                   bounds=(round(lo or 0.0, 6), None if hi is None else round(hi, 6)),
                   converged=converged, slo=slo.bounds(), points=points, burst=burst, pruned_at=pruned_at)


def crossing(points: list[Point], lo: float | None, hi: float | None, slo: Slo) -> float:
    """Where between the last rate that held and the first that broke the binding p99 meets its
    bound, linearly: a figure that varies with the server, not only with the search's steps (two
    instances that stop on the same bracket still differ, so the gate sees their noise)."""
    if lo is None:
        return 0.0
    if hi is None:
        return lo
    at = {p.rate: p for p in points}
    held, broke = at[round(lo, 6)], at[round(hi, 6)]
    fractions = []
    for name, bound in slo.bounds().items():
        below, above = getattr(held, name), getattr(broke, name)
        if below is not None and above is not None and above > bound and above > below:
            fractions.append(min(1.0, max(0.0, (bound - below) / (above - below))))
    return lo + (hi - lo) * (min(fractions) if fractions else 0.0)   # broke by errors alone: the held rate
