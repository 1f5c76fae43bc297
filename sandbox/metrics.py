"""The server's own Prometheus metrics that explain a result.

Gauges (KV-cache usage, waiting requests) are sampled during the measured phase and their peak
and mean kept; counters (preemptions, speculative tokens) are read before and after and their
difference kept, so warm-ups and quality requests do not leak into the figures.
"""

from __future__ import annotations

import asyncio
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


def parse(text: str) -> dict[str, float]:
    """Sum each sample name over its labels (one engine, so labels only name the model)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


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
                except asyncio.TimeoutError:
                    pass


def summarize(before: dict[str, float], after: dict[str, float], sampler: Sampler) -> dict:
    def peak(xs: list[float]) -> float | None:
        return round(max(xs), 4) if xs else None

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    out: dict = {
        "kv_cache_usage_max": peak(sampler.kv_usage),
        "kv_cache_usage_mean": mean(sampler.kv_usage),
        "requests_waiting_max": peak(sampler.waiting),
        "requests_running_mean": mean(sampler.running),
        "samples": len(sampler.kv_usage),
    }
    for key, names in COUNTERS.items():
        a, b = first(before, names), first(after, names)
        out[key] = None if a is None or b is None else round(b - a, 3)
    drafted, accepted = out["spec_draft_tokens"], out["spec_accepted_tokens"]
    out["spec_acceptance_rate"] = round(accepted / drafted, 4) if drafted else None
    if out["spec_drafts"]:
        out["spec_mean_acceptance_length"] = round(1 + accepted / out["spec_drafts"], 3)
    return out
