"""A ladder of loads on one server, for what a config is worth (`agent capacity`, issue 58).

Each rung is one load: closed-loop streams (`concurrency`) or open-loop requests/s (`rate`, the
workload's arrival pattern at that rate). At each rung the server gets warm-ups at that load, then
`repeats` measured phases, every one a fresh draw: the rungs take their requests in turn from one
cursor over the traffic's whole pool (the search split, then the held-out one: no decision rests on
a ladder), so no request reaches the server twice. Every closed-loop phase of a ladder up to T > 1
streams sends at least 8 T requests (sandbox.workload.PHASE_PER_SLOT: the same mix at every rung) and
is counted over its steady window, as every figure.

The ladder climbs until the loads given are spent, the traffic is, a rung's p99 breaks a bound of
the SLO given, or output tokens/s stopped rising (a rung less than RISING above the one below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sandbox.traffic import Request
from sandbox.workload import PHASE_PER_SLOT, Workload

KINDS = ("concurrency", "rate")
RISING = 0.05        # a rung whose output tokens/s is not 5% above the one below ends the climb
MAX_RUNGS = 12
OPEN_LOOP_CAP = 256  # requests in flight at most under open-loop arrivals
PHASE_SECONDS = 10   # an open-loop phase sends at least this many seconds of arrivals
OPEN_LOOP_MIN = 16   # and at least this many requests (4 a phase at 0.2 req/s on the CPU read a p99 of 4)
SLO_FIELDS = {"ttft_p99_ms": "ttft_ms", "itl_p99_ms": "itl_ms", "e2e_p99_ms": "latency_ms"}


@dataclass(frozen=True)
class Ladder:
    """What a spec asks: the kind of load, the loads in climbing order, and the bounds that end it."""
    kind: str
    loads: tuple[float, ...]
    slo: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: object, source: str) -> Ladder:
        if not isinstance(raw, dict) or set(raw) - {"kind", "loads", "slo"}:
            raise ValueError(f"{source}: {raw!r} is not a mapping of kind, loads and slo")
        kind, loads, slo = raw.get("kind"), raw.get("loads"), raw.get("slo") or {}
        if kind not in KINDS:
            raise ValueError(f"{source}.kind: {kind!r} is not one of {', '.join(KINDS)}")
        if (not isinstance(loads, list) or not 0 < len(loads) <= MAX_RUNGS
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x <= 4096 for x in loads)
                or sorted(loads) != loads or len(set(loads)) != len(loads)
                or (kind == "concurrency" and not all(float(x).is_integer() for x in loads))):
            raise ValueError(f"{source}.loads: {loads!r} is not 1 to {MAX_RUNGS} rising loads above 0 "
                             f"(whole streams for concurrency)")
        if not isinstance(slo, dict) or set(slo) - set(SLO_FIELDS) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in slo.values()):
            raise ValueError(f"{source}.slo: {slo!r} is not bounds in ms among {', '.join(SLO_FIELDS)}")
        return cls(kind, tuple(float(x) if kind == "rate" else int(x) for x in loads), dict(slo))

    def as_dict(self) -> dict:
        return {"kind": self.kind, "loads": list(self.loads), "slo": dict(self.slo)}

    def at(self, workload: Workload, load: float) -> Workload:
        """The workload of this ladder's rung at `load` (rung_workload)."""
        return rung_workload(workload, self.kind, load, self.loads[-1])


def rung_workload(workload: Workload, kind: str, load: float, top: float | None = None) -> Workload:
    """The workload at one rung: C streams with a phase of at least 8 T requests at every rung of a ladder
    whose top load T is above 1 (each rung's phase the same size, so every rung draws a like mix of
    short and long requests and their latencies compare: 4 requests a phase at one stream read a p99
    end-to-end a tenth of 16 at two, on the realistic default, by their lengths alone), or the workload's
    arrival pattern (Poisson where it has none) at `load` requests/s for at least PHASE_SECONDS of
    arrivals and OPEN_LOOP_MIN requests, at most OPEN_LOOP_CAP in flight (as `vllm bench serve --request-rate` without
    --max-concurrency: a server that falls behind queues them, and the queue counts in their latency)."""
    if kind == "concurrency":
        streams = int(load)
        highest = int(top or load)
        least = PHASE_PER_SLOT * highest if highest > 1 else 0   # as sandbox.workload's phases at C > 1
        return replace(workload, concurrency=streams, num_prompts=max(workload.num_prompts, least),
                       arrivals="concurrency", name=f"{workload.name}@c{streams}")
    # The profile's shape (its burstiness and seed, or the trace's timing) where it has one; the rung's rate
    # reaches it as offsets(rate=load), which overrides the profile's own.
    arrivals = workload.arrivals if workload.arrivals.startswith(("rate", "trace")) else f"rate:{load:g}"
    return replace(workload, arrivals=arrivals, concurrency=max(workload.concurrency, OPEN_LOOP_CAP),
                   num_prompts=max(workload.num_prompts, OPEN_LOOP_MIN, math.ceil(PHASE_SECONDS * load)),
                   name=f"{workload.name}@r{load:g}")


class Cursor:
    """The traffic's whole pool in a fixed order, handed out once: what the rungs draw from."""

    def __init__(self, workload: Workload):
        self.pool: list[Request] = workload.pool("search") + (workload.pool("heldout") if workload.traffic else [])
        self.at = 0

    def take(self, count: int) -> list[Request] | None:
        """The next count requests, or None where fewer are left."""
        if self.at + count > len(self.pool):
            return None
        self.at += count
        return self.pool[self.at - count:self.at]


def broken(bench: dict, slo: dict) -> str | None:
    """The first bound a phase's p99 breaks, in words; None where all hold."""
    for name, latency in SLO_FIELDS.items():
        bound, p99 = slo.get(name), (bench.get(latency) or {}).get("p99")
        if bound is not None and p99 is not None and p99 > bound:
            return f"p99 {latency.removesuffix('_ms').replace('latency', 'end-to-end')} {p99:.0f} ms broke the " \
                   f"SLO's {bound:g} ms"
    return None


def median_tps(phases: list[dict]) -> float:
    return sorted(p["tps"] for p in phases)[len(phases) // 2]
