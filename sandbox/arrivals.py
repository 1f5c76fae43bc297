"""How requests arrive: a fixed concurrency (closed loop), an open-loop rate, or a trace's own times.

- `concurrency`: `concurrency` requests in flight, the next sent as one finishes (the meter's
  original profile; tokens/s ranks configs under it).
- `rate:R[,burstiness=B][,seed=S]`: requests sent at R a second whatever the server does, the gaps
  drawn as `vllm bench serve --request-rate R --burstiness B` draws them (gamma with shape B and
  scale 1/(R*B); B=1 is a Poisson process), then scaled so that n requests span n/R seconds, as
  vLLM does. The gaps come from the seed alone, so every config gets the same arrivals, and one
  pattern serves every rate (the goodput search scales it).
- `trace[:SCALE]`: the trace's own timing (its `timestamp`s, consecutive, from the first), times
  SCALE (0.5 plays it twice as fast); the goodput search rescales its pace instead.

In an open-loop profile the workload's `concurrency` caps the requests in flight, as
`--max-concurrency` does (docs/arrivals.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sandbox.traffic import TrafficError

KINDS = ("concurrency", "rate", "trace")


@dataclass(frozen=True)
class Arrivals:
    kind: str = "concurrency"
    rate: float | None = None        # requests a second (rate)
    burstiness: float = 1.0          # gamma shape (rate): 1 Poisson, below 1 burstier, above 1 steadier
    scale: float = 1.0               # trace: a multiplier on its gaps
    seed: int = 0

    @property
    def open_loop(self) -> bool:
        return self.kind != "concurrency"

    def offsets(self, count: int, rate: float | None = None, window: int = 0,
                trace: list[float] | None = None) -> list[float] | None:
        """When each of `count` requests is sent, in seconds from the phase's start (None: closed loop).

        rate overrides the profile's own (the goodput search measures several). A trace lends its
        timing, not its requests: at its own pace, phase `window` takes the trace's `count`
        consecutive timestamps from position window * count (the trace repeating past its end),
        relative to the first, times `scale`; at a given rate, every phase takes the first stretch,
        rescaled so its requests arrive at that rate, so one pattern serves every rate point as with
        `rate:`. Which requests are sent is the draw's business (fresh ones on every phase), so a
        trace's timing never makes a server see one request twice."""
        if self.kind == "concurrency":
            return None
        if self.kind == "rate":
            pace = rate or self.rate
            assert pace, "a rate profile has its rate"
            return [t / pace for t in unit_times(count, self.burstiness, self.seed)]
        times = stretch(trace, count, 0 if rate is not None else window)
        if rate is None:
            return [t * self.scale for t in times]
        return [t * (count - 1) / (rate * times[-1]) for t in times] if times[-1] > 0 else [0.0] * count
    def describe(self) -> str:
        if self.kind == "rate":
            shape = "Poisson" if self.burstiness == 1 else f"gamma, burstiness {self.burstiness:g}"
            return f"{self.rate:g} requests/s ({shape}, seed {self.seed})"
        if self.kind == "trace":
            return "the trace's own times" + (f" x {self.scale:g}" if self.scale != 1 else "")
        return "a fixed concurrency"

    def text(self) -> str:
        """The profile as parse() reads it: what workload files and results hold."""
        if self.kind == "rate":
            return f"rate:{self.rate:g},burstiness={self.burstiness:g},seed={self.seed}"
        if self.kind == "trace":
            return f"trace:{self.scale:g}"
        return "concurrency"


def stretch(trace: list[float] | None, count: int, window: int) -> list[float]:
    """count consecutive send times of a trace from position window * count, from 0; past its end the
    trace repeats, one mean gap after its last request."""
    if not trace or len(trace) < 2 or not trace[-1] > trace[0]:
        raise TrafficError("arrivals 'trace' needs a traffic file with two or more distinct timestamps")
    period = (trace[-1] - trace[0]) * len(trace) / (len(trace) - 1)
    first = window * count
    times = [trace[(first + i) % len(trace)] + period * ((first + i) // len(trace)) for i in range(count)]
    return [t - times[0] for t in times]


def mean_rate(trace: list[float]) -> float:
    """A trace's own pace, requests a second: its gaps' count over its span."""
    span = trace[-1] - trace[0]
    return (len(trace) - 1) / span if span > 0 else float("inf")


def unit_times(n: int, burstiness: float, seed: int) -> list[float]:
    """Send times at one request a second: cumulative gamma gaps (shape burstiness, scale 1/burstiness),
    scaled so the n requests span n seconds (vllm.benchmarks.serve.get_request's normalisation)."""
    if n == 0:
        return []
    # NumPy's legacy generator, seeded: the draws `vllm bench serve --seed S` makes (np.random.gamma).
    gaps = np.random.RandomState(seed).gamma(shape=burstiness, scale=1.0 / burstiness, size=n)
    times = np.cumsum(gaps)
    if not times[-1] > 0:   # every gap rounded to 0 (a burstiness near 0): all at once, as vLLM leaves them
        return [0.0] * n
    return [float(t) for t in times * (n / times[-1])]


def parse(text: str, where: str = "--arrivals") -> Arrivals:
    """`concurrency`, `rate:2`, `poisson:2`, `rate:2,burstiness=0.5,seed=7`, `trace` or `trace:0.5`."""
    kind, _, rest = str(text).strip().partition(":")
    kind = "rate" if kind == "poisson" else kind
    if kind not in KINDS:
        raise TrafficError(f"{where}: {text!r} is not one of concurrency, rate:R[,burstiness=B][,seed=S], "
                           f"poisson:R, trace[:SCALE]")
    parts = [p.strip() for p in rest.split(",") if p.strip()] if rest else []
    try:
        if kind == "concurrency":
            if parts:
                raise ValueError("takes no value")
            return Arrivals()
        if kind == "trace":
            scale = float(parts[0]) if parts else 1.0
            if len(parts) > 1 or not 0 < scale < float("inf"):
                raise ValueError("the scale must be one finite number above 0")
            return Arrivals("trace", scale=scale)
        if not parts or "=" in parts[0]:
            raise ValueError("needs a rate in requests a second first")
        if any("=" not in p for p in parts[1:]):
            raise ValueError("options are name=value (burstiness, seed)")
        options = dict(p.split("=", 1) for p in parts[1:])
        unknown = set(options) - {"burstiness", "seed"}
        if unknown:
            raise ValueError(f"unknown option {sorted(unknown)[0]!r} (burstiness, seed)")
        rate, burstiness = float(parts[0]), float(options.get("burstiness", 1.0))
        found = Arrivals("rate", rate=rate, burstiness=burstiness, seed=int(options.get("seed", 0)))
        if not (rate > 0 and burstiness > 0 and np.isfinite([rate, burstiness]).all()):
            raise ValueError("the rate and the burstiness must be finite and above 0")
        if not 0 <= found.seed < 2 ** 32:
            raise ValueError("the seed must be from 0 to 2**32 - 1 (NumPy's)")
        return found
    except ValueError as e:
        raise TrafficError(f"{where}: {text!r}: {e}") from None
