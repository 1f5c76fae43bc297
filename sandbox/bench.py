"""The meter: run a workload through the OpenAI-compatible API and measure it.

TPS = output tokens of the measured requests / wall time of the measured phase. Warm-up requests
run first and are never counted. Token counts come from the server's usage record; TTFT and
inter-token latency come from the arrival times of streamed chunks.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import httpx

from sandbox.workload import Workload


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass
class BenchResult:
    tps: float
    output_tokens: int
    wall_s: float
    requests: int
    errors: int
    short_outputs: int
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    latency_ms: dict[str, float]
    first_error: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, 2)

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99),
            "mean": round(statistics.fmean(ordered) * scale, 2)}


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> RequestResult:
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:300]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data.strip() == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"stream error: {str(chunk['error'])[:300]}"
                    return result
                now = time.perf_counter()
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.output_tokens = int(chunk["usage"]["completion_tokens"])
        result.ok = True
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        result.error = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        result.latency_s = time.perf_counter() - start
    return result


def request_body(model: str, prompt: str, workload: Workload) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": workload.max_tokens,
        "temperature": workload.temperature,
        "ignore_eos": workload.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def run_prompts(base_url: str, model: str, prompts: list[str], workload: Workload,
                      timeout_s: float) -> tuple[list[RequestResult], float]:
    """Send prompts with the workload's concurrency; returns results and the phase's wall time."""
    url = f"{base_url}/v1/completions"
    gate = asyncio.Semaphore(workload.concurrency)
    limits = httpx.Limits(max_connections=workload.concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits) as client:

        async def bounded(prompt: str) -> RequestResult:
            async with gate:
                return await one_request(client, url, request_body(model, prompt, workload))

        start = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(bounded(p) for p in prompts)), timeout_s)
        return results, time.perf_counter() - start


def summarize(results: list[RequestResult], wall_s: float, workload: Workload) -> BenchResult:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    short = sum(1 for r in ok if workload.ignore_eos and r.output_tokens != workload.max_tokens)
    errors = [r for r in results if not r.ok]
    return BenchResult(
        tps=round(tokens / wall_s, 3) if wall_s > 0 else 0.0,
        output_tokens=tokens,
        wall_s=round(wall_s, 3),
        requests=len(results),
        errors=len(errors),
        short_outputs=short,
        ttft_ms=percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        itl_ms=percentiles([g for r in ok for g in r.itl_s]),
        latency_ms=percentiles([r.latency_s for r in ok]),
        first_error=errors[0].error if errors else None,
    )


def bench_deadline_s(workload: Workload, floor_tps: float = 2.0) -> float:
    """A generous default deadline: every token at floor_tps per stream, plus slack."""
    tokens = (workload.num_prompts + workload.warmup_requests) * workload.max_tokens
    return 60.0 + tokens / (floor_tps * workload.concurrency)
