"""The meter: run a workload through the OpenAI-compatible API and measure it.

TPS = output tokens streamed inside the measured phase's steady window / the window's length.
Closed loop at concurrency C > 1 the window opens once every one of the phase's first C requests
has streamed its first token (the ramp: until then some slots are still waiting for their first
prefill) and closes when the phase's last request is sent (the drain: from then on fewer than C
are in flight); a token counts where its chunk arrived, each request's tokens (the server's
usage record) spread evenly over its chunks. At one stream, open loop, or a phase too short for a
window, the window is the whole phase. Latencies count every request of the phase, the ramp's and
the drain's included. `phase_tps` keeps the whole phase's figure (vllm bench serve's definition:
every token over the span from the first send to the last byte). Warm-up requests run first and
are never counted. Each request goes through vLLM's own request function, the one
`vllm bench serve` uses: token counts from the server's usage record, TTFT and inter-token
latency from the arrival of streamed chunks, as it reads them. This module holds what that
function leaves to its caller: pacing (a concurrency cap, open-loop arrivals, a conversation's
turns in order), the pruner and the phase's figures (docs/meter-vs-vllm-bench.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass, field

from sandbox.traffic import ENDPOINTS, Request, keys_hash
from sandbox.workload import Workload


@dataclass
class RequestResult:
    ok: bool
    output_tokens: int = 0
    input_tokens: int = 0            # the prompt's tokens, as the server's usage record counts them
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None
    finish: str | None = None      # eos, stop (a stop string or token), length, or the server's word
    exact_tokens: int | None = None  # with ignore_eos: the count it must return
    bad_answer: bool = False         # 200 OK, but not a stream of the API's chunks (bad output, not a refusal)
    repeat_hits: int = 0             # output words a prompt lookup would have drafted right (lookup_hits)
    repeat_words: int = 0
    sent_at: float | None = None     # perf_counter when vLLM's request function sent it
    chunk_at: list[float] = field(default_factory=list)   # perf_counter of each streamed chunk


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
    itl_token_ms: dict[str, float] = field(default_factory=dict)  # chunk gaps per token they bring (per_token_gaps)
    repeat_hits: int = 0      # over the answered requests: output words a prompt lookup drafts right
    repeat_words: int = 0
    phase_tps: float | None = None      # every token over the whole phase's wall time (vllm bench serve's figure)
    window_s: float | None = None       # the steady window tps counts over (None: the whole phase)
    window_tokens: int | None = None
    input_tokens: int = 0               # the answered requests' prompt tokens (the server's usage records)
    # The values behind each latency field, in seconds, so repeats pool into one percentile; not written out.
    samples: dict[str, list[float]] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "samples"}


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """p50, p90, p99 and the mean, as `vllm bench serve` computes them (numpy's default: linear
    interpolation between the two nearest ranks), with n, the count they come from: a p99 of 4
    requests is their largest but one, interpolated, and says so."""
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)

    def pick(q: float) -> float:
        rank = q * (n - 1)
        low = int(rank)
        high = min(low + 1, n - 1)
        return round((ordered[low] + (ordered[high] - ordered[low]) * (rank - low)) * scale, 2)

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99),
            "mean": round(statistics.fmean(ordered) * scale, 2), "n": n}


def per_token_gaps(r: RequestResult) -> list[float]:
    """A request's chunk gaps, each divided by the tokens its chunk brought (the request's tokens after
    the first over its gaps): a 250 ms gap that brings 5 tokens is 50 ms a token to a reader, not a
    250 ms stall. The same as the chunk gaps where every chunk is one token."""
    if not r.itl_s or r.output_tokens <= 1:
        return []
    per_chunk = max(1.0, (r.output_tokens - 1) / len(r.itl_s))
    return [g / per_chunk for g in r.itl_s]


def _vllm_requests():
    """vLLM's own request functions (vllm/benchmarks/lib/endpoint_request_func.py): what `vllm bench
    serve` sends and how it times TTFT, inter-token gaps and latency. Imported when a phase starts,
    since importing vllm takes seconds; the harness runs in the engine's environment, so it is there."""
    from vllm.benchmarks.lib import endpoint_request_func
    return endpoint_request_func


def _session(concurrency: int):
    """An aiohttp session set up as `vllm bench serve` sets its own (vllm/benchmarks/serve.py)."""
    import aiohttp
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
                                     force_close=False)
    return aiohttp.ClientSession(connector=connector, trust_env=False,
                                 timeout=aiohttp.ClientTimeout(total=6 * 60 * 60, sock_connect=10))


_MARK = re.compile(rb'"finish_reason":\s*"|"error"\s*:')


class _Tap:
    """The session as vLLM's request function sees it, keeping what that function drops: the status
    and body of a refused request, how the stream ended (finish_reason, stop_reason) and an error
    sent in the stream. It reads the same bytes as they pass and parses only the lines that carry
    those words (one per request), so the function's timing is left as it is."""

    def __init__(self, session):
        self.session = session
        self.status: int | None = None
        self.refusal = ""
        self.finish: str | None = None
        self.stream_error: str | None = None
        self.rest = b""

    def post(self, **kwargs):
        return _Tapped(self, self.session.post(**kwargs))

    def see(self, data: bytes) -> None:
        *lines, self.rest = (self.rest + data).split(b"\n")
        for line in lines:
            if line.startswith(b"data: {") and _MARK.search(line):
                try:
                    chunk = json.loads(line[6:])
                except json.JSONDecodeError:
                    continue
                if "error" in chunk:
                    self.stream_error = f"stream error: {str(chunk['error'])[:300]}"
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        self.finish = _finish(choice)


class _Tapped:
    def __init__(self, tap: _Tap, request):
        self.tap, self.request = tap, request

    async def __aenter__(self):
        response = await self.request.__aenter__()
        self.tap.status = response.status
        if response.status != 200:
            self.tap.refusal = (await response.text(errors="replace"))[:300]
        return _TappedResponse(self.tap, response)

    async def __aexit__(self, *exc):
        return await self.request.__aexit__(*exc)


class _TappedResponse:
    """The response, its body's chunks seen by the tap on their way to the request function."""

    def __init__(self, tap: _Tap, response):
        self.tap, self.response = tap, response
        self.content = self

    def __getattr__(self, name: str):   # status, reason and anything else: the response's own
        return getattr(self.response, name)

    async def iter_any(self):
        async for data in self.response.content.iter_any():
            self.tap.see(data)
            yield data


def _func_input(erf, api_url: str, model: str, request: Request):
    """The request as vLLM's RequestFuncInput: its prompt or messages and output bound where that
    function puts them, every other field of the user's body as extra_body (sent as given)."""
    body = dict(request.body)
    chat = request.endpoint == "chat"
    messages = body.pop("messages", None) if chat else None
    prompt = "" if chat else body.pop("prompt")
    output_len = request.max_tokens
    body.pop("max_completion_tokens" if chat else "max_tokens", None)
    if chat:
        body.pop("max_tokens", None)   # the function sends max_completion_tokens, which vLLM takes first
    return erf.RequestFuncInput(prompt=prompt, api_url=api_url, prompt_len=0, output_len=output_len,
                                model=model, ignore_eos=bool(body.get("ignore_eos")), extra_body=body or None,
                                chat_messages=messages)


async def one_request(session, base_url: str, model: str, request: Request,
                      arrived: float | None = None) -> RequestResult:
    """One streamed request through vLLM's request function (the completions or chat one): TTFT,
    inter-token gaps, latency and tokens (the server's usage record) as `vllm bench serve` reads them.
    arrived (open loop): when the request arrived, so time it waited for a free slot counts."""
    erf = _vllm_requests()
    send = (erf.async_request_openai_chat_completions if request.endpoint == "chat"
            else erf.async_request_openai_completions)
    tap = _Tap(session)
    sent = time.perf_counter()
    output = await send(_func_input(erf, base_url.rstrip("/") + ENDPOINTS[request.endpoint], model, request), tap)
    waited = 0.0 if arrived is None else (output.start_time or sent) - arrived
    result = RequestResult(ok=output.success and tap.stream_error is None, finish=tap.finish,
                           sent_at=output.start_time or sent)
    result.latency_s = (output.latency if output.success else time.perf_counter() - sent) + waited
    if result.ok:
        result.output_tokens = int(output.output_tokens or 0)
        result.input_tokens = int(output.prompt_len or 0)
        result.ttft_s = output.ttft + waited
        result.itl_s = list(output.itl)
        result.repeat_hits, result.repeat_words = lookup_hits(_context(request), output.generated_text or "")
        result.chunk_at = list(itertools.accumulate(output.itl, initial=(output.start_time or sent) + output.ttft))
    elif tap.stream_error:
        result.error = tap.stream_error
    elif tap.status not in (None, 200):
        result.error = f"HTTP {tap.status}: {tap.refusal or output.error}"
    else:   # a traceback (its last line names the exception), or a 200 with no chunk it could read
        result.bad_answer = tap.status == 200
        result.error = (("bad answer: " if result.bad_answer else "") +
                        (output.error.strip().splitlines() or ["no answer"])[-1])[:300]
    return result


_WORD = re.compile(r"\S+")


def lookup_hits(context: str, output: str, n: int = 2) -> tuple[int, int]:
    """How repetitive an answer is, in the spirit of prompt lookup (vLLM's ngram speculation), in
    words: of the output's words, those whose last n words occurred before, in the prompt or the
    output so far, and were then (at their latest occurrence) followed by this same word. Returns
    (hits, output words). Greedy loops score near 1, fresh sampled prose near 0. vLLM matches tokens,
    the longest suffix up to prompt_lookup_max, and drafts k of them: this fixed-n, one-word view
    ranks traffic for speculation (the planner's threshold is calibrated on it, docs/results.md)
    rather than predicting an acceptance rate."""
    before, words = _WORD.findall(context), _WORD.findall(output)
    seen = before + words
    last: dict[tuple, int] = {}   # each n-gram's latest end position so far
    for i in range(n, len(before)):   # the prompt's last n words are looked up by the first output word
        last[tuple(seen[i - n:i])] = i
    hits = 0
    for i in range(len(before), len(seen)):
        key = tuple(seen[i - n:i]) if i >= n else None
        at = last.get(key) if key else None
        hits += at is not None and at < i and seen[at] == seen[i]
        if key:
            last[key] = i
    return hits, len(words)


def _context(request: Request) -> str:
    if request.endpoint == "chat":
        return "\n".join(str(m.get("content", "")) for m in request.body.get("messages", []))
    return str(request.body.get("prompt", ""))


def _finish(choice: dict) -> str:
    """vLLM's finish_reason 'stop' with no stop_reason is the end-of-sequence token."""
    reason = str(choice["finish_reason"])
    if reason == "stop":
        return "stop" if choice.get("stop_reason") is not None else "eos"
    return reason


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
    def for_workload(below_tps: float, workload: Workload) -> Pruner:
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
    done: list[RequestResult] = []
    stop = asyncio.Event()
    answered = [asyncio.Event() for _ in requests]
    before = previous_turns(requests)

    async def bounded(i: int, request: Request, at: float | None) -> RequestResult | None:
        try:
            if at:
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            arrival = None if at is None else start + at
            if (previous := before[i]) is not None:
                await answered[previous].wait()
                arrival = None if arrival is None else max(arrival, time.perf_counter())
            async with gate:
                if stop.is_set():
                    return None
                result = await one_request(session, base_url, model, request, arrival)
                result.exact_tokens = request.max_tokens if request.body.get("ignore_eos") else None
                done.append(result)
                if pruner and pruner.hopeless(done, time.perf_counter() - start):
                    stop.set()
                return result
        finally:
            answered[i].set()

    session = _session(concurrency)
    try:
        start = time.perf_counter()
        times = offsets if offsets is not None else [None] * len(requests)
        results = await asyncio.wait_for(
            asyncio.gather(*(bounded(i, r, at) for i, (r, at) in enumerate(zip(requests, times, strict=False)))),
            timeout_s)
        return [r for r in results if r is not None], time.perf_counter() - start
    finally:
        await session.close()


def previous_turns(requests: list[Request]) -> list[int | None]:
    """For each request, the index of its conversation's previous turn among these requests (None: none)."""
    last: dict[str, int] = {}
    out: list[int | None] = []
    for i, r in enumerate(requests):
        out.append(last.get(r.conversation) if r.conversation is not None else None)
        if r.conversation is not None:
            last[r.conversation] = i
    return out


def steady_window(results: list[RequestResult], concurrency: int) -> tuple[float, float] | None:
    """The closed-loop phase's steady window (perf_counter bounds): from the moment every one of its
    first `concurrency` requests has streamed its first token to the moment its last request was sent.
    None at one stream, or where the phase has no such stretch (fewer than twice the concurrency, a
    failed first request, or the last send before the ramp ended)."""
    sent = sorted((r for r in results if r.sent_at is not None), key=lambda r: r.sent_at or 0.0)
    if concurrency <= 1 or len(sent) < 2 * concurrency or len(sent) < len(results):
        return None
    first = sent[:concurrency]
    if not all(r.ok and r.chunk_at for r in first):
        return None
    opens, closes = max(r.chunk_at[0] for r in first), sent[-1].sent_at or 0.0
    return (opens, closes) if closes > opens else None


def window_tokens(results: list[RequestResult], opens: float, closes: float) -> float:
    """Tokens whose chunk arrived in (opens, closes]: each request's count spread evenly over its chunks."""
    total = 0.0
    for r in results:
        if r.ok and r.chunk_at:
            inside = sum(1 for t in r.chunk_at if opens < t <= closes)
            total += r.output_tokens * inside / len(r.chunk_at)
    return total


def summarize(results: list[RequestResult], wall_s: float, requests: list[Request],
              window_concurrency: int = 1) -> BenchResult:
    """The phase's figures; requests are those it was given (a pruned phase answered only some).
    window_concurrency: the closed-loop phase's concurrency, for its steady window (1: open loop or
    one stream, the whole phase)."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    phase_tps = round(tokens / wall_s, 3) if wall_s > 0 else 0.0
    window = steady_window(results, window_concurrency)
    counted, span = (window_tokens(results, *window), window[1] - window[0]) if window else (tokens, wall_s)
    short = sum(1 for r in ok if r.exact_tokens is not None and r.output_tokens != r.exact_tokens)
    errors = [r for r in results if not r.ok]
    finish: dict[str, int] = {}
    for r in ok:
        finish[r.finish or "unknown"] = finish.get(r.finish or "unknown", 0) + 1
    samples = {"ttft_ms": [r.ttft_s for r in ok if r.ttft_s is not None], "itl_ms": [g for r in ok for g in r.itl_s],
               "latency_ms": [r.latency_s for r in ok],
               "tpot_ms": [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok
                           if r.ttft_s is not None and r.output_tokens > 1],
               "itl_token_ms": [g for r in ok for g in per_token_gaps(r)]}
    return BenchResult(
        tps=round(counted / span, 3) if window else phase_tps,
        output_tokens=tokens,
        wall_s=round(wall_s, 3),
        requests=len(results),
        errors=len(errors),
        short_outputs=short,
        ttft_ms=percentiles(samples["ttft_ms"]),
        itl_ms=percentiles(samples["itl_ms"]),
        latency_ms=percentiles(samples["latency_ms"]),
        first_error=errors[0].error if errors else None,
        finish=finish,
        draw_hash=keys_hash(requests),
        tpot_ms=percentiles(samples["tpot_ms"]),
        itl_token_ms=percentiles(samples["itl_token_ms"]),
        repeat_hits=sum(r.repeat_hits for r in ok),
        repeat_words=sum(r.repeat_words for r in ok),
        phase_tps=phase_tps,
        window_s=round(span, 3) if window else None,
        window_tokens=round(counted) if window else None,
        input_tokens=sum(r.input_tokens for r in ok),
        samples=samples,
    )


def bench_deadline_s(workload: Workload, floor_tps: float = 2.0) -> float:
    """A generous default deadline: every token at floor_tps per stream, plus slack."""
    longest = workload.longest_output()
    tokens = (workload.num_prompts + workload.warmup_count()) * longest
    return 60.0 + tokens / (floor_tps * workload.concurrency)
