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
from urllib.parse import urlsplit

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


class _Connections:
    """Keep-alive HTTP/1.1 connections to one server, for the streamed completions.

    The meter's client shares the host with the server it measures: on a 2-core machine the CPU
    it spends per streamed chunk is taken from the engine, and a heavier client reads a slower
    server. httpx's streaming (its transport layers, not the SSE parsing) cost 0.15 s of client
    CPU per challenge-cpu phase (256 chunks); this plain asyncio reader costs 0.06 s, and
    `vllm bench serve` (aiohttp) 0.09 s. With httpx the meter read 3% below `vllm bench serve`
    on the same server; with this reader it agrees (docs/meter-vs-vllm-bench.md).
    """

    def __init__(self, base_url: str, connect_timeout_s: float):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported server URL {base_url!r}")
        self.host, self.ssl = parts.hostname, parts.scheme == "https"
        self.port = parts.port or (443 if self.ssl else 80)
        self.authority = parts.netloc.encode()
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await asyncio.wait_for(asyncio.open_connection(self.host, self.port, ssl=self.ssl or None,
                                                              limit=2 ** 20), self.connect_timeout_s)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class _Response:
    """One HTTP/1.1 response read from a stream: status, headers, then the body in pieces."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False  # the body was read to its end and the connection may be reused

    async def read_head(self) -> None:
        status_line = await self.reader.readline()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
        self.status = int(parts[1])
        self.http10 = parts[0] == b"HTTP/1.0"
        while True:
            line = await self.reader.readline()
            if not line.endswith(b"\n"):
                raise asyncio.IncompleteReadError(line, None)
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.decode("latin-1").partition(":")
            self.headers[name.strip().lower()] = value.strip()

    async def pieces(self):
        """The body as it arrives: chunked, Content-Length or until the server closes."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await self.reader.readline()).split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                data = await self.reader.readexactly(size)
                await self.reader.readexactly(2)  # CRLF after each chunk
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await self.reader.read(min(left, 2 ** 16))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                left -= len(data)
                yield data
        else:
            while data := await self.reader.read(2 ** 16):
                yield data
            return
        self.complete = not self.http10 and self.headers.get("connection", "").lower() != "close"

    async def read_all(self) -> bytes:
        return b"".join([piece async for piece in self.pieces()])


async def one_request(pool: _Connections, path: str, body: dict) -> RequestResult:
    """One streamed completion: TTFT and inter-token gaps from chunk arrival, tokens from usage."""
    start = time.perf_counter()
    last = None
    result = RequestResult(ok=False)
    payload = json.dumps(body).encode()
    conn = None
    reuse = False
    try:
        conn = await pool.get()
        reader, writer = conn
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                     % ((pool.prefix + path).encode(), pool.authority, len(payload), payload))
        await writer.drain()
        response = _Response(reader)
        await response.read_head()
        if response.status != 200:
            text = (await response.read_all()).decode(errors="replace")
            result.error = f"HTTP {response.status}: {text[:300]}"
            reuse = response.complete
            return result
        buffer = b""
        done = False
        async for piece in response.pieces():
            now = time.perf_counter()
            buffer += piece
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                if done or not raw.startswith(b"data: "):
                    continue
                data = raw[6:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"stream error: {str(chunk['error'])[:300]}"
                    return result
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    if result.ttft_s is None:
                        result.ttft_s = now - start
                    else:
                        result.itl_s.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.output_tokens = int(chunk["usage"]["completion_tokens"])
        reuse = response.complete
        result.ok = True
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
            json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        result.error = f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        result.latency_s = time.perf_counter() - start
        if conn is not None:
            if reuse:
                pool.put(conn)
            else:
                conn[1].close()
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


@dataclass
class Pruner:
    """Stops a benchmark once its TPS cannot reach `below_tps` (the agent's threshold: the defaults'
    TPS less the instance noise it allows for, so a hopeless config is stopped, never a slow-looking
    instance of a good one).

    After `after` requests have finished, the most this phase could still read is its tokens so far
    plus a whole answer for every request in flight, over the time it has taken; when even that is
    below the threshold, the phase is over. It only looks while that bound can still fall: at the
    workload's concurrency, requests finish at the pace the server sets.
    """
    below_tps: float
    after: int
    max_tokens: int
    concurrency: int
    pruned: bool = False
    upper_tps: float | None = None

    def hopeless(self, done: list[RequestResult], elapsed_s: float) -> bool:
        if len(done) < self.after or elapsed_s <= 0:
            return False
        tokens = sum(r.output_tokens for r in done if r.ok)
        self.upper_tps = (tokens + self.concurrency * self.max_tokens) / elapsed_s
        self.pruned = self.upper_tps < self.below_tps
        return self.pruned

    @staticmethod
    def for_workload(below_tps: float, workload: Workload) -> "Pruner":
        return Pruner(below_tps, max(3, workload.num_prompts // 8), workload.max_tokens, workload.concurrency)


async def run_prompts(base_url: str, model: str, prompts: list[str], workload: Workload,
                      timeout_s: float, pruner: Pruner | None = None) -> tuple[list[RequestResult], float]:
    """Send prompts with the workload's concurrency; returns results and the phase's wall time.
    With a pruner, the requests still to run are cancelled once it calls the phase hopeless, and
    only the finished ones are returned."""
    gate = asyncio.Semaphore(workload.concurrency)
    pool = _Connections(base_url, connect_timeout_s=10.0)
    bodies = [request_body(model, prompt, workload) for prompt in prompts]
    done: list[RequestResult] = []
    stop = asyncio.Event()

    async def bounded(body: dict) -> RequestResult | None:
        async with gate:
            if stop.is_set():
                return None
            result = await one_request(pool, "/v1/completions", body)
            done.append(result)
            if pruner and pruner.hopeless(done, time.perf_counter() - start):
                stop.set()
            return result

    try:
        start = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(bounded(b) for b in bodies)), timeout_s)
        return [r for r in results if r is not None], time.perf_counter() - start
    finally:
        pool.close()


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
