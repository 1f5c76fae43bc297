"""The meter's requests go through vLLM's own request functions (what `vllm bench serve` sends):
what reaches the server, and what the meter keeps that those functions drop (how a stream ended,
a refusal's body, an error in the stream). Against the stand-in server over real HTTP; the
real-engine tests (test_run_real, test_harness) read the same fields from vLLM itself."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_traffic import FAKE, wait_up

from sandbox import bench
from sandbox.traffic import load

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fake(tmp_path: Path, mode: str = "ok", token_s: float = 0.001):
    port, record = free_port(), tmp_path / f"record-{mode}.jsonl"
    env = {**os.environ, "FAKE_MODE": mode, "FAKE_TOKEN_S": str(token_s), "FAKE_RECORD": str(record)}
    proc = subprocess.Popen([sys.executable, str(FAKE), "--model", "m", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url)
        record.write_text("")
        yield url, record
    finally:
        proc.kill()
        proc.wait()


def two_requests(tmp_path: Path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt": "Once", "max_tokens": 6, "temperature": 0.7, "top_k": 20,
                                "stop": ["\n"], "seed": 3}) + "\n" +
                    json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Hi"}],
                                "max_completion_tokens": 4, "temperature": 0}) + "\n")
    return list(load(path).requests)


def test_the_users_bodies_reach_the_server_as_given_with_streaming_added(tmp_path):
    requests = two_requests(tmp_path)
    with fake(tmp_path) as (url, record):
        results, wall = asyncio.run(bench.run_requests(url, "served-name", requests, 2, 30))
    sent = {json.loads(x)["path"]: json.loads(x)["body"] for x in record.read_text().splitlines()}
    completion, chat = sent["/v1/completions"], sent["/v1/chat/completions"]
    assert {k: completion[k] for k in ("prompt", "max_tokens", "temperature", "top_k", "stop", "seed")} == \
        {"prompt": "Once", "max_tokens": 6, "temperature": 0.7, "top_k": 20, "stop": ["\n"], "seed": 3}
    assert completion["model"] == chat["model"] == "served-name"
    assert completion["stream"] is chat["stream"] is True
    assert completion["stream_options"] == chat["stream_options"] == {"include_usage": True}
    assert chat["messages"] == requests[1].body["messages"] and chat["max_completion_tokens"] == 4
    assert "max_tokens" not in chat and chat["temperature"] == 0
    # What came back: tokens from the usage record, one TTFT and a gap per later chunk, how it ended.
    assert [r.ok for r in results] == [True, True] and [r.output_tokens for r in results] == [6, 4]
    assert [len(r.itl_s) for r in results] == [5, 3] and all(r.ttft_s > 0 for r in results)
    assert [r.finish for r in results] == ["length", "length"]
    summary = bench.summarize(results, wall, requests)
    assert summary.output_tokens == 10 and summary.finish == {"length": 2} and summary.errors == 0


def test_a_refusal_keeps_its_status_and_the_servers_words(tmp_path):
    requests = two_requests(tmp_path)
    with fake(tmp_path, "errors") as (url, _):
        results, wall = asyncio.run(bench.run_requests(url, "m", requests, 2, 30))
    assert [r.ok for r in results] == [False, False]
    assert all(r.error.startswith("HTTP 500: ") and "fake internal error" in r.error for r in results)
    summary = bench.summarize(results, wall, requests)
    assert summary.errors == 2 and summary.output_tokens == 0 and "fake internal error" in summary.first_error


def test_an_error_sent_in_the_stream_fails_the_request(tmp_path):
    """vLLM's request function counts a stream that began as a success; the meter does not."""
    requests = two_requests(tmp_path)[:1]
    with fake(tmp_path, "stream_error") as (url, _):
        results, _ = asyncio.run(bench.run_requests(url, "m", requests, 1, 30))
    assert not results[0].ok and results[0].error.startswith("stream error:") and "fake engine died" in results[0].error


def test_no_server_is_an_error_naming_the_connection(tmp_path):
    requests = two_requests(tmp_path)[:1]
    results, _ = asyncio.run(bench.run_requests(f"http://127.0.0.1:{free_port()}", "m", requests, 1, 30))
    assert not results[0].ok and "connect" in results[0].error.lower(), results[0].error


def test_open_loop_latency_counts_the_wait_for_a_free_slot(tmp_path):
    """Two requests arrive together at concurrency 1: the second's TTFT includes the first's answer."""
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "max_tokens": 50}) + "\n" for i in range(2)))
    requests = list(load(path).requests)
    with fake(tmp_path) as (url, _):
        results, _ = asyncio.run(bench.run_requests(url, "m", requests, 1, 30, offsets=[0.0, 0.0]))
    first, second = sorted(results, key=lambda r: r.ttft_s)
    assert second.ttft_s >= first.latency_s * 0.9, (first, second)
    assert second.latency_s >= first.latency_s + second.latency_s * 0.4


def test_the_meter_agreement_script_runs_in_a_minute_and_both_meters_count_alike(tmp_path, embedded_model):
    """bench/meter_vs_vllm_bench.py against a running server (--url): the agent's meter and
    `vllm bench serve` itself, interleaved, sampled and seeded alike; on the stand-in server (10 ms a
    token, sleep-bound) the two must read the same tokens and nearly the same rate. The figures on
    real vLLM are in docs/meter-vs-vllm-bench.md, from the same script."""
    script = Path(__file__).resolve().parents[1] / "bench" / "meter_vs_vllm_bench.py"
    # At 1 ms a token a round lasted 0.3 s, and the clients' own overhead decided the ratio (CI read 0.84).
    with fake(tmp_path, token_s=0.01) as (url, record):
        out = tmp_path / "out"
        proc = subprocess.run([sys.executable, str(script), "--url", url, "--model", str(embedded_model),
                               "--pairs", "2", "--sampled", "0.8", "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        sent = [json.loads(x) for x in record.read_text().splitlines()]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["order"] for r in rounds] == [["agent", "vllm"], ["vllm", "agent"]]
    for r in rounds:
        assert r["agent"]["tokens"] == r["vllm"]["tokens"] and r["agent"]["requests"] == r["vllm"]["requests"] == 4
        assert 0.85 < r["ratio_agent"] < 1.15, r
    measured = [s["body"] for s in sent if s["path"] == "/v1/completions" and s["body"].get("temperature") == 0.8]
    seeded = [b for b in measured if b.get("seed") == 0]   # the one warm-up carries its own draw's seed
    assert len(seeded) == 16 and len(measured) == 17 and not any(b.get("ignore_eos") for b in measured)
    assert "| mean |" in (out / "table.md").read_text()
