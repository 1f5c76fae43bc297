"""Real signals to a real `agent run` process (the deterministic engine at its engine seam,
tests/agent_with_seam_engine.py): SIGTERM and SIGHUP stop it as Ctrl-C does, the trial in flight
recorded `interrupted` and the run `stopped`, resumable. SIGHUP is a dropped SSH session: the
terminal is gone, so nothing more is written to it, and a write would have raised."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.ledger import Ledger

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

ROOT = Path(__file__).resolve().parents[1]


def events(home: Path) -> list[dict]:
    found = list(home.glob("*/events.jsonl"))
    return [json.loads(line) for line in found[0].read_text().splitlines()] if found else []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_trial_stops_the_run_with_the_trial_recorded_and_resumable(tmp_path, embedded_model, signum):
    home = tmp_path / "home"
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "3"}
    argv = [sys.executable, str(ROOT / "tests" / "agent_with_seam_engine.py"), "run", "--budget", "10m",
            "--model", str(embedded_model), "--max-trials", "3"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 240
        # a candidate is in flight
        while not any(e.get("event") == "trial" and e.get("source") in ("planner", "sampler") for e in events(home)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
            time.sleep(0.2)
        time.sleep(0.5)
        if signum == signal.SIGHUP:
            proc.stdout.close()     # the terminal went with the session: a write now raises EPIPE
        proc.send_signal(signum)
        code = proc.wait(timeout=60)
        said = "" if signum == signal.SIGHUP else proc.stdout.read().decode()
    finally:
        proc.kill()
        proc.wait()
    assert code == 130, (code, said[-2000:])
    (run,) = Ledger(home / "ledger.sqlite").runs()
    assert run.status == "stopped"
    trials = Ledger(home / "ledger.sqlite").trials(run.id)
    assert trials[-1].source in ("planner", "sampler") and trials[-1].status == "interrupted", \
        [(t.number, t.source, t.status) for t in trials]
    assert not [t for t in trials if t.status == "running"]
    if signum == signal.SIGHUP:
        return   # the state is the one SIGTERM leaves, whose resume is run below
    assert f"agent run --resume {run.id}" in said
    resumed = subprocess.run([*argv[:2], "run", "--resume", run.id], env=env, capture_output=True, text=True,
                             timeout=300, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    trials = Ledger(home / "ledger.sqlite").trials(run.id)
    assert Ledger(home / "ledger.sqlite").run(run.id).status == "finished"
    ran = [t for t in trials if t.source in ("planner", "sampler") and t.status not in ("interrupted", "skipped")]
    assert len(ran) == 3, [(t.number, t.source, t.status) for t in trials]   # --max-trials: the cut one not counted


def test_the_runs_traffic_template_and_perplexity_text_are_its_own_copies_checked_on_resume(tmp_path, embedded_model):
    """Every trial and the branch read the run's copies: the user's files may be edited or removed in the
    night and nothing measured changes; a copy edited since the start refuses the resume, in one line.
    Before, each trial read the user's paths, and a removed file made every later point invalid_config."""
    home, mine = tmp_path / "home", tmp_path / "mine"
    mine.mkdir()
    template = mine / "chat.jinja"
    template.write_text((ROOT / "sandbox/data/traffic/gemma-chat.jinja").read_text())
    traffic = mine / "chat.jsonl"
    traffic.write_text((ROOT / "sandbox/data/traffic/chat.jsonl").read_text())
    text = mine / "ppl.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40 + "\n\n"
                    + "A second paragraph of plain text. " * 40 + "\n")
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.05", "COLUMNS": "300"}
    agent = [sys.executable, str(ROOT / "tests" / "agent_with_seam_engine.py"), "run"]
    first = subprocess.run([*agent, "--budget", "20s", "--model", str(embedded_model), "--max-trials", "1",
                            "--traffic", str(traffic), "--chat-template", str(template),
                            "--quality-text", str(text)],
                           env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    inputs = home / run.id / "inputs"
    assert run.settings["workload"]["chat_template"] == str(inputs / "chat.jinja")
    assert run.settings["quality_text"] == str(inputs / "ppl.txt")
    for given in (template, text, traffic):   # the user's own files, gone: nothing the run reads
        given.unlink()
    ledger.update(run, status="stopped")
    again = subprocess.run([*agent, "--resume", run.id], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    (inputs / "ppl.txt").write_text("edited\n")
    ledger.update(ledger.run(run.id), status="stopped")
    refused = subprocess.run([*agent, "--resume", run.id], env=env, capture_output=True, text=True, timeout=300,
                             cwd=ROOT)
    said = " ".join(refused.stderr.split())   # one message (the console wraps it at its width)
    assert refused.returncode == 2 and said.startswith("error: --resume:") and said.count("error:") == 1, said
    assert f"--resume: its perplexity text ({inputs / 'ppl.txt'}) changed since run {run.id} started" in said
    (inputs / "ppl.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40 + "\n\n"
                                    + "A second paragraph of plain text. " * 40 + "\n")
    (inputs / "chat.jinja").write_text("{{ messages }}")
    refused = subprocess.run([*agent, "--resume", run.id], env=env, capture_output=True, text=True, timeout=300,
                             cwd=ROOT)
    assert refused.returncode == 2 and "its traffic or chat template" in refused.stderr, refused.stderr
