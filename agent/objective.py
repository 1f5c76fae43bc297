"""What a run ranks configs by, fixed when it starts: its name (the traffic's `objective`), the unit
its figures are in, and which way is better. Every figure the ledger, the branches and the reports
hold is in this unit; every ratio is a candidate's figure over the defaults'."""

from __future__ import annotations

from dataclasses import dataclass

from sandbox.contract import latency_of


@dataclass(frozen=True)
class Objective:
    name: str                    # tps, goodput, or a latency percentile (ttft-p99, e2e-p90, ...)
    unit: str                    # how its figures read
    direction: str = "maximize"  # a latency objective is ranked by its inverse, so higher is better


def named(name: str | None) -> Objective:
    name = name or "tps"
    if name == "goodput":
        return Objective(name, "req/s goodput")
    if latency_of(name):
        metric, q = name.split("-")
        return Objective(name, f"/s (1000 / {metric.upper()} {q} ms)")
    return Objective(name, "tok/s")


def of(summary: dict | None) -> Objective:
    """The objective a trial's meter, or a run's traffic summary, names (tokens/s where none is named)."""
    return named((summary or {}).get("objective"))


def of_run(run) -> Objective:
    return of((run.settings or {}).get("traffic"))
