"""Kills and resumes over one real `agent run`: nothing lost, nothing run twice, nothing left running.

    .venv/bin/python bench/kill_soak.py --kills 10 --budget 45m --seed 0

Starts `agent run` on the embedded model under a fresh AGENT_HOME (runs/kill-soak/<stamp>/home)
and, at moments drawn from a seeded schedule (gaps uniform between --min-gap and --max-gap seconds),
SIGKILLs the agent: no handler runs, and its worker, server and vLLM's engine core are left behind
as a crash leaves them. Each kill records what it hit (the trial in flight, its source and phase,
from the trial's progress file, or the agent's own work between trials); then `agent run --resume`
continues the run to its original deadline. After the last resume ends, the run is checked:

- `agent doctor`: the ledger, the Optuna study and the branches agree, no trial process is left;
- no row is left `running`, and every trial a kill cut is `interrupted` (none is lost or invented);
- no candidate point was measured to a result twice (an interrupted one is measured again once);
- the points the kills cut, and whether each was measured again before the deadline.

The instances are made cheap by tests/test_run_real.py's own helpers (the CPU space with enforce-eager fixed,
one repeat of --num-prompts requests, perplexity on a short text), so a kill every few minutes
still lets the run progress. Prints one line a kill, then the checks; writes soak.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from cheap_instances import eager_space, quality_text  # noqa: E402   the real-run test's cheap instances

from agent import recovery  # noqa: E402
from agent.ledger import Ledger  # noqa: E402


def in_flight(home: Path) -> dict:
    """What a kill now would hit: the trial whose worker process is alive (a held-out instance is its
    candidate's, in a folder of its own), its phase; else the agent's own work between trials."""
    for progress in sorted(home.glob("*/trial-*/progress.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            info = json.loads(progress.read_text())
            worker = psutil.Process(info["worker_pid"])
            if worker.status() == psutil.STATUS_ZOMBIE or info.get("phase") in (None, "done"):
                continue
        except (OSError, ValueError, KeyError, psutil.Error):
            continue
        number = int(progress.parent.name.split("-")[1])
        row = next((t for t in Ledger(home / "ledger.sqlite").trials() if t.number == number), None)
        heldout = "heldout" in progress.parent.name
        return {"trial": number, "source": row.source if row else None,
                "phase": ("held-out instance: " if heldout else "") + info["phase"], "heldout": heldout}
    return {"trial": None, "source": None, "phase": "between trials", "heldout": False}


def agent(home: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent.cli", *args], env={**os.environ, "AGENT_HOME": str(home)},
                            stdout=kw.get("stdout"), stderr=subprocess.STDOUT, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--budget", default="45m", help="the run's --budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-gap", type=float, default=90.0, help="seconds, at least, between a start and its kill")
    parser.add_argument("--max-gap", type=float, default=300.0)
    parser.add_argument("--num-prompts", type=int, default=8)
    args = parser.parse_args()
    out = ROOT / "runs" / "kill-soak" / datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    home = out / "home"
    home.mkdir(parents=True)
    rng = random.Random(args.seed)
    gaps = [rng.uniform(args.min_gap, args.max_gap) for _ in range(args.kills)]
    print(f"soak in {out}: {args.kills} kills after {', '.join(f'{g:.0f}' for g in gaps)} s of each start",
          flush=True)
    log = open(out / "agent.log", "a")
    proc = agent(home, "run", "--budget", args.budget, "--space", str(eager_space(out)), "--repeats", "1",
                 "--num-prompts", str(args.num_prompts), "--quality-text", str(quality_text(out)), stdout=log)
    kills, run_id = [], None
    for i, gap in enumerate(gaps, 1):
        deadline = time.monotonic() + gap
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
        if proc.poll() is not None:   # the run ended (its deadline) before this kill
            print(f"kill {i}: the run had ended (exit {proc.returncode}); no more kills", flush=True)
            break
        hit = in_flight(home)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        run_id = run_id or Ledger(home / "ledger.sqlite").runs()[0].id
        kills.append({"kill": i, "after_s": round(gap, 1), **hit})
        print(f"kill {i} at {gap:.0f} s: {hit['phase']}" + (f" of trial {hit['trial']} ({hit['source']})"
                                                             if hit["trial"] is not None else ""), flush=True)
        with open(out / "soak.jsonl", "a") as f:
            f.write(json.dumps(kills[-1]) + "\n")
        log.write(f"\n=== kill {i}: resume ===\n")
        log.flush()
        proc = agent(home, "run", "--resume", run_id, stdout=log)
    proc.wait()
    log.close()
    doctor = subprocess.run([sys.executable, "-m", "agent.cli", "doctor"], env={**os.environ, "AGENT_HOME": str(home)},
                            capture_output=True, text=True)
    ledger = Ledger(home / "ledger.sqlite")
    (run,) = ledger.runs()
    trials = ledger.trials(run.id)
    by_number = {t.number: t for t in trials}
    key = lambda t: repr(sorted(t.params.items()))  # noqa: E731
    measured = Counter(key(t) for t in trials if t.source in ("planner", "sampler") and t.status not in
                       ("interrupted", "skipped"))
    cut = [by_number.get(k["trial"]) for k in kills if k["trial"] is not None and not k["heldout"]]
    again = [t for t in cut if t is not None and t.source in ("planner", "sampler")
             and any(u.number > t.number and key(u) == key(t) and u.status != "interrupted" for u in trials)]
    checks = {
        "doctor consistent": doctor.returncode == 0 and "consistent" in doctor.stdout,
        "no row left running": all(t.status != "running" for t in trials),
        "no candidate left awaiting its decision": all(t.decision not in ("awaiting_recheck", "put_forward")
                                                       for t in trials),
        "every cut trial is a row, interrupted": all(t is not None and t.status == "interrupted" for t in cut),
        "no candidate point measured twice": all(n == 1 for n in measured.values()),
        "no trial process left": recovery.stray_servers(home / run.id) == [],
    }
    print(doctor.stdout.strip())
    print(f"run {run.id}: {run.status}, {len(trials)} trials ({dict(Counter(t.status for t in trials))}), "
          f"{sum(1 for t in trials if t.branch)} branch(es)")
    print(f"kills: {len(kills)}; what they hit: {dict(Counter(k['phase'] for k in kills))}; by source: "
          f"{dict(Counter(k['source'] or 'none' for k in kills))}")
    candidates = [t for t in cut if t is not None and t.source in ("planner", "sampler")]
    print(f"candidates cut: {len(candidates)}, measured again before the deadline: {len(again)}")
    for name, ok in checks.items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    summary = {"run": run.id, "kills": kills, "checks": checks, "trials": len(trials),
               "statuses": dict(Counter(t.status for t in trials)), "candidates_cut": len(candidates),
               "measured_again": len(again), "doctor": doctor.stdout}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
