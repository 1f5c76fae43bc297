"""What a config is worth: its load curve, the knee of it, the highest load that holds the user's SLOs,
what a device-hour serves there and what a million tokens cost (issue 58).

A curve is a ladder of loads measured on fresh servers of one config (sandbox.ladder): each rung is
one load (closed-loop streams, or open-loop requests/s) and the repeats measured at it, each a fresh
draw of requests. Everything here is arithmetic over those figures, so it is the same for a ladder
measured by `agent capacity` and for one read from a `vllm bench sweep serve` folder (agent.sweep).

Definitions (docs/manual.md, "What a win is worth"):
- A rung's figures are its median repeat's (by output tokens/s); its spread is the repeats' range.
- The knee: walking up the ladder, the first rung whose p99 end-to-end latency rose by a larger
  fraction than its output tokens/s did marks the one below it as the knee: past it, load buys more
  waiting than throughput. A ladder with no such rung has no knee within it (None), said so, not invented.
- The SLO limit: the highest rung, climbing from the lowest, before the first whose p99 TTFT, ITL
  or end-to-end latency breaks a bound the user set (None where the lowest breaks one, or none is set).
- The operating point: the SLO limit where SLOs are set, else the knee, else the top rung measured
  (throughput still rising there: a ladder too short to say more).
- Cost: the device-hour's price over the output tokens an hour serves at the operating point, and
  the same price over its input tokens: each the whole price given to one kind of token, as
  inference-perf reports them (not a split of one bill).
- Servers for a target rate: the target's requests/s over the operating point's (requests over the
  whole phase, as vLLM counts them), rounded up.
- A rung where a request failed ends the curve for all of these: a load the server could not answer
  is no operating point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sandbox.contract import SLO_FIELDS, Ladder, Workload

LATENCIES = ("ttft_ms", "itl_ms", "latency_ms")


@dataclass(frozen=True)
class Repeat:
    """One measured phase at one load: what `vllm bench serve` reports for one run."""
    output_tps: float
    total_tps: float
    request_rate: float             # completed requests/s
    input_tokens: int
    output_tokens: int
    requests: int
    duration_s: float
    ttft_ms: dict = field(default_factory=dict)      # p50, p90, p99, mean, n
    itl_ms: dict = field(default_factory=dict)
    latency_ms: dict = field(default_factory=dict)  # end to end
    errors: int = 0

    @property
    def input_tps(self) -> float:
        return self.input_tokens / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class Rung:
    load: float                     # streams (closed loop) or requests/s (open loop)
    repeats: tuple[Repeat, ...]

    @property
    def median(self) -> Repeat:
        return sorted(self.repeats, key=lambda r: r.output_tps)[len(self.repeats) // 2]

    @property
    def spread(self) -> tuple[float, float]:
        tps = [r.output_tps for r in self.repeats]
        return min(tps), max(tps)

    def disagrees(self, noise_sd: float) -> bool:
        """Whether its repeats differ by more than two instances of the same config may (the gate's
        A/A bound: 2.8 noise standard deviations on the log scale); one repeat cannot say."""
        low, high = self.spread
        return len(self.repeats) > 1 and low > 0 and math.log(high / low) > 2.8 * noise_sd

    def p99(self, latency: str) -> float | None:
        return getattr(self.median, latency).get("p99")


@dataclass(frozen=True)
class Curve:
    subject: str                    # "defaults", a branch name, or an imported sweep's label
    kind: str                       # "concurrency" (closed loop) or "rate" (open loop)
    rungs: tuple[Rung, ...]
    stopped: str = ""               # why the ladder ended where it did
    devices: int = 1                # devices a server of this config takes (tokens per device-hour)


@dataclass(frozen=True)
class Worth:
    """One curve, judged: the knee, the SLO limit, the operating point and what it is worth."""
    knee: Rung | None
    slo_limit: Rung | None
    point: Rung | None
    point_is: str                   # "SLO limit", "knee", "top of the ladder", "none"
    tokens_per_device_hour: float | None
    cost_per_m_output: float | None
    cost_per_m_input: float | None
    servers: int | None


def served(curve: Curve) -> tuple[Rung, ...]:
    """The rungs up to the first where a request failed: a load the server could not answer is no
    operating point (the worker ends the climb there)."""
    clean = []
    for rung in curve.rungs:
        if any(r.errors for r in rung.repeats):
            break
        clean.append(rung)
    return tuple(clean)


def knee(curve: Curve) -> Rung | None:
    """The rung below the first whose p99 end-to-end latency rose by a larger fraction than its output
    tokens/s (module docstring); None where no rung did."""
    rungs = served(curve)
    for below, rung in zip(rungs, rungs[1:], strict=False):
        was, now = below.p99("latency_ms"), rung.p99("latency_ms")
        gained = rung.median.output_tps / below.median.output_tps - 1 if below.median.output_tps > 0 else 0.0
        if was and now is not None and now / was - 1 > gained:
            return below
    return None


def holds(rung: Rung, slo: dict) -> bool:
    """Whether the rung's p99s are within every bound set (slo: ttft_p99_ms, itl_p99_ms, e2e_p99_ms); a
    p99 the rung lacks (a sweep that did not record it) is not judged, as the worker's climb does."""
    for name, latency in SLO_FIELDS.items():
        bound, p99 = slo.get(name), rung.p99(latency)
        if bound is not None and p99 is not None and p99 > bound:
            return False
    return True


def slo_limit(curve: Curve, slo: dict) -> Rung | None:
    """The highest rung before the first that breaks a bound; None where none is set or the lowest breaks."""
    if not any(slo.get(name) is not None for name in SLO_FIELDS):
        return None
    limit = None
    for rung in served(curve):
        if not holds(rung, slo):
            break
        limit = rung
    return limit


def worth(curve: Curve, slo: dict, price_per_hour: float | None = None, target_rate: float | None = None) -> Worth:
    sloed = any(slo.get(name) is not None for name in SLO_FIELDS)
    bend, limit = knee(curve), slo_limit(curve, slo)
    if sloed:
        point, point_is = limit, "SLO limit" if limit else "none"
    elif bend:
        point, point_is = bend, "knee"
    elif served(curve):
        point, point_is = served(curve)[-1], "top of the ladder"
    else:
        point, point_is = None, "none"
    if point is None:
        return Worth(bend, limit, None, point_is, None, None, None, None)
    m = point.median
    per_hour_out, per_hour_in = m.output_tps * 3600, m.input_tps * 3600
    return Worth(
        bend, limit, point, point_is,
        tokens_per_device_hour=per_hour_out / curve.devices,
        cost_per_m_output=price_per_hour / (per_hour_out / 1e6) if price_per_hour is not None and per_hour_out
        else None,
        cost_per_m_input=price_per_hour / (per_hour_in / 1e6) if price_per_hour is not None and per_hour_in else None,
        servers=math.ceil(target_rate / m.request_rate) if target_rate and m.request_rate > 0 else None)


def repeat_from_bench(bench: dict) -> Repeat:
    """A repeat from a worker's phase figures (sandbox.bench.BenchResult as JSON): output tokens/s over
    its steady window, as every figure; total tokens/s and requests/s over the whole phase, as
    `vllm bench serve` counts them."""
    wall = bench["wall_s"]
    requests = bench["requests"] - bench.get("errors", 0)
    tokens = bench["output_tokens"] + bench.get("input_tokens", 0)
    return Repeat(output_tps=bench["tps"], total_tps=round(tokens / wall, 3) if wall else 0.0,
                  request_rate=round(requests / wall, 4) if wall else 0.0, input_tokens=bench.get("input_tokens", 0),
                  output_tokens=bench["output_tokens"], requests=requests, duration_s=wall,
                  ttft_ms=bench["ttft_ms"], itl_ms=bench["itl_ms"], latency_ms=bench["latency_ms"],
                  errors=bench.get("errors", 0))


def as_dict(curve: Curve) -> dict:
    from dataclasses import asdict

    return asdict(curve)


def from_dict(data: dict) -> Curve:
    rungs = tuple(Rung(r["load"], tuple(Repeat(**x) for x in r["repeats"])) for r in data["rungs"])
    return Curve(data["subject"], data["kind"], rungs, data.get("stopped", ""), data.get("devices", 1))


def ladder_of(text: str, where: str = "--capacity") -> Ladder:
    """--capacity's ladder: closed-loop streams (1,2,4,8) or open-loop requests/s (rate:0.5,1,2)."""
    kind, body = ("rate", text.removeprefix("rate:")) if text.startswith("rate:") else ("concurrency", text)
    try:
        loads = [float(x) if kind == "rate" else int(x) for x in body.split(",")]
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not loads like 1,2,4,8 (streams) or rate:0.5,1,2 "
                         f"(requests/s)") from None
    return Ladder.from_dict({"kind": kind, "loads": loads}, where)


def estimate_s(timings: dict, workload: Workload, repeats: int, ladder: Ladder) -> tuple[float, float]:
    """Seconds for both ladders (defaults and branch), from an instance of the defaults: each a server
    start and teardown like theirs, and every rung's warm-ups and phases at the defaults' time a
    request (their phases' own concurrency); the low end if a rung of C streams runs C/concurrency
    times as fast, the high if no faster; open-loop rungs no shorter than their arrivals. A ladder that
    stops early (tokens/s no longer rising, an SLO broken) takes less."""
    per_request = timings.get("benchmark_s", 0.0) / max(1, repeats * workload.num_prompts)
    fixed = timings.get("start_s", 0.0) + timings.get("teardown_s", 0.0)
    low = high = fixed
    for load in ladder.loads:
        rung = ladder.at(workload, load)
        serial = (rung.warmup_count() + repeats * rung.num_prompts) * per_request
        if ladder.kind == "concurrency":
            low += serial * min(1.0, workload.concurrency / load)
            high += serial
        else:
            arrivals = (repeats + 1) * rung.num_prompts / load
            low, high = low + arrivals, high + max(arrivals, serial)
    return 2 * low, 2 * high
