"""The server's own Prometheus metrics that explain a result.

Gauges (KV-cache usage, waiting requests) are sampled during the measured phase and their peak
and mean kept; counters (preemptions, speculative tokens) and histograms (time in the queue,
tokens a step) are read before and after and their difference kept, so warm-ups and quality
requests do not leak into the figures. The planner's triggers read these (agent/planner.py).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Names vary across vLLM versions; the first one present is used.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc")
WAITING = ("vllm:num_requests_waiting",)
RUNNING = ("vllm:num_requests_running",)
COUNTERS = {
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "spec_drafts": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts"),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",
                             "vllm:spec_decode_num_accepted_tokens"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
}


QUEUE_TIME = "vllm:request_queue_time_seconds"     # waiting before the first schedule, per request
STEP_TOKENS = "vllm:iteration_tokens_total"        # tokens an engine step ran (prefill and decode)


def parse(text: str) -> dict[str, float]:
    """Sum each sample name over its labels (one engine, so labels only name the model); a histogram's
    buckets keep their bound, as `name|le`."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = f"{sample.name}|{sample.labels['le']}" if sample.name.endswith("_bucket") else sample.name
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def buckets(values: dict[str, float], histogram: str) -> dict[float, float]:
    """A histogram's cumulative counts by upper bound (inf for +Inf)."""
    prefix = f"{histogram}_bucket|"
    return {float(k[len(prefix):]): v for k, v in values.items() if k.startswith(prefix)}


def share_above(counts: dict, bound: float) -> float | None:
    """The share of a histogram's observations above bound, from its cumulative counts by upper bound
    (keys as numbers or their strings, "inf" the total; a summary's step_tokens_buckets), rounded down
    to the bucket edge at or below bound, so the share is never understated."""
    counts = {float(k): v for k, v in (counts or {}).items()}
    total, edges = counts.get(math.inf), [e for e in counts if e <= bound]
    return round((total - counts[max(edges)]) / total, 4) if total and edges else None


def _mean(before: dict[str, float], after: dict[str, float], histogram: str) -> float | None:
    count = after.get(f"{histogram}_count", 0.0) - before.get(f"{histogram}_count", 0.0)
    total = after.get(f"{histogram}_sum", 0.0) - before.get(f"{histogram}_sum", 0.0)
    return total / count if count > 0 else None


def first(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    for name in names:
        if name in values:
            return values[name]
    return None


async def scrape(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    try:
        response = await client.get(f"{base_url}/metrics")
        return parse(response.text) if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


@dataclass
class Sampler:
    """Samples gauges every interval_s until stopped."""

    base_url: str
    interval_s: float = 1.0
    kv_usage: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not stop.is_set():
                values = await scrape(client, self.base_url)
                for series, names in ((self.kv_usage, KV_USAGE), (self.waiting, WAITING),
                                      (self.running, RUNNING)):
                    value = first(values, names)
                    if value is not None:
                        series.append(value)
                try:
                    await asyncio.wait_for(stop.wait(), self.interval_s)
                except TimeoutError:
                    pass


def summarize(before: dict[str, float], after: dict[str, float], sampler: Sampler,
              api_cpu_share: float | None = None) -> dict:
    """The phase's explanation. api_cpu_share: CPU seconds the API server processes spent per second
    of the phase (1.0: one core busy), read by the worker from the processes themselves."""
    def peak(xs: list[float]) -> float | None:
        return round(max(xs), 4) if xs else None

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    out: dict = {
        "kv_cache_usage_max": peak(sampler.kv_usage),
        "kv_cache_usage_mean": mean(sampler.kv_usage),
        "requests_waiting_max": peak(sampler.waiting),
        "requests_running_mean": mean(sampler.running),
        "requests_running_max": peak(sampler.running),
        "samples": len(sampler.kv_usage),
    }
    for key, names in COUNTERS.items():
        a, b = first(before, names), first(after, names)
        out[key] = None if a is None or b is None else round(b - a, 3)
    queue = _mean(before, after, QUEUE_TIME)
    out["queue_time_mean_ms"] = round(queue * 1000, 3) if queue is not None else None
    steps = after.get(f"{STEP_TOKENS}_count", 0.0) - before.get(f"{STEP_TOKENS}_count", 0.0)
    out["steps"] = round(steps) if steps > 0 else None
    tokens = _mean(before, after, STEP_TOKENS)
    out["tokens_per_step_mean"] = round(tokens, 2) if tokens is not None else None
    # tokens a step, by bucket, for the graph-size trigger (the share above the largest captured size)
    was, now = buckets(before, STEP_TOKENS), buckets(after, STEP_TOKENS)
    out["step_tokens_buckets"] = {str(k): round(v - was.get(k, 0.0)) for k, v in sorted(now.items())} or None
    out["api_cpu_share"] = round(api_cpu_share, 3) if api_cpu_share is not None else None
    drafted, accepted = out["spec_draft_tokens"], out["spec_accepted_tokens"]
    out["spec_acceptance_rate"] = round(accepted / drafted, 4) if drafted else None
    if out["spec_drafts"]:
        out["spec_mean_acceptance_length"] = round(1 + accepted / out["spec_drafts"], 3)
    return out
