"""SIGKILL a real `agent run` inside the two windows where a crash could lose the night's winner, on
purpose, resume after each, and say what became of the candidates cut there (docs/RELIABILITY.md,
windows 1 and 2; the crash suite does the same on the test engine, tests/crash_run.py).

    python bench/kill_windows.py --budget 40m            # any `agent run` options after the script

1. `agent run ...`, killed right after its first candidate's figures are recorded, before the gate's
   verdict (window 1);
2. `agent run --resume ID`, killed when its first accepted candidate is about to be committed (window 2);
3. `agent run --resume ID` to the deadline; then `agent doctor --run ID` and each cut candidate's row.

Each killed process is this file run as `agent` (KILL_WINDOW set): the real engine, the real vLLM,
with the kill wrapped around the two writes. A development tool, not shipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def armed(window: str) -> None:
    """Inside the agent process: SIGKILL itself at the first entry into `window`."""
    from agent import gitops, judging
    from agent.states import CANDIDATES

    def die(note: str) -> None:
        print(f"KILLED in window {window}: {note}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    if window == "judge":
        record = judging.record

        def recording(ledger, row, result):
            row = record(ledger, row, result)
            if row.source in CANDIDATES:
                die(f"trial {row.number} recorded ({row.status}, {row.figure}), not yet gated")
            return row

        judging.record = recording
    elif window == "accepted":
        def committing(repo, name, *args, **kwargs):
            die(f"{name} accepted, not yet committed")

        gitops.commit_branch = committing


def agent(args: list[str], window: str | None, log) -> int:
    env = {k: v for k, v in os.environ.items() if k != "KILL_WINDOW"}
    if window:
        env["KILL_WINDOW"] = window
    proc = subprocess.run([sys.executable, __file__, *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc.returncode


def main() -> int:
    from agent import paths
    from agent.ledger import Ledger

    home = paths.home()
    out = home / "kill-windows.log"
    home.mkdir(parents=True, exist_ok=True)
    before = {r.id for r in Ledger(home / "ledger.sqlite").runs()} if (home / "ledger.sqlite").exists() else set()
    with open(out, "a") as log:
        print(f"1. agent run {' '.join(sys.argv[1:])}, killed in window 1 (log: {out})", flush=True)
        code = agent(["run", *sys.argv[1:]], "judge", log)
        ledger = Ledger(home / "ledger.sqlite")
        (run,) = [r for r in ledger.runs() if r.id not in before]
        print(f"   exit {code}; run {run.id}", flush=True)
        print(f"2. agent run --resume {run.id}, killed in window 2", flush=True)
        code = agent(["run", "--resume", run.id], "accepted", log)
        print(f"   exit {code}", flush=True)
        print(f"3. agent run --resume {run.id} to the deadline", flush=True)
        code = agent(["run", "--resume", run.id], None, log)
        print(f"   exit {code}", flush=True)
        doctor = subprocess.run([sys.executable, "-m", "agent.cli", "doctor", "--run", run.id], capture_output=True,
                                text=True, cwd=ROOT)
    text = out.read_text()
    print("repairs said:", *[line.strip() for line in text.splitlines() if "repaired:" in line or "KILLED" in line],
          sep="\n   ")
    print(f"agent doctor: exit {doctor.returncode}: "
          f"{doctor.stdout.strip().splitlines()[-1] if doctor.stdout.strip() else ''}")
    for t in Ledger(home / "ledger.sqlite").trials(run.id):
        if t.source in ("planner", "sampler"):
            print(json.dumps({"trial": t.number, "source": t.source, "status": t.status, "decision": t.decision,
                              "search_ratio": t.search_ratio, "heldout_ratio": t.heldout_ratio, "branch": t.branch,
                              "params": t.params}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:   # a child: `agent` itself, armed where KILL_WINDOW says
        if window := os.environ.get("KILL_WINDOW"):
            armed(window)
        from agent.cli import app

        app()
    else:
        sys.exit(main())
