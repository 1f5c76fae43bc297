"""A trial's life as typed values: where it came from (Source), how its process ended (Status) and
what was decided about it (Decision), each stored as its string so old ledgers and users' SQL read
the same; and the moves the lifecycle allows, which `Ledger.transition` checks on every write.

    running --> ok | failed | interrupted | skipped | pruned      (the worker's result, or the crash)
    ok, pruned --> interrupted    (cut between its measurement and its gate, its result unreadable: measured again)

A candidate's decision (None until the gate has spoken):

    None --> refused | failed | skipped | pruned | speed-only | dominated | awaiting_recheck | put_forward | accepted
    awaiting_recheck --> accepted | refused | dominated | put_forward   (a resume decides it again)
    put_forward --> awaiting_recheck | accepted | refused | dominated
    accepted --> dominated   (a better config of the same point was accepted first, by another worker)

An instance of the defaults is decided once: baseline, drift, extra, aa-passed, aa-failed, or failed.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"
    PRUNED = "pruned"


class Source(StrEnum):
    BASELINE = "baseline"   # the defaults, measured first
    AA = "aa"               # the defaults again, judged as a candidate (the A/A check)
    DRIFT = "drift"         # the defaults during the search: how far the machine moved
    EXTRA = "extra"         # the defaults on the held-out prompts, for a candidate's decision
    DEVICE = "device"       # the defaults on another worker's device
    PLANNER = "planner"     # a candidate the planner proposed
    SAMPLER = "sampler"     # a candidate Optuna's sampler drew


class Decision(StrEnum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    DOMINATED = "dominated"
    AWAITING_RECHECK = "awaiting_recheck"
    PUT_FORWARD = "put_forward"
    FAILED = "failed"
    SKIPPED = "skipped"
    PRUNED = "pruned"
    SPEED_ONLY = "speed-only"
    BASELINE = "baseline"
    DRIFT = "drift"
    EXTRA = "extra"
    AA_PASSED = "aa-passed"
    AA_FAILED = "aa-failed"


class RunStatus(StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"


class WorkerStatus(StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"
    LOST = "lost"


class WorkerRole(StrEnum):
    COORDINATOR = "coordinator"   # re-checks on held-out prompts and commits branches
    WORKER = "worker"             # measures and puts forward


CANDIDATES = frozenset({Source.PLANNER, Source.SAMPLER})
DEFAULTS = frozenset(Source) - CANDIDATES
# The instances of the defaults measured on the search prompts (an extra measures the held-out ones only).
DEFAULTS_ON_SEARCH = DEFAULTS - {Source.EXTRA}
FINISHED = frozenset({Status.OK, Status.FAILED, Status.SKIPPED, Status.PRUNED})   # what Optuna is told


def candidate(trial) -> bool:
    return trial.source in CANDIDATES


def of_defaults(trial) -> bool:
    return trial.source in DEFAULTS


def branch_pending(trial) -> bool:
    """Accepted with no branch yet: a crash or a git error between the decision and its commit."""
    return trial.decision == Decision.ACCEPTED and not trial.branch


STATUS_MOVES = {
    Status.RUNNING: frozenset(Status) - {Status.RUNNING},
    Status.OK: frozenset({Status.INTERRUPTED}),
    Status.PRUNED: frozenset({Status.INTERRUPTED}),
}
_FIRST = frozenset(Decision)
DECISION_MOVES = {
    None: _FIRST,
    Decision.AWAITING_RECHECK: frozenset({Decision.ACCEPTED, Decision.REFUSED, Decision.DOMINATED,
                                          Decision.PUT_FORWARD}),
    Decision.PUT_FORWARD: frozenset({Decision.AWAITING_RECHECK, Decision.ACCEPTED, Decision.REFUSED,
                                     Decision.DOMINATED}),
    Decision.ACCEPTED: frozenset({Decision.DOMINATED}),
}


class Superseded(RuntimeError):
    """Another process moved this trial since this one read it (a worker declared lost, its trial
    recorded as interrupted): this process's write is dropped, so the trial stays recorded once."""


class BadMove(ValueError):
    """A write the lifecycle does not allow: a bug in the caller, never a user's input."""


def check_move(number: int | None, field: str, before, after) -> None:
    """Raise BadMove unless a trial's status or decision may go from `before` to `after`."""
    if before == after:
        return
    kind, moves = (Status, STATUS_MOVES) if field == "status" else (Decision, DECISION_MOVES)
    if after is not None:
        kind(after)   # a value that is not one of the kind's raises ValueError, naming it
    if after not in moves.get(before, frozenset()):
        raise BadMove(f"trial {number}: {field} may not move from {before!r} to {after!r}")
