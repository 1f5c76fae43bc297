"""A deterministic engine at the worker seam, for testing the loop in seconds.

TPS is an analytic function of the flags; some regions fail the way real vLLM does. Results are the
worker's type (sandbox.result.TrialResult, held to a real worker's by test_worker_plumbing), so the
loop, gate, ledger and git see what they would see from a real trial; the pre-flight answers as
sandbox.preflight does, so the loop's tests run with it on, as `agent run` does.
"""

import time

from sandbox import allowed
from sandbox import result as results
from sandbox.result import Failure, Figures, Quality, TrialResult
from sandbox.spec import SpecError
from sandbox.workload import load_workload

GREEDY = [[10 + i, 20 + i, 30 + i] for i in range(8)]
# Each position's top-2, keyed by token id as the worker records them: clear choices everywhere.
TOPS = [[{str(t): -0.05, str(t + 100): -3.0} for t in g] for g in GREEDY]
# What the fake's pre-flight refuses, as vLLM's config classes refuse a combination (sandbox.preflight).
PREFLIGHT_REFUSAL = ("1 validation error for VllmConfig: ngram speculation is not supported with enforce_eager "
                     "(num_speculative_tokens={k})")
DEFAULTS = {"dtype": ["auto", "bfloat16"], "kv-cache-dtype": ["auto"], "VLLM_CPU_OMP_THREADS_BIND": ["auto"],
            "speculative-config.method": ["none"], "enforce-eager": [False], "max-num-seqs": None}


def refused_at_preflight(flags: dict) -> bool:
    return bool(flags.get("enforce-eager")) and "speculative-config" in flags


def latencies(flags: dict) -> dict:
    """The p99s a config shows: speculation streams chunks of several tokens, so its chunk gaps are 4x
    the defaults' while each request's pace and end-to-end time are lower (as on the CPU engine)."""
    if flags.get("speculative-config"):
        return {"ttft_ms": {"p99": 50.0}, "itl_ms": {"p99": 160.0}, "itl_token_ms": {"p99": 32.0},
                "tpot_ms": {"p99": 32.0}, "latency_ms": {"p99": 1600.0}}
    return {"ttft_ms": {"p99": 50.0}, "itl_ms": {"p99": 40.0}, "itl_token_ms": {"p99": 40.0},
            "tpot_ms": {"p99": 40.0}, "latency_ms": {"p99": 2000.0}}


class FakeEngine:
    """slowdown: (after_calls, factor), the machine slowing down mid-run; speculation_heldout: what
    ngram speculation's gain becomes on held-out prompts (it overfits the search prompts)."""

    def __init__(self, delay_s: float = 0.02, slowdown: tuple[int, float] | None = None,
                 speculation_heldout: float = 1.1, factors: dict | None = None):
        self.delay_s = delay_s
        self.factors = factors or {}    # {(flag, value): speed factor}: a knob a test wants to act
        self.calls = 0
        self.slowdown, self.speculation_heldout = slowdown, speculation_heldout
        self.specs = []
        self.preflights: list[dict] = []

    def preflight(self, model, flags, env):
        """The pre-flight's answer (agent.engine.WorkerEngine.preflight's shape): one refusal, in vLLM's words."""
        self.preflights.append(flags)
        if refused_at_preflight(flags):
            return {"ok": False, "message": PREFLIGHT_REFUSAL.format(
                k=flags["speculative-config"].get("num_speculative_tokens", 0))}
        return {"ok": True}

    def defaults(self, model, names):
        return {n: DEFAULTS.get(n) for n in names}

    @staticmethod
    def meter(spec) -> dict:
        """What the real worker records of its workload (sandbox.worker.TrialRun)."""
        w = load_workload(spec["workload"])
        return {"name": w.name, "meter_version": w.meter_version, "hash": w.hash, "prompt_split": w.prompt_split,
                **w.summary()}

    def allow(self, rules):
        """The run's allow-list, checked as the real worker checks it (sandbox.allowed)."""
        self.rules = rules

    def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
        try:
            if getattr(self, "rules", None) is not None:
                allowed.check(self.rules, spec["flags"], spec["env"])
        except SpecError as e:
            result = TrialResult(status="failed", failure=Failure("invalid_config", str(e), "spec"),
                                 workload=self.meter(spec))
        else:
            result = self._evaluate(spec, trial_dir, on_phase)
        results.write(trial_dir / "result.json", result)   # as the worker does (agent.judging.judge_again reads it)
        return result

    def _evaluate(self, spec, trial_dir, on_phase):
        self.calls += 1
        self.specs.append(spec)
        time.sleep(self.delay_s)
        trial_dir.mkdir(parents=True, exist_ok=True)
        flags, env = spec["flags"], spec["env"]
        on_phase("start")
        if flags.get("max-num-seqs", 1) > 128:
            return TrialResult(status="failed", failure=Failure("oom", "fake: out of memory", "OOM"),
                               workload=self.meter(spec))
        tps = 18.0 * (1.5 if env.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto" else 1.0)
        tps *= 0.8 if flags.get("enforce-eager") else 1.0
        for (flag, value), factor in self.factors.items():
            tps *= factor if flags.get(flag) == value else 1.0
        heldout = isinstance(spec["workload"], dict) and spec["workload"].get("prompt_split") == "heldout"
        speculation = self.speculation_heldout if heldout else 1.1
        tps *= speculation if "speculative-config" in flags else 1.0
        tps *= 1 + 0.005 * (self.calls % 3)          # instance-to-instance noise, about ±0.5%
        if self.slowdown and self.calls > self.slowdown[0]:
            tps *= self.slowdown[1]
        rules = spec.get("stop_rules") or {}   # the agent's (sandbox.spec.StopRules)
        if rules.get("prune_below") and tps < rules["prune_below"]:   # the worker's Pruner, in one line
            return TrialResult(status="pruned", log_path=str(trial_dir / "server.log"),
                               pruned={"after_requests": 3, "of": 4, "upper": round(tps * 4 / 3, 3),
                                       "below": rules["prune_below"]},
                               workload=self.meter(spec),
                               bench=Figures(tps=round(tps, 3), repeat_figures=[tps], requests=3),
                               metrics={}, timings={"start_s": 0.01, "benchmark_s": 0.01})
        ppl = 8.5 if str(flags.get("kv-cache-dtype", "auto")).startswith("fp8") else 8.0
        skip_quality = rules.get("quality_above") is not None and tps <= rules["quality_above"]
        greedy = [list(g) for g in GREEDY]
        if flags.get("block-size") == 128:          # a "lossless" knob that is not: flips one token
            greedy[0][2] += 1
        # Under the objective goodput the worker's figure is requests/s within the SLOs: here tps / 20.
        goodput = load_workload(spec["workload"]).objective == "goodput"
        # As the worker's search records it: a bracket of 3 points around the figure, from its start.
        start = rules.get("goodput_start") or 0.75
        figure = (lambda x: {"objective": "goodput", "figure": round(x / 20, 4), "goodput": {
            "rate": round(x / 20, 4), "bounds": [round(x / 20 * 0.98, 4), round(x / 20 * 1.02, 4)], "converged": True,
            "points": [{"rate": start}, {}, {}]}}) if goodput else (lambda x: {})
        return TrialResult(
            status="ok", log_path=str(trial_dir / "server.log"),
            bench_heldout=(Figures(tps=round(tps * 0.97, 3), **figure(tps * 0.97))
                           if spec.get("heldout_bench") else None),
            workload=self.meter(spec),
            bench=Figures(tps=round(tps, 3), repeat_figures=[tps, tps * 1.002, tps * 0.998],
                          finish={"length": 4}, **latencies(flags), **figure(tps)),
            quality_skipped="slower" if skip_quality else None,
            quality=None if spec.get("quality") == "none" or skip_quality else
                    Quality(ppl=ppl, greedy=[{"token_ids": g, "top_logprobs": t}
                                             for g, t in zip(greedy, TOPS, strict=False)]),
            metrics={"kv_cache_usage_max": 0.1}, timings={"start_s": 0.01},
            engine={"name": "fake", "version": "0"}, hardware={"kind": "cpu"})
