"""Failure classes of a trial, and how a server log is read to tell them apart.

A failure is a value in the result, never an exception that escapes the worker: the loop feeds
the class back to the sampler so it learns which regions of the space do not run.
"""

from __future__ import annotations

import re

CLASSES = ("invalid_config", "oom", "start_timeout", "crashed", "request_errors", "bad_output",
           "unclean_teardown", "interrupted", "worker_error", "port_in_use")
TAIL_LINES = 40

# Ordered: the first class whose pattern matches wins. Memory first, because an allocation
# failure often surfaces as a ValueError from the engine's config checks.
_PATTERNS = [
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

    def __init__(self, klass: str, message: str, log_tail: str = ""):
        assert klass in CLASSES, klass
        super().__init__(message)
        self.klass = klass
        self.message = message
        self.log_tail = log_tail


def classify_log(text: str, default: str = "crashed") -> str:
    for klass, pattern in _PATTERNS:
        if pattern.search(text):
            return klass
    return default


_ERROR_LINE = re.compile(r"(\w+(Error|Exception)|error): ")
_LOG_PREFIX = re.compile(r"^\([^)]*\)\s+(ERROR|WARNING|INFO)\s+\S+ \S+ \[[^\]]*\]\s*")


def server_message(text: str) -> str:
    """The server's own account of why it stopped: its last error line, with the detail lines
    pydantic puts under a ValidationError (the field and the rule it broke). Warnings and info
    lines are never taken for it, even when they mention an error."""
    raw = text.splitlines()
    lines = [_LOG_PREFIX.sub("", line).strip() for line in raw]
    for i in range(len(lines) - 1, -1, -1):
        if " WARNING " in raw[i] or " INFO " in raw[i] or not _ERROR_LINE.search(lines[i]):
            continue
        if lines[i].startswith("RuntimeError: Engine core initialization"):
            continue  # the wrapper; the cause is logged above it
        if "ValidationError" in lines[i]:
            detail = [ln for ln in lines[i + 1:i + 7] if ln and not ln.startswith("For further information")]
            return " ".join([lines[i], *detail])[:600]
        return lines[i][:600]
    return ""


def log_tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])
