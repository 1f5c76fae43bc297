"""Multi-turn traffic: conversations replayed turn by turn with their history.

ShareGPT conversations with --multi-turn, or OpenAI lines sharing a `conversation` id, become turns
that stay together on one side of the split, adjacent and in order in every draw; the meter sends a
turn only after the turn before it was answered, so what a server gains from a conversation's
shared prefix is measured as served, and nothing else is.
"""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_traffic import FAKE, wait_up

from sandbox import bench
from sandbox.traffic import TrafficError, load

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

words = lambda text: len(text.split())   # noqa: E731  a tokenizer for the tests: one token a word


def sharegpt(path: Path, conversations: list[list[str]]) -> Path:
    path.write_text(json.dumps([{"id": f"c{i}", "conversations": [
        {"from": "human" if j % 2 == 0 else "gpt", "value": v} for j, v in enumerate(turns)]}
        for i, turns in enumerate(conversations)]))
    return path


def test_sharegpt_turn_by_turn_carries_the_history_and_each_replys_length(tmp_path):
    path = sharegpt(tmp_path / "sg.json", [
        ["what is the boiling point of water", "one hundred degrees at sea level",
         "and on a mountain", "lower since the air pressure falls with height",
         "why", "water boils when its vapour pressure meets the air's"],
        ["tell me a joke about cats please", "cats do not tell jokes they are the joke", "ha"],   # unanswered last
    ])
    first_only = load(path, count_tokens=words)
    assert [r.endpoint for r in first_only.requests] == ["completions", "completions"]
    turns = load(path, count_tokens=words, multi_turn=True).requests
    assert [(r.conversation, r.turn) for r in turns] == [("c0", 0), ("c0", 1), ("c0", 2), ("c1", 0)]
    assert all(r.endpoint == "chat" for r in turns)
    third = turns[2].body["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    assert third[1]["content"] == "one hundred degrees at sea level" and third[-1]["content"] == "why"
    assert [r.max_tokens for r in turns] == [6, 8, 9, 9]
    assert turns[1].body["messages"] == third[:3]   # each turn's history is the one before it, grown


def test_a_conversation_stays_on_one_side_of_the_split_its_turns_adjacent_and_in_order(tmp_path):
    path = tmp_path / "conv.jsonl"
    lines = []
    for turn in range(3):   # the file interleaves conversations; the draws must not
        for c in range(60):
            lines.append({"conversation": f"chat-{c}", "messages": [{"role": "user", "content": f"c{c} t{turn}"}],
                          "max_tokens": 8})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    traffic = load(path)
    assert {r.turn for r in traffic.requests} == {0, 1, 2}
    sides = {}
    for name in ("search", "heldout"):
        part = traffic.split(name)
        assert part, name
        for r in part:
            sides.setdefault(r.conversation, set()).add(name)
        order = [(r.conversation, r.turn) for r in part]
        for c in {r.conversation for r in part}:
            at = [i for i, (conv, _) in enumerate(order) if conv == c]
            assert at == list(range(at[0], at[0] + 3)) and [order[i][1] for i in at] == [0, 1, 2]
    assert all(len(s) == 1 for s in sides.values()) and len(sides) == 60


@pytest.mark.parametrize("value", [True, [1], {"a": 1}, ""])
def test_a_bad_conversation_id_is_one_line_naming_the_file_and_line(tmp_path, value):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "a", "max_tokens": 2}) + "\n" +
                    json.dumps({"prompt": "b", "max_tokens": 2, "conversation": value}) + "\n")
    with pytest.raises(TrafficError) as e:
        load(path)
    assert str(e.value).startswith(f"{path}:2: conversation is ")


def test_the_meter_sends_a_turn_only_after_the_turn_before_it_was_answered(tmp_path):
    """Three conversations of three turns at concurrency 8: the conversations run side by side, and
    within each a turn arrives only after the previous one streamed its 10 tokens of 20 ms."""
    record = tmp_path / "record.jsonl"
    port = 18640
    env = {**os.environ, "FAKE_TOKEN_S": "0.02", "FAKE_RECORD": str(record)}
    proc = subprocess.Popen([sys.executable, str(FAKE), "--model", "m", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps({"conversation": c, "prompt": f"{c} turn {t}", "max_tokens": 10}) + "\n"
                            for c in ("a", "b", "c") for t in range(3)))
    requests = list(load(path).requests)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url)
        record.write_text("")
        results, wall = asyncio.run(bench.run_requests(url, "fake-model", requests, 8, 60))
    finally:
        proc.kill()
        proc.wait()
    assert len(results) == 9 and all(r.ok for r in results)
    arrived = {json.loads(x)["body"]["prompt"]: json.loads(x)["at"] for x in record.read_text().splitlines()}
    for c in ("a", "b", "c"):
        at = [arrived[f"{c} turn {t}"] for t in range(3)]
        assert at[1] - at[0] >= 0.2 and at[2] - at[1] >= 0.2, at   # 10 tokens of 20 ms each, answered first
    firsts = [arrived[f"{c} turn 0"] for c in ("a", "b", "c")]
    assert max(firsts) - min(firsts) < 0.15   # the three conversations side by side, not one after another
    assert 0.6 <= wall < 1.5


def test_without_conversations_requests_still_go_out_together(tmp_path):
    """The same nine requests with no conversation ids: all in flight at once at concurrency 9."""
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"r {i}", "max_tokens": 10}) + "\n" for i in range(9)))
    assert bench.previous_turns(list(load(path).requests)) == [None] * 9
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"conversation": c, "prompt": f"{c} {t}", "max_tokens": 10}) + "\n"
                            for t in range(2) for c in ("a", "b")))
    assert bench.previous_turns(list(load(conv).requests)) == [None, None, 0, 1]


def test_the_runs_copy_keeps_each_turn_in_its_conversation(tmp_path):
    """The night measures the run's own copy (OpenAI bodies): read back, it is the same turns."""
    from agent.traffic import prepare

    path = sharegpt(tmp_path / "sg.json", [["how do magnets work exactly", "moving charges make fields",
                                            "and why do they stick", "opposite poles pull together"]])
    found = prepare(path, tmp_path / "copy.jsonl", words, multi_turn=True)
    again = load(tmp_path / "copy.jsonl")
    assert again.format == "openai"
    assert [(r.key, r.conversation, r.turn) for r in again.requests] == \
        [(r.key, r.conversation, r.turn) for r in found.requests] == [(found.requests[0].key, "c0", 0),
                                                                       (found.requests[1].key, "c0", 1)]


def test_multi_turn_without_a_traffic_file_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--budget", "1m", "--multi-turn"],
                          capture_output=True, text=True, env={**os.environ, "AGENT_HOME": str(tmp_path)})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: --multi-turn: replays a --traffic file's conversations turn by turn; give --traffic FILE"]
