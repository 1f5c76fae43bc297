"""The quality gate: a candidate is accepted only if it is faster and no worse.

Pure functions of a worker result and the baseline, so every verdict can be recomputed from the
ledger. The reasons are sentences a reviewer reads in the morning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GateSettings:
    ppl_tolerance: float = 0.01        # relative: ppl <= baseline ppl * (1 + tolerance)
    ppl_max: float | None = None       # optional absolute bound
    min_gain: float = 0.0              # margin the TPS gain must clear on top of the noise
    heldout_margin: float = 0.05       # how much of the ratio may be lost on held-out prompts
    kl_max: float | None = None        # optional: mean KL divergence (nats) from the baseline's top-k logprobs
    ttft_p99_ms_max: float | None = None   # SLO bounds: a faster config that breaks one is refused
    itl_p99_ms_max: float | None = None


@dataclass(frozen=True)
class Baseline:
    tps: float
    ppl: float
    greedy: list[list[int]]
    noise: float                       # relative spread of TPS across baseline server instances
    drift: float = 1.0                 # the machine's speed now relative to when the baseline was measured
    heldout_tps: float | None = None   # the baseline on the held-out prompts (same instances)
    top_logprobs: list | None = None   # per greedy prompt, per position: {token: logprob} (top-k)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    tps_ratio: float | None = None
    ppl_change: float | None = None
    agreement: float | None = None
    kl: float | None = None


def agreement(baseline: list[list[int]], candidate: list[list[int]]) -> float:
    """Mean share of each baseline greedy output that the candidate reproduces before diverging."""
    if not baseline or len(baseline) != len(candidate):
        return 0.0
    shares = []
    for want, got in zip(baseline, candidate):
        same = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
        shares.append(same / max(len(want), 1))
    return round(sum(shares) / len(shares), 4)


def kl_divergence(base: list | None, cand: list | None, base_ids: list[list[int]],
                  cand_ids: list[list[int]]) -> float | None:
    """Mean KL(baseline || candidate) over generated positions whose context is still shared.

    Each side gives only its top-k, so both are renormalised over the union of their tokens, a token
    missing from one side taking that side's smallest logprob (an upper bound on its mass there).
    Positions after the outputs diverge are left out: their contexts differ, so their
    distributions are not comparable (agreement already counts the divergence).
    """
    if not base or not cand or len(base) != len(cand):
        return None
    total, n = 0.0, 0
    for b_prompt, c_prompt, b_ids, c_ids in zip(base, cand, base_ids, cand_ids):
        if b_prompt is None or c_prompt is None:
            return None
        for position, (b, c) in enumerate(zip(b_prompt, c_prompt)):
            if position > 0 and b_ids[position - 1] != c_ids[position - 1]:
                break
            tokens = set(b) | set(c)
            pb = {t: math.exp(b.get(t, min(b.values()))) for t in tokens}
            pc = {t: math.exp(c.get(t, min(c.values()))) for t in tokens}
            zb, zc = sum(pb.values()), sum(pc.values())
            total += sum(pb[t] / zb * math.log((pb[t] / zb) / (pc[t] / zc)) for t in tokens)
            n += 1
    return round(total / n, 6) if n else None


def check(result: dict, base: Baseline, lossless: bool, settings: GateSettings = GateSettings()) -> Verdict:
    if result.get("status") != "ok":
        failure = result.get("failure") or {}
        return Verdict(False, [f"trial failed: {failure.get('class')}: {failure.get('message', '')[:200]}"])
    reasons = []
    tps, ppl = result["bench"]["tps"], result["quality"]["ppl"]
    ratio = tps / (base.tps * base.drift)
    ppl_change = ppl / base.ppl - 1
    greedy = result["quality"]["greedy"]
    agree = agreement(base.greedy, [g["token_ids"] for g in greedy])
    kl = kl_divergence(base.top_logprobs, [g.get("top_logprobs") for g in greedy], base.greedy,
                       [g["token_ids"] for g in greedy])
    if settings.kl_max is not None:
        if kl is None:
            reasons.append("KL divergence not measurable: the server returned no top-k logprobs")
        elif kl > settings.kl_max:
            reasons.append(f"KL divergence {kl:.4f} nats from the baseline's next-token distributions is above "
                           f"{settings.kl_max}")
    if result["bench"]["errors"]:
        reasons.append(f"{result['bench']['errors']} request errors")
    if ppl_change > settings.ppl_tolerance:
        reasons.append(f"perplexity {ppl:.4f} is {ppl_change:+.2%} from the baseline's {base.ppl:.4f} "
                       f"(tolerance {settings.ppl_tolerance:.2%})")
    if settings.ppl_max is not None and ppl > settings.ppl_max:
        reasons.append(f"perplexity {ppl:.4f} is above the absolute bound {settings.ppl_max}")
    if lossless and agree < 1.0:
        reasons.append(f"broken lossless claim: greedy outputs agree {agree:.1%} with the baseline's, 100% required")
    reasons += slo_breaches(result["bench"], settings)
    needed = 1 + base.noise + settings.min_gain
    if ratio <= needed:
        reasons.append(f"TPS ratio {ratio:.3f} does not clear the noise: needs more than {needed:.3f} "
                       f"(noise ±{base.noise:.1%}, margin {settings.min_gain:.1%})")
    return Verdict(not reasons, reasons, round(ratio, 4), round(ppl_change, 5), agree, kl)


def slo_breaches(bench: dict, settings: GateSettings) -> list[str]:
    out = []
    for key, bound, name in (("ttft_ms", settings.ttft_p99_ms_max, "time to first token"),
                             ("itl_ms", settings.itl_p99_ms_max, "inter-token latency")):
        p99 = (bench.get(key) or {}).get("p99")
        if bound is not None and p99 is not None and p99 > bound:
            out.append(f"SLO: p99 {name} {p99:.0f} ms is above the bound {bound:.0f} ms")
    return out


def slo_excess(bench: dict, settings: GateSettings) -> float:
    """How far the worst SLO is broken, relative to its bound (0 when all hold): Optuna's constraint."""
    worst = 0.0
    for key, bound in (("ttft_ms", settings.ttft_p99_ms_max), ("itl_ms", settings.itl_p99_ms_max)):
        p99 = (bench.get(key) or {}).get("p99")
        if bound and p99 is not None:
            worst = max(worst, p99 / bound - 1)
    return worst


def heldout_check(search_ratio: float, heldout_tps: float, base: Baseline, settings: GateSettings) -> tuple[float, list[str]]:
    """The ratio on held-out prompts (fresh server) and why it does not confirm the search ratio, if so.

    The re-check adds two noisy measurements (a fresh candidate server, the defaults' held-out
    figure), so a drop counts only beyond the user's margin plus twice the noise: in the first real
    run with this check, the same config measured 13.61 and 12.61 tok/s on two servers (7%) while
    two baseline instances had put the noise at 2.5%.
    """
    ratio = heldout_tps / (base.heldout_tps * base.drift)
    allowed = settings.heldout_margin + 2 * base.noise
    reasons = []
    if ratio < search_ratio * (1 - allowed):
        reasons.append(f"held-out re-check: {ratio:.3f}x on prompts the search never saw against {search_ratio:.3f}x "
                       f"on the search prompts, a drop beyond the allowed {allowed:.1%} (margin "
                       f"{settings.heldout_margin:.0%} + twice the noise)")
    if ratio <= 1 + base.noise:
        reasons.append(f"held-out re-check: {ratio:.3f}x, not faster than the defaults beyond the noise "
                       f"(±{base.noise:.1%}) on held-out prompts")
    return round(ratio, 4), reasons


# Two-sided 95% Student t quantiles by degrees of freedom (measurements - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093}


def interval(values: list[float], noise: float) -> tuple[float, float]:
    """95% interval of a positive figure (TPS, or a ratio) from repeated measurements: Student's t on
    the logs with two or more, ±2x the measured noise with one (two measurements, each carrying it)."""
    import statistics

    if len(values) < 2:
        return values[0] * (1 - 2 * noise), values[0] * (1 + 2 * noise)
    logs = [math.log(v) for v in values]
    half = T95[min(len(values) - 1, 19)] * statistics.stdev(logs) / math.sqrt(len(logs))
    centre = statistics.fmean(logs)
    return math.exp(centre - half), math.exp(centre + half)
