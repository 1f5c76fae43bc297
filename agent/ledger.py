"""The ledger: every run and every trial, failures included, in one SQLite file (or, for a run
whose workers are on several hosts, one PostgreSQL database: agent.storage).

It is the record of a night: the Optuna study can be rebuilt from it, branches point back to
its rows, and `agent ledger sql` reads it directly. SQLite in WAL mode with a busy timeout, so a
reader never blocks the run that writes and several local workers wait for each other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict, TypeVar, Unpack

from sqlalchemy import (
    JSON,
    Enum,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import DeclarativeBase, Mapped, defer, mapped_column, relationship, sessionmaker

from agent import migrations, states
from agent.states import Decision, RunStatus, Source, Status, WorkerRole, WorkerStatus
from sandbox.contract import FailureClass


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


def state(kind: type[StrEnum]) -> Enum:
    """A state column: one of `kind`'s members, stored as its string (what the column held before it
    was typed, so old ledgers and users' SQL read the same), refused on write if it is not one."""
    return Enum(kind, native_enum=False, create_constraint=False, length=32, validate_strings=True,
                values_callable=lambda members: [m.value for m in members])


RowT = TypeVar("RowT", bound=Base)   # a row of any table: what is written comes back as its own type


class Migration(Base):
    """A schema change this ledger has had (agent.migrations), by name."""
    __tablename__ = "migrations"
    name: Mapped[str] = mapped_column(String, primary_key=True, doc="the migration's name (agent/migrations.py)")
    applied_at: Mapped[str] = mapped_column(String, default=utcnow, doc="when this ledger had it (UTC)")


_RUNS_STARTED_AT = "ISO times, UTC; the deadline is fixed at the start"
_RUNS_SPACE_PATH = (
    "the space and meter every figure belongs to; `settings` keeps the workload as used (`workload`, "
    "with the run's own copy of `--traffic`), `traffic` (file name, SHA-256, request counts, split "
    "sizes and hashes, sampled share) and `max_model_len`"
)
_RUNS_BASELINE_FIGURE = (
    "the defaults' geometric-mean figure over instances, mean PPL, the pooled log-sd of the figure "
    "between server instances and its degrees of freedom"
)


class Run(Base):
    """One row per run (`agent run`): what was tuned, on what, with which settings, and the defaults'
    figures every ratio divides by."""
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String, primary_key=True, doc="run id, `YYYYMMDD-HHMMSS` (UTC start)")
    started_at: Mapped[str] = mapped_column(String, default=utcnow, doc=_RUNS_STARTED_AT)
    deadline_at: Mapped[str] = mapped_column(String, doc=_RUNS_STARTED_AT)
    finished_at: Mapped[str | None] = mapped_column(String, doc=_RUNS_STARTED_AT)
    status: Mapped[RunStatus] = mapped_column(state(RunStatus), default=RunStatus.RUNNING, doc=(
        "running, finished, stopped (Ctrl-C / SIGTERM; `agent run --resume ID` continues it), failed "
        "(the baseline failed)"))
    model: Mapped[str] = mapped_column(String, doc="what was tuned, on what")
    model_revision: Mapped[str | None] = mapped_column(String, doc=(
        "for a model given by Hugging Face id: the commit it resolved to, which every trial loaded "
        "(offline)"))
    engine: Mapped[str | None] = mapped_column(String, doc="what was tuned, on what")
    engine_version: Mapped[str | None] = mapped_column(String, doc="what was tuned, on what")
    hardware: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="what was tuned, on what")
    space_path: Mapped[str] = mapped_column(String, doc=_RUNS_SPACE_PATH)
    space_hash: Mapped[str] = mapped_column(String, doc=_RUNS_SPACE_PATH)
    workload: Mapped[str] = mapped_column(String, doc=_RUNS_SPACE_PATH)
    workload_hash: Mapped[str | None] = mapped_column(String, doc=_RUNS_SPACE_PATH)
    repo: Mapped[str] = mapped_column(String, doc="the repository proposals go into")
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=(
        "the run's settings as it used them: the fields of `agent.context.Settings` under their own "
        "names (the `run` command's options carry the same names), the gate's under `gate` "
        "(`gate.noise_prior` the space's noise prior, `{sd, df}`); beside them the options that are "
        "not settings (budget, planner, workers, arrivals, ...). A run written before 2026-12-03 "
        "14:00 had flat options (`workload_spec`, `noise_prior` as `[sd, df]`): migration "
        "`m003_settings_as_used` rewrote them in this shape when the ledger was first opened by a "
        "later agent"))
    baseline_figure: Mapped[float | None] = mapped_column(Float, doc=_RUNS_BASELINE_FIGURE)
    baseline_ppl: Mapped[float | None] = mapped_column(Float, doc=_RUNS_BASELINE_FIGURE)
    noise: Mapped[float | None] = mapped_column(Float, doc=_RUNS_BASELINE_FIGURE)
    noise_df: Mapped[int | None] = mapped_column(Integer, doc=_RUNS_BASELINE_FIGURE)
    calibration: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc=(
        "JSON: the greedy rule (`calibrated` or `exact`), tau (nats), flips_allowed, kl_bound, why, "
        "the A/A verdict line (`aa`), and the engine's defaults read from vLLM (`engine_defaults`)"))
    # The coordinator that last took the run up (host/pid/token): a resume swaps it only if it still
    # reads what that resume read, so of two hosts resuming at once one wins.
    owner: Mapped[str | None] = mapped_column(String, doc=(
        "the coordinator that last started or resumed the run (host/pid/token): a resume takes the "
        "run only where it still reads what it read, so of two hosts resuming at once one goes on"))
    trials: Mapped[list[Trial]] = relationship(back_populates="run", order_by="Trial.number")


class Claims:
    """What a trial's row and its frozen view (agent.views) derive from its held-out columns."""
    heldout_ratio: Any
    heldout_interval: Any
    search_ratio: Any

    @property
    def claimed_ratio(self) -> float:
        """What a branch is ranked by: its held-out ratio (the committed claim), else its search ratio."""
        return self.heldout_ratio or self.search_ratio or 0.0

    @property
    def held_out_claim(self) -> str | None:
        """The committed claim as people read it: the held-out ratio and its bounds."""
        if self.heldout_ratio is None or not self.heldout_interval:
            return None
        low, high = self.heldout_interval
        return f"{self.heldout_ratio:.3f}x held-out [{low:.3f}, {high:.3f}]"


_TRIALS_RUN_ID = "the trial's identity (numbers count from 0 per run)"
_TRIALS_PARAMS = (
    "the point of the space; what reached vLLM; whether every knob that differs from the engine's "
    "default is lossless"
)
_TRIALS_FAILURE_CLASS = "for failures: invalid_config, oom, start_timeout, crashed, request_errors, bad_output, ..."
_TRIALS_FAILURE_CAUSE = (
    "vLLM's own words for the failure (the root cause its log or its pre-flight gave, wrappers left "
    "out) and the phase it ended in (preflight, start, warmup, bench, quality, teardown); learned "
    "refusals are built from these"
)
_TRIALS_FIGURE = (
    "raw: the instance's figure on this trial's server under the run's objective (tokens/s: its "
    "tokens over its time across the measured repeats; requests/s under `--objective goodput`, "
    "docs/arrivals.md; 1000 / the percentile in ms under a latency objective); their 95% interval "
    "(Student's t on the logs; two or more repeats). It covers one server only: the run's `noise` is "
    "the spread between servers. The trial's `meter.objective` and the run's "
    "`settings.traffic.objective` name the objective, and so the unit of every figure column (figure, "
    "heldout_figure, figure_corrected, baseline_figure)"
)
_TRIALS_DRIFT = "the machine's speed factor in force (1: no drift beyond the noise) and figure / drift"
_TRIALS_HELDOUT_INSTANCES = (
    "candidates that passed the screen: the figure of each fresh instance on the held-out prompts, "
    "their median, and the ratio against the defaults' held-out instances with its one-sided bounds "
    "at the decision's level: the committed claim (for instances of the defaults, heldout_figure is "
    "measured on the same server)"
)
_TRIALS_PPL = "perplexity and its relative change; share of the baseline's greedy outputs reproduced"
_TRIALS_TTFT_P99_MS = (
    "latencies, request errors, the server's own metrics (KV-cache usage, preemptions, speculative "
    "acceptance)"
)
_TRIALS_TOP_LOGPROBS = (
    "per prompt and position, the server's top-5 logprobs; the mean KL divergence from the baseline's"
)
_TRIALS_FLIPS = (
    "each prompt's first divergence from the reference greedy path (prompt, position, reference and "
    "candidate token ids, margin in nats, null outside the top-k) and which greedy rule decided"
)
_TRIALS_TIMINGS = (
    "phase seconds, the server log, the workload name/version/hash with the split's and the draw's "
    "hashes, the sampled and ignore_eos shares and the traffic file's summary (never a prompt), why "
    "it was tried"
)


class Trial(Base, Claims):
    """One row per config a run started a server for (the defaults' instances and the candidates, failures
    included), written as its trial goes: opened, its result recorded once, its verdict and decision."""
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("run_id", "number"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id")
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), doc=_TRIALS_RUN_ID)
    number: Mapped[int] = mapped_column(Integer, doc=_TRIALS_RUN_ID)
    source: Mapped[Source] = mapped_column(state(Source), doc=(
        "instances of the defaults: baseline, aa (the A/A check: judged as a candidate), drift "
        "(re-measured mid-run), extra (held-out only, measured for a decision), device (the defaults "
        "on a further device of the run, once each: part of the baseline's noise); candidates: "
        "planner or sampler"))
    optuna_number: Mapped[int | None] = mapped_column(Integer, doc=(
        "the Optuna trial it answers (null for the baseline)"))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=_TRIALS_PARAMS)
    flags: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=_TRIALS_PARAMS)
    env: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=_TRIALS_PARAMS)
    lossless: Mapped[bool | None] = mapped_column(doc=_TRIALS_PARAMS)
    status: Mapped[Status] = mapped_column(state(Status), default=Status.RUNNING, doc=(
        "running, ok, failed, skipped (excluded by a rule), pruned (its benchmark stopped early: it "
        "could not reach the defaults), interrupted; the moves allowed between them, and between "
        "decisions, are in `agent/states.py` and docs/architecture.md"))
    failure_class: Mapped[FailureClass | None] = mapped_column(state(FailureClass), doc=_TRIALS_FAILURE_CLASS)
    failure_message: Mapped[str | None] = mapped_column(Text, doc=_TRIALS_FAILURE_CLASS)
    failure_cause: Mapped[str | None] = mapped_column(Text, doc=_TRIALS_FAILURE_CAUSE)
    failed_phase: Mapped[str | None] = mapped_column(String, doc=_TRIALS_FAILURE_CAUSE)
    log_tail: Mapped[str | None] = mapped_column(Text, doc=_TRIALS_FAILURE_CLASS)
    # A figure is the run's objective's (agent.objective: tokens/s, or requests/s under goodput); a ratio
    # is a figure over the defaults'. The old names (tps, tps_ratio, ...) stay as read-only aliases.
    figure: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_FIGURE)
    figure_interval: Mapped[list[Any] | None] = mapped_column(JSON, doc=_TRIALS_FIGURE)
    search_ratio: Mapped[float | None] = mapped_column(Float, doc=(
        "figure_corrected / the baseline's figure: what the gate and Optuna use"))
    drift: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_DRIFT)
    figure_corrected: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_DRIFT)
    heldout_figure: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_HELDOUT_INSTANCES)
    heldout_ratio: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_HELDOUT_INSTANCES)
    heldout_instances: Mapped[list[Any] | None] = mapped_column(JSON, doc=_TRIALS_HELDOUT_INSTANCES)
    heldout_interval: Mapped[list[Any] | None] = mapped_column(JSON, doc=_TRIALS_HELDOUT_INSTANCES)
    search_interval: Mapped[list[Any] | None] = mapped_column(JSON, doc=(
        "the bounds of the search-prompt ratio (one instance against the defaults' instances)"))
    ppl: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_PPL)
    ppl_change: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_PPL)
    agreement: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_PPL)
    ttft_p99_ms: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_TTFT_P99_MS)
    itl_p99_ms: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_TTFT_P99_MS)
    errors: Mapped[int | None] = mapped_column(Integer, doc=_TRIALS_TTFT_P99_MS)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=_TRIALS_TTFT_P99_MS)
    greedy: Mapped[list[Any] | None] = mapped_column(JSON, doc=(
        "the greedy token ids per comparison prompt (the baseline's are what agreement is measured "
        "against)"))
    top_logprobs: Mapped[list[Any] | None] = mapped_column(JSON, doc=_TRIALS_TOP_LOGPROBS)
    kl: Mapped[float | None] = mapped_column(Float, doc=_TRIALS_TOP_LOGPROBS)
    flips: Mapped[list[Any] | None] = mapped_column(JSON, doc=_TRIALS_FLIPS)
    rule: Mapped[str | None] = mapped_column(String, doc=_TRIALS_FLIPS)
    decision: Mapped[Decision | None] = mapped_column(state(Decision), doc=(
        "put_forward (a candidate that passed on the search prompts, waiting for the coordinator's "
        "held-out decision: a worker's, or the coordinator's own cut by a crash inside that decision "
        "and repaired), accepted (branched), dominated (accepted, not branched: no faster than a "
        "branch already proposed), refused, awaiting_recheck (the held-out decision was in flight), "
        "failed, skipped; baseline, aa-passed/aa-failed, drift, extra for the defaults"))
    constraint: Mapped[float | None] = mapped_column(Float, doc=(
        "what Optuna was told for this trial (0: feasible), computed once"))
    gate_passed: Mapped[bool | None] = mapped_column(doc="the verdict and its reasons")
    gate_reasons: Mapped[list[Any]] = mapped_column(default=list, doc="the verdict and its reasons")
    branch: Mapped[str | None] = mapped_column(String, doc="for accepted trials")
    commit: Mapped[str | None] = mapped_column(String, doc="for accepted trials")
    timings: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=_TRIALS_TIMINGS)
    log_path: Mapped[str | None] = mapped_column(String, doc=_TRIALS_TIMINGS)
    rationale: Mapped[str | None] = mapped_column(Text, doc=_TRIALS_TIMINGS)
    meter: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=_TRIALS_TIMINGS)
    measured: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc=(
        "latencies (TTFT, ITL, TPOT), repeats, finish reasons, `repeat_share` (of the answers' words, "
        "those a prompt lookup over the prompt and the answer so far would have drafted right: how "
        "much the traffic's answers repeat their context, which the built-in planner reads on the "
        "defaults' rows before it proposes speculation), the goodput search's rate points and bounds, "
        "`phase_tps` (every token over the whole phases: `vllm bench serve`'s figure) and `window_s` "
        "(the steady windows the tokens/s figure counts over at a concurrency above one, "
        "docs/meters-and-gate.md), engine, hardware and device as the worker measured them: what the "
        "branch's `results.json` carries, wherever the trial ran"))
    worker_id: Mapped[int | None] = mapped_column(Integer, doc=(
        "the `workers` row (a process on one device) that ran it"))
    started_at: Mapped[str] = mapped_column(String, default=utcnow, doc="when its row was opened (UTC)")
    finished_at: Mapped[str | None] = mapped_column(String, doc="when its result was recorded (UTC)")
    run: Mapped[Run] = relationship(back_populates="trials")
    repeats: Mapped[list[Repeat]] = relationship(back_populates="trial", order_by="Repeat.id")



class TrialWrite(TypedDict, total=False):
    """The columns a trial's write may give, each with its column's type: a state is a member of its
    kind (states.Status, Decision, FailureClass), never a bare string, and a misspelt column is a
    type error before it is a run-time one (Ledger.transition checks again)."""
    status: Status
    decision: Decision | None
    failure_class: FailureClass | None
    failure_message: str | None
    failure_cause: str | None
    failed_phase: str | None
    log_tail: str | None
    lossless: bool | None
    figure: float | None
    figure_interval: list[Any] | None
    search_ratio: float | None
    drift: float | None
    figure_corrected: float | None
    heldout_figure: float | None
    heldout_ratio: float | None
    heldout_instances: list[Any] | None
    heldout_interval: list[Any] | None
    search_interval: list[Any] | None
    ppl: float | None
    ppl_change: float | None
    agreement: float | None
    ttft_p99_ms: float | None
    itl_p99_ms: float | None
    errors: int | None
    metrics: dict[str, Any]
    greedy: list[Any] | None
    top_logprobs: list[Any] | None
    kl: float | None
    flips: list[Any] | None
    rule: str | None
    constraint: float | None
    gate_passed: bool | None
    gate_reasons: list[Any]
    timings: dict[str, Any]
    log_path: str | None
    meter: dict[str, Any]
    measured: dict[str, Any] | None
    finished_at: str | None


class Repeat(Base):
    """One measured phase behind a trial's figure (several per server, several servers for the baseline)."""

    __tablename__ = "repeats"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id")
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id"), doc="the trial (trials.id)")
    instance: Mapped[int] = mapped_column(Integer, doc=(
        "0: the trial's own server on the search prompts; 1, 2, ...: its fresh held-out servers in "
        "order (an `extra` trial, the defaults measured for a decision, has only instance 1)"))
    figure: Mapped[float] = mapped_column(Float, doc="the phase's figure under the run's objective")
    trial: Mapped[Trial] = relationship(back_populates="repeats")


class PlannerCall(Base):
    """One exchange with an LLM planner: what was asked, what came back, what was kept."""

    __tablename__ = "planner_calls"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id")
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), doc="the run (runs.id)")
    at: Mapped[str] = mapped_column(String, default=utcnow, doc="when it was asked (UTC)")
    model: Mapped[str] = mapped_column(String, doc="the LLM (a litellm model name)")
    prompt: Mapped[str] = mapped_column(Text, doc="what was asked (API keys are never recorded)")
    response: Mapped[str | None] = mapped_column(Text, doc="what came back")
    error: Mapped[str | None] = mapped_column(Text, doc="why no usable answer came back")
    input_tokens: Mapped[int | None] = mapped_column(Integer, doc="tokens sent")
    output_tokens: Mapped[int | None] = mapped_column(Integer, doc="tokens received")
    cost_usd: Mapped[float | None] = mapped_column(Float, doc="litellm's cost estimate")
    latency_s: Mapped[float | None] = mapped_column(Float, doc="seconds the call took")
    accepted: Mapped[int] = mapped_column(Integer, default=0, doc="proposals kept")
    rejected: Mapped[list[Any]] = mapped_column(default=list, doc="why each refused part was refused")


class RangeChange(Base):
    """A planner narrowed the range the sampler draws a knob from (see planner.Narrowing)."""

    __tablename__ = "narrowings"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id")
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), doc="the run (runs.id)")
    at: Mapped[str] = mapped_column(String, default=utcnow, doc="when (UTC)")
    after_trial: Mapped[int] = mapped_column(Integer, doc="the trial number it followed")
    planner: Mapped[str] = mapped_column(String, doc="the planner that narrowed")
    knob: Mapped[str] = mapped_column(String, doc="the numeric knob")
    low: Mapped[float] = mapped_column(Float, doc="the sampler's new range: from")
    high: Mapped[float] = mapped_column(Float, doc="the sampler's new range: to")
    rationale: Mapped[str] = mapped_column(Text, doc=(
        "why (for the built-in planner: the failures that triggered it); a resumed run re-applies "
        "them"))


class LearnedRule(Base):
    """Knob settings vLLM refused in this run, reduced to what causes the refusal (see agent.refusals);
    later points that contain them are skipped without a start."""

    __tablename__ = "learned_rules"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id")
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), doc="the run (runs.id)")
    at: Mapped[str] = mapped_column(String, default=utcnow, doc="when (UTC)")
    from_trial: Mapped[int] = mapped_column(Integer, doc="the refused trial's number")
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=(
        "knob -> value: a later point holding all of them is skipped without a start (its row "
        "`skipped`, naming the rule)"))
    message: Mapped[str] = mapped_column(Text, doc="vLLM's root cause")
    stage: Mapped[str] = mapped_column(String, doc=(
        "`pre-flight` (its config classes refused it before any start) or `start` (only engine "
        "initialisation did)"))
    how: Mapped[str] = mapped_column(String, doc=(
        "`minimised at pre-flight` (one knob at a time back to its default while the same refusal "
        "holds), `named in vLLM's message`, or `the whole point`"))
    checks: Mapped[int] = mapped_column(Integer, default=0, doc="pre-flight calls the reduction took")


class Capacity(Base):
    """One config's ladder of loads and what it is worth (`agent capacity`, agent.capacity): measured on
    fresh servers of the run's engine, or read from a `vllm bench sweep serve` folder."""

    __tablename__ = "capacity"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id")
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), doc="the run (runs.id)")
    at: Mapped[str] = mapped_column(String, default=utcnow, doc="when (UTC)")
    subject: Mapped[str] = mapped_column(String, doc="defaults, a branch, or an imported sweep's label")
    trial_number: Mapped[int | None] = mapped_column(Integer, doc=(
        "the branch's trial (null: the defaults, an imported sweep)"))
    source: Mapped[str] = mapped_column(String, doc=(
        "`measured` (`agent capacity`), `imported from DIR`, or `agent run --capacity` (the night's "
        "first branch and the defaults, also written into that branch's results.json)"))
    kind: Mapped[str] = mapped_column(String, doc=(
        "`concurrency` (streams) or `rate` (requests/s)"))
    curve: Mapped[dict[str, Any]] = mapped_column(default=dict, doc=(
        "every rung and repeat: output and total tokens/s, requests/s, input and output tokens, TTFT, "
        "ITL and end-to-end percentiles with their count"))
    slo: Mapped[dict[str, Any]] = mapped_column(default=dict, doc="the bounds judged: ttft/itl/e2e_p99_ms")
    price_per_hour: Mapped[float | None] = mapped_column(Float, doc="a device-hour's price, where given")
    target_rate: Mapped[float | None] = mapped_column(Float, doc="the requests/s to serve, where given")
    knee: Mapped[float | None] = mapped_column(Float, doc=(
        "the load at the knee (null: no knee in the ladder)"))
    slo_limit: Mapped[float | None] = mapped_column(Float, doc="the highest load within the SLOs")
    point: Mapped[float | None] = mapped_column(Float, doc="the operating point's load")
    point_is: Mapped[str] = mapped_column(String, doc="SLO limit, knee, top of the ladder, or none")
    output_tps: Mapped[float | None] = mapped_column(Float, doc="output tokens/s at the operating point")
    tokens_per_device_hour: Mapped[float | None] = mapped_column(Float, doc="output tokens a device-hour there")
    cost_per_m_output: Mapped[float | None] = mapped_column(Float, doc="price per million output tokens")
    cost_per_m_input: Mapped[float | None] = mapped_column(Float, doc="price per million input tokens")
    servers: Mapped[int | None] = mapped_column(Integer, doc="servers needed for target_rate")


class Worker(Base):
    """One process running trials of a run on one device (a GPU, or a set of cores), on some host.

    It writes heartbeat_at while it lives; one that falls silent is declared lost by whoever notices
    first (agent.crew.bury), and its trial in flight is recorded as interrupted, once."""

    __tablename__ = "workers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, doc="row id (trials.worker_id)")
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), doc="the run (runs.id)")
    name: Mapped[str] = mapped_column(String, doc="host/slot, as reports show it")
    host: Mapped[str] = mapped_column(String, doc="the host it ran on")
    pid: Mapped[int] = mapped_column(Integer, doc="its process id there")
    slot: Mapped[int] = mapped_column(Integer, doc="its slot of the host's devices")
    device: Mapped[str] = mapped_column(String, doc=(
        "`GPU 1`, `cores 2-3`, or `host` for a run on one device"))
    role: Mapped[WorkerRole] = mapped_column(state(WorkerRole), doc=(
        "coordinator (the `agent run` that re-checks on held-out prompts and commits) or worker"))
    status: Mapped[WorkerStatus] = mapped_column(state(WorkerStatus), default=WorkerStatus.RUNNING, doc=(
        "running, stopped, or lost (silent past the grace: its trial in flight recorded interrupted)"))
    started_at: Mapped[str] = mapped_column(String, default=utcnow, doc="when it joined (UTC)")
    heartbeat_at: Mapped[str] = mapped_column(String, default=utcnow, doc=(
        "written every `AGENT_HEARTBEAT_S` (default 5 s) on the database's clock"))
    stopped_at: Mapped[str | None] = mapped_column(String, doc="when it stopped or was declared lost")
    note: Mapped[str | None] = mapped_column(Text, doc="why it stopped, where it said")


# A database host that drops packets silently must fail a write in seconds, not after TCP's
# retransmissions (many minutes): connect and keepalive deadlines, and libpq's TCP_USER_TIMEOUT.
PG_CONNECT = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 3, "tcp_user_timeout": 30_000}


SECRET_QUERY_KEYS = ("password", "sslpassword", "passfile", "sslkey")


def safe_url(url: str) -> str:
    """A database URL as it may be printed or logged: its password hidden, whether given before the
    host or as a query parameter (?password=...), which SQLAlchemy's own rendering keeps."""
    parsed = make_url(url)
    query = {k: ("***" if k.lower() in SECRET_QUERY_KEYS else v) for k, v in parsed.query.items()}
    return parsed.set(query=query).render_as_string(hide_password=True)


class Ledger:
    def __init__(self, where: Path | str):
        """where: a SQLite file's path, or a database URL (sqlite:///..., postgresql+psycopg://...)."""
        given = str(where) if "://" in str(where) else None
        self.path = None if given else Path(where)
        self.sqlite = given is None or given.startswith("sqlite")
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            url = f"sqlite:///{self.path}"
        else:
            url = str(given)
            if self.sqlite:
                self.path = Path(url.split("///", 1)[1])
        self.url = url
        # How messages name it: the file, or the URL without its password.
        self.where = str(self.path) if self.sqlite else safe_url(url)
        self.engine = (create_engine(url, connect_args={"timeout": 30}) if self.sqlite
                       else create_engine(url, pool_pre_ping=True, connect_args=PG_CONNECT))

        if self.sqlite:
            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn, _):
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.close()

        fresh = not inspect(self.engine).has_table("runs")
        self._create_tables()
        try:
            self.migrated = migrations.apply(self.engine, fresh, Base.metadata.tables, Migration.__table__)
        except migrations.UnknownState as e:
            raise migrations.UnknownState(f"{self.where}: {e}") from None
        self.session = sessionmaker(self.engine, expire_on_commit=False)

    def _create_tables(self) -> None:
        """A fresh ledger whole; an older one gains its new tables. create_all checks, then creates:
        a second process opening the same ledger at that moment finds the table made, and looks again."""
        for attempt in range(5):
            try:
                Base.metadata.create_all(self.engine)
                return
            except (OperationalError, IntegrityError, ProgrammingError) as e:
                if attempt == 4 or "exist" not in str(e).lower() and "duplicate" not in str(e).lower():
                    raise
                time.sleep(0.05 * (attempt + 1))

    def add(self, row: RowT) -> RowT:
        with self.session.begin() as s:
            s.add(row)
        return row

    def add_trial(self, row: Trial) -> Trial:
        """Insert a trial under the run's next number. Several workers may take the same number at
        once: the (run, number) uniqueness refuses all but one, and the others take the next."""
        for _ in range(100):
            row.number = self.next_number(row.run_id)
            try:
                with self.session.begin() as s:
                    s.add(row)
                return row
            except IntegrityError:
                row.id = None  # type: ignore[assignment]  # the database gives the next attempt its id
                continue
        raise RuntimeError(f"run {row.run_id}: no free trial number after 100 attempts")

    def now(self) -> str:
        """The database's clock, in utcnow()'s form: the one clock every host of a shared run reads, so
        heartbeats and their ages never compare two machines' clocks."""
        sql = ("SELECT strftime('%Y-%m-%dT%H:%M:%S', 'now')" if self.sqlite else
               "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')")
        with self.session() as s:
            return s.execute(text(sql)).scalar_one() + "+00:00"

    def claim(self, model: type[Run] | type[Trial] | type[Worker], id_: int | str, expect: dict, **values: Any) -> bool:
        """Update one row only if its columns still hold `expect`: True for the one writer that did it
        (how a lost worker's trial is recorded as interrupted once, whoever notices)."""
        for field in ("status", "decision") if model is Trial else ():
            if field in values and field in expect:
                states.check_move(None, field, expect[field], values[field])
        with self.session.begin() as s:
            q = update(model).where(model.id == id_, *(getattr(model, k) == v for k, v in expect.items()))
            return _changed(s.execute(q.values(**values))) == 1

    def record_result(self, row: Trial, repeats: list[float], **values: Unpack[TrialWrite]) -> bool:
        """A running trial's result: its figures and its server's measured phases in one transaction
        (a crash leaves both or neither); False where another process recorded it as interrupted first."""
        states.check_move(row.number, "status", states.Status.RUNNING, values["status"])
        with self.session.begin() as s:
            q = update(Trial).where(Trial.id == row.id, Trial.status == states.Status.RUNNING)
            if _changed(s.execute(q.values(**values))) != 1:
                return False
            s.add_all(Repeat(trial_id=row.id, instance=0, figure=x) for x in repeats)
        for key, value in values.items():   # the row in memory as written: no read back
            setattr(row, key, value)
        return True

    def set_decision(self, row: Trial, decision: Decision, reason: str | None = None, *,
               passed: bool | None = None) -> Trial:
        """A candidate's decision, with the reason added to its gate's (`passed`: its gate_passed,
        where the decision changes it)."""
        values: TrialWrite = {"decision": decision}
        if reason is not None:
            values["gate_reasons"] = [*(row.gate_reasons or []), reason]
        if passed is not None:
            values["gate_passed"] = passed
        return self.transition(row, **values)

    def add_reason(self, row: Trial, reason: str) -> Trial:
        """A line added to a trial's reasons (a branch that could not be committed, say)."""
        return self.transition(row, gate_reasons=[*(row.gate_reasons or []), reason])

    def set_branch(self, row: Trial, commit: str, name: str | None = None) -> Trial:
        """An accepted trial's branch (its name, given once) and the commit it stands on."""
        if name is None:
            return self._move(row, {"commit": commit})
        return self._move(row, {"branch": name, "commit": commit})

    def workers(self, run_id: str) -> list[Worker]:
        with self.session() as s:
            return list(s.scalars(select(Worker).where(Worker.run_id == run_id).order_by(Worker.id)))

    def transition(self, row: Trial, **values: Unpack[TrialWrite]) -> Trial:
        """A trial's write: its status and decision only along the moves agent.states allows, from the
        ones the database still holds (a move another process made since `row` was read raises
        Superseded, and this write is dropped), and only the given columns, each a column of the
        table (a misspelt one is an error, not a value silently never saved)."""
        return self._move(row, dict(values))

    def _move(self, row: Trial, values: dict[str, Any]) -> Trial:
        self._columns(row, values)
        for field in ("status", "decision"):
            if field in values:
                states.check_move(row.number, field, getattr(row, field), values[field])
        with self.session.begin() as s:
            q = update(Trial).where(Trial.id == row.id, Trial.status == row.status, Trial.decision == row.decision)
            if _changed(s.execute(q.values(**values))) != 1:
                raise states.Superseded(f"trial {row.number}: moved by another process since it was read (it was "
                                        f"{row.status}, decision {row.decision}); this write is dropped")
        for key, value in values.items():
            setattr(row, key, value)
        return row

    def update(self, row: RowT, **values: Any) -> RowT:
        """A run's or a worker's write (a trial's goes through `transition`)."""
        if isinstance(row, Trial):
            raise TypeError("a trial is written through Ledger.transition")
        return self._write(row, values)

    @staticmethod
    def _columns(row: Base, values: dict) -> None:
        if unknown := sorted(set(values) - set(row.__table__.columns.keys())):
            raise ValueError(f"{row.__tablename__} has no column {unknown[0]!r}")

    def _write(self, row: RowT, values: dict) -> RowT:
        self._columns(row, values)
        with self.session.begin() as s:
            for key, value in values.items():
                setattr(row, key, value)
            s.merge(row)
        return row

    def run(self, run_id: str) -> Run | None:
        with self.session() as s:
            return s.get(Run, run_id)

    def run_now(self, run: Run) -> Run:
        """A run's row as the database holds it now (another process may have written it since)."""
        row = self.run(run.id)
        if row is None:
            raise LookupError(f"run {run.id} is no longer in {self.where}")
        return row

    def runs(self) -> list[Run]:
        with self.session() as s:
            return list(s.scalars(select(Run).order_by(Run.started_at.desc())))

    def trials(self, run_id: str | None = None, status: Status | None = None) -> list[Trial]:
        with self.session() as s:
            q = select(Trial).order_by(Trial.run_id, Trial.number)
            if run_id:
                q = q.where(Trial.run_id == run_id)
            if status:
                q = q.where(Trial.status == status)
            return list(s.scalars(q))

    def history(self, run_id: str, whole: Collection[str]) -> list[Trial]:
        """A run's trials as a step of the loop reads them: greedy outputs and their top logprobs, most
        of a row's bytes, only on the rows whose source is in `whole` (the defaults' instances, which
        the gate compares with); reading them on another row raises rather than query again."""
        bulk = (Trial.greedy, Trial.top_logprobs)
        with self.session() as s:
            rows = list(s.scalars(select(Trial).where(Trial.run_id == run_id).order_by(Trial.number)
                                  .options(*(defer(c, raiseload=True) for c in bulk))))
        with self.session() as s:
            full = {t.id: t for t in s.scalars(select(Trial).where(Trial.run_id == run_id,
                                                                  Trial.source.in_(sorted(whole))))}
        return [full.get(t.id, t) for t in rows]

    def trial(self, run_id: str, number: int) -> Trial | None:
        with self.session() as s:
            return s.scalars(select(Trial).where(Trial.run_id == run_id, Trial.number == number)).first()

    def add_repeats(self, trial_id: int, instance: int, figures: list[float]) -> None:
        """The measured phases of one server instance of a trial."""
        with self.session.begin() as s:
            s.add_all(Repeat(trial_id=trial_id, instance=instance, figure=x) for x in figures)

    def repeats(self, trial_id: int) -> list[Repeat]:
        with self.session() as s:
            return list(s.scalars(select(Repeat).where(Repeat.trial_id == trial_id)))

    def capacities(self, run_id: str) -> list[Capacity]:
        with self.session() as s:
            return list(s.scalars(select(Capacity).where(Capacity.run_id == run_id).order_by(Capacity.id)))

    def narrowings(self, run_id: str) -> list[RangeChange]:
        with self.session() as s:
            return list(s.scalars(select(RangeChange).where(RangeChange.run_id == run_id).order_by(RangeChange.id)))

    def learned_rules(self, run_id: str) -> list[LearnedRule]:
        with self.session() as s:
            return list(s.scalars(select(LearnedRule).where(LearnedRule.run_id == run_id).order_by(LearnedRule.id)))

    def next_number(self, run_id: str) -> int:
        with self.session() as s:
            last = s.scalar(select(Trial.number).where(Trial.run_id == run_id).order_by(Trial.number.desc()))
            return 0 if last is None else last + 1

    def sql(self, query: str) -> tuple[list[str], list[tuple]]:
        """Run a read-only query: SQLite opened read-only, PostgreSQL in a read-only transaction (rolled
        back after), so a write fails either way."""
        if not self.sqlite:
            if ";" in query.strip().rstrip(";"):   # several statements could COMMIT out of the read-only one
                raise ValueError("one statement at a time: the query holds a ';' before its end")
            with self.engine.connect() as conn:
                conn.execute(text("SET TRANSACTION READ ONLY"))
                try:
                    cur = conn.exec_driver_sql(query)
                    return (list(cur.keys()) if cur.returns_rows else [],
                            [tuple(r) for r in cur] if cur.returns_rows else [])
                finally:
                    conn.rollback()
        import sqlite3

        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        # mode=ro keeps the ledger's own file unwritten, not the disk: VACUUM INTO copies the ledger to any
        # path, ATTACH creates a file (and takes CREATE TABLE in it). Refused before they run.
        db.set_authorizer(_read_only)
        try:
            rows = db.execute(query)
            return [d[0] for d in rows.description or []], rows.fetchall()
        except sqlite3.DatabaseError as e:
            if "not authorized" in str(e) or "authorization denied" in str(e):
                raise ValueError(f"{' '.join(query.split()[:2])!r}: agent ledger sql only reads; it does not "
                                 f"attach, copy or write database files") from None
            raise
        finally:
            db.close()


def _read_only(action: int, *_: Any) -> int:
    """An SQLite authorizer for `agent ledger sql`: no ATTACH or DETACH (VACUUM INTO a file attaches it)."""
    import sqlite3

    return sqlite3.SQLITE_DENY if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else sqlite3.SQLITE_OK


def _changed(result: Any) -> int:
    """The rows an UPDATE changed (a CursorResult's rowcount; SQLAlchemy types execute's result as Result)."""
    return result.rowcount


def as_dict(row: Base) -> dict:
    return {c.name: getattr(row, c.name) for c in row.__table__.columns}


def to_json(rows: Sequence[Base]) -> str:
    return json.dumps([as_dict(r) for r in rows], indent=2, default=str)



