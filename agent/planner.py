"""Planners propose what to try next, each proposal with a reason a person can check.

The built-in planner makes the moves an expert makes, each triggered by a measured fact that its
rationale cites: use every core, try ngram speculation on single-stream workloads and tune its
token count by the measured acceptance, move a step's token budget the way the SLO the defaults
broke first asks, grow the batch limit or the token budget a step (whichever the queue shows
binds) when requests queue and the KV cache is idle, capture larger CUDA graphs when many steps
run above the largest one, try an fp8 KV cache when memory runs short. Proposals start from the
best accepted config (the defaults at first), and each trigger reads that config's own
measurements, so a move is made only where the config it builds on showed the lever can bind.
A lever the lever table measured winning nowhere (WON_NOWHERE) is not a first move, whatever its
trigger says; the sampler may still draw it. Every proposal is checked against the space before it
reaches the study; one that is not a valid point is dropped, never passed on. The rules themselves
are in agent/rules.py, each a function of one typed Situation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from agent import points
from agent.points import Point
from agent.rules import RULES, WON_NOWHERE, Proposal, Situation
from agent.space import Space
from agent.states import Source, Status
from agent.views import RunView, TrialView

__all__ = ["BuiltinPlanner", "Narrowing", "NoPlanner", "Planner", "Proposal"]


@dataclass(frozen=True)
class Narrowing:
    """The sampler draws a numeric knob from [low, high] from now on (planner proposals are not bound)."""

    knob: str
    low: float
    high: float
    rationale: str


class Planner(Protocol):
    name: str

    def propose(self, space: Space, run: RunView, history: list[TrialView], facts: dict, k: int) -> list[Proposal]:
        """Up to k proposals, valid points of space, none already tried in history. The loop hands the
        run and its trials as frozen copies (agent.views): a planner reads them, never writes."""
        ...

    def narrow(self, space: Space, history: list[TrialView]) -> list[Narrowing]:
        """Ranges the sampler should keep to from now on, given what history showed (may be empty)."""
        ...


class NoPlanner:
    """The sampler alone (`--planner off`, and the benchmark's Optuna-only arm)."""

    name = "off"

    def propose(self, space, run, history, facts, k):
        return []

    def narrow(self, space, history):
        return []


# Failures that say a value was too large for this machine, not that a combination was refused,
# and the knobs that size memory: only those are narrowed after such a failure (a sampled point
# sets every knob, and the failure says nothing about, say, the ngram lookup length).
CAPACITY_FAILURES = ("oom", "start_timeout")
CAPACITY_KNOBS = ("max-num-seqs", "max-num-batched-tokens", "max-model-len", "gpu-memory-utilization",
                  "max-num-partial-prefills", "max-long-partial-prefills", "swap-space")


class BuiltinPlanner:
    name = "builtin"

    def propose(self, space: Space, run: RunView, history: list[TrialView], facts: dict, k: int) -> list[Proposal]:
        ok = [t for t in history if t.status == Status.OK and t.source != Source.EXTRA]  # extra: held-out speed only
        accepted = [t for t in ok if t.gate_passed]
        best = max(accepted, key=lambda t: t.figure or 0, default=None)
        start = dict(best.params) if best else {}
        basis = f"trial {best.number} ({best.search_ratio:.2f}x)" if best else "the defaults"
        # The triggers read the start's own newest measurement: a lever is moved where the config it
        # builds on showed that it binds.
        measured = max((t for t in ok if t.params == start), key=lambda t: t.number, default=None)
        situation = Situation(space, start, basis, history, measured, facts)
        seen, out = points.tried(history), []
        for move in (m for rule in RULES for m in rule(situation)):
            key = Point.of(move.params)
            if key in seen or space.problems(move.params) or any(move.params.get(k) != start.get(k)
                                                                 for k in WON_NOWHERE if k in move.params):
                continue
            seen.add(key)
            out.append(move)
            if len(out) == k:
                break
        return out

    def narrow(self, space: Space, history: list[TrialView]) -> list[Narrowing]:
        """Keep the sampler below values that ran out of memory or time while smaller ones ran.

        The new top is the geometric middle between the largest value that worked and the smallest
        that failed, so one unlucky failure halves the range rather than cutting it to what is known.
        """
        out = []
        for knob in space.knobs.values():
            if knob.type not in ("int", "float") or knob.name not in CAPACITY_KNOBS:
                continue
            failed = [t.params[knob.name] for t in history
                      if t.failure_class in CAPACITY_FAILURES and knob.name in t.params]
            worked = [t.params[knob.name] for t in history if t.status == Status.OK and knob.name in t.params]
            low, high = knob.range
            if not failed or not worked or max(worked) >= min(failed) or max(worked) < low:
                continue
            top = (max(worked) * min(failed)) ** 0.5
            top = int(top) if knob.type == "int" else round(top, 6)
            if top < high and top >= max(worked):
                fails = sorted(t.failure_class for t in history if t.failure_class in CAPACITY_FAILURES
                               and knob.name in t.params)
                out.append(Narrowing(knob.name, low, top,
                                     f"{knob.name} failed ({', '.join(sorted(set(fails)))}) at {min(failed)} and "
                                     f"above while {max(worked)} ran: the sampler keeps to [{knob.low}, {top}]"))
        return out
