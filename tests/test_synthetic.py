"""`agent traffic random`: a synthetic traffic file from length distributions, for users without logs.

The file is drawn by vLLM's own random dataset with the model's tokenizer, so it must hold exactly
what `vllm bench serve --dataset-name random` would send for the same seed and lengths, read back
as an ordinary traffic file, and be reproducible from its seed.
"""

import json
import os
import subprocess
import sys

import pytest

from sandbox.traffic import load

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

def _write(out, *args):
    return subprocess.run([sys.executable, "-m", "agent.cli", "traffic", "random", str(out), *args],
                          capture_output=True, text=True, env={**os.environ, "AGENT_HOME": str(out.parent)})


@pytest.fixture(scope="module")
def written(embedded_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic") / "random.jsonl"
    proc = _write(out, "--model", str(embedded_model), "--input-len", "96", "--output-len", "40",
                  "--range-ratio", "0.5", "--num-prompts", "60", "--seed", "7", "--temperature", "0.8")
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr


def test_the_file_is_what_vllms_random_dataset_draws_for_the_seed(written, embedded_model):
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets import RandomDataset

    out, _ = written
    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    theirs = RandomDataset(random_seed=7).sample(tokenizer=tokenizer, num_requests=60, range_ratio=0.5,
                                                 input_len=96, output_len=40)
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    assert [b["prompt"] for b in ours] == [r.prompt for r in theirs]
    assert [b["max_tokens"] for b in ours] == [r.expected_output_len for r in theirs]
    assert all(b["ignore_eos"] is True and b["temperature"] == 0.8 for b in ours)


def test_lengths_follow_the_distribution_and_the_file_reads_as_traffic(written, embedded_model):
    from transformers import AutoTokenizer

    out, printed = written
    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    traffic = load(out)
    assert traffic.format == "openai" and len(traffic.requests) == 60
    outputs = [r.max_tokens for r in traffic.requests]
    prompts = [len(tokenizer(r.body["prompt"], add_special_tokens=False).input_ids) for r in traffic.requests]
    assert 20 <= min(outputs) and max(outputs) <= 60 and len(set(outputs)) > 10   # uniform in [20, 60]
    assert 47 <= min(prompts) and max(prompts) <= 145 and len(set(prompts)) > 10  # about [48, 144], re-encoded
    assert all(r.sampled for r in traffic.requests)
    assert "60 requests" in printed and "seed 7" in printed


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_prompts(written, embedded_model, tmp_path):
    from agent.synthetic import Shape, write

    out, _ = written
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    write(Shape(96, 40, 0.5, 60, 7, True, 0.8), str(embedded_model), again)   # in this process, not the CLI's
    write(Shape(96, 40, 0.5, 60, 8, True, 0.8), str(embedded_model), other)
    assert again.read_bytes() == out.read_bytes()
    assert other.read_text().splitlines()[0] != out.read_text().splitlines()[0]


@pytest.mark.parametrize("args, named", [(["--range-ratio", "1.5"], "--range-ratio"),
                                         (["--num-prompts", "0"], "--num-prompts"),
                                         (["--rate", "0"], "--rate"),
                                         (["--rate", "2", "--burstiness", "0"], "--burstiness"),
                                         (["--model", "/nowhere/model"], "--model")])
def test_bad_options_are_one_line_naming_the_option(tmp_path, args, named):
    out = tmp_path / "x.jsonl"
    proc = _write(out, *args)
    assert proc.returncode == 2 and not out.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]


def test_with_a_rate_the_file_is_a_trace_with_vllms_gamma_send_times(embedded_model, tmp_path):
    """--rate R --burstiness B: each request a timestamp, the gaps vllm bench serve draws for the seed
    (sandbox.arrivals.unit_times), so the file replays under --arrivals trace at about R requests/s."""
    from agent.synthetic import Shape, write
    from sandbox.arrivals import mean_rate, unit_times

    out = tmp_path / "trace.jsonl"
    rows = write(Shape(32, 8, 0.5, 200, 3, True, None, rate=4.0, burstiness=0.5), str(embedded_model), out)
    times = [r["timestamp"] for r in rows]
    assert times == [round(t / 4.0, 3) for t in unit_times(200, 0.5, 3)] and times == sorted(times)
    assert 3.9 < mean_rate(times) < 4.2
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    spread = (sum((g - 0.25) ** 2 for g in gaps) / len(gaps)) ** 0.5 / 0.25
    assert spread > 1.2   # burstiness 0.5: gaps spread about sqrt(2) times a Poisson process's
    loaded = load(out)
    assert [r.timestamp for r in loaded.requests] == times and all("timestamp" not in r.body for r in loaded.requests)
