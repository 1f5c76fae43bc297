"""`agent status` on a run in progress in another process (the deterministic engine), then killed."""

import os
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

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


def test_status_on_a_workers_host_reads_the_coordinators_heartbeat(tmp_path):
    """A host that joined a run holds no run lock: the run is going while its coordinator's heartbeat
    is fresh, and each worker's device, state and trials are listed."""
    from datetime import datetime, timedelta

    from agent import crew
    from agent.ledger import Run, Trial, Worker
    from agent.status import describe

    now = datetime.now(UTC)
    iso = lambda t: t.isoformat(timespec="seconds")  # noqa: E731
    run = Run(id="r1", started_at=iso(now - timedelta(minutes=30)), deadline_at=iso(now + timedelta(hours=2)),
              status="running", model="/models/m", baseline_figure=100.0, noise=0.04, calibration={})
    coordinator = Worker(id=1, role="coordinator", status="running", heartbeat_at=iso(now), name="gpu-a/0",
                         host="gpu-a", pid=4242, device="GPU 0")
    joined = Worker(id=2, role="worker", status="lost", heartbeat_at=iso(now - timedelta(minutes=9)),
                    name="gpu-b/1", host="gpu-b", pid=77, device="GPU 1")
    trials = [Trial(number=3, source="sampler", status="ok", params={"max-num-seqs": 8}, worker_id=2,
                    decision="put_forward"),
              Trial(number=4, source="sampler", status="running", params={"max-num-seqs": 64}, worker_id=1)]
    lines = describe(run, trials, tmp_path, workers=[coordinator, joined])
    assert lines[0].startswith("run r1 (running, agent run pid 4242 on gpu-a)"), lines
    assert any(line.startswith("  coordinator gpu-a/0 (GPU 0): running, heartbeat ") and
               line.endswith(" s ago; 1 trial(s), 0 accepted") for line in lines), lines
    assert "  worker gpu-b/1 (GPU 1): lost; 1 trial(s), 0 accepted, 1 put forward, not decided yet" in lines
    assert "  trial 4 [sampler] in flight: max-num-seqs=64" in lines
    # A coordinator silent past the grace is no evidence the run goes on.
    coordinator.heartbeat_at = iso(now - timedelta(seconds=crew.grace_s() + 5))
    lines = describe(run, trials, tmp_path, workers=[coordinator, joined])
    assert "stopped without finishing (no process holds it): agent run --resume r1" in lines[0], lines
