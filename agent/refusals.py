"""What vLLM refused in this run, learned once: the smallest set of knob settings it still refuses.

A refused start costs a minute or more, and the sampler keeps drawing the same combination. So
when vLLM refuses a point, at pre-flight or at engine start, the run reduces it to the settings
that cause the refusal and records that as a learned rule; every later point containing them is
skipped without starting anything, the planner is shown the rule, and so is `agent report`.

Reduction: each changed knob in turn goes back to the engine's default, and stays there while
vLLM's pre-flight still refuses the point with the same root cause (the end state of delta
debugging: no single setting can be dropped). A refusal only the engine's initialisation raises
(a kernel or backend check) cannot be replayed at pre-flight; its rule is then the settings whose
knob or value vLLM's message names, or the whole set of changes when it names none.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.ledger import LearnedRule

_VARIABLE = re.compile(r"0x[0-9a-f]+|\d+(\.\d+)?")


def same_cause(a: str, b: str) -> bool:
    """Two messages state the same refusal when they differ only in numbers (values, pids, sizes)."""
    return _VARIABLE.sub("#", a.strip().lower()) == _VARIABLE.sub("#", b.strip().lower())


def contains(point: dict, settings: dict) -> bool:
    return all(point.get(k) == v for k, v in settings.items())


def matching(point: dict, rules: list[LearnedRule]) -> LearnedRule | None:
    return next((r for r in rules if contains(point, r.settings)), None)


def minimise(changes: dict, message: str, refused: Callable[[dict], str | None]) -> tuple[dict, int]:
    """The changes reduced one knob at a time while `refused(sub)` (vLLM's message for the point
    with only `sub` changed, None when it passes) still states the same cause; and how many checks
    that took."""
    keep, checks = dict(changes), 0
    for name in list(changes):
        if len(keep) == 1:
            break
        sub = {k: v for k, v in keep.items() if k != name}
        said = refused(sub)
        checks += 1
        if said is not None and same_cause(said, message):
            keep = sub
    return keep, checks


def named(changes: dict, message: str) -> dict:
    """The changes whose knob (`async-scheduling` as "async scheduling" or "async_scheduling") or
    value (`FLASHINFER` as "FlashInfer") vLLM's message names."""
    said = message.lower()

    def mentioned(name: str, value) -> bool:
        bare = re.sub(r"^(enable|disable)-", "", name.split(".")[-1])
        words = {bare.replace("-", " "), bare.replace("-", "_")}
        if isinstance(value, str) and len(value) >= 3 and value.lower() in said:
            return True
        return any(w in said for w in words if len(w) >= 4)

    return {k: v for k, v in changes.items() if mentioned(k, v)}


def describe(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())
