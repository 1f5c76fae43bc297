"""The quality gate: a candidate is accepted only if it is faster and no worse.

Pure functions of a worker result and the baseline, so every verdict can be recomputed from the
ledger. The reasons are sentences a reviewer reads in the morning.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GateSettings:
    ppl_tolerance: float = 0.01        # relative: ppl <= baseline ppl * (1 + tolerance)
    ppl_max: float | None = None       # optional absolute bound
    min_gain: float = 0.0              # margin the TPS gain must clear on top of the noise


@dataclass(frozen=True)
class Baseline:
    tps: float
    ppl: float
    greedy: list[list[int]]
    noise: float                       # relative spread of TPS across baseline server instances


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    tps_ratio: float | None = None
    ppl_change: float | None = None
    agreement: float | None = None


def agreement(baseline: list[list[int]], candidate: list[list[int]]) -> float:
    """Mean share of each baseline greedy output that the candidate reproduces before diverging."""
    if not baseline or len(baseline) != len(candidate):
        return 0.0
    shares = []
    for want, got in zip(baseline, candidate):
        same = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        shares.append(same / max(len(want), 1))
    return round(sum(shares) / len(shares), 4)


def check(result: dict, base: Baseline, lossless: bool, settings: GateSettings = GateSettings()) -> Verdict:
    if result.get("status") != "ok":
        failure = result.get("failure") or {}
        return Verdict(False, [f"trial failed: {failure.get('class')}: {failure.get('message', '')[:200]}"])
    reasons = []
    tps, ppl = result["bench"]["tps"], result["quality"]["ppl"]
    ratio = tps / base.tps
    ppl_change = ppl / base.ppl - 1
    agree = agreement(base.greedy, [g["token_ids"] for g in result["quality"]["greedy"]])
    if result["bench"]["errors"]:
        reasons.append(f"{result['bench']['errors']} request errors")
    if ppl_change > settings.ppl_tolerance:
        reasons.append(f"perplexity {ppl:.4f} is {ppl_change:+.2%} from the baseline's {base.ppl:.4f} "
                       f"(tolerance {settings.ppl_tolerance:.2%})")
    if settings.ppl_max is not None and ppl > settings.ppl_max:
        reasons.append(f"perplexity {ppl:.4f} is above the absolute bound {settings.ppl_max}")
    if lossless and agree < 1.0:
        reasons.append(f"broken lossless claim: greedy outputs agree {agree:.1%} with the baseline's, 100% required")
    needed = 1 + base.noise + settings.min_gain
    if ratio <= needed:
        reasons.append(f"TPS ratio {ratio:.3f} does not clear the noise: needs more than {needed:.3f} "
                       f"(noise ±{base.noise:.1%}, margin {settings.min_gain:.1%})")
    return Verdict(not reasons, reasons, round(ratio, 4), round(ppl_change, 5), agree)
