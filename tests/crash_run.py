"""A run of the real loop with the deterministic engine, in its own process, so a test can SIGKILL it.

    python tests/crash_run.py HOME RUN_ID SECONDS [--resume]

With PHASE_S set, each trial spends that many seconds in its benchmark phase and the run writes
its events.jsonl as `agent run` does (for `agent status` to read while it runs).

Uses the same recovery and the same loop as `agent run`; only the engine is the test double.
"""

import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import gitops, recovery, space as spaces  # noqa: E402
from agent.ledger import Ledger, Run  # noqa: E402
from agent.loop import Settings, run_search  # noqa: E402
from fake_engine import FakeEngine  # noqa: E402


def main() -> None:
    home, run_id, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    ledger, space = Ledger(home / "ledger.sqlite"), spaces.load("vllm-cpu")
    repo = gitops.open_repo(home / "proposals", create=not (home / "proposals").exists())
    storage = f"sqlite:///{home / 'optuna.sqlite'}"
    with recovery.run_lock(home):
        run = ledger.run(run_id)
        if run is None:
            deadline = datetime.now(timezone.utc) + timedelta(seconds=seconds)
            run = ledger.add(Run(id=run_id, deadline_at=deadline.isoformat(), model="m", space_path=space.path,
                                 space_hash=space.hash, workload="smoke", repo=str(repo.working_dir),
                                 settings={"home": str(home)}))
        else:
            for line in recovery.repair(ledger, run, storage, repo):
                print("repaired:", line, flush=True)
        settings = Settings(model="m", workload="smoke", drift_every=4, facts={"cpus": 2, "concurrency": 1})
        if os.environ.get("PHASE_S"):
            from rich.console import Console

            from agent.log import event_logger
            say = event_logger(home / run_id / "events.jsonl", Console(stderr=True))
            run_search(run, settings, space, ledger, SlowEngine(float(os.environ["PHASE_S"])), repo, storage, say)
        else:
            run_search(run, settings, space, ledger, FakeEngine(delay_s=0.15), repo, storage)


class SlowEngine(FakeEngine):
    def __init__(self, phase_s: float):
        super().__init__()
        self.phase_s = phase_s

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        on_phase("benchmark")
        time.sleep(self.phase_s)
        return super().evaluate(spec, trial_dir, timeout_s, on_phase=lambda phase: None)


if __name__ == "__main__":
    main()
