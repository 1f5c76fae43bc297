"""Failure classes of a trial, and how a server log is read to tell them apart.

A failure is a value in the result, never an exception that escapes the worker: the loop feeds
the class back to the sampler so it learns which regions of the space do not run.
"""

from __future__ import annotations

import re
from enum import StrEnum


class FailureClass(StrEnum):
    """Why a trial failed, as the ledger stores it (its string)."""
    INVALID_CONFIG = "invalid_config"
    OOM = "oom"
    START_TIMEOUT = "start_timeout"
    CRASHED = "crashed"
    REQUEST_ERRORS = "request_errors"
    BAD_OUTPUT = "bad_output"
    UNCLEAN_TEARDOWN = "unclean_teardown"
    INTERRUPTED = "interrupted"
    WORKER_ERROR = "worker_error"
    PORT_IN_USE = "port_in_use"
    MODEL_UNAVAILABLE = "model_unavailable"
    # Written by the agent, never by the worker: an instance of the defaults started for a held-out
    # decision that could not be measured (its server failed, or the budget ended first).
    RECHECK = "recheck"

    @classmethod
    def of(cls, klass: str, message: str | None) -> tuple[FailureClass, str | None]:
        """A failure as the ledger keeps it: a class no member has (another engine's, an older ledger's)
        is a worker_error whose message names the class it gave, never a value the ledger refuses."""
        if klass in cls.__members__.values():
            return cls(klass), message
        return cls.WORKER_ERROR, f"(failure class {klass}) {message or ''}"


CLASSES = tuple(k.value for k in FailureClass if k is not FailureClass.RECHECK)   # what a worker can say
TAIL_LINES = 40

# Ordered: the first class whose pattern matches wins. Memory first, because an allocation
# failure often surfaces as a ValueError from the engine's config checks.
_PATTERNS = [
    # Trials run offline: a model that is not in the cache (or not readable there) is its own class.
    ("model_unavailable", re.compile(
        r"LocalEntryNotFoundError|outgoing traffic has been disabled|RepositoryNotFoundError|GatedRepoError|"
        r"does not appear to have a file named config\.json")),
    ("oom", re.compile(
        r"out of memory|OutOfMemoryError|Insufficient memory|MemoryError|"
        r"No available memory for the cache blocks|Cannot allocate memory|"
        r"larger than the available KV cache memory|not enough (KV cache |free )?memory|"
        r"controls the fraction of CPU memory reserved", re.I)),
    ("invalid_config", re.compile(
        r"error: (argument|unrecognized arguments|the following arguments)|ValidationError|"
        r"ValueError|NotImplementedError|is not supported|not supported (for|on|by|with)|"
        r"Invalid (value|argument|choice)|TypeError: .*(argument|config)|AssertionError", re.I)),
]


class TrialFailure(Exception):
    """Raised inside the worker to end a trial early; turned into the result's failure."""

    def __init__(self, klass: str, message: str, log_tail: str = "", cause: str | None = None):
        assert klass in CLASSES, klass
        super().__init__(message)
        self.klass = klass
        self.message = message
        self.log_tail = log_tail
        self.cause = cause   # vLLM's own words for why it stopped (root_cause of its log), when it said


def classify_log(text: str, default: str = "crashed") -> str:
    for klass, pattern in _PATTERNS:
        if pattern.search(text):
            return klass
    return default


# "(EngineCore_DP0 pid=812) ", "(APIServer pid=77) ", then "ERROR 11-30 12:00:01 [core.py:123] ".
_PROCESS_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+\)\s*")
_LOG_PREFIX = re.compile(r"^(ERROR|WARNING|INFO|DEBUG|CRITICAL)\s+\S+ \S+ \[[^\]]*\]\s*")
_EXCEPTION = re.compile(r"^([\w.]+(Error|Exception|Exit|Interrupt)|error)(: |$)")
# Lines vLLM raises on top of the real cause, which it logged above them.
_WRAPPERS = re.compile(r"Engine core initialization failed|See root cause above|EngineDeadError|"
                       r"Engine process failed to start|Background process .* died")
_DETAIL_SKIP = re.compile(r"^For further information|^\[type=")


def _strip(line: str) -> str:
    return _LOG_PREFIX.sub("", _PROCESS_PREFIX.sub("", line)).strip()


def root_cause(text: str) -> str:
    """vLLM's own account of why it stopped, in one line: the last exception it raised that is not
    a wrapper of another one (the engine core's, whichever process printed it), with the rule a
    config validation broke (pydantic's `Value error, ...` or the field and its bound), or a CUDA
    or CPU out-of-memory line. Warnings and info lines are never taken for it."""
    raw = text.splitlines()
    lines = [_strip(line) for line in raw]
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if re.search(r"\b(WARNING|INFO|DEBUG)\b", raw[i][:80]) or _WRAPPERS.search(line):
            continue
        if "CUDA out of memory" in line or "CUDA error: out of memory" in line:
            return line[:600]
        if not _EXCEPTION.search(line):
            continue
        if "ValidationError" in line:
            detail = [ln for ln in lines[i + 1:i + 9] if ln and not _DETAIL_SKIP.search(ln)]
            detail = [ln.split(" [type=")[0] for ln in detail]
            value = next((ln for ln in detail if ln.startswith("Value error, ")), None)
            return (f"{line.split(': ')[-1]}: {value[len('Value error, '):]}" if value
                    else " ".join([line, *detail[:4]]))[:600]
        return line[:600]
    return ""


def log_tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
