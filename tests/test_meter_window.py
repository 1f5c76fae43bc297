"""The meter's steady window (sandbox.bench.steady_window): at concurrency C > 1 a phase's tokens/s
counts the tokens streamed between the end of its ramp (every one of its first C requests has its
first token) and the start of its drain (its last request sent). Pure tests on hand-made timings,
then phases against the stand-in server over real HTTP: a long drain does not move the figure, a
stalled tail lowers it, a slow first batch (a cold kernel) is left out, and every request is still
in the latencies. The real engine's phases are in docs/history.md (bench/phase_table.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
from test_meter_client import free_port
from test_traffic import FAKE, wait_up

from sandbox import bench
from sandbox.traffic import Request, TrafficError
from sandbox.workload import load_workload, sampling_path

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

def answered(sent: float, first: float, gap: float, tokens: int) -> bench.RequestResult:
    chunks = [first + i * gap for i in range(tokens)]
    return bench.RequestResult(ok=True, output_tokens=tokens, ttft_s=first - sent, latency_s=chunks[-1] - sent,
                               itl_s=[gap] * (tokens - 1), sent_at=sent, chunk_at=chunks)


def test_the_window_opens_when_every_first_slot_streams_and_closes_at_the_last_send():
    # Concurrency 2: requests 0 and 1 sent at 0 (first tokens at 1.0 and 1.5), 2 and 3 sent as they end.
    results = [answered(0.0, 1.0, 0.5, 5), answered(0.0, 1.5, 0.5, 3), answered(2.5, 3.0, 0.5, 4),
               answered(3.0, 3.5, 0.5, 10)]
    assert bench.steady_window(results, 2) == (1.5, 3.0)
    # Inside (1.5, 3.0]: request 0's chunks at 2.0, 2.5, 3.0; request 1's at 2.0, 2.5; request 2's at 3.0.
    assert bench.window_tokens(results, 1.5, 3.0) == pytest.approx(6)
    summary = bench.summarize(results, 8.0, [], window_concurrency=2)
    assert summary.window_s == 1.5 and summary.window_tokens == 6 and summary.tps == pytest.approx(4.0)
    assert summary.phase_tps == pytest.approx(22 / 8.0) and summary.output_tokens == 22
    # Every request in the latencies, the drain's included.
    assert summary.requests == 4 and len(summary.samples["latency_ms"]) == 4


def test_a_chunk_of_several_tokens_counts_its_share():
    """Speculative decoding streams several tokens a chunk: a request's usage count spread over its chunks."""
    r = answered(0.0, 1.0, 1.0, 4)
    r.output_tokens = 12   # 4 chunks of 3 tokens
    assert bench.window_tokens([r], 1.5, 3.0) == pytest.approx(6)


def test_no_window_at_one_stream_open_loop_or_a_phase_too_short():
    results = [answered(float(i), i + 0.5, 0.1, 3) for i in range(8)]
    assert bench.steady_window(results, 1) is None                  # one stream: the whole phase is steady
    assert bench.steady_window(results[:3], 2) is None              # fewer than twice the concurrency
    failed = [bench.RequestResult(ok=False, error="x", sent_at=0.0), *results[1:]]
    assert bench.steady_window(failed, 2) is None                   # a first slot never streamed
    summary = bench.summarize(results, 10.0, [], window_concurrency=1)
    assert summary.window_s is None and summary.tps == summary.phase_tps == pytest.approx(24 / 10.0)


def phase(lengths: list[int], tag: str) -> list[Request]:
    return [Request("completions", {"prompt": f"{tag} {i}", "max_tokens": n, "temperature": 0.0}, i + 1)
            for i, n in enumerate(lengths)]


@contextmanager
def stand_in(token_s: float, **env: str):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE), "--model", "m", "--host", "127.0.0.1", "--port", str(port)],
                            env={**os.environ, "FAKE_TOKEN_S": str(token_s), **env},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url)
        yield url
    finally:
        proc.kill()
        proc.wait()


def measure(url: str, requests: list[Request], concurrency: int) -> bench.BenchResult:
    results, wall = asyncio.run(bench.run_requests(url, "m", requests, concurrency, 120))
    assert all(r.ok for r in results)
    return bench.summarize(results, wall, requests, window_concurrency=concurrency)


C = 4
MIXED = [8, 16, 24, 32] * 8   # 32 requests: 8 times the concurrency


def test_a_long_drain_moves_the_whole_phase_but_not_the_window():
    """The same requests, the longest last (a long drain: one request streams alone at the end) or
    first: the whole-phase figure reads the drain, the window reads the server's steady pace."""
    long_tail = sorted(MIXED)[:-1] + [160]
    short_tail = sorted(long_tail, reverse=True)
    with stand_in(0.004) as url:
        late = measure(url, phase(long_tail, "late"), C)
        early = measure(url, phase(short_tail, "early"), C)
    assert late.phase_tps < 0.85 * early.phase_tps, (late.phase_tps, early.phase_tps)
    assert abs(late.tps / early.tps - 1) < 0.12, (late.tps, early.tps)
    assert late.output_tokens == early.output_tokens == sum(long_tail)


def test_a_stalled_tail_reads_lower_not_higher():
    """The stand-in stalls its last quarter of answers 0.6 s before their first token: slots sit idle
    inside the window (the clients wait for them before they can send the last requests), so the
    figure must fall; the stalled requests are in the latencies."""
    requests = phase(MIXED, "tail")
    with stand_in(0.004) as url:
        steady = measure(url, requests, C)
    with stand_in(0.004, FAKE_STALL="24:0.6") as url:
        stalled = measure(url, requests, C)
    assert stalled.tps < 0.8 * steady.tps, (stalled.tps, steady.tps)
    assert stalled.requests == steady.requests == 32
    assert stalled.ttft_ms["p99"] >= 600 > steady.ttft_ms["p99"]


def test_a_slow_first_batch_is_the_ramp_and_stays_out():
    """A cold first batch (the stand-in holds its first C answers 0.8 s, as a kernel compiled on first
    use would) is before the window opens: the phase reads as a warm one does."""
    with stand_in(0.004) as url:
        warm = measure(url, phase(MIXED, "warm"), C)
    with stand_in(0.004, FAKE_STALL="0:0.8", FAKE_STALL_COUNT=str(C)) as url:
        cold = measure(url, phase(MIXED, "cold"), C)
    assert cold.phase_tps < 0.8 * warm.phase_tps, (cold.phase_tps, warm.phase_tps)
    assert abs(cold.tps / warm.tps - 1) < 0.12, (cold.tps, warm.tps)


def test_warm_ups_fill_the_concurrency_and_reach_every_sampling_path(tmp_path):
    """At concurrency 4: 8 warm-ups at least; a sampling path first seen at request 20 of the search
    split's first quarter extends them to it; the first measured request is the one after."""
    import json

    lines = [{"prompt": f"greedy {i}", "max_tokens": 8, "temperature": 0.0} for i in range(200)]
    traffic = tmp_path / "t.jsonl"
    traffic.write_text("".join(json.dumps(x) + "\n" for x in lines))
    workload = load_workload({"name": "w", "meter_version": 5, "concurrency": 4, "num_prompts": 32,
                              "warmup_requests": 1, "prompt_split": "search", "traffic": str(traffic)})
    assert workload.warmup_count() == 8
    from sandbox import workload as module

    def with_top_k(prompt: str):
        changed = [{**x, "temperature": 0.8, "top_k": 20} if x["prompt"] == prompt else x for x in lines]
        traffic.write_text("".join(json.dumps(x) + "\n" for x in changed))
        module._traffic.cache_clear(), module._seeded_pool.cache_clear()
        w = load_workload({"name": "w", "meter_version": 5, "concurrency": 4, "num_prompts": 32,
                           "warmup_requests": 1, "prompt_split": "search", "traffic": str(traffic)})
        search = w.pool("search")
        return w, search, next((i for i, r in enumerate(search) if r.body.get("top_k")), None)

    # The split and its order follow each request's hash: take a request that lands past the 8
    # warm-ups and inside the split's first quarter once it samples.
    workload, search, at = next(found for x in lines if (found := with_top_k(x["prompt"]))[2] is not None
                                and 8 <= found[2] < len(found[1]) // 4)
    assert workload.warmup_count() == at + 1
    assert {sampling_path(r) for r in workload.warmups()} == {sampling_path(r) for r in search}
    assert workload.measured(0)[0] == search[at + 1]


def test_the_gpu_default_warms_up_at_its_concurrency_on_every_early_path():
    default = load_workload("default")
    assert default.concurrency == 32 and default.warmup_count() >= 64
    search = default.pool("search")
    assert {sampling_path(r) for r in search[:len(search) // 4]} <= {sampling_path(r) for r in default.warmups()}
    assert len({r.sampled for r in default.warmups()}) == 2   # greedy and sampled both


def test_a_phase_shorter_than_eight_times_the_concurrency_is_refused():
    from dataclasses import replace

    default = load_workload("default")
    with pytest.raises(TrafficError, match=r"128 requests a phase at concurrency 32: a phase needs at least 256"):
        replace(default, num_prompts=128).check(2)
    replace(default, num_prompts=256).check(2)   # the shipped default fits its own file
