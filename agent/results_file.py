"""A branch's serving/results.json: one typed model, version 1, and the JSON Schema generated from it.

What a claim is, what it was measured under and with what, every figure with its unit. `agent verify`
and `agent branches --json/--diff` read branches through `read`, which maps a branch written before
the schema (agent 2efafb4 and older: flat names) onto version 1. The schema is published as
docs/results-v1.schema.json, its fields as a table in docs/ledger.md (`python -m agent.reference
--write` writes both; a test checks they are current).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SCHEMA_VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Percentiles(Strict):
    """Milliseconds, over every measured request of the instance's repeats, interpolated as `vllm bench
    serve` does (numpy's linear). n: how many values they come from (a p99 of 4 is its count's)."""
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None
    n: int | None = Field(default=None,
                          description="values behind the percentiles (None: a branch written before counts)")


class Latency(Strict):
    """The candidate's search instance; every figure in ms."""
    ttft_ms: Percentiles = Field(default_factory=Percentiles)
    tpot_ms: Percentiles = Field(default_factory=Percentiles,
                                 description="per request: (end-to-end - TTFT) / (tokens - 1)")
    itl_token_ms: Percentiles = Field(default_factory=Percentiles, description="chunk gaps per token they bring")
    itl_chunk_ms: Percentiles = Field(default_factory=Percentiles,
                                      description="every gap between two streamed chunks")
    e2e_ms: Percentiles = Field(default_factory=Percentiles)


class Claim(Strict):
    unit: str = Field(description="the unit of figure, baseline_figure and heldout_figure (tokens/s, requests/s)")
    objective: dict[str, Any] = {}
    statement: str = ""
    figure: float | None = Field(default=None, description="the candidate's search instance")
    baseline_figure: float | None = None
    search_ratio: float | None = None
    search_interval: list[float] | None = None
    heldout_figure: float | None = None
    heldout_ratio: float | None = Field(default=None, description="the claim: candidate instances over the defaults' "
                                                          "on held-out prompts")
    heldout_interval: list[float] | None = Field(default=None, description="the claim's one-sided bounds")
    heldout_instances: Any = None
    repeat_figures: list[float] | None = None
    drift: float | None = None
    figure_corrected: float | None = None


class Noise(Strict):
    log_sd: float | None = Field(default=None, description="instance-to-instance noise of the defaults (log scale)")
    df: int | None = None
    prior: dict[str, Any] = {}


class QualityFigures(Strict):
    ppl: float | None = None
    baseline_ppl: float | None = None
    ppl_change: float | None = Field(default=None, description="relative to the defaults' perplexity")
    greedy_agreement: float | None = Field(default=None, description="share of greedy tokens equal to the defaults'")
    lossless: bool | None = None
    greedy_rule: str | None = None
    flips: list[Any] = []
    calibration: dict[str, Any] = {}


class Load(Strict):
    """How requests reached the server while it was measured."""
    arrivals: str = Field(default="concurrency", description="concurrency (closed loop), rate:R, poisson:R or trace")
    concurrency: int | None = Field(default=None, description="requests in flight (closed loop)")
    rate: float | None = Field(default=None, description="requests/s (open loop)")
    requests_per_phase: int | None = None
    repeats: int | None = Field(default=None, description="measured phases a server instance")
    warmup_requests: int | None = None


class Traffic(Strict):
    """The requests, by hash and shares: never a prompt."""
    meter: str | None = None
    meter_version: int | None = None
    file: str | None = Field(default=None, description="the traffic file as the user named it")
    format: str | None = None
    file_hash: str | None = Field(default=None, description="sha256 of the user's traffic file")
    requests: int | None = None
    split: str | None = None
    split_hash: str | None = None
    sampled_share: float | None = None
    ignore_eos_share: float | None = None


class Serving(Strict):
    """What the branch deploys: serving/config.yaml holds flags, serving/env holds env."""
    model: str = Field(description="as the user named it: a Hub id, a folder, or 'embedded'")
    model_revision: str | None = None
    flags: dict[str, Any] = {}
    env: dict[str, str] = {}
    changed: dict[str, Any] = Field(default_factory=dict,
                                    description="the knobs the candidate changed from the engine's defaults")
    env_only: bool = Field(default=False, description="the whole change is in environment variables")
    host_specific: dict[str, str] = Field(default_factory=dict,
                                          description="variable -> why its value belongs to the measuring host")
    max_model_len: int | None = Field(default=None, description="the context the branch serves (the model's maximum "
                                                        "unless the user chose one)")


class Measurement(Strict):
    """What the agent set only to measure; none of it narrows the served config."""
    max_model_len: int | None = None
    longest_request_tokens: int | None = None
    settings: dict[str, Any] = {}


class CapacityRung(Strict):
    """One load of the ladder: its median repeat's figures (by output tokens/s) and the repeats' range."""
    load: float = Field(description="streams (concurrency) or requests/s (rate)")
    output_tps: float
    output_tps_range: list[float] = Field(description="lowest and highest repeat")
    total_tps: float
    request_rate: float = Field(description="completed requests/s over the whole phase, as vLLM counts them")
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    requests: int = Field(description="measured requests of the median repeat (its p99's count)")
    repeats: int


class CapacityCurve(Strict):
    """One config's ladder, judged as `agent capacity` judges it (docs/manual.md, "What a win is worth")."""
    rungs: list[CapacityRung]
    stopped: str = Field(description="why the ladder ended where it did")
    knee: float | None = Field(default=None, description="the load of the knee; None: none within the ladder")
    slo_limit: float | None = Field(default=None, description="the highest load whose p99s hold the SLOs")
    point: float | None = Field(default=None, description="the operating point's load")
    point_is: str = Field(description="SLO limit, knee, top of the ladder, or none")
    tokens_per_device_hour: float | None = Field(default=None, description="output tokens at the operating point")
    cost_per_m_output: float | None = Field(default=None, description="price_per_hour over output tokens, per million")
    cost_per_m_input: float | None = Field(default=None, description="price_per_hour over input tokens, per million")
    servers: int | None = Field(default=None, description="servers for target_rate at the operating point")


class CapacityFigures(Strict):
    """What the win is worth under load: the defaults and this config on fresh servers, up one ladder of
    loads on the run's whole traffic pool (`agent run --capacity`, after the night's first decision)."""
    kind: Literal["concurrency", "rate"]
    loads: list[float]
    slo: dict[str, float] = {}
    price_per_hour: float | None = None
    target_rate: float | None = None
    devices: int = 1
    defaults: CapacityCurve
    config: CapacityCurve
    tokens_per_device_hour_ratio: float | None = Field(
        default=None, description="this config's output tokens a device-hour over the defaults', each at its own "
                                  "operating point")
    again: str = Field(description="the command that measures it again")


class Agent(Strict):
    version: str | None = None
    commit: str | None = None


class Results(Strict):
    schema_version: Literal[1] = 1
    agent: Agent = Field(default_factory=Agent)
    run: str
    trial: int
    source: str | None = None
    rationale: str | None = None
    claim: Claim
    noise: Noise = Field(default_factory=Noise)
    quality: QualityFigures = Field(default_factory=QualityFigures)
    latency: Latency = Field(default_factory=Latency)
    load: Load = Field(default_factory=Load)
    traffic: Traffic = Field(default_factory=Traffic)
    serving: Serving
    measurement: Measurement = Field(default_factory=Measurement)
    engine: dict[str, Any] = Field(default_factory=dict, description="name and version of the engine that served it")
    hardware: dict[str, Any] = {}
    device: Any = None
    capacity: CapacityFigures | None = Field(default=None, description="agent run --capacity's load curves")


class ResultsError(ValueError):
    pass


def read(text: str, where: str) -> Results:
    """A branch's results.json, of any version this agent wrote; ResultsError in one line otherwise."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f"{where}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(raw, dict):
        raise ResultsError(f"{where}: not a JSON object")
    try:
        return Results.model_validate(raw if "schema_version" in raw else from_unversioned(raw))
    except (ValidationError, KeyError, TypeError, ValueError) as e:
        first = e.errors()[0] if isinstance(e, ValidationError) else None
        said = (f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}" if first else f"{type(e).__name__} {e}")
        raise ResultsError(f"{where}: not a results file this agent reads ({said})") from None


# A branch from before version 1 kept its figures flat, some under the ledger's older column names
# (agent.migrations.RENAMED: tps, tps_ratio, ... before 2026-12-06).
_OLD = {"tps": "figure", "tps_ratio": "search_ratio", "baseline_tps": "baseline_figure",
        "tps_repeats": "repeat_figures", "heldout_tps": "heldout_figure", "tps_corrected": "figure_corrected",
        "tps_interval": "figure_interval"}


def from_unversioned(old: dict) -> dict:
    """Version 1's fields from a flat results.json (agent 2efafb4 and older)."""
    o = {**{new: old[k] for k, new in _OLD.items() if k in old}, **old}
    pct = lambda v: {k: v.get(k) for k in ("p50", "p90", "p99", "mean") if k in v} if isinstance(v, dict) else {}  # noqa: E731
    objective = o.get("objective") or {}
    meter = o.get("meter") or {}
    given = o.get("traffic_source") or meter.get("traffic") or {}
    return {
        "schema_version": 1, "run": o["run"], "trial": o["trial"], "source": o.get("source"),
        "rationale": o.get("rationale"),
        "claim": {"unit": objective.get("unit", "tokens/s"), "objective": objective, "statement": o.get("claim", ""),
                  **{k: o.get(k) for k in ("figure", "baseline_figure", "search_ratio", "search_interval",
                                           "heldout_figure", "heldout_ratio", "heldout_interval", "heldout_instances",
                                           "repeat_figures", "drift", "figure_corrected")}},
        "noise": {"log_sd": o.get("noise_log_sd", o.get("noise")), "df": o.get("noise_df"),
                  "prior": o.get("noise_prior") or {}},
        "measurement": {"max_model_len": (o.get("flags") or {}).get("max-model-len")},
        "quality": {"ppl": o.get("ppl"), "baseline_ppl": o.get("baseline_ppl"), "ppl_change": o.get("ppl_change"),
                    "greedy_agreement": o.get("greedy_agreement"), "lossless": o.get("lossless"),
                    "greedy_rule": o.get("greedy_rule"), "flips": o.get("flips") or [],
                    "calibration": o.get("calibration") or {}},
        "latency": {"ttft_ms": pct(o.get("ttft_ms")), "itl_chunk_ms": pct(o.get("itl_ms"))},
        "load": {"arrivals": meter.get("arrivals") or "concurrency", "concurrency": meter.get("concurrency"),
                 "requests_per_phase": meter.get("num_prompts")},
        "traffic": {"meter": meter.get("name"), "meter_version": meter.get("meter_version"),
                    **{k: meter.get(k) for k in ("split", "split_hash", "sampled_share", "ignore_eos_share")},
                    **{k: given.get(k) for k in ("file", "format", "file_hash", "requests")}},
        "serving": {"model": o.get("model") or "", "max_model_len": (o.get("flags") or {}).get("max-model-len"),
                    "model_revision": o.get("model_revision"),
                    "flags": o.get("flags") or {}, "env": {k: str(v) for k, v in (o.get("env") or {}).items()},
                    "changed": o.get("params") or {}},
        "engine": o.get("engine") or {}, "hardware": o.get("hardware") or {}, "device": o.get("device"),
    }


def schema() -> dict:
    return Results.model_json_schema()


def field_table(model: type[BaseModel] = Results, prefix: str = "") -> list[str]:
    """The fields of results.json version 1 as Markdown table rows: the path, its type, what it holds."""
    rows = []
    for name, f in model.model_fields.items():
        kind = f.annotation
        nested = kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None
        if nested is not None:
            rows += field_table(nested, f"{prefix}{name}.")
            continue
        shown = getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
        doc = f.description or ""
        rows.append(f"| `{prefix}{name}` | {shown.replace('|', 'or')} | {doc} |")
    return rows


if __name__ == "__main__":   # the schema; `python -m agent.reference --write` writes it and the docs
    sys.stdout.write(json.dumps(schema(), indent=2, sort_keys=True) + "\n")
