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

from sandbox.traffic import ENDPOINTS, Request, keys_hash
from sandbox.workload import Workload


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None
    finish: str | None = None      # eos, stop (a stop string or token), length, or the server's word
    exact_tokens: int | None = None  # with ignore_eos: the count it must return


@dataclass
class BenchResult:
    tps: float
    output_tokens: int
    wall_s: float
    requests: int
    errors: int
    short_outputs: int
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]      # every gap between two streamed chunks: what a reader waits for
    latency_ms: dict[str, float]  # end to end, send to last byte
    first_error: str | None
    finish: dict[str, int] = field(default_factory=dict)   # how the requests ended: eos, stop, length
    draw_hash: str | None = None                           # the requests measured (sandbox.traffic.keys_hash)
    tpot_ms: dict[str, float] = field(default_factory=dict)  # per request: (latency - TTFT) / (tokens - 1)

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


async def one_request(pool: _Connections, path: str, body: dict, arrived: float | None = None) -> RequestResult:
    """One streamed completion: TTFT and inter-token gaps from chunk arrival, tokens from usage.
    arrived (open loop): when the request arrived, so time it waited for a free slot counts."""
    start = time.perf_counter() if arrived is None else arrived
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
                choice = (chunk.get("choices") or [{}])[0]
                if choice.get("finish_reason"):
                    result.finish = _finish(choice)
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
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


def _finish(choice: dict) -> str:
    """vLLM's finish_reason 'stop' with no stop_reason is the end-of-sequence token."""
    reason = str(choice["finish_reason"])
    if reason == "stop":
        return "stop" if choice.get("stop_reason") is not None else "eos"
    return reason


def request_body(model: str, request: Request) -> dict:
    """What is sent: the request as the user wrote it, streamed, with usage in the last chunk."""
    return {**request.body, "model": model, "stream": True, "stream_options": {"include_usage": True}}


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
        longest = workload.longest_output()
        return Pruner(below_tps, max(3, workload.num_prompts // 8), longest, workload.concurrency)


async def run_requests(base_url: str, model: str, requests: list[Request], concurrency: int,
                       timeout_s: float, pruner: Pruner | None = None,
                       offsets: list[float] | None = None) -> tuple[list[RequestResult], float]:
    """Send requests, `concurrency` at a time; returns results (in request order) and the phase's
    wall time. With offsets (sandbox.arrivals: open loop), request i arrives `offsets[i]` seconds
    after the start whatever the server does, `concurrency` still capping those in flight, and its
    latencies count from its arrival (a wait for a free slot is a queue the user sees). With a
    pruner, the requests still to run are cancelled once it calls the phase hopeless, and only the
    finished ones are returned. A conversation's turn is sent only once the turn before it in these
    requests has been answered (open loop: at its arrival time or then, whichever is later)."""
    gate = asyncio.Semaphore(concurrency)
    pool = _Connections(base_url, connect_timeout_s=10.0)
    done: list[RequestResult] = []
    stop = asyncio.Event()
    answered = [asyncio.Event() for _ in requests]
    before = previous_turns(requests)

    async def bounded(i: int, request: Request, at: float | None) -> RequestResult | None:
        try:
            if at:
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            arrival = None if at is None else start + at
            if before[i] is not None:
                await answered[before[i]].wait()
                arrival = None if at is None else max(arrival, time.perf_counter())
            async with gate:
                if stop.is_set():
                    return None
                result = await one_request(pool, ENDPOINTS[request.endpoint], request_body(model, request), arrival)
                result.exact_tokens = request.max_tokens if request.body.get("ignore_eos") else None
                done.append(result)
                if pruner and pruner.hopeless(done, time.perf_counter() - start):
                    stop.set()
                return result
        finally:
            answered[i].set()

    try:
        start = time.perf_counter()
        times = offsets if offsets is not None else [None] * len(requests)
        results = await asyncio.wait_for(
            asyncio.gather(*(bounded(i, r, at) for i, (r, at) in enumerate(zip(requests, times)))), timeout_s)
        return [r for r in results if r is not None], time.perf_counter() - start
    finally:
        pool.close()


def previous_turns(requests: list[Request]) -> list[int | None]:
    """For each request, the index of its conversation's previous turn among these requests (None: none)."""
    last: dict[str, int] = {}
    out: list[int | None] = []
    for i, r in enumerate(requests):
        out.append(last.get(r.conversation) if r.conversation is not None else None)
        if r.conversation is not None:
            last[r.conversation] = i
    return out


def summarize(results: list[RequestResult], wall_s: float, requests: list[Request]) -> BenchResult:
    """The phase's figures; requests are those it was given (a pruned phase answered only some)."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    short = sum(1 for r in ok if r.exact_tokens is not None and r.output_tokens != r.exact_tokens)
    errors = [r for r in results if not r.ok]
    finish: dict[str, int] = {}
    for r in ok:
        finish[r.finish or "unknown"] = finish.get(r.finish or "unknown", 0) + 1
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
        finish=finish,
        draw_hash=keys_hash(requests),
        tpot_ms=percentiles([(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok
                             if r.ttft_s is not None and r.output_tokens > 1]),
    )


def bench_deadline_s(workload: Workload, floor_tps: float = 2.0) -> float:
    """A generous default deadline: every token at floor_tps per stream, plus slack."""
    longest = workload.longest_output()
    tokens = (workload.num_prompts + workload.warmup_requests) * longest
    return 60.0 + tokens / (floor_tps * workload.concurrency)
