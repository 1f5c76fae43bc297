"""The budget on the simulated engine: how often a run of the README's shape reaches its first
held-out decision, and commits its first win, before its deadline, over many seeds.

    .venv/bin/python bench/budget_sim.py --runs 100                 # the slow CPU machine's figures
    .venv/bin/python bench/budget_sim.py --runs 100 --noise 0.03 --start-s 90 176 --quality-s 30 --bench-tokens 72
    git worktree add /tmp/before 4d50a09 && PYTHONPATH=/tmp/before .venv/bin/python bench/budget_sim.py --runs 100

The loop runs unchanged, on the simulated clock: tests/sim_engine.py advances it by each phase's
time (here the slow 2-core machine's: starts 160-245 s, 180 output tokens a repeat at about 8
tokens/s, quality 66 s, instance noise log-sd 0.06, as measured on 2026-12-02), and agent.loop
reads the time from it instead of the wall clock. The defaults' one lossless win is core binding
(1.5x in the simulation). PYTHONPATH picks the agent's code under test, so one script measures a
commit before and after. Prints one table row per code version.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # after PYTHONPATH: an older checkout's agent wins
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))   # the simulated engine

import agent.loop as loop  # noqa: E402
from agent import gitops  # noqa: E402
from agent import space as spaces
from agent.gate import GateSettings  # noqa: E402
from agent.ledger import Ledger, Run  # noqa: E402
from agent.stats import Noise  # noqa: E402

try:   # this checkout: one clock seam, a run context
    from agent import clock  # noqa: E402
    from agent.context import RunContext, Seams, Settings  # noqa: E402
    from agent.defaults import BaselineFailed  # noqa: E402
except ImportError:   # an older checkout on PYTHONPATH (the "before" row): the loop read the time itself
    clock = None
    from agent.loop import BaselineFailed, Settings  # noqa: E402
from sim_engine import SimulatedEngine  # noqa: E402

from agent.loop import run_search  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)


def on_clock(engine: SimulatedEngine, budget_s: float) -> None:
    """The loop reads the simulated clock: its deadline, the run's age and each trial's duration."""
    if clock is not None:   # agent.clock, the one seam
        clock.now = lambda: START + timedelta(seconds=engine.clock)
        clock.monotonic = lambda: engine.clock
        return

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return START + timedelta(seconds=engine.clock)

    loop.seconds_left = lambda deadline_iso, now=None: budget_s - engine.clock
    loop.time = types.SimpleNamespace(monotonic=lambda: engine.clock)
    loop.datetime = Clock


def one_run(seed: int, home: Path, budget_s: float, noise: float, start_s: tuple, quality_s: float,
            bench_tokens: int, prior: bool, binding: float) -> dict:
    space = spaces.load("vllm-cpu")
    engine = SimulatedEngine(seed=seed, noise=noise, start_s=start_s, quality_s=quality_s, bench_tokens=bench_tokens,
                             binding=binding)
    on_clock(engine, budget_s)
    ledger, repo = Ledger(home / "ledger.sqlite"), gitops.open_repo(home / "proposals", create=True)
    run = ledger.add(Run(id="r", model="sim", space_path=space.path, space_hash=space.hash, workload="default-cpu",
                         repo=str(repo.working_dir), settings={"home": str(home)}, started_at=START.isoformat(),
                         deadline_at=(START + timedelta(seconds=budget_s)).isoformat()))
    settings = Settings(model="sim", workload="default-cpu", seed=seed,
                        facts={"cpus": 2, "concurrency": 1, "sampled_share": 0.6},
                        **({"gate": GateSettings(noise_prior=Noise(*space.noise_prior))}
                           if prior else {}))
    decided, committed, stopped = None, None, None

    def note(event, **info):
        nonlocal decided, committed
        row = info.get("row")
        # A held-out verdict, accepted or refused by the bounds: not "the budget ends before another instance".
        verdict = row is not None and row.heldout_instances and not any("budget ends" in r for r in row.gate_reasons)
        if event == "result" and verdict and decided is None:
            decided = engine.clock
        if event == "result" and row is not None and row.branch and committed is None:
            committed = engine.clock
    try:
        if clock is None:
            run_search(run, settings, space, ledger, engine, repo, f"sqlite:///{home / 'optuna.sqlite'}", note)
        else:
            run_search(RunContext(run, settings, space), Seams(ledger, engine, repo, note),
                       f"sqlite:///{home / 'optuna.sqlite'}")
    except BaselineFailed as e:
        stopped = (engine.clock, str(e))
    trials = ledger.trials("r")
    for t in trials:
        if t.heldout_instances and "--verbose" in sys.argv:
            print(seed, t.number, t.decision, t.gate_reasons[-1][:200])
    return {"decided": decided, "committed": committed, "stopped": stopped, "instances": len(trials),
            "candidates": sum(1 for t in trials
                              if t.source in ("planner", "sampler") and "start_s" in (t.timings or {}))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--budget-min", type=float, default=30.0)
    parser.add_argument("--noise", type=float, default=0.06)
    parser.add_argument("--start-s", type=float, nargs=2, default=(160.0, 245.0), help="a start's range, seconds")
    parser.add_argument("--quality-s", type=float, default=66.0)
    parser.add_argument("--bench-tokens", type=int, default=180, help="output tokens a repeat (10 tok/s defaults)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/budget-sim"))
    parser.add_argument("--binding", type=float, default=1.5, help="core binding's true gain (measured 1.26-1.45x)")
    parser.add_argument("--no-prior", action="store_true", help="ignore the space's noise_prior (as before it)")
    parser.add_argument("--verbose", action="store_true", help="print each held-out decision's last reason")
    args = parser.parse_args()
    rows = [one_run(seed, args.out / datetime.now().strftime("%H%M%S%f") / str(seed), args.budget_min * 60, args.noise,
                    tuple(args.start_s), args.quality_s, args.bench_tokens, not args.no_prior, args.binding)
            for seed in range(args.runs)]
    decided = [r["decided"] / 60 for r in rows if r["decided"] is not None]
    committed = [r["committed"] / 60 for r in rows if r["committed"] is not None]
    stopped = [r["stopped"] for r in rows if r["stopped"]]
    median = lambda xs: f"{statistics.median(xs):.1f}" if xs else "-"  # noqa: E731
    print("| code | runs | budget | binding | first decision reached | its minute (median) | first win committed | "
          "its minute (median) | stopped early (minute, median) | candidates a run (mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {Path(loop.__file__).resolve().parents[1]}{' (no prior)' if args.no_prior else ''} | {args.runs} | "
          f"{args.budget_min:g} min | {args.binding:g}x | "
          f"{len(decided)} | {median(decided)} | {len(committed)} | {median(committed)} | "
          f"{len(stopped)} ({median([s[0] / 60 for s in stopped])}) | "
          f"{statistics.fmean(r['candidates'] for r in rows):.2f} |")
    if stopped:
        print("e.g.:", stopped[0][1][:300])
    return 0


if __name__ == "__main__":
    sys.exit(main())
