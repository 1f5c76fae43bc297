"""A run of the real loop with the deterministic engine, in its own process, so a test can SIGKILL it.

    python tests/crash_run.py HOME RUN_ID SECONDS [--resume]

With PHASE_S set, each trial spends that many seconds in its benchmark phase and the run writes
its events.jsonl as `agent run` does (for `agent status` to read while it runs).

With KILL_AT=WINDOW:K set, the process SIGKILLs itself the K-th time the run is inside WINDOW,
after appending WINDOW to HOME/kills.txt (so a test knows which window each kill hit):
  baseline      inside an instance of the defaults (before the A/A)
  candidate     inside a candidate trial's measurement on the search prompts
  heldout       inside a held-out instance of a candidate's decision
  judge         after a candidate's result is recorded, before the gate's verdict is (window 1)
  accepted      after a candidate is recorded as accepted, before its branch is committed (window 2)
  branch        after a branch is committed, before its ledger row names it
  tell          after a candidate's ledger row is finished, before Optuna is told

Uses the same recovery and the same loop as `agent run`; only the engine is the test double.
"""

import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_engine import FakeEngine  # noqa: E402

from agent import gitops, judging, recovery  # noqa: E402
from agent import space as spaces
from agent import study as studies
from agent.context import RunContext, Seams, Settings  # noqa: E402
from agent.ledger import Ledger, Run  # noqa: E402
from agent.loop import run_search  # noqa: E402
from agent.states import CANDIDATES  # noqa: E402

WINDOWS = ("baseline", "candidate", "heldout", "judge", "accepted", "branch", "tell")


def kill_at(home: Path, run_id: str, ledger: Ledger, engine: FakeEngine) -> None:
    """Arm the KILL_AT window: wrap the engine, git and Optuna seams the loop calls through."""
    window, k = os.environ["KILL_AT"].split(":")
    seen = {"n": 0}

    def maybe_die(here: str) -> None:
        if here != window:
            return
        seen["n"] += 1
        if seen["n"] == int(k):
            with open(home / "kills.txt", "a") as f:
                f.write(here + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

    evaluate = engine.evaluate

    def evaluating(spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        heldout = isinstance(spec["workload"], dict) and spec["workload"].get("prompt_split") == "heldout"
        defaults = not spec["flags"].keys() - {"max-model-len"} and not spec["env"].keys() - {
            "VLLM_CPU_KVCACHE_SPACE", "VLLM_USE_AOT_COMPILE"}
        aa_done = any(t.source == "aa" for t in ledger.trials(run_id))
        maybe_die("heldout" if heldout and not defaults else "baseline" if defaults and not aa_done
                  else "candidate" if not defaults and not heldout else "")
        return evaluate(spec, trial_dir, timeout_s, on_phase)

    engine.evaluate = evaluating
    recorded = judging.record

    def recording(ledger_, row, result):
        row = recorded(ledger_, row, result)
        if row.source in CANDIDATES:
            maybe_die("judge")
        return row

    judging.record = recording
    propose = gitops.commit_branch

    def proposing(*args, **kwargs):
        maybe_die("accepted")
        sha = propose(*args, **kwargs)
        maybe_die("branch")
        return sha

    gitops.commit_branch = proposing
    tell = studies.tell

    def telling(study, trial, *args, **kwargs):
        if any(t.optuna_number == trial.number and t.status != "running" for t in ledger.trials(run_id)):
            maybe_die("tell")
        return tell(study, trial, *args, **kwargs)

    studies.tell = telling


def main() -> None:
    home, run_id, seconds = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    ledger, space = Ledger(home / "ledger.sqlite"), spaces.load("vllm-cpu")
    repo = gitops.open_repo(home / "proposals", create=not (home / "proposals").exists())
    storage = f"sqlite:///{home / 'optuna.sqlite'}"
    with recovery.run_lock(home):
        run = ledger.run(run_id)
        if run is None:
            deadline = datetime.now(UTC) + timedelta(seconds=seconds)
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
            run_search(RunContext(run, settings, space),
                       Seams(ledger, SlowEngine(float(os.environ["PHASE_S"])), repo, say),
                       storage)
        else:
            engine = FakeEngine(delay_s=0.15)
            if os.environ.get("KILL_AT"):
                kill_at(home, run_id, ledger, engine)
            run_search(RunContext(run, settings, space), Seams(ledger, engine, repo), storage)


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
