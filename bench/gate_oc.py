"""The gate's operating characteristic, measured on the simulated engine.

    python bench/gate_oc.py [--decisions 2000] [--seed 0]

For each instance noise (log-sd 0.07 and 0.15: about the largest spreads measured on the CPU
machine and on the H200) and each truth (no gain; a lossless 1.3x gain), it plays a run's
decision many times: the defaults on fresh server instances, the A/A check, then one candidate
through the gate: its search instance, and the held-out decision on fresh instances. Greedy
outputs flip at near-ties as the H200's did (every instance, the defaults' too). It prints how
often the candidate is accepted, and how many server instances a decision cost, for the gate
before this change (the rules of agent/gate.py up to commit aa1c0fb, re-implemented below) and for
the gate as it is (agent/gate.py itself, at its default settings).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))   # the simulated engine

from sim_engine import SimulatedEngine  # noqa: E402

from agent.context import Settings  # noqa: E402
from agent.gate import (  # noqa: E402
    GateSettings,
    Instance,
    baseline_of,
    check,
    greedy_of,
    judge_aa,
    more_defaults_wanted,
    sequential_test,
)
from agent.stats import Noise  # noqa: E402
from sandbox.result import TrialResult  # noqa: E402

DEFAULTS = {"flags": {}, "env": {}}
FAST = {"flags": {}, "env": {"GAIN": "on"}}
TMP = Path("/tmp/gate-oc")


def measure(engine: SimulatedEngine, config: dict, heldout_bench: bool = False, quality: bool = True) -> TrialResult:
    spec = {**config, "workload": "challenge", "repeats": 2, "heldout_bench": heldout_bench,
            "quality": "default" if quality else "none"}
    return engine.evaluate(spec, TMP, 60)


def instance(result: TrialResult) -> Instance:
    return Instance(result.bench.tps, result.bench_heldout.tps if result.bench_heldout else None,
                    result.quality.ppl, greedy_of(result))


def new_gate(engine: SimulatedEngine, config: dict, settings: GateSettings,
             baseline_instances: int) -> tuple[bool, int]:
    """One decision by agent/gate.py, in the loop's order: (accepted, server instances spent on the
    candidate and on instances of the defaults beyond the first baseline ones)."""
    defaults = [instance(measure(engine, DEFAULTS)) for _ in range(baseline_instances)]
    first = baseline_of(defaults, settings)
    aa = instance(measure(engine, DEFAULTS, heldout_bench=True))
    verdict = judge_aa(aa, first, settings)
    spent, added = 0, 0
    while more_defaults_wanted(baseline_of(defaults, settings, aa=aa), verdict, added, settings):
        defaults.append(instance(measure(engine, DEFAULTS)))
        spent, added = spent + 1, added + 1
    # As agent.defaults.baseline_from: the A/A out of the screen, its held-out figure shared by decisions.
    base = replace(baseline_of(defaults, settings, aa=aa), reference=first.reference, calibration=verdict.calibration)
    result = measure(engine, config)
    spent += 1
    screened = check(result, base, lossless=True, settings=settings)
    if not screened.passed:
        return False, spent
    first_heldout = measure(engine, config, quality=False).bench.tps

    def more(cfg):
        return lambda: measure(engine, cfg, quality=False).bench.tps

    decision = sequential_test(first_heldout, base, settings, more(config), more(DEFAULTS), screened.search_ratio)
    spent += len(decision.candidate) + len(decision.extra_defaults)
    return decision.accepted, spent


def old_gate(engine: SimulatedEngine, config: dict) -> tuple[bool, int]:
    """The rules before this change: noise = half-range of two instances, one candidate instance
    must beat 1 + noise with 100% greedy agreement, then one held-out instance must beat 1 + noise
    and stay within 5% + twice the noise of the search ratio."""
    defaults = [measure(engine, DEFAULTS, heldout_bench=True) for _ in range(2)]
    tps = statistics.median(d.bench.tps for d in defaults)
    held = statistics.median(d.bench_heldout.tps for d in defaults)
    noise = max(abs(d.bench.tps - tps) for d in defaults) / tps
    ref = defaults[0].quality.token_ids
    result = measure(engine, config)
    ratio = result.bench.tps / tps
    if result.quality.token_ids != ref or ratio <= 1 + noise:
        return False, 1
    heldout = measure(engine, config, quality=False).bench.tps / held
    return heldout > 1 + noise and heldout >= ratio * (1 - 0.05 - 2 * noise), 2


def old_aa_passes(engine: SimulatedEngine) -> bool:
    defaults = [measure(engine, DEFAULTS, heldout_bench=True) for _ in range(2)]
    ref = defaults[0].quality.token_ids
    aa = measure(engine, DEFAULTS)
    return aa.quality.token_ids == ref


def new_aa_passes(engine: SimulatedEngine, settings: GateSettings, baseline_instances: int) -> bool:
    defaults = [instance(measure(engine, DEFAULTS, heldout_bench=True)) for _ in range(baseline_instances)]
    return judge_aa(instance(measure(engine, DEFAULTS, heldout_bench=True)), baseline_of(defaults, settings),
                    settings).passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, nargs="*", default=[0.07, 0.15])
    parser.add_argument("--after-only", action="store_true", help="the gate as it is, without the old rules' rows")
    parser.add_argument("--no-flips", action="store_true", help="the CPU build's case only (no near-tie flips)")
    parser.add_argument("--set", nargs="*", default=[], help="gate settings to try instead of the defaults, "
                        "e.g. level=0.99 max_instances=6 baseline_instances=3 noise_prior=0.07,4")
    args = parser.parse_args()
    settings, instances = GateSettings(), Settings(model="", workload="").baseline_instances
    for item in args.set:
        key, value = item.split("=")
        if key == "baseline_instances":
            instances = int(value)
        elif key == "noise_prior":   # noise_prior=SD,DF
            sd, df = value.split(",")
            settings = replace(settings, noise_prior=Noise(float(sd), int(df)))
        else:
            settings = replace(settings, **{key: type(getattr(settings, key))(value)})
    print(f"{args.decisions} decisions per cell; defaults: {instances} baseline instances + the A/A (more while "
          f"their log-sd is above {settings.noisy}, up to {settings.max_defaults}), level {settings.level}, detect "
          f"{settings.detect:.0%}, at most {settings.max_instances} held-out instances. Flips: none (the CPU build), "
          f"or at near-ties on a quarter of 32 prompts, every instance taking the runner-up half the time (the H200)\n")
    print("| instance noise (log-sd) | greedy flips | truth | gate | accepted | server instances per decision (max) "
          "| A/A passes |")
    print("|---|---|---|---|---|---|---|")
    for sd in args.noise:
        for flips, rate in (("none", 0.0),) + ((("near-ties", 0.5),) if not args.no_flips else ()):
            for gain in (1.0, 1.3):
                truth = "no gain" if gain == 1.0 else "1.3x lossless"
                for name in ("after",) if args.after_only else ("before", "after"):
                    accepted, spent, aa = 0, [], 0
                    for i in range(args.decisions):
                        engine = SimulatedEngine(seed=args.seed * 1_000_003 + i, noise=sd, flip_rate=rate,
                                                 gain={"GAIN=on": gain})
                        ok, n = (old_gate(engine, FAST) if name == "before"
                                 else new_gate(engine, FAST, settings, instances))
                        accepted += ok
                        spent.append(n)
                        if gain == 1.0:
                            aa += (old_aa_passes(engine) if name == "before"
                                   else new_aa_passes(engine, settings, instances))
                    aa_text = f"{aa / args.decisions:.1%}" if gain == 1.0 else ""
                    print(f"| {sd} | {flips} | {truth} | {name} | {accepted / args.decisions:.1%} | "
                          f"{statistics.fmean(spent):.2f} ({max(spent)}) | {aa_text} |", flush=True)


if __name__ == "__main__":
    main()
