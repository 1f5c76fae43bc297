"""Traffic files: the formats users bring, read as vLLM's own benchmark loaders read them; the
hashed split; bad input named by file and line; and a meter no config can win by replay."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import bench
from sandbox.traffic import TrafficError, load, sharegpt_kept, split_of
from sandbox.workload import load_workload

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_server.py"


class WordTokenizer:
    """The tokenizer seam both loaders share (vLLM's datasets call tokenizer(text).input_ids)."""

    class _Out:
        def __init__(self, ids):
            self.input_ids = ids

    def __call__(self, text: str):
        return self._Out(list(range(len(text.split()))))


def count(text: str) -> int:
    return len(WordTokenizer()(text).input_ids)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def sharegpt_rows(n: int) -> list[dict]:
    rows = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"please tell me about topic number {i} in a few words"},
        {"from": "gpt", "value": " ".join(["word"] * (5 + 3 * i))},
        {"from": "human", "value": "thanks"}]} for i in range(n)]
    rows.append({"id": "no-reply", "conversations": [{"from": "human", "value": "hello there my friend"}]})
    rows.append({"id": "short", "conversations": [{"from": "human", "value": "hi"},
                                                  {"from": "gpt", "value": "a b c d e"}]})
    return rows


# ---- vLLM's own loaders read the same requests -------------------------------------------------

def test_sharegpt_is_read_as_vllm_bench_serve_reads_it(tmp_path):
    datasets = pytest.importorskip("vllm.benchmarks.datasets")
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(sharegpt_rows(12)))
    theirs = datasets.ShareGPTDataset(dataset_path=str(path), random_seed=0, disable_shuffle=True).sample(
        tokenizer=WordTokenizer(), num_requests=100, no_oversample=True)
    ours = load(path, count_tokens=count)
    assert ours.format == "sharegpt" and ours.skipped == 2   # no reply; a 1-word prompt (vLLM's rule)
    assert [(r.body["prompt"], r.max_tokens) for r in ours.requests] == \
        [(s.prompt, s.expected_output_len) for s in theirs]
    assert all(r.endpoint == "completions" for r in ours.requests)
    assert not sharegpt_kept(3, 10) and not sharegpt_kept(10, 3) and not sharegpt_kept(1025, 10)


def test_custom_dataset_lines_are_read_as_vllm_reads_them(tmp_path):
    datasets = pytest.importorskip("vllm.benchmarks.datasets")
    pytest.importorskip("pandas")
    path = write_jsonl(tmp_path / "custom.jsonl", [{"prompt": f"What is the capital of country {i}?",
                                                    "output_tokens": 10 + i} for i in range(9)])
    theirs = datasets.CustomDataset(dataset_path=str(path), random_seed=0, disable_shuffle=True).sample(
        tokenizer=WordTokenizer(), num_requests=9, skip_chat_template=True, no_oversample=True)
    ours = load(path)
    assert [(r.body["prompt"], r.max_tokens) for r in ours.requests] == \
        [(s.prompt, s.expected_output_len) for s in theirs]


def test_a_trace_is_read_with_the_timing_vllm_reads_from_it(tmp_path):
    """One file, both loaders: vLLM's timed trace reads timestamp, input_length and output_length (and
    makes up prompt tokens from hash_ids); ours reads the same timestamps and output lengths, and
    sends the line's own prompt."""
    datasets = pytest.importorskip("vllm.benchmarks.datasets.datasets")
    trace = write_jsonl(tmp_path / "trace.jsonl", [
        {"timestamp": 0.5 * i, "prompt": f"request {i} " * 3, "input_length": 6, "output_length": 8 + i,
         "hash_ids": [i]} for i in range(6)])
    theirs = datasets.TimedTrace(dataset_path=str(trace), random_seed=0, timed_trace_label_timestamp="timestamp",
                                 timed_trace_label_input_length="input_length",
                                 timed_trace_label_output_length="output_length",
                                 timed_trace_label_hash_ids="hash_ids").sample(tokenizer=FakeVocab(), num_requests=6)
    ours = load(trace)
    assert ours.format == "trace" and len(theirs) == 6
    assert ([(r.timestamp, r.max_tokens) for r in ours.requests]
            == [(s.timestamp, s.expected_output_len) for s in theirs])
    bare = write_jsonl(tmp_path / "bare.jsonl", [{"timestamp": 0, "input_length": 6, "output_length": 8}])
    with pytest.raises(TrafficError, match=":1: a request needs exactly one of prompt"):
        load(bare)   # lengths alone: the meter sends real requests, not made-up tokens


class FakeVocab(WordTokenizer):
    all_special_ids = [0]

    def get_vocab(self):
        return {f"t{i}": i for i in range(50)}


# ---- Formats, fields, the split -----------------------------------------------------------------

def test_openai_bodies_completions_and_chat_keep_their_own_parameters(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"model": "ignored", "prompt": "Once", "max_tokens": 40, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
         "stop": ["\n"], "seed": 3, "user": "u1", "n": 1, "stream": True},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "max_completion_tokens": 16, "temperature": 0},
    ])
    t = load(path)
    first, second = t.requests
    assert first.endpoint == "completions" and first.body == {"prompt": "Once", "max_tokens": 40, "temperature": 0.7,
                                                              "top_p": 0.9, "top_k": 20, "stop": ["\n"], "seed": 3}
    assert second.endpoint == "chat" and second.max_tokens == 16 and not second.sampled
    # What the meter sends from these bodies: test_meter_client.


def test_the_split_is_by_hash_so_identical_requests_share_a_side(tmp_path):
    rows = [{"prompt": f"p{i}", "max_tokens": 8} for i in range(300)] + [{"prompt": "p7", "max_tokens": 8}]
    t = load(write_jsonl(tmp_path / "t.jsonl", rows))
    search, heldout = t.split("search"), t.split("heldout")
    assert len(t.requests) == 301 and len(search) + len(heldout) == 300 and 30 < len(heldout) < 90
    sevens = [r for r in t.requests if r.body["prompt"] == "p7"]
    assert len({split_of(r.key) for r in sevens}) == 1   # both copies on one side, and one request there
    assert sum(r.body["prompt"] == "p7" for r in [*search, *heldout]) == 1
    # The same file in another order splits the same way.
    again = load(write_jsonl(tmp_path / "u.jsonl", list(reversed(rows))))
    assert [r.key for r in again.split("heldout")] == [r.key for r in heldout]
    assert t.summary()["heldout"]["hash"] == again.summary()["heldout"]["hash"]
    assert "p7" not in json.dumps(t.summary())   # hashes and shares, never text


@pytest.mark.parametrize("content, needle", [
    ("", "the file is empty"),
    ('{"prompt": "a", "max_tokens": 4}\n{"prompt": "b", "max_tokens": 4\n', ":2: not a JSON object"),
    ('{"prompt": "a", "max_tokens": 4, "colour": "red"}\n', ":1: field 'colour' is not an OpenAI request field"),
    ('{"prompt": "a", "max_tokens": 4, "n": 2}\n', ":1: n: 2 is refused"),
    ('{"prompt": "a", "max_tokens": 4, "stream": false}\n', ":1: stream: false is refused"),
    ('{"prompt": "a"}\n', ":1: no max_tokens"),
    ('{"prompt": "a", "max_tokens": "lots"}\n', ":1: max_tokens is 'lots'"),
    ('{"prompt": "a", "max_tokens": 4, "temperature": -1}\n', ":1: temperature is -1.0, outside"),
    ('{"prompt": "a", "messages": [], "max_tokens": 4}\n', ":1: a request needs exactly one of prompt"),
    ('{"messages": [{"role": "user"}], "max_tokens": 4}\n', ":1: messages[0]"),
    ('{"prompt": "a", "max_tokens": 4, "timestamp": 2}\n{"prompt": "b", "max_tokens": 4, "timestamp": 1}\n',
     ":2: timestamp 1.0 is before line 1's 2.0"),
    ('{"prompt": "a", "max_tokens": 4, "timestamp": 2}\n{"prompt": "b", "max_tokens": 4}\n', ":2: no timestamp"),
    ('{"prompt": "a", "max_tokens": 4, "continue_final_message": true}\n',
     ":1: continue_final_message is a chat field"),
    ('{"messages": [{"role": "user", "content": "a"}], "max_tokens": 4, "continue_final_message": true, '
     '"add_generation_prompt": false}\n', ":1: continue_final_message needs add_generation_prompt: false and an "
                                          "assistant message last"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "max_tokens": 4, '
     '"continue_final_message": true}\n', ":1: continue_final_message needs add_generation_prompt: false"),
])
def test_bad_traffic_is_one_line_naming_file_line_and_value(tmp_path, content, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TrafficError) as e:
        load(path)
    assert needle in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_chat_request_may_give_the_start_of_its_answer_for_the_model_to_continue(tmp_path):
    """vLLM's chat fields for an answer the client starts (an editing tool's label, a code fence): sent as
    given; the shipped edit chat file is made of them (bench/make_edit_traffic.py --chat)."""
    row = {"messages": [{"role": "user", "content": "Fix: teh cat"}, {"role": "assistant", "content": "Fixed:"}],
           "max_completion_tokens": 16, "add_generation_prompt": False, "continue_final_message": True}
    (request,) = load(write_jsonl(tmp_path / "t.jsonl", [row])).requests
    assert request.endpoint == "chat" and request.body == row
    shipped = load_workload("edits-chat-cpu")
    assert all(r.body["continue_final_message"] is True for r in shipped.requests_of("search"))


def test_a_file_too_small_for_a_sound_split_names_the_minimum(tmp_path):
    path = write_jsonl(tmp_path / "small.jsonl", [{"prompt": f"p{i}", "max_tokens": 8} for i in range(20)])
    w = load_workload({**load_workload("default-cpu").as_dict(), "traffic": str(path)})
    with pytest.raises(TrafficError, match=r"20 requests split into .* need at least 9 search .* and 8 held-out"):
        w.check(repeats=2)


# ---- A meter no config can win by replay ---------------------------------------------------------

def test_a_server_that_memoizes_responses_gains_on_replayed_requests_and_not_on_fresh_draws(tmp_path):
    """The stand-in answers a body it has seen at once and streams a new one at a fixed pace. The old
    meter (the same requests every repeat, the median kept) reads it as much faster than an honest
    server; the traffic meter, whose repeats draw fresh requests, reads both the same."""
    w = load_workload({**load_workload("smoke").as_dict(), "num_prompts": 3, "max_tokens": 12})

    def phases(memo: bool, replay: bool) -> float:
        port = 18600 + int(memo) * 2 + int(replay)
        env = {**os.environ, "FAKE_MODE": "memo" if memo else "ok", "FAKE_TOKEN_S": "0.02"}
        proc = subprocess.Popen([sys.executable, str(FAKE), "--model", "m", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_up(url)
            tps = []
            for repeat in range(3):
                requests = w.measured(0 if replay else repeat)
                results, wall = asyncio.run(bench.run_requests(url, "fake-model", requests, 1, 60))
                tps.append(bench.summarize(results, wall, requests).tps)
            return sorted(tps)[1]
        finally:
            proc.kill()
            proc.wait()

    old_gain = phases(memo=True, replay=True) / phases(memo=False, replay=True)
    new_gain = phases(memo=True, replay=False) / phases(memo=False, replay=False)
    assert old_gain > 3, old_gain
    assert 0.8 < new_gain < 1.25, new_gain


def wait_up(url: str) -> None:
    import httpx

    for _ in range(100):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never came up")


# ---- agent run --traffic: bad input stops the run before anything is written ----------------------

def agent_run(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "run", "--budget", "5m", *args],
                          env={**os.environ, "AGENT_HOME": str(home), "COLUMNS": "300"},
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def no_run_written(home: Path) -> bool:
    from agent.ledger import Ledger

    db = home / "ledger.sqlite"
    return not db.exists() or not Ledger(db).runs()


@pytest.mark.parametrize("content, needle", [
    ('{"prompt": "a", "max_tokens": 4}\n{"prompt": "b", "max_tokens": 4, "colour": 1}\n', ":2: field 'colour'"),
    ("", "the file is empty"),
])
def test_run_with_a_malformed_traffic_file_stops_with_one_line(tmp_path, content, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    proc = agent_run(tmp_path / "home", "--traffic", str(bad))
    assert proc.returncode == 2
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --traffic: ") and needle in lines[0] and str(bad) in lines[0]
    assert no_run_written(tmp_path / "home")


def test_run_refuses_requests_beyond_the_models_context_and_chat_without_a_template(tmp_path, embedded_model):
    rows = [{"prompt": f"p{i}", "max_tokens": 8} for i in range(80)]
    long = write_jsonl(tmp_path / "long.jsonl", rows[:40] + [{"prompt": "x", "max_tokens": 40000}] + rows[40:])
    proc = agent_run(tmp_path / "home", "--traffic", str(long), "--model", str(embedded_model))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and f"{long}:41: " in said and "beyond the model's context of 32768" in said
    chat = write_jsonl(tmp_path / "chat.jsonl", rows[:10] + [{"messages": [{"role": "user", "content": "hi"}],
                                                               "max_tokens": 8}] + rows[10:])
    proc = agent_run(tmp_path / "home", "--traffic", str(chat), "--model", str(embedded_model))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and f"{chat}:11: a chat request" in said and "--chat-template" in said
    small = write_jsonl(tmp_path / "small.jsonl", rows[:12])
    proc = agent_run(tmp_path / "home", "--traffic", str(small), "--model", str(embedded_model))
    assert proc.returncode == 2 and "need at least 9 search" in proc.stdout + proc.stderr
    assert no_run_written(tmp_path / "home")


def test_a_run_on_user_traffic_keeps_held_out_requests_out_of_search_and_prompts_out_of_branches(
        tmp_path, embedded_model):
    """A real `agent run --traffic` with the deterministic engine at its seam: every spec the loop sends
    is read back; search trials never draw a held-out request, held-out instances draw only held-out
    ones; branches, commit messages and the HTML report carry hashes, never a prompt."""
    from agent.ledger import Ledger

    marker = "zebra-quartz-{}"
    rows = [{"prompt": f"{marker.format(i)} tell me something", "max_tokens": 16 + i % 5,
             **({"temperature": 0.8} if i % 2 else {"temperature": 0})} for i in range(120)]
    source = write_jsonl(tmp_path / "mine.jsonl", rows)
    home, specs = tmp_path / "home", tmp_path / "specs.jsonl"
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.05", "AGENT_TEST_SPECS": str(specs)}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "agent_with_seam_engine.py"), "run", "--budget", "25s",
                           "--traffic", str(source),
                           "--model", str(embedded_model), "--max-trials", "6"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "traffic: default-cpu+traffic: mine.jsonl, 120 requests" in proc.stdout + proc.stderr
    (run,) = Ledger(home / "ledger.sqlite").runs()
    import hashlib

    given = run.settings["traffic_source"]
    assert given["file"] == "mine.jsonl" and given["file_hash"] == hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    assert run.settings["traffic"]["split_hash"] and run.settings["traffic"]["traffic"]["requests"] == 120
    # Every trial serves the context the branch ships: the model's own maximum, not the traffic's longest
    # request (35 tokens with its greedy quality answers), which is kept beside it.
    assert run.settings["max_model_len"] == 32768 and run.settings["longest_request"] == 35
    # The shipped space's noise prior, recorded once, in the run's settings as it started.
    assert run.settings["gate"]["noise_prior"] == {"sd": 0.07, "df": 4} and "noise_prior" not in run.calibration
    assert "with the space's prior ±7.0% worth 4 df" in proc.stdout + proc.stderr
    heldout_keys = {r.key for r in load_workload(run.settings["workload"]).pool("heldout")}
    sent = [json.loads(line) for line in specs.read_text().splitlines()]
    assert len(sent) >= 4
    for spec in sent:
        w = load_workload(spec["workload"])
        assert spec["flags"]["max-model-len"] == 32768
        drawn = [*w.warmups(), *(r for rep in range(spec["repeats"]) for r in w.measured(rep))]
        if spec.get("quality") != "none":
            drawn += w.quality_requests(8)
        if w.prompt_split == "search":
            assert not {r.key for r in drawn} & heldout_keys
        else:
            assert {r.key for r in w.measured(0)} <= heldout_keys and not {r.key for r in w.warmups()} & heldout_keys
    branches = subprocess.run(["git", "-C", str(home / "proposals"), "log", "--all", "-p", "--format=%B"],
                              capture_output=True, text=True, check=True).stdout
    assert f"Measured on: default-cpu+traffic meter v4, mine.jsonl (openai, sha256 {given['file_hash']}" in branches
    report = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "agent.cli", "report", "--html", str(report)], env=env, check=True,
                   capture_output=True, cwd=ROOT)
    for text in (branches, report.read_text(), proc.stdout):
        assert "zebra-quartz" not in text


@pytest.mark.parametrize("field, value", [
    ("repetition_penalty", -1), ("repetition_penalty", 0), ("min_tokens", 64), ("logit_bias", {"x": "y"}),
    ("logit_bias", {"12": 500}), ("stop_token_ids", ["x"]), ("stop_token_ids", [-3]), ("frequency_penalty", 3),
    ("presence_penalty", -2.5), ("temperature", 5), ("response_format", {"type": "yaml"})])
def test_values_vllm_would_answer_400_to_are_refused_before_any_server_starts(tmp_path, field, value):
    """Each would reach vLLM, which answers 400 only after the model loads (the run failing at its
    defaults); the reader refuses it with the file, the line and the value (min_tokens: above max_tokens 16)."""
    path = tmp_path / "t.jsonl"
    good = {"prompt": "Hello", "max_tokens": 16}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n")
    with pytest.raises(TrafficError) as e:
        load(path)
    assert f"{path}:2" in str(e.value) and field in str(e.value), str(e.value)
