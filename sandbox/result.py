"""A trial's result: what the worker writes, the engine reads back, the gate judges and the loop records.

One type, written and read as JSON by `write` and `read` (and `to_json`/`from_json`) below and
nowhere else. The file's fields and names are the JSON's (a failure's `klass` is written `class`);
`result_version` says which shape a file has, and a file of a version this code does not know is
refused by name rather than half read.

    status    ok | failed | pruned
    failure   why a failed trial failed (a class from sandbox.failures, a message, the log's tail)
    bench     the instance's figures on the split it measured (Figures); bench_heldout the same
              server's on the held-out split, when asked for
    quality   perplexity and greedy outputs through the same server (Quality), None when not measured
    timings   seconds per phase: start_s, warmup_s, benchmark_s, heldout_s, quality_s, teardown_s
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_VERSION = 1


class ResultError(ValueError):
    """A result file that cannot be read as a trial result."""


@dataclass
class Failure:
    klass: str                  # sandbox.failures' classes: start_timeout, oom, crashed, request_errors, ...
    message: str
    log_tail: str = ""
    cause: str | None = None    # a named cause under the class (sandbox.failures.classify)


@dataclass
class Figures:
    """One server's measurement of one split: its figure under the objective, tokens/s, and the median
    repeat's latencies (ms percentiles: p50, p90, p99, mean)."""
    tps: float
    objective: str = "tps"
    figure: float | None = None          # under the objective; higher is better (None: tokens/s)
    output_tokens: int = 0
    wall_s: float = 0.0
    requests: int = 0
    errors: int = 0
    short_outputs: int = 0
    first_error: str | None = None
    ttft_ms: dict[str, float] = field(default_factory=dict)
    itl_ms: dict[str, float] = field(default_factory=dict)     # every gap between two streamed chunks
    tpot_ms: dict[str, float] = field(default_factory=dict)    # per request: (latency - TTFT) / (tokens - 1)
    itl_token_ms: dict[str, float] = field(default_factory=dict)  # chunk gaps per token they bring
    latency_ms: dict[str, float] = field(default_factory=dict)
    finish: dict[str, int] = field(default_factory=dict)       # how the requests ended: eos, stop, length
    repeat_figures: list[float] = field(default_factory=list)  # each repeat's figure (under goodput: each rate point)
    draw_hash: str | None = None
    draw_hashes: list[str | None] = field(default_factory=list)
    goodput: dict | None = None          # sandbox.goodput.Found.as_dict() under the objective goodput
    points_tps: list[float] | None = None
    hash: str | None = None              # the held-out split's hash, on bench_heldout
    repeat_hits: int = 0                 # output words a prompt lookup drafts right (sandbox.bench.lookup_hits)
    repeat_words: int = 0
    phase_tps: float | None = None       # every token over the whole phases' time (vllm bench serve's figure)
    window_s: float | None = None        # the steady windows tps counts over (sandbox.bench; None: whole phases)
    window_tokens: int | None = None
    input_tokens: int = 0                # the answered requests' prompt tokens (the server's usage records)

    @property
    def repeat_share(self) -> float | None:
        """How much of what this server answered repeats its context, as prompt lookup sees it."""
        return round(self.repeat_hits / self.repeat_words, 3) if self.repeat_words else None

    @property
    def value(self) -> float:
        """The figure the gate compares: under the objective, tokens/s where none was named."""
        return self.tps if self.figure is None else self.figure


@dataclass
class Quality:
    ppl: float
    nll: float | None = None
    ppl_tokens: int | None = None
    ppl_windows: int | None = None
    greedy: list[dict] = field(default_factory=list)   # per prompt: token_ids, top_logprobs (and text)

    @property
    def token_ids(self) -> list[list[int]]:
        return [g["token_ids"] for g in self.greedy]

    @property
    def top_logprobs(self) -> list:
        return [g.get("top_logprobs") for g in self.greedy]


@dataclass
class TrialResult:
    status: str = "ok"
    failure: Failure | None = None
    bench: Figures | None = None
    bench_heldout: Figures | None = None
    quality: Quality | None = None
    quality_skipped: str | None = None   # why quality was not measured: too slow to be accepted anyway
    pruned: dict | None = None           # after_requests, of, upper, below: figures under the objective
    metrics: dict | None = None          # the engine's Prometheus counters over the measured phase
    timings: dict[str, float] = field(default_factory=dict)
    workload: dict = field(default_factory=dict)        # the meter: name, version, hash, split, summary
    quality_set: dict | None = None
    model: str | None = None
    flags: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    port: int | None = None
    engine: dict | None = None
    hardware: dict | None = None
    device: str | None = None            # the device of a host's worker slot (set by the agent's engine)
    log_path: str | None = None
    cleanup: dict | None = None          # leftover_pids, port_free, forced_kill, device_memory_held
    failed_phase: str | None = None
    started_at_utc: str | None = None
    ladder: dict | None = None           # a capacity ladder's rungs (sandbox.ladder): kind, loads, slo, rungs, stopped
    result_version: int = RESULT_VERSION

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, klass: str, message: str, log_tail: str = "", cause: str | None = None) -> None:
        self.status, self.failure = "failed", Failure(klass, message, log_tail, cause)

    def why(self) -> str:
        """A failed trial's class and message in one line (its status where it failed to say why)."""
        return f"{self.failure.klass}: {self.failure.message}" if self.failure else f"status {self.status}"


def failed(klass: str, message: str, log_tail: str = "", **fields: Any) -> TrialResult:
    return TrialResult(status="failed", failure=Failure(klass, message, log_tail), **fields)


def to_json(result: TrialResult) -> dict:
    data = dataclasses.asdict(result)
    if result.failure is not None:
        data["failure"] = {"class": result.failure.klass, **{k: v for k, v in data["failure"].items() if k != "klass"}}
    return data


def from_json(data: dict) -> TrialResult:
    """A result as the worker wrote it; ResultError names what is wrong with one that is not."""
    if not isinstance(data, dict):
        raise ResultError(f"a trial result is a JSON object, not {type(data).__name__}")
    if data.get("result_version") != RESULT_VERSION:
        raise ResultError(f"result_version {data.get('result_version')!r} is not {RESULT_VERSION}, the one this "
                          f"agent reads")
    if data.get("status") not in STATUSES:
        raise ResultError(f"status {data.get('status')!r} is not one of {', '.join(STATUSES)}")
    if data["status"] == "failed" and not isinstance(data.get("failure"), dict):
        raise ResultError("a failed result without its failure")
    try:
        return _typed(TrialResult, data)
    except (TypeError, KeyError) as e:
        raise ResultError(f"not a trial result: {e}") from None


STATUSES = ("ok", "failed", "pruned")
REQUIRED = {Failure: ("class", "message"), Figures: ("tps",), Quality: ("ppl",)}
NESTED = {"failure": Failure, "bench": Figures, "bench_heldout": Figures, "quality": Quality}
MAPPINGS = ("timings", "workload", "flags", "env")


def _typed(cls, data):
    if data is None and cls is not TrialResult:
        return None
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} is a JSON object, not {type(data).__name__}")
    if missing := [k for k in REQUIRED.get(cls, ()) if data.get(k) is None]:
        raise KeyError(f"{cls.__name__} without {', '.join(missing)}")
    if cls is Failure:
        data = {"klass": data["class"], **{k: v for k, v in data.items() if k != "class"}}
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise KeyError(f"unknown field(s) {sorted(unknown)} for {cls.__name__}")
    if cls is TrialResult:
        if bad := [k for k in MAPPINGS if k in data and not isinstance(data[k], dict)]:
            raise TypeError(f"{', '.join(bad)} must be JSON objects")
        data = {k: _typed(NESTED[k], v) if k in NESTED else v for k, v in data.items()}
    return cls(**data)


def write(path: Path, result: TrialResult) -> None:
    """Atomically: a reader never sees half a result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(to_json(result), indent=2) + "\n")
    os.replace(tmp, path)


def read(path: Path) -> TrialResult:
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ResultError(f"{path}: not JSON: {e}") from None
    try:
        return from_json(data)
    except ResultError as e:
        raise ResultError(f"{path}: {e}") from None
