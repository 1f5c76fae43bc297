"""`agent status` on a run in progress in another process (the deterministic engine), then killed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

HERE = Path(__file__).parent


def status(home: Path) -> list[str]:
    from agent.cli import app

    result = CliRunner().invoke(app, ["status"], env={"AGENT_HOME": str(home)})
    if result.exit_code == 2 and "no runs yet" in result.output:
        return []   # the ledger file exists a moment before the run's row
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_status_shows_the_trial_in_flight_while_another_process_runs_and_a_stop_after(tmp_path):
    proc = subprocess.Popen([sys.executable, str(HERE / "crash_run.py"), str(tmp_path), "live", "120"],
                            env={**os.environ, "PHASE_S": "3"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lines, end = [], time.monotonic() + 60
        while time.monotonic() < end:
            lines = status(tmp_path) if (tmp_path / "ledger.sqlite").exists() else []
            if any("[sampler] benchmark for" in ln or "[planner] benchmark for" in ln for ln in lines):
                break
            time.sleep(0.5)
        assert lines and lines[0].startswith(f"run live (running, agent run pid {proc.pid}): "), lines
        assert "min left" in lines[0] or " s left" in lines[0]
        assert any(ln.startswith("  baseline ") and "tok/s" in ln for ln in lines), lines
        (flight,) = [ln for ln in lines if "benchmark for" in ln]
        assert flight.startswith("  trial ") and flight.split(" s: ")[0].split()[-1].isdigit(), flight
        assert any(ln.startswith("  best so far: ") for ln in lines)
        assert any(" trial(s) done: " in ln and "ok" in ln for ln in lines)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = status(tmp_path)
    assert "stopped without finishing (no process holds it): agent run --resume live" in lines[0]
    assert any("interrupted (the resume records it)" in ln for ln in lines), lines


def test_status_without_a_run_says_so(tmp_path):
    from agent.cli import app

    result = CliRunner().invoke(app, ["status"], env={"AGENT_HOME": str(tmp_path)})
    assert result.exit_code == 2 and "no runs yet" in result.stderr
