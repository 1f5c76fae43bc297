"""The gate's statistics, in one place. Server instances are the unit of noise.

A server instance of a config measures its TPS once (the median of its repeats); two instances
of the same config differ by several percent (docs/results.md, "How noisy is a server instance"). So every
figure here is the log of an instance's TPS, the noise is the spread of those logs pooled over
every group of instances of one config, and a ratio's bounds are Student-t prediction bounds
for the candidate's instances against the defaults' instances.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

NORMAL = statistics.NormalDist()


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile, exact to about 1e-12: closed forms for 1 and 2 degrees of freedom, beyond
    them the root of the distribution function (t_cdf, through the regularized incomplete beta
    function) by bisection. Tested against tabulated values at every level the gate uses
    (tests/test_gate.py). The Cornish-Fisher series used before was 1.9% low at 0.99 and 8.6% low
    at 0.999 with 3 degrees of freedom: bounds narrower than stated, most where pruning decides."""
    if df < 1:
        raise ValueError(f"t quantile needs at least one degree of freedom, got {df}")
    if not 0 < p < 1:
        raise ValueError(f"t quantile needs 0 < p < 1, got {p}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-13 * max(1.0, high):
            break
    return (low + high) / 2


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function: 1 - I_x(df/2, 1/2) / 2 at x = df / (df + t^2), for t >= 0."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x > (a + 1) / (a + b + 2):   # the fraction converges fast on this side only
        return 1 - _incomplete_beta(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * f / a


@dataclass(frozen=True)
class Noise:
    """The pooled standard deviation of log TPS between server instances of one config."""
    sd: float
    df: int          # degrees of freedom: instances minus groups

    def as_dict(self) -> dict:
        return {"sd": round(self.sd, 5), "df": self.df}


def pooled_noise(groups: list[list[float]], prior: Noise | None = None) -> Noise:
    """Pool the log-scale spread of several groups of TPS figures, each group instances of one
    config measured on one prompt split (each instance in one group only).

    A prior (the spread measured on earlier runs of this engine on machines of this kind, worth
    `prior.df` instances) joins as that many degrees of freedom at its own spread: the conjugate
    scaled inverse chi-square prior on the variance, whose posterior predictive is Student's t with
    the summed degrees of freedom. A run's own instances outweigh it as they accumulate."""
    squares, df = (prior.df * prior.sd ** 2, prior.df) if prior and prior.df > 0 else (0.0, 0)
    for group in groups:
        logs = [math.log(x) for x in group if x and x > 0]
        if len(logs) >= 2:
            mean = statistics.fmean(logs)
            squares += sum((v - mean) ** 2 for v in logs)
            df += len(logs) - 1
    return Noise(math.sqrt(squares / df) if df else 0.0, df)


@dataclass(frozen=True)
class Comparison:
    """Candidate instances against the defaults' instances: the ratio of geometric means and its
    one-sided bounds at the given level (each side holds with that probability)."""
    ratio: float
    low: float
    high: float
    candidates: int
    defaults: int
    level: float

    def as_dict(self) -> dict:
        return {"ratio": round(self.ratio, 4), "low": round(self.low, 4), "high": round(self.high, 4),
                "candidate_instances": self.candidates, "default_instances": self.defaults, "level": self.level}


def compare(candidate: list[float], defaults: list[float], noise: Noise, level: float = 0.95,
            scale: float = 1.0) -> Comparison:
    """Bounds on the ratio candidate/defaults from server instances of each.

    scale multiplies the defaults (the machine's drift). With no degrees of freedom there is no
    noise estimate, and the bounds are left open rather than pretending to be tight.
    """
    diff = (statistics.fmean(math.log(x) for x in candidate)
            - statistics.fmean(math.log(x * scale) for x in defaults))
    if noise.df < 1:
        return Comparison(math.exp(diff), 0.0, math.inf, len(candidate), len(defaults), level)
    half = t_quantile(level, noise.df) * noise.sd * math.sqrt(1 / len(candidate) + 1 / len(defaults))
    return Comparison(math.exp(diff), math.exp(diff - half), math.exp(diff + half), len(candidate),
                      len(defaults), level)


def interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Two-sided interval of a positive figure from repeated measurements of it (t on the logs)."""
    logs = [math.log(v) for v in values]
    if len(logs) < 2:
        return 0.0, math.inf
    half = t_quantile(1 - (1 - level) / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    centre = statistics.fmean(logs)
    return math.exp(centre - half), math.exp(centre + half)
