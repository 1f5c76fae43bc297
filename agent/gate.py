"""The quality gate and the speed decision: a config is accepted only if it is faster and no worse.

Pure functions of worker results and the run's baseline, so every verdict can be recomputed from
the ledger. Three questions, in the order a trial answers them:
1. No worse (`check`): perplexity, request errors, SLOs (or, without one, no p99 latency above the
   defaults' beyond their noise: `latency_regressions`), and for a lossless config greedy
   outputs equivalent to the defaults' up to numerics (agent.greedy), judged by a tolerance
   calibrated on the defaults' own server instances.
2. Plausibly faster (`check`'s screen): one instance on the search prompts; a config that is not
   even faster there is not worth fresh servers.
3. Faster (`decide`): fresh instances on held-out prompts against the defaults' instances, a
   sequential test that measures more instances while the bounds straddle the threshold.
The reasons are sentences a reviewer reads in the morning.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.greedy import TAU_CAP, Calibration, Flip, agreement, calibrate, flips, greedy_check, kl_divergence
from agent.stats import Comparison, Noise, compare, pooled_noise, t_quantile
from sandbox.contract import Figures, Quality, TrialResult


@dataclass(frozen=True)
class GateSettings:
    ppl_tolerance: float = 0.01        # relative: ppl <= baseline ppl * (1 + tolerance)
    ppl_max: float | None = None       # optional absolute bound
    min_gain: float = 0.0              # the held-out ratio's lower bound must clear 1 + min_gain
    kl_max: float | None = None        # optional: mean KL divergence (nats) from the defaults' top-k, every config
    kl_max_lossy: float = 0.005        # the same bound, on by default for lossy configs: perplexity alone was
                                       # gamed in the challenge; between online fp8 weights and numerics-only
                                       # speculation (docs/meters-and-gate.md)
    slo_ttft_p99_ms: float | None = None   # SLO bounds: a faster config that breaks one is refused; where
    slo_itl_p99_ms: float | None = None    # set, each replaces the latency guard for its latency (the chunk-gap
                                           # p99 is judged only by its SLO: latency_regressions)
    slo_tpot_p99_ms: float | None = None   # per request, (latency - TTFT) / (tokens - 1), as vllm bench serve's TPOT
    latency_tolerance: float = 0.10    # the latency guard's least tolerance: a p99 is the 3rd-highest of a few hundred
                                       # requests, so one instance's moves by several percent, and with one or two
                                       # instances of the defaults their spread says little (latency_bound)
    level: float = 0.99                # one-sided level of each bound, per look of the sequential test
    detect: float = 0.10               # the gain the test is sized for: refused once the bounds exclude it
    max_instances: int = 16            # fresh candidate instances at most in one held-out decision
    exact: bool = False                # greedy outputs must match token for token (batch-invariant mode)
    noisy: float = 0.06                # instance log-sd above which the defaults get more instances...
    noise_prior: Noise = Noise(0.0, 0)  # instance noise known before the run (the space's); df 0: none
    max_defaults: int = 6              # ...up to this many (the baseline's, the A/A's and later ones)


# ---- 1 and 2. No worse, and plausibly faster: one instance on the search prompts --------------

@dataclass(frozen=True)
class Baseline:
    """The run's defaults: every instance so far, and what a lossless config must reproduce.

    The held-out decision compares a candidate only with instances of the defaults that played no
    part in screening it: the A/A instance (its search figure counts in the noise, not in the
    screen's reference) and those measured on the held-out prompts alone (`extras`), never the
    baseline instances the search-side screen used. A screen passes a candidate more often when the
    instances it compared with happened to be slow, and an instance is slow on both prompt sets; a
    decision against those same instances would accept a config with no gain more often than its
    bounds say (6.3% instead of 3.9% at log-sd 0.07, measured with bench/gate_oc.py).
    """
    search: list[float]                 # TPS of each instance of the defaults the screen compares with
    heldout: list[float]                # on the held-out prompts: the A/A's and instances measured for decisions
    ppl: float
    reference: dict                     # first instance's greedy path: {"ids": ..., "tops": ...}
    calibration: Calibration
    drift: float = 1.0                  # the machine's speed now relative to the baseline's
    noise_groups: tuple = ()            # further groups of instances of one config (see stats.pooled_noise)
    unscreened: tuple = ()              # search figures of the defaults kept out of the screen (the A/A's)
    prior: Noise = Noise(0.0, 0)        # the instance noise known before the run (GateSettings.noise_prior)
    ttft_p99: tuple = ()                # p99 TTFT (ms) of each instance on the search prompts, the A/A's included
    itl_p99: tuple = ()                 # p99 gap between streamed chunks (ms), the same instances
    tpot_p99: tuple = ()                # p99 time per output token of a request (ms), the same instances
    e2e_p99: tuple = ()                 # p99 end-to-end latency (ms), the same instances

    @property
    def figure(self) -> float:
        return geomean(self.search)

    @property
    def heldout_figure(self) -> float | None:
        return geomean(self.heldout) if self.heldout else None

    @property
    def groups(self) -> list:
        """Every group of instances of one config that the run's instance noise is pooled from."""
        return [[*self.search, *self.unscreened], *self.noise_groups]

    @property
    def noise(self) -> Noise:
        """The instance noise every bound uses: the run's own instances and the prior together."""
        return self.noise_with()

    def noise_with(self, *more: list[float]) -> Noise:
        """The noise with further groups of instances of one config each (a candidate's, say)."""
        return pooled_noise([*self.groups, *more], self.prior)

    @property
    def measured_noise(self) -> Noise:
        """The run's own instances alone: what this machine showed."""
        return pooled_noise(self.groups)


@dataclass(frozen=True)
class Verdict:
    passed: bool                        # no worse, and plausibly faster: worth the held-out decision
    reasons: list[str] = field(default_factory=list)
    quality_ok: bool = True             # no worse (Optuna's constraint is this, not the speed)
    search_ratio: float | None = None
    search: Comparison | None = None
    ppl_change: float | None = None
    agreement: float | None = None
    kl: float | None = None
    flips: list[Flip] = field(default_factory=list)
    latency_excess: float = 0.0         # how far (relative) the worst p99 was above the latency guard's bound


def greedy_of(result: TrialResult) -> dict:
    quality = result.quality or Quality(ppl=float("nan"))
    return {"ids": quality.token_ids, "tops": quality.top_logprobs}


def check(result: TrialResult, base: Baseline, lossless: bool, settings: GateSettings = GateSettings()) -> Verdict:
    """The gate on one candidate instance: quality (perplexity, KL, greedy outputs where lossless, the
    SLOs) and speed on the search prompts; the figure is the run's objective's (Figures.value)."""
    if not result.ok:
        failure = result.failure
        return Verdict(False, [f"trial failed: {failure.klass if failure else None}: "
                               f"{(failure.message if failure else '')[:200]}"], False)
    assert result.bench is not None and result.quality is not None   # what an ok result measured
    reasons = []
    figure, ppl = result.bench.value, result.quality.ppl
    search = compare([figure], base.search, base.noise, settings.level, base.drift)
    ppl_change = ppl / base.ppl - 1
    greedy = greedy_of(result)
    agree = agreement(base.reference["ids"], greedy["ids"])
    found = flips(base.reference["ids"], base.reference["tops"], greedy["ids"])
    kl = kl_divergence(base.reference["tops"], greedy["tops"], base.reference["ids"], greedy["ids"])
    kl_max = settings.kl_max if settings.kl_max is not None or lossless else settings.kl_max_lossy
    if kl_max is not None:
        if kl is None:
            reasons.append("KL divergence not measurable: the server returned no top-k logprobs")
        elif kl > kl_max:
            reasons.append(f"KL divergence {kl:.4f} nats from the defaults' next-token distributions is above "
                           f"{kl_max}" + ("" if settings.kl_max is not None else " (the bound for lossy configs)"))
    if result.bench.errors:
        reasons.append(f"{result.bench.errors} request errors")
    if ppl_change > settings.ppl_tolerance:
        reasons.append(f"perplexity {ppl:.4f} is {ppl_change:+.2%} from the defaults' {base.ppl:.4f} "
                       f"(tolerance {settings.ppl_tolerance:.2%})")
    if settings.ppl_max is not None and ppl > settings.ppl_max:
        reasons.append(f"perplexity {ppl:.4f} is above the absolute bound {settings.ppl_max}")
    if lossless:
        why, found, kl = greedy_check(base.reference, greedy, base.calibration)
        reasons += why
    reasons += slo_breaches(result.bench, settings)
    slower, excess = latency_regressions(result.bench, base, settings)
    reasons += slower
    quality_ok = not reasons
    if search.ratio <= 1 + settings.min_gain:
        reasons.append(f"not faster on the search prompts: {search.ratio:.3f}x the defaults "
                       f"(more than {1 + settings.min_gain:.3f} is needed to be worth fresh servers)")
    return Verdict(not reasons, reasons, quality_ok, round(search.ratio, 4), search, round(ppl_change, 5),
                   agree, kl, found, excess)


def slo_breaches(bench: Figures, settings: GateSettings) -> list[str]:
    out = []
    for key, bound, name in (("ttft_ms", settings.slo_ttft_p99_ms, "time to first token"),
                             ("itl_ms", settings.slo_itl_p99_ms, "inter-token latency"),
                             ("tpot_ms", settings.slo_tpot_p99_ms, "time per output token")):
        p99 = getattr(bench, key).get("p99")
        if bound is not None and p99 is not None and p99 > bound:
            out.append(f"SLO: p99 {name} {p99:.0f} ms is above the bound {bound:.0f} ms")
    return out


# What the latency guard watches, as a reader feels it: the Figures field, the Baseline field with the
# defaults' p99s, the GateSettings SLO that replaces the guard for it (None: no SLO does), the name a
# reason uses, and the option that allows it. The gap between two streamed chunks is not here: under
# speculative decoding a chunk carries several tokens, so its gaps grow while every request ends
# sooner; it is judged only where the user bounds it (--slo-itl-p99-ms, slo_breaches).
LATENCIES = (("ttft_ms", "ttft_p99", "slo_ttft_p99_ms", "time to first token", "--slo-ttft-p99-ms"),
             ("tpot_ms", "tpot_p99", "slo_tpot_p99_ms", "time per output token", "--slo-tpot-p99-ms"),
             ("latency_ms", "e2e_p99", None, "end-to-end latency", None))


def latency_bound(p99s: tuple, settings: GateSettings) -> float | None:
    """The highest p99 a candidate may show without being slower than the defaults beyond their noise.

    A one-sided Student-t prediction bound, at the gate's level, for one more instance's log p99 from
    the defaults' instances: their geometric mean times exp(t * sd * sqrt(1 + 1/n)). Never tighter
    than latency_tolerance (a p99 of a few hundred requests moves by several percent between
    instances, and two or three instances can agree by luck); with one instance, the tolerance alone.
    None: the defaults measured no such latency."""
    if not p99s:
        return None
    spread = math.log(1 + settings.latency_tolerance)
    noise = pooled_noise([list(p99s)])   # the defaults' instances as one group: n - 1 degrees of freedom
    if noise.df >= 1:
        spread = max(spread, t_quantile(settings.level, noise.df) * noise.sd * math.sqrt(1 + 1 / len(p99s)))
    return geomean(p99s) * math.exp(spread)


def latency_regressions(bench: Figures, base: Baseline, settings: GateSettings) -> tuple[list[str], float]:
    """The latency guard: at the same load, a config may raise tokens/s by holding requests longer
    (fewer --max-num-seqs raise the TTFT p99, a longer --stream-interval each request's pace:
    docs/results.md). Why a candidate's p99 time to first token, time per output token or end-to-end
    latency is above the defaults' beyond their noise, and how far above its bound the worst one is.

    Only under the objective tps: goodput counts only requests within the SLOs, and a latency
    objective is the latency itself, so both already weigh what this guards. A latency the user gave
    an SLO for is judged by that SLO alone (slo_breaches): the user said how much latency is fine."""
    if bench.objective != "tps":
        return [], 0.0
    reasons, worst = [], 0.0
    for key, field_, slo, name, option in LATENCIES:
        mine, theirs = getattr(bench, key).get("p99"), getattr(base, field_)
        bound = latency_bound(theirs, settings)
        if (slo and getattr(settings, slo) is not None) or mine is None or bound is None or mine <= bound:
            continue
        allow = f"; set {option} to allow it" if option else ""
        reasons.append(f"latency: p99 {name} {fmt_ms(mine)} ms is above the defaults' {fmt_ms(geomean(theirs))} ms "
                       f"beyond their noise (bound {fmt_ms(bound)} ms{allow})")
        worst = max(worst, mine / bound - 1)
    return reasons, round(worst, 4)


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def fmt_ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"   # an ITL of a few ms keeps its tenths


def constraint(verdict: Verdict, result: TrialResult, settings: GateSettings) -> float:
    """Optuna's constraint for a trial, computed once (0: feasible). A failure or any quality
    refusal is infeasible, scaled by how far an SLO or the latency guard's bound was broken where
    that is what refused it."""
    if not result.ok:
        return 1.0
    if verdict.quality_ok:
        return 0.0
    worst = verdict.latency_excess
    for key, bound in (("ttft_ms", settings.slo_ttft_p99_ms), ("itl_ms", settings.slo_itl_p99_ms),
                       ("tpot_ms", settings.slo_tpot_p99_ms)):
        p99 = getattr(result.bench, key).get("p99")
        if bound and p99 is not None:
            worst = max(worst, p99 / bound - 1)
    return round(max(worst, 1e-3), 4) if worst > 0 else 1.0


def screen_floor(base: Baseline, settings: GateSettings) -> float:
    """The figure a candidate's search instance must exceed to pass the screen (see check)."""
    return round(base.figure * base.drift * (1 + settings.min_gain), 3)


PRUNE_LEVEL = 0.999   # a config is stopped only when even this unlucky an instance of it could not be slower


def prune_below(base: Baseline) -> float | None:
    """The figure under which a candidate's benchmark is stopped (sandbox.bench.Pruner): the defaults'
    figure less what instance noise can take from one instance of a config that is really as fast, at
    PRUNE_LEVEL. Nothing is pruned before the noise is known (measured, or the space's prior)."""
    noise = base.noise
    if noise.df < 1:
        return None
    spread = t_quantile(PRUNE_LEVEL, noise.df) * noise.sd * math.sqrt(1 + 1 / len(base.search))
    return round(base.figure * base.drift * math.exp(-spread), 3)


# ---- 3. Faster: a sequential test on held-out prompts -----------------------------------------

class MeasureFailed(RuntimeError):
    """A fresh instance needed for a decision did not give a figure (the message says why)."""


@dataclass(frozen=True)
class HeldOutOutcome:
    accepted: bool
    reasons: list[str]
    comparison: Comparison
    candidate: list[float]     # the candidate's held-out instances
    extra_defaults: list[float]  # default instances measured for this decision


def sequential_test(first: float, base: Baseline, settings: GateSettings, more_candidate: Callable[[], float],
           more_defaults: Callable[[], float], search_ratio: float | None = None) -> HeldOutOutcome:
    """A sequential test of the held-out ratio, looking again after each fresh instance.

    Accept when the lower bound (at `level`) clears 1 + min_gain: the claim committed. Refuse when
    the evidence favours no gain over the gain the test is sized for (Wald's sequential probability
    ratio, whose lower boundary stops configs without a gain after few instances), or when
    max_instances of the candidate have not decided it. While neither, measure one more instance
    of the candidate, and one of the defaults whenever they have no more instances than it.
    """
    candidate, extras = [first], list[float]()
    need = 1 + settings.min_gain
    while True:
        defaults = [*base.heldout, *extras]
        if not defaults:
            try:
                extras.append(more_defaults())
            except MeasureFailed as e:
                return HeldOutOutcome(False, [f"no instance of the defaults on the held-out prompts: {e}"],
                                compare(candidate, candidate, Noise(0.0, 0)), candidate, extras)
            continue
        noise = base.noise_with(candidate, extras)
        c = compare(candidate, defaults, noise, settings.level, base.drift)
        why = (f"held-out {c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}] from {len(candidate)} fresh instance(s) "
               f"against {len(defaults)} of the defaults")
        drop = _drop(search_ratio, c, noise)
        if c.low > need:
            return HeldOutOutcome(True, [f"{why}: clears {need:.3f}{drop}"], c, candidate, extras)
        target = sized_gain(settings, noise)
        if _favours_no_gain(c, noise, math.log(need), target):
            return HeldOutOutcome(False, [f"{why}: favours no gain over the {target - 1:.0%} the test is sized "
                                          f"for{drop}"], c, candidate, extras)
        if len(candidate) >= settings.max_instances:
            return HeldOutOutcome(False, [f"{why}: undecided after {len(candidate)} instances, not shown to clear "
                                    f"{need:.3f}{drop}"], c, candidate, extras)
        try:
            if len(defaults) <= len(candidate):
                extras.append(more_defaults())
            candidate.append(more_candidate())
        except MeasureFailed as e:
            return HeldOutOutcome(False, [f"{why}; then {e}"], c, candidate, extras)


def sized_gain(settings: GateSettings, noise: Noise) -> float:
    """The gain the test is sized to find: `detect`, or SIZED_SD times the instance noise where that is
    larger (a smaller gain cannot be told from one instance's luck at an affordable number of them)."""
    return max(1 + settings.detect, math.exp(SIZED_SD * noise.sd))


def looks_needed(gain: float, noise: Noise, settings: GateSettings) -> int | None:
    """About how many fresh held-out instances of a candidate `decide` measures before a true `gain`
    clears 1 + min_gain at the noise (the defaults getting one more whenever they have no more than
    the candidate: about as many): the smallest n with log(gain) - t * sd * sqrt(2 / n) above
    log(1 + min_gain). None: not within max_instances, or no noise known to size it by."""
    margin = math.log(gain) - math.log(1 + settings.min_gain)
    if noise.df < 1 or margin <= 0:
        return None
    spread = t_quantile(settings.level, noise.df) * noise.sd / margin
    n = max(1, math.ceil(2 * spread ** 2))
    return n if n <= settings.max_instances else None


SIZED_SD = 1.5
WALD_LOWER = math.log(0.05 / (1 - 0.05))   # Wald's lower boundary for 5% false refusal at the sized gain


def _favours_no_gain(c: Comparison, noise: Noise, floor: float, target: float) -> bool:
    if noise.df < 1:
        return False
    se2 = noise.sd ** 2 * (1 / c.candidates + 1 / c.defaults)
    delta = math.log(target)
    llr = delta / se2 * (math.log(c.ratio) - floor - delta / 2)
    return llr < WALD_LOWER


def _drop(search_ratio: float | None, c: Comparison, noise: Noise) -> str:
    """A held-out ratio below the search one beyond the noise is reported (it does not refuse)."""
    if search_ratio is None or noise.df < 1 or c.high >= search_ratio:
        return ""
    return f" (below the search prompts' {search_ratio:.3f}x beyond the noise: the gain depends on the prompts)"


# ---- The baseline, and the A/A check that proves the gate on it -------------------------------

@dataclass(frozen=True)
class Instance:
    """One server instance of the defaults, as the gate needs it."""
    figure: float
    heldout_figure: float | None = None
    ppl: float | None = None
    greedy: dict | None = None          # {"ids": ..., "tops": ...}
    ttft_p99_ms: float | None = None    # its latencies on the search prompts, for the latency guard
    itl_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p99_ms: float | None = None


def baseline_of(instances: list[Instance], settings: GateSettings, extras: tuple = (),
                aa: Instance | None = None) -> Baseline:
    """The defaults from their first instances: the first one's greedy path is the reference. The
    A/A instance, once judged, is no part of the screen: its search figure joins the noise, its
    held-out figure is the first instance of the defaults every held-out decision compares with
    (so a first decision needs one fresh instance of the candidate, not two instances)."""
    reference = instances[0].greedy or {"ids": [], "tops": []}
    others = [i.greedy for i in instances[1:] if i.greedy]
    measured = [*instances, *([aa] if aa else [])]   # every instance measured on the search prompts
    ppls = [i.ppl for i in measured if i.ppl]
    heldout = [*([aa.heldout_figure] if aa and aa.heldout_figure else []), *extras]
    return Baseline(search=[i.figure for i in instances], heldout=heldout, ppl=sum(ppls) / len(ppls),
                    reference=reference,
                    calibration=calibrate(reference, others, settings.exact),
                    noise_groups=(tuple(heldout),) if heldout else (), unscreened=(aa.figure,) if aa else (),
                    prior=settings.noise_prior,
                    ttft_p99=tuple(i.ttft_p99_ms for i in measured if i.ttft_p99_ms and i.ttft_p99_ms > 0),
                    itl_p99=tuple(i.itl_p99_ms for i in measured if i.itl_p99_ms and i.itl_p99_ms > 0),
                    tpot_p99=tuple(i.tpot_p99_ms for i in measured if i.tpot_p99_ms and i.tpot_p99_ms > 0),
                    e2e_p99=tuple(i.e2e_p99_ms for i in measured if i.e2e_p99_ms and i.e2e_p99_ms > 0))


@dataclass(frozen=True)
class AAVerdict:
    passed: bool
    line: str                           # what the run says about it, in one line
    speed: Comparison
    flips: list[Flip]
    calibration: Calibration            # widened to cover what the A/A showed, where the cap allows
    add_instances: bool                 # the speed rule called the defaults faster or slower than themselves


def judge_aa(aa: Instance, base: Baseline, settings: GateSettings) -> AAVerdict:
    """The defaults once more, as if a candidate: the verdict must be "no loss, no gain"."""
    speed = compare([aa.figure], base.search, base.noise, settings.level, base.drift)
    greedy = aa.greedy or {"ids": [], "tops": []}
    reasons, found, kl = greedy_check(base.reference, greedy, base.calibration)
    cal, notes = base.calibration, []
    if reasons and cal.rule == "calibrated":
        margins = [f.margin for f in found if f.margin is not None]
        if len(margins) == len(found) and all(m <= TAU_CAP for m in margins):
            tau = max([cal.tau, *margins])
            kl_bound = round(max(cal.kl_bound, 2 * (kl or 0.0)), 6)
            cal = Calibration(round(tau, 5), max(cal.flips_allowed, len(found)), kl_bound, cal.rule,
                              f"{cal.reason}; widened by the A/A check, which flipped {len(found)} prompt(s) at "
                              f"margins up to {max(margins, default=0.0):.3f} nats")
            notes.append(f"greedy check failed ({reasons[0]}); tau widened to {cal.tau:.3f}")
        else:
            notes.append(f"greedy check failed beyond the cap ({reasons[0]}); lossless configs will be judged "
                         f"against a reference the defaults themselves do not reproduce")
    faster, slower = speed.low > 1 + settings.min_gain, speed.high < 1
    if faster or slower:
        notes.append(f"the speed rule calls the defaults {'faster' if faster else 'slower'} than themselves "
                     f"({speed.ratio:.3f}x [{speed.low:.3f}, {speed.high:.3f}]); adding baseline instances")
    passed = not notes
    line = (f"A/A check: no loss, no gain ({speed.ratio:.3f}x [{speed.low:.3f}, {speed.high:.3f}], "
            f"{len(found)} flip(s), tau {cal.tau:.3f})" if passed else
            f"A/A check failed: {'; '.join(notes)} ({len(found)} flip(s), tau {cal.tau:.3f})")
    return AAVerdict(passed, line, speed, found, cal, faster or slower)


def more_defaults_wanted(base: Baseline, aa: AAVerdict, added_after_aa: int, settings: GateSettings) -> bool:
    """Whether the run should measure the defaults on one more instance before any candidate: when the
    A/A called them faster or slower than themselves (once), or while their noise is high, where
    a few instances leave every bound wide and the estimate of the noise itself uncertain."""
    if len(base.search) + len(base.unscreened) >= settings.max_defaults:
        return False
    return (aa.add_instances and added_after_aa == 0) or base.measured_noise.sd > settings.noisy
