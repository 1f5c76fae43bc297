"""The morning through the command line, on a night of the deterministic engine (real `agent run`
process, real SQLite, real git): `agent branches --json` and `--diff`, `agent report --json`,
`agent model path` and `agent traffic export`, each as a user types it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.ledger import Ledger

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent
ROOT = HERE.parent


@pytest.fixture(scope="module")
def night(tmp_path_factory, embedded_model):
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.02", "COLUMNS": "300"}
    two = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:2])
    done = subprocess.run(["taskset", "-c", two, sys.executable, str(HERE / "agent_with_seam_engine.py"), "run",
                           "--budget", "10m", "--model", str(embedded_model), "--max-trials", "8"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return home, env


def agent(env, *args):
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_branches_as_json_and_as_a_diff_against_the_defaults(night):
    home, env = night
    (run,) = Ledger(home / "ledger.sqlite").runs()
    branched = [t for t in Ledger(home / "ledger.sqlite").trials(run.id) if t.branch]
    assert branched
    out = agent(env, "branches", "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert [b["branch"] for b in found] == [t.branch for t in sorted(branched, key=lambda t: -t.claimed_ratio)]
    first = found[0]
    assert first["schema_version"] == 1 and first["run"] == run.id and first["claim"]["heldout_ratio"]
    assert first["serving"]["env"] == next(t.env for t in branched if t.branch == first["branch"])
    diff = agent(env, "branches", "--diff")
    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.splitlines()
    assert lines[0].startswith(f"{first['branch']}: ") and "held out" in lines[0]
    assert lines[1].startswith("  load: concurrency, concurrency 1,")
    assert any(line.startswith("  env: VLLM_CPU_OMP_THREADS_BIND: auto -> 0-") or
               line.startswith("  env: VLLM_CPU_OMP_THREADS_BIND: (unset) -> 0-") for line in lines), lines
    # The seeded night branches core binding alone: a win that lives in the environment, said in a line.
    env_only = [b["branch"] for b in found if b["serving"]["env_only"]]
    assert env_only
    table = agent(env, "branches")
    for name in env_only:
        assert f"{name}: the whole gain is in the environment (serving/env: VLLM_CPU_OMP_THREADS_BIND=" in table.stdout


def test_report_as_json_holds_the_run_and_every_trial(night):
    home, env = night
    out = agent(env, "report", "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    (run,) = Ledger(home / "ledger.sqlite").runs()
    assert found["run"]["id"] == run.id and len(found["trials"]) == len(Ledger(home / "ledger.sqlite").trials(run.id))


def test_traffic_export_writes_the_claims_split_and_refuses_another_file(night, tmp_path):
    home, env = night
    branch = json.loads(agent(env, "branches", "--json").stdout)[0]["branch"]
    out = agent(env, "traffic", "export", "--branch", branch, str(tmp_path / "heldout.jsonl"))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert rows and all(set(r) == {"prompt", "output_tokens"} and r["output_tokens"] > 0 for r in rows)
    assert out.stdout.startswith(f"wrote {len(rows)} requests of the heldout split")
    assert "not carried by vLLM's custom dataset: stop sequences" in out.stdout
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "hello", "max_tokens": 8}\n')
    refused = agent(env, "traffic", "export", "--branch", branch, str(tmp_path / "x.jsonl"), "--traffic", str(other))
    assert refused.returncode == 1 and "the run measured" in refused.stderr + refused.stdout
    assert not (tmp_path / "x.jsonl").exists()
    missing = agent(env, "traffic", "export", "--branch", "agent/nope/1", str(tmp_path / "y.jsonl"))
    said = missing.stdout + missing.stderr
    assert missing.returncode == 1 and "is not a branch agent/<run-id>/<trial> of a run" in said


def test_model_path_prints_the_prepared_folder_and_says_when_there_is_none(embedded_model, tmp_path):
    ready = agent({**os.environ, "AGENT_HOME": str(Path(embedded_model).parent.parent)}, "model", "path")
    assert ready.returncode == 0 and ready.stdout.strip() == str(embedded_model)
    none = agent({**os.environ, "AGENT_HOME": str(tmp_path)}, "model", "path")
    assert none.returncode == 1 and "run agent model prepare" in none.stdout + none.stderr


def test_an_error_naming_markup_is_one_line_of_text(tmp_path):
    """A run, branch or table named "[/x]" is data: each command's error prints it as text, one line,
    exit status 1 or 2 (before: Rich's MarkupError traceback)."""
    env = {**os.environ, "AGENT_HOME": str(tmp_path), "COLUMNS": "300"}
    traffic = tmp_path / "t.jsonl"
    traffic.write_text('{"prompt": "[/x]", "max_tokens": "[/x]"}\n')
    for args in (["ledger", "sql", 'select * from "[/x]"'], ["report", "--run", "[/x]"], ["status", "--run", "[/x]"],
                 ["verify", "agent/[/x]/1"], ["run", "--resume", "[/x]"], ["branches", "--run", "[/x]", "--diff"],
                 ["run", "--budget", "5m", "--traffic", str(traffic)]):
        done = agent(env, *args)
        said = (done.stdout + done.stderr).strip().splitlines()
        assert "Traceback" not in done.stderr and "MarkupError" not in done.stderr, (args, done.stderr[-500:])
        if args[0] == "branches":   # no run of that name: nothing to list, said as such
            assert done.returncode == 0
            continue
        assert done.returncode in (1, 2) and said[-1].startswith("error:") and "[/x]" in said[-1], (args, said)


@pytest.mark.parametrize("line, names", [
    ('{"prompt": "a", "max_tokens": 8, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper"),
    ('{"prompt": "a", "max_tokens": 8, "temperature": 1' + "0" * 400 + "}", "temperature"),
    ('{"prompt": "a", "max_tokens": 8, "top_p": 1' + "0" * 400 + "}", "top_p"),
    ('{"prompt": "a", "max_tokens": 8, "timestamp": 1' + "0" * 400 + "}", "timestamp"),
    ('{"prompt": "a", "max_tokens": 1' + "0" * 5000 + "}", "an integer of more than 4,300 digits"),
])
def test_a_traffic_line_deeply_nested_or_with_a_huge_number_is_one_line_and_nothing_is_written(tmp_path, line,
                                                                                               names):
    """Before: RecursionError (nested 100,000 deep), OverflowError (a 400-digit float field), ValueError (a
    5,000-digit integer) tracebacks from `agent run --traffic`."""
    env = {**os.environ, "AGENT_HOME": str(tmp_path / "home"), "COLUMNS": "300"}
    traffic = tmp_path / "t.jsonl"
    traffic.write_text(line + "\n")
    done = agent(env, "run", "--budget", "5m", "--traffic", str(traffic))
    said = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and done.returncode == 2, done.stderr[-800:]
    assert len(said) == 1 and said[0].startswith(f"error: --traffic: {traffic}:1: ") and names in said[0], said
    ledger = tmp_path / "home" / "ledger.sqlite"
    assert not ledger.exists() or Ledger(ledger).runs() == []
