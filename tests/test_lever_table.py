"""bench/lever_table.py, the lever table's script, on the stand-in server (its real-engine runs are the
GPU blocks, docs/history.md): the levers take turns on fresh servers, a known loser reads below 1
beyond its interval, a lever whose server refuses to start is a row saying so, and the table is
printed from the raw lines alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import lever_table  # noqa: E402

FAKE = ROOT / "tests" / "fake_server.py"


def test_levers_take_turns_and_a_batch_limit_below_the_concurrency_loses(tmp_path, monkeypatch, embedded_model):
    """The stand-in serves any model; the prepared one gives the script its tokenizer (the context length)."""
    monkeypatch.setenv("FAKE_TOKEN_S", "0.001")
    monkeypatch.setitem(lever_table.SHAPES, "tiny-c8", lever_table.Shape("tiny-c8", "default", 8, 64, 16))
    monkeypatch.setitem(lever_table.LEVERS, "max-num-seqs-2", ["--max-num-seqs", "2"])
    monkeypatch.setitem(lever_table.LEVERS, "refused", ["--max-num-seqs", "-1"])
    monkeypatch.setitem(lever_table.LEVERS, "max-num-seqs-4", ["--max-num-seqs", "4"])
    out = tmp_path / "levers.jsonl"
    assert lever_table.main(["run", "--shape", "tiny-c8", "--lever", "max-num-seqs-2", "--lever", "refused",
                             "--instances", "2", "--also", "max-num-seqs-4", "--bar", "100", "--budget-s", "3600",
                             "--launcher", str(FAKE), "--model", str(embedded_model),
                             "--space", str(ROOT / "search_space" / "vllm-cpu.yaml"),
                             "--out", str(out), "--raw", str(tmp_path / "raw")]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["lever"] for r in rows] == ["defaults", "max-num-seqs-2", "refused"] * 2 + ["max-num-seqs-4"]
    assert [r["instance"] for r in rows] == list(range(7))
    measured = [r for r in rows if r["lever"] != "refused"]
    assert all(r["errors"] == 0 and r["requests"] == 64 and r["tps"] > 0 for r in measured)
    assert all(r["failure"] == "invalid_config" for r in rows if r["lever"] == "refused")
    assert all((tmp_path / "raw" / f"{r['run']}-{r['instance']:03d}-{r['lever']}.tiny-c8.metrics.txt").exists()
               for r in measured)
    # Every instance got the same requests: the same output tokens, whatever the config.
    assert len({r["output_tokens"] for r in measured}) == 1
    loser = lever_table.comparisons(rows)[(rows[0]["run"], "tiny-c8", "max-num-seqs-2")]
    assert loser.high < 1 and loser.ratio < 0.5   # 2 slots of 8: about a quarter the speed
    once = lever_table.comparisons(rows)[(rows[0]["run"], "tiny-c8", "max-num-seqs-4")]   # --also: one instance,
    assert once.high < 1 and loser.ratio < once.ratio                                    # the pooled noise
    text = lever_table.table([out])
    assert "| max-num-seqs-2 | 2 |" in text and f"{loser.ratio:.3f} [{loser.low:.3f}, {loser.high:.3f}]" in text
    assert "| refused | failed to start | invalid_config" in text


def test_the_next_instance_goes_to_the_widest_row_or_to_the_defaults_when_they_have_fewer():
    def rows(lever, values):
        return [{"run": "r", "shape": "s", "lever": lever, "instance": f"{lever}{i}", "tps": v}
                for i, v in enumerate(values)]

    tight = rows("defaults", [100, 101, 99]) + rows("a", [120, 121, 119])
    assert lever_table.next_lever(tight, ["defaults", "a"], 0.05) is None
    wide = tight + rows("b", [80, 120])   # one lever spreads: the pooled noise widens every row
    assert lever_table.next_lever(wide, ["defaults", "a", "b"], 0.05) == "b"
    assert lever_table.next_lever(wide + rows("b", [90, 110]), ["defaults", "a", "b"], 0.05) == "defaults"


def test_the_spread_between_instances_of_the_defaults_is_read_per_shape():
    cold = [{"lever": "defaults", "instance": 0, "shape": "a", "tps": 60.0}]   # the run's first: left out
    rows = cold + [{"lever": "defaults", "instance": 1, "shape": "a", "tps": 100.0},
                   {"lever": "defaults", "instance": 1, "shape": "b", "tps": 50.0},
                   {"lever": "x", "instance": 2, "shape": "a", "tps": 300.0}]
    assert lever_table.defaults_spread(rows) is None   # one warm instance a shape: nothing to compare
    rows.append({"lever": "defaults", "instance": 3, "shape": "a", "tps": 170.0})
    assert abs(lever_table.defaults_spread(rows) - 0.7) < 1e-9   # the H100 host of 2026-12-06 read 1.7x
