"""The run's Optuna study opens in optuna-dashboard (the real package, over real HTTP)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent.ledger import Ledger

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_shows_the_runs_study_with_its_trials(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "crash_run.py"), str(tmp_path), "night", "8"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:]
    port = free_port()
    dashboard = subprocess.Popen([str(Path(sys.executable).parent / "optuna-dashboard"),
                                  f"sqlite:///{tmp_path / 'optuna.sqlite'}", "--port", str(port), "--server", "wsgiref",
                                  "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
    try:
        url, end = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while True:
            try:
                studies = httpx.get(f"{url}/api/studies", timeout=5).json()["study_summaries"]
                break
            except httpx.HTTPError:
                assert time.monotonic() < end and dashboard.poll() is None, "optuna-dashboard did not answer"
                time.sleep(0.5)
        (study,) = [s for s in studies if s["study_name"] == "night"]
        trials = httpx.get(f"{url}/api/studies/{study['study_id']}", timeout=10).json()["trials"]
        told = [t for t in Ledger(tmp_path / "ledger.sqlite").trials("night") if t.optuna_number is not None]
        assert told and len(trials) >= len(told)
        # Each ledger row's Optuna trial is shown in the state its status was told as.
        shown = {t["number"]: t["state"] for t in trials}
        as_told = {"ok": "Complete", "failed": "Complete", "skipped": "Complete", "pruned": "Pruned",
                   "interrupted": "Fail"}
        assert {t.number: shown[t.optuna_number] for t in told} == {t.number: as_told[t.status] for t in told}
        assert "Optuna Dashboard" in httpx.get(f"{url}/dashboard", timeout=10).text
    finally:
        os.killpg(dashboard.pid, signal.SIGKILL)
        dashboard.wait()
