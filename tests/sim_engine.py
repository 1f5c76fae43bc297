"""A simulated vLLM for benchmarking the search and the gate: thousands of trials in seconds.

Never a default and never a stand-in for the real-engine tests. The speed surface is hand-written
from what we measured (binding every core: about 1.5x) and what vLLM's docs and our notes lead us
to expect for the other knobs; it has a few traps a search must learn (a region that runs out of
memory, a lossy knob that costs perplexity, a "lossless" knob that is slower).

Noise is what we measured on real servers: every server instance draws its own speed factor,
log-normal with log-sd `noise` (0.03-0.05 on the 2-core CPU machine, 0.07-0.15 on the H200), and
its repeats differ by a third of that. A held-out re-check is a fresh instance with the same noise;
the baseline's held-out figure shares its instance's factor. Greedy outputs flip at near-ties the
way bf16 serving did on the H200: each prompt has a position where the top two tokens are
`tie_margin` nats apart, and each instance takes the runner-up there with probability `flip_rate`.

Time is simulated too (`clock`, seconds; start 60-120 s, the benchmark its tokens over the TPS, the
quality phase 25 s: the CPU machine's figures), and so are the two kinds of refusal vLLM has:
one its config classes raise, which the pre-flight answers in a second, and one only engine
initialisation raises, after a start's worth of time. A hopeless region (tiny batched-token
budgets) runs at a tenth of the defaults' speed, so its benchmark takes ten times as long unless
it is pruned.
"""

from __future__ import annotations

import math
import random

from sandbox.result import Failure, Figures, Quality, TrialResult

PROMPTS, TOKENS = 32, 64
BENCH_TOKENS = 24 * 64          # the measured requests' output tokens (a CPU meter)
CONFIG_REFUSAL = ("1 validation error for VllmConfig: Value error, ngram speculation needs chunked prefill "
                  "(num_speculative_tokens={k})")
START_REFUSAL = "NotImplementedError: CPU_ATTN with block size 32 needs prefix caching"


def config_refused(flags: dict) -> str | None:
    spec_cfg = flags.get("speculative-config") or {}
    if spec_cfg.get("method") == "ngram" and flags.get("enable-chunked-prefill") is False:
        return CONFIG_REFUSAL.format(k=spec_cfg.get("num_speculative_tokens"))
    return None


class SimulatedEngine:
    def __init__(self, seed: int = 0, noise: float = 0.03, flip_rate: float = 0.0, tie_margin: float = 0.125,
                 tie_share: float = 0.25, gain: dict | None = None, start_s: tuple = (60.0, 120.0),
                 quality_s: float = 25.0, bench_tokens: int = BENCH_TOKENS, binding: float = 1.5):
        self.rng = random.Random(seed)
        self.start_range, self.quality_s, self.bench_tokens = start_s, quality_s, bench_tokens
        self.clock = 0.0                # simulated seconds spent so far
        self.noise, self.flip_rate, self.tie_margin = noise, flip_rate, tie_margin
        self.gain = gain or {}          # extra speed factors by env/flag value, for the gate's benchmark
        self.binding = binding          # core binding's gain, the defaults' one lossless win here
        tie_rng = random.Random(1234)   # the model's near-ties are a property of the model, not the run
        self.ties = {p: tie_rng.randrange(4, TOKENS) for p in range(PROMPTS) if tie_rng.random() < tie_share}

    def speed(self, flags: dict, env: dict) -> float:
        tps = 10.0
        tps *= self.binding if env.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" else 1.0
        tps *= 0.85 if flags.get("enforce-eager") else 1.0
        tps *= 0.6 if flags.get("dtype") == "float32" else 1.0
        tps *= 1.03 if flags.get("block-size") == 128 else 1.0
        tps *= 0.97 if flags.get("enable-chunked-prefill") is False else 1.0
        tps *= 0.1 if flags.get("max-num-batched-tokens", 2048) < 400 else 1.0   # hopeless: steps too small
        spec_cfg = flags.get("speculative-config") or {}
        if spec_cfg.get("method") == "ngram":
            k = spec_cfg.get("num_speculative_tokens", 4)
            lookup = spec_cfg.get("prompt_lookup_min", 2)
            tps *= (1.0 + 0.06 * min(k, 4) - 0.05 * max(0, k - 4)) * (1.0 if lookup <= 2 else 0.95)
        for key, factor in self.gain.items():
            name, value = key.split("=", 1)
            if str(env.get(name, flags.get(name))) == value:
                tps *= factor
        return tps

    def start_refused(self, flags: dict) -> str | None:
        """A refusal only engine initialisation raises, after a start's worth of time."""
        if flags.get("block-size") == 32 and flags.get("enable-prefix-caching") is False:
            return START_REFUSAL
        return None

    def repeat_share(self) -> float | None:
        """The answers' repeat share the meter records (None: not modelled for this engine's traffic)."""
        return None

    def greedy(self, lossy: bool) -> list[dict]:
        out = []
        for p in range(PROMPTS):
            ids = [1000 + 7 * p + i for i in range(TOKENS)]
            tops = [{str(t): -0.05, str(t + 1): -3.0} for t in ids]
            if p in self.ties:
                at = self.ties[p]
                tops[at] = {str(ids[at]): -1.0, str(ids[at] + 1): -1.0 - self.tie_margin}
                if self.rng.random() < self.flip_rate:
                    ids = ids[:at] + [ids[at] + 1] + [5000 + i for i in range(TOKENS - at - 1)]
                    tops = tops[:at + 1] + [{str(t): -0.05, str(t + 1): -3.0} for t in ids[at + 1:]]
            if lossy and p % 4 == 0:   # a lossy config changes a clear choice on a quarter of the prompts
                ids = ids[:2] + [ids[2] + 2] + ids[3:]
            out.append({"token_ids": ids, "top_logprobs": tops})
        return out

    def preflight(self, model, flags, env):
        self.clock += 1.0 + (10.0 if not getattr(self, "_imported", False) else 0.0)   # vLLM imported once
        self._imported = True
        said = config_refused(flags)
        return {"ok": said is None, "message": said} if said else {"ok": True}

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        trial_dir.mkdir(parents=True, exist_ok=True)
        flags, env = spec["flags"], spec["env"]
        on_phase("start")
        start_s = self.rng.uniform(*self.start_range)
        for said in (config_refused(flags), self.start_refused(flags)):
            if said:
                self.clock += start_s / 2
                return TrialResult(status="failed", failed_phase="start", timings={"start_s": start_s / 2},
                                   failure=Failure("invalid_config", f"server exited with code 1 during start: {said}",
                                                   said, cause=said))
        seqs, tokens = flags.get("max-num-seqs", 256), flags.get("max-num-batched-tokens", 2048)
        if seqs * 8 > tokens * 4 and tokens > 4096:  # large batches with large steps: out of memory
            self.clock += start_s
            return TrialResult(status="failed", failure=Failure("oom", "simulated: out of memory"))
        instance = math.exp(self.rng.gauss(0.0, self.noise))   # this server's own speed
        tps = self.speed(flags, env) * instance
        repeats = [tps * math.exp(self.rng.gauss(0.0, self.noise / 3)) for _ in range(max(1, spec.get("repeats", 1)))]
        lossy = str(flags.get("kv-cache-dtype", "auto")).startswith("fp8") or flags.get("dtype") == "float32"
        ppl = 4.674 * (1.004 if lossy else 1.0)
        bench_s = self.bench_tokens / tps * max(1, spec.get("repeats", 1))
        timings = {"start_s": start_s, "warmup_s": 5.0, "benchmark_s": bench_s}
        below = (spec.get("stop_rules") or {}).get("prune_below")   # the agent's (sandbox.spec.StopRules)
        if below and tps * 4 / 3 < below:   # the Pruner after 3 of 24
            timings["benchmark_s"] = bench_s * 3 / 24 / max(1, spec.get("repeats", 1))
            self.clock += sum(timings.values())
            return TrialResult(status="pruned", log_path=str(trial_dir / "server.log"),
                               pruned={"after_requests": 3, "of": 24, "upper": round(tps * 4 / 3, 3),
                                       "below": below},
                               workload={"name": str(spec["workload"]), "hash": "simulated", "meter_version": 1},
                               bench=Figures(tps=round(tps, 3), repeat_figures=[tps], requests=3), metrics={},
                               timings=timings)
        if spec.get("quality") != "none":
            timings["quality_s"] = self.quality_s
        if spec.get("heldout_bench"):
            timings["heldout_s"] = bench_s
        self.clock += sum(timings.values())
        share = self.repeat_share()
        bench = Figures(tps=round(sorted(repeats)[len(repeats) // 2], 3), repeat_figures=repeats,
                        ttft_ms={"p99": 50.0}, itl_ms={"p99": 40.0},
                        repeat_hits=round(1000 * share) if share is not None else 0,
                        repeat_words=1000 if share is not None else 0)
        return TrialResult(
            status="ok", log_path=str(trial_dir / "server.log"),
            bench_heldout=Figures(tps=round(tps * math.exp(self.rng.gauss(0.0, self.noise / 3)), 3))
            if spec.get("heldout_bench") else None,
            workload={"name": str(spec["workload"]), "hash": "simulated", "meter_version": 1},
            bench=bench,
            quality=None if spec.get("quality") == "none" else Quality(ppl=ppl, greedy=self.greedy(lossy)),
            metrics={"kv_cache_usage_max": 0.01, "requests_waiting_max": 0},
            timings=timings, engine={"name": "simulated", "version": "0"}, hardware={"kind": "cpu"})


# The H200's one-stream figures (docs/history.md, 2026-12-03): ratios to the defaults on the
# realistic default (sampled, ending at stop strings) and on the challenge meter (greedy, fixed
# length), each measured on fresh vLLM 0.26 servers. Speculation's gain is the traffic's: ngram_gpu
# k=4/8/16 is 1.23-1.54x/1.81x/1.46x greedy and 0.45x/0.56x/0.55x sampled; CPU-side ngram turns
# async scheduling off (0.92x) on top.
H200 = {"async-off": (0.917, 0.880), "full-decode-only": (0.904, 0.954), "triton-attn": (0.883, 0.898),
        "eager": (0.08, 0.08)}   # eager: one sampler point (eager, fp8 cache) pruned at 0.08x on the H200
H200_SPEC = {"greedy": {4: 1.40, 8: 1.81, 16: 1.46}, "sampled": {4: 0.453, 8: 0.564, 16: 0.55}}
# The defaults' answers' repeat share on the H200 (docs/history.md, 2026-12-04), which the built-in
# planner reads before it proposes speculation: challenge-short's and the realistic default's.
H200_REPEAT_SHARE = {"greedy": 0.868, "sampled": 0.433}
GPU_START_REFUSAL = ("NotImplementedError: FlashInfer backend on SM90 currently crashes with sliding-window "
                     "attention layers")


class SimulatedGPU(SimulatedEngine):
    """The H200 at one stream, on greedy (the challenge meter) or sampled traffic (the realistic default):
    the measured levers above, FlashInfer refused at start as it is for Gemma 3 on SM90, and every
    other knob worth nothing at one stream (batch limits, prefix caching and block size only matter
    under load). Starts of 90-150 s, the quality phase 20 s."""

    def __init__(self, seed: int = 0, traffic: str = "greedy", noise: float = 0.07, **kw):
        super().__init__(seed=seed, noise=noise, start_s=(90.0, 150.0), quality_s=20.0, **kw)
        self.traffic = traffic

    def speed(self, flags: dict, env: dict) -> float:
        column = 0 if self.traffic == "sampled" else 1
        tps = 400.0
        tps *= H200["async-off"][column] if flags.get("async-scheduling") is False else 1.0
        tps *= H200["eager"][column] if flags.get("enforce-eager") else 1.0
        mode = (flags.get("compilation-config") or {}).get("cudagraph_mode")
        tps *= (H200["full-decode-only"][column] if mode == "FULL_DECODE_ONLY"
                else 0.9 if mode in ("NONE", "PIECEWISE") else 1.0)
        tps *= H200["triton-attn"][column] if flags.get("attention-backend") == "TRITON_ATTN" else 1.0
        spec_cfg = flags.get("speculative-config") or {}
        if spec_cfg.get("method") in ("ngram", "ngram_gpu"):
            k = spec_cfg.get("num_speculative_tokens", 4)
            points = H200_SPEC[self.traffic]
            below, above = max((p for p in points if p <= k), default=4), min((p for p in points if p >= k), default=16)
            share = 0.0 if above == below else (k - below) / (above - below)
            gain = points[below] + share * (points[above] - points[below])
            if k < 4:   # shorter drafts: less to gain and less to lose
                gain = 1.0 + (points[4] - 1.0) * k / 4
            off = spec_cfg["method"] == "ngram" and flags.get("async-scheduling") is not False   # ngram turns it off
            tps *= gain * (H200["async-off"][column] if off else 1.0)
        return tps

    def start_refused(self, flags: dict) -> str | None:
        return GPU_START_REFUSAL if flags.get("attention-backend") == "FLASHINFER" else None

    def repeat_share(self) -> float | None:
        return H200_REPEAT_SHARE[self.traffic]
