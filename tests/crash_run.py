"""A run of the real loop with the deterministic engine, in its own process, so a test can SIGKILL it.

    python tests/crash_run.py HOME RUN_ID SECONDS [--resume]

Uses the same recovery and the same loop as `agent run`; only the engine is the test double.
"""

import sys
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
        run_search(run, settings, space, ledger, FakeEngine(delay_s=0.15), repo, storage)


if __name__ == "__main__":
    main()
