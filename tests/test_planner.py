"""The built-in planner: each move is triggered by a measured fact, valid in the space, and new."""

import gzip
import json
import os
import sys
from pathlib import Path

from agent import space as spaces
from agent.ledger import Run, Trial
from agent.planner import BuiltinPlanner
from agent.rules import WON_NOWHERE, EngineMetrics
from sandbox import metrics

SPACE = spaces.load("vllm-cpu", cpu_flags={"avx512f"})  # a host where every choice runs
RUN = Run(id="r", model="m")


def trial(number, params, metrics=None, ratio=1.0, passed=True, status="ok"):
    return Trial(number=number, params=params, metrics=metrics or {}, figure=10 * ratio, search_ratio=ratio,
                 gate_passed=passed, status=status, source="planner")


def propose(history, **facts):
    return BuiltinPlanner().propose(SPACE, RUN, history, {"cpus": 2, "concurrency": 1, **facts}, k=5)


def test_uses_every_core_first_and_never_repeats_a_tried_point():
    first = propose([trial(0, {}, passed=None)])
    assert first[0].params == {"VLLM_CPU_OMP_THREADS_BIND": f"0-{max(os.sched_getaffinity(0))}"}
    tried = [trial(0, {}, passed=None), trial(1, first[0].params, ratio=1.4)]
    assert all(p.params != first[0].params for p in propose(tried))


def test_a_point_interrupted_by_a_crash_is_proposed_again_once():
    """Core binding killed in its benchmark (the agent SIGKILLed, then resumed): it was never measured,
    so the resumed run proposes it again; interrupted twice, it is left alone."""
    bind = propose([trial(0, {}, passed=None)])[0].params
    once = [trial(0, {}, passed=None), trial(1, bind, passed=None, status="interrupted")]
    assert propose(once)[0].params == bind
    twice = once + [trial(2, bind, passed=None, status="interrupted")]
    assert all(p.params != bind for p in propose(twice))


def test_speculation_only_for_few_streams_and_k_follows_acceptance():
    assert not [p for p in propose([trial(0, {})], concurrency=16) if "speculative-config.method" in p.params]
    ngram = {"speculative-config.method": "ngram", "speculative-config.num_speculative_tokens": 4,
             "speculative-config.prompt_lookup_min": 2, "speculative-config.prompt_lookup_max": 4}
    high = propose([trial(0, {}), trial(1, ngram, {"spec_acceptance_rate": 0.9}, ratio=1.2)])
    assert any(p.params.get("speculative-config.num_speculative_tokens") == 6 and "90%" in p.rationale for p in high)
    low = propose([trial(0, {}), trial(1, ngram, {"spec_acceptance_rate": 0.2}, ratio=1.2)])
    assert any(p.params.get("speculative-config.num_speculative_tokens") == 2 for p in low)
    # Mostly sampled traffic: no ngram as a first move (measured 0.65-0.70x there), greedy traffic: yes.
    assert not [p for p in propose([trial(0, {})], sampled_share=0.6) if "speculative-config.method" in p.params]
    assert [p for p in propose([trial(0, {})], sampled_share=0.4) if "speculative-config.method" in p.params]


def test_on_a_gpu_speculation_is_ngram_gpu_with_async_scheduling_and_k_follows_the_speed():
    gpu = spaces.load("vllm-gpu")
    say = lambda history, **facts: BuiltinPlanner().propose(gpu, RUN, history, {"concurrency": 1, **facts}, k=5)  # noqa: E731
    (first,) = [p for p in say([trial(0, {})], sampled_share=0.0) if "speculative-config.method" in p.params]
    assert first.params["speculative-config.method"] == "ngram_gpu" and first.params["async-scheduling"] is True
    assert not gpu.problems(first.params) and "ngram_gpu" in first.rationale
    assert not say([trial(0, {})], sampled_share=0.6)   # sampled traffic: measured a loss, no first move
    # Accepted at 1.8x with k=4: double k (acceptance is under-reported under async scheduling), then halve.
    at4 = [trial(0, {}), trial(1, first.params, {"spec_acceptance_rate": 0.1}, ratio=1.8)]
    ks = [p.params["speculative-config.num_speculative_tokens"] for p in say(at4, sampled_share=0.0)]
    assert ks == [8, 2] and all(not gpu.problems(p.params) for p in say(at4, sampled_share=0.0))
    # The mean acceptance length orders the moves: 3.65 of 5 (the H200's, k=4) doubles first; 1.4 halves first.
    long_ = [trial(0, {}),
             trial(1, first.params, {"spec_acceptance_rate": 0.1, "spec_mean_acceptance_length": 3.65}, ratio=1.5)]
    short = [trial(0, {}), trial(1, first.params, {"spec_mean_acceptance_length": 1.4}, ratio=1.1)]
    assert [p.params["speculative-config.num_speculative_tokens"] for p in say(long_, sampled_share=0.0)] == [8, 2]
    (halve, _) = say(short, sampled_share=0.0)
    assert halve.params["speculative-config.num_speculative_tokens"] == 2 and "1.40 of 5" in halve.rationale
    at16 = {**first.params, "speculative-config.num_speculative_tokens": 16}
    tried = [trial(0, {}), trial(1, at16, ratio=1.5)]
    assert [p.params["speculative-config.num_speculative_tokens"] for p in say(tried, sampled_share=0.0)] == [8]


def test_the_defaults_own_answers_decide_speculation_over_the_traffics_sampled_share():
    """Sampled traffic whose answers repeat their context (the defaults measured it) gets speculation;
    greedy traffic whose answers do not, none; the rationale cites the measured share."""
    gpu = spaces.load("vllm-gpu")
    say = lambda history, **facts: BuiltinPlanner().propose(gpu, RUN, history, {"concurrency": 1, **facts}, k=5)  # noqa: E731

    def defaults(share):
        return Trial(number=0, params={}, metrics={}, figure=10, status="ok", source="baseline",
                     measured={"repeat_share": share})

    (move,) = say([defaults(0.66), defaults(0.62)], sampled_share=0.9)
    assert move.params["speculative-config.method"] == "ngram_gpu" and "64% of their words" in move.rationale
    assert not say([defaults(0.05), defaults(0.07)], sampled_share=0.0)
    # The H200's realistic default: its answers repeat 43% and ngram_gpu measured 0.45x there.
    assert not say([defaults(0.43)], sampled_share=0.6)
    # The CPU: ngram lost even at challenge-cpu's 67%; only answers that repeat more get it first.
    cpu = lambda share: [p for p in propose([defaults(share)], sampled_share=0.0)  # noqa: E731
                         if "speculative-config.method" in p.params]
    assert not cpu(0.67) and cpu(0.85)[0].params["speculative-config.method"] == "ngram"
    assert say([Trial(number=0, params={}, metrics={}, figure=10, status="ok", source="baseline", measured={})],
               sampled_share=0.0)   # not measured (an older ledger): the sampled share decides, as before


def test_on_a_gpu_answers_that_repeat_most_of_their_words_start_with_the_longer_draft():
    """challenge-short's 85%: k=8 first (the H200 measured 1.81x at k=8 against 1.23-1.40x at k=4),
    with the tokens a step it expects; at 64% k=4; on the CPU k=4 whatever the share."""
    gpu = spaces.load("vllm-gpu")
    say = lambda history: BuiltinPlanner().propose(gpu, RUN, history, {"concurrency": 1}, k=5)  # noqa: E731

    def defaults(share):
        return Trial(number=0, params={}, metrics={}, figure=10, status="ok", source="baseline",
                     measured={"repeat_share": share})

    (long_,) = say([defaults(0.85)])
    assert long_.params["speculative-config.num_speculative_tokens"] == 8
    assert long_.params["speculative-config.prompt_lookup_max"] == 8 and not gpu.problems(long_.params)
    assert "about 5.1 tokens a step at k=8 against 3.7 at k=4" in long_.rationale
    (short,) = say([defaults(0.64)])
    assert short.params["speculative-config.num_speculative_tokens"] == 4
    assert short.params["speculative-config.prompt_lookup_max"] == 4 and "tokens a step" not in short.rationale
    (cpu,) = [p for p in propose([defaults(0.95)]) if "speculative-config.method" in p.params]
    assert cpu.params["speculative-config.num_speculative_tokens"] == 4
    assert say([defaults(0.8)])[0].params["speculative-config.num_speculative_tokens"] == 8   # the bound is in
    assert say([defaults(0.79)])[0].params["speculative-config.num_speculative_tokens"] == 4
    # k=8 gained but was not accepted (the held-out decision): k=4 next, once; slower than the defaults: none.
    (fallback,) = say([defaults(0.85), trial(1, long_.params, ratio=1.2, passed=False)])
    assert fallback.params == {**long_.params, "speculative-config.num_speculative_tokens": 4,
                               "speculative-config.prompt_lookup_max": 4} and "k=8 (trial 1)" in fallback.rationale
    assert not say([defaults(0.85), trial(1, long_.params, ratio=0.9, passed=False)])
    assert not say([defaults(0.85), trial(1, long_.params, ratio=1.2, passed=False),
                    trial(2, fallback.params, passed=False)])


def test_batching_and_kv_moves_cite_the_metric_that_triggered_them():
    queued = propose([trial(0, {}, {"kv_cache_usage_max": 0.1, "requests_waiting_max": 5})], concurrency=16)
    batch = next(p for p in queued if "max-num-seqs" in p.params)
    assert batch.params["max-num-seqs"] == 256 and "waiting" in batch.rationale
    assert not SPACE.problems(batch.params)
    full = propose([trial(0, {}, {"kv_cache_usage_max": 0.97, "preemptions": 3})], concurrency=16)
    kv = next(p for p in full if "kv-cache-dtype" in p.params)
    assert kv.params["kv-cache-dtype"].startswith("fp8") and "preemptions" in kv.rationale


def test_no_move_without_its_trigger():
    calm = propose([trial(0, {}, {"kv_cache_usage_max": 0.2, "requests_waiting_max": 0})], concurrency=16, cpus=1)
    assert calm == []


def test_narrows_only_below_capacity_failures_and_cites_them():
    def t(n, seqs, status="ok", klass=None):
        return Trial(number=n, params={"max-num-seqs": seqs}, status=status, failure_class=klass, metrics={})

    history = [t(1, 16), t(2, 200, "failed", "oom"), t(3, 100, "failed", "start_timeout")]
    [change] = BuiltinPlanner().narrow(SPACE, history)
    assert change.knob == "max-num-seqs" and change.high == 40 and change.low == 1  # sqrt(16 * 100)
    assert "oom" in change.rationale and "start_timeout" in change.rationale
    # A larger value that ran says the failure was not about size; a refused config is not capacity.
    assert BuiltinPlanner().narrow(SPACE, [*history, t(4, 150)]) == []
    assert BuiltinPlanner().narrow(SPACE, [t(1, 16), t(2, 200, "failed", "invalid_config")]) == []


def defaults_under_goodput(misses_at_upper: list[str], number: int = 0, source: str = "baseline") -> Trial:
    """An instance of the defaults whose goodput search held at 0.5 requests/s and broke at 0.55."""
    points = [{"rate": 0.5, "held": True, "misses": [], "ttft_p99_ms": 900.0, "itl_p99_ms": 150.0},
              {"rate": 0.55, "held": False, "misses": misses_at_upper, "ttft_p99_ms": 1800.0, "itl_p99_ms": 260.0}]
    return Trial(number=number, params={}, metrics={}, figure=0.52, status="ok", source=source,
                 measured={"goodput": {"rate": 0.52, "bounds": [0.5, 0.55], "points": points}})


def test_under_goodput_the_slo_the_defaults_broke_first_moves_the_token_budget_a_step():
    """ITL alone broke at the rate above the defaults' goodput: half vLLM's token budget for this host
    (8192 on an H200, so 4096), with chunked prefill; TTFT alone: twice it. End-to-end, several SLOs
    at once, failed requests or instances that disagree: no move. Set already: no move."""
    gpu = spaces.load("vllm-gpu")
    h200 = {"kind": "gpu", "gpus": ["NVIDIA H200, 143771 MiB"], "concurrency": 64}
    say = lambda history, facts=h200: [p for p in BuiltinPlanner().propose(gpu, RUN, history, facts, k=5)  # noqa: E731
                                       if "max-num-batched-tokens" in p.params]
    (itl,) = say([defaults_under_goodput(["itl_p99_ms 260 > 200"])])
    assert (itl.params == {"max-num-batched-tokens": 4096, "enable-chunked-prefill": True}
            and not gpu.problems(itl.params))
    assert "inter-token p99 alone broke its SLO (260 ms, TTFT p99 held at 1800 ms)" in itl.rationale
    assert "vLLM's 8192 here to 4096" in itl.rationale and "0.55 requests/s" in itl.rationale
    (ttft,) = say([defaults_under_goodput(["ttft_p99_ms 1800 > 1500"])])
    assert ttft.params == {"max-num-batched-tokens": 16384} and "vLLM's 8192 here to 16384" in ttft.rationale
    # The host sets vLLM's default: 2048 on an A100 and on a CPU, 16384 from 160 GiB.
    a100 = {**h200, "gpus": ["NVIDIA A100-SXM4-80GB, 81920 MiB"]}
    assert say([defaults_under_goodput(["itl_p99_ms 260 > 200"])], a100)[0].params["max-num-batched-tokens"] == 1024
    b200 = {**h200, "gpus": ["NVIDIA B200, 183359 MiB"]}
    assert say([defaults_under_goodput(["ttft_p99_ms 1800 > 1500"])], b200)[0].params["max-num-batched-tokens"] == 32768
    cpu = [p for p in propose([defaults_under_goodput(["itl_p99_ms 260 > 200"])])
           if "max-num-batched-tokens" in p.params]
    assert cpu and cpu[0].params["max-num-batched-tokens"] == 1024 and not SPACE.problems(cpu[0].params)
    for misses in (["e2e_p99_ms 36795.8 > 30000"], ["ttft_p99_ms 1800 > 1500", "itl_p99_ms 260 > 200"],
                   ["3 of 24 requests failed", "itl_p99_ms 260 > 200"]):
        assert not say([defaults_under_goodput(misses)]), misses
    disagree = [defaults_under_goodput(["itl_p99_ms 260 > 200"]),
                defaults_under_goodput(["ttft_p99_ms 1800 > 1500"], 1)]
    assert not say(disagree)
    agree = [defaults_under_goodput(["itl_p99_ms 260 > 200"]),
             defaults_under_goodput(["itl_p99_ms 230 > 200"], 1, "aa")]
    assert say(agree)
    set_already = trial(1, {"max-num-batched-tokens": 2048}, ratio=1.2)
    assert not say([defaults_under_goodput(["itl_p99_ms 260 > 200"]), set_already])
    assert not say([trial(0, {})])   # not goodput: no points, no move


# ---- Triggers on what an H100 measured (tests/data/gpu-levers, 2026-12-06) --------------------

GPU_DATA = Path(__file__).parent / "data" / "gpu-levers"
H100 = {"kind": "gpu", "gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04, Enabled"], "cpus": 16}


def measured_on_h100(tag: str, params: dict | None = None, number: int = 0, source: str = "baseline") -> Trial:
    """An instance as the lever table measured it: its row's gauges and latencies, and the histograms
    of the server's /metrics text (the queue, tokens a step) captured after its phase."""
    run_instance, _, shape = tag.rpartition(".")
    row = next(json.loads(line) for name in ("levers-first.jsonl", "levers-frontend.jsonl")
               for line in (GPU_DATA / name).read_text().splitlines()
               if f"{json.loads(line)['run']}-{json.loads(line)['instance']:03d}-"
                  f"{json.loads(line)['lever']}" == run_instance
               and json.loads(line).get("shape") == shape)
    text = gzip.open(GPU_DATA / f"{tag}.metrics.txt.gz", "rt").read()
    from_text = metrics.summarize({}, metrics.parse(text), metrics.Sampler("unused"), row["api_cpu_share"])
    kept = ("queue_time_mean_ms", "steps", "tokens_per_step_mean", "step_tokens_buckets", "api_cpu_share")
    return Trial(number=number, params=params or {}, metrics={**row["gauges"], **{k: from_text[k] for k in kept}},
                 figure=row["tps"], search_ratio=1.0, gate_passed=True, status="ok", source=source,
                 ttft_p99_ms=row["ttft_ms"]["p99"], itl_p99_ms=row["itl_ms"]["p99"])


def gpu_moves(history, concurrency=32, slo=None):
    facts = {**H100, "concurrency": concurrency, "slo": slo or {}}
    return BuiltinPlanner().propose(spaces.load("vllm-gpu"), RUN, history, facts, k=8)


def test_at_32_in_flight_the_h100s_defaults_trigger_nothing():
    """No queue (0.02 ms), the KV cache at 0.1%, 2.8% of steps above the largest graph, the API server at
    0.70 of a core, latencies inside the interactive SLOs: the defaults leave no lever a first move."""
    defaults = measured_on_h100("20261206-080830-000-defaults.serving-c32")
    assert defaults.metrics["queue_time_mean_ms"] < 1 and defaults.metrics["api_cpu_share"] < 0.9
    assert gpu_moves([defaults], slo={"ttft_p99_ms": 450.0, "itl_p99_ms": 40.0}) == []


def test_at_128_in_flight_steps_above_the_largest_graph_move_the_graph_size_and_the_busy_front_end_is_withheld():
    defaults = measured_on_h100("20261206-080830-003-defaults.serving-c128")
    moves = gpu_moves([defaults], concurrency=128)
    (graphs,) = [m for m in moves if "compilation-config.max_cudagraph_capture_size" in m.params]
    assert graphs.params == {"compilation-config.max_cudagraph_capture_size": 1024, "enforce-eager": False}
    assert "4.8% of trial 0's engine steps ran more than 512 tokens" in graphs.rationale
    # The API server held 0.94 of a core: the trigger says so, but 4 API servers won nowhere in the table.
    busy = EngineMetrics.of(defaults.metrics).front_end_busy()
    assert busy and "0.94 CPU seconds" in busy
    assert not [m for m in moves if "api-server-count" in m.params]
    assert "api-server-count" in WON_NOWHERE


def test_a_queue_with_the_batch_at_its_limit_grows_the_limit_and_below_it_the_token_budget():
    limited = measured_on_h100("20261206-080010-001-max-num-seqs-8.serving-c32", {"max-num-seqs": 8}, 1, "planner")
    (grow,) = [m for m in gpu_moves([limited]) if m.params.get("max-num-seqs") != 8]
    assert grow.params["max-num-seqs"] == 16 and not spaces.load("vllm-gpu").problems(grow.params)
    assert "waiting (up to 24, 814 ms on average" in grow.rationale and "6.6 requests a step" in grow.rationale
    budget = measured_on_h100("20261206-080010-002-max-num-batched-tokens-2048.serving-c32",
                              {"max-num-batched-tokens": 2048}, 2, "planner")
    (wider,) = [m for m in gpu_moves([budget]) if m.params.get("max-num-batched-tokens") != 2048]
    assert wider.params == {"max-num-batched-tokens": 4096}
    assert "111 ms on average" in wider.rationale and "well under max-num-seqs 1024" in wider.rationale


def test_long_prompts_that_break_the_inter_token_slo_alone_halve_the_token_budget():
    """The defaults on long prompts at 32 in flight: TTFT p99 357 ms inside 450, ITL p99 63 ms above 40."""
    rag = measured_on_h100("20261206-075427-000-defaults.rag-c32")
    (halve,) = [m for m in gpu_moves([rag], slo={"ttft_p99_ms": 450.0, "itl_p99_ms": 40.0})
                if "max-num-batched-tokens" in m.params]
    assert halve.params == {"max-num-batched-tokens": 4096, "enable-chunked-prefill": True}
    assert "at 32 requests in flight the inter-token p99 alone broke its SLO (63 ms, TTFT p99 held at 357 ms)" \
        in halve.rationale and "vLLM's 8192 here" in halve.rationale
    assert not [m for m in gpu_moves([rag]) if "max-num-batched-tokens" in m.params]   # no SLO given: no move


def test_the_levers_withheld_won_nowhere_in_the_committed_table():
    """WON_NOWHERE is the lever table's verdict: each of its levers, on every shape it was measured on,
    has an interval that does not lie above 1 (bench/lever_table.py on every committed table's raw rows)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
    import lever_table

    tables = sorted((Path(__file__).parents[1] / "docs" / "data" / "levers").glob("*/levers-*.jsonl"))
    assert len(tables) >= 6   # both H100 blocks of 2026-12-06
    rows = [json.loads(line) for path in tables for line in path.read_text().splitlines()]
    named = {"api-server-count": "api-server-count-4", "stream-interval": "stream-interval-8"}
    assert set(named) == set(WON_NOWHERE)
    comps = lever_table.comparisons(rows)
    for knob, lever in named.items():
        measured = {shape: c for (run, shape, lv), c in comps.items() if lv == lever}
        assert {"serving-c32", "serving-c128"} <= set(measured)
        assert all(c.low <= 1 for c in measured.values()), (knob, measured)


def test_under_load_speculation_is_a_first_move_only_on_a_gpu_where_most_answers_repeat_their_context():
    """edits-c32 on the H100 (2026-12-07): the defaults' answers repeated 72% of their words at 32 in
    flight, and the planner said nothing, so the one lever that might win there was never measured.
    Now ngram_gpu with a short draft is proposed there; not on the realistic default (43%), not on the CPU."""
    gpu = spaces.load("vllm-gpu")

    def defaults(share):
        return Trial(number=0, params={}, metrics={}, figure=10, status="ok", source="baseline",
                     measured={"repeat_share": share})

    def spec(space, share, concurrency):
        facts = {"concurrency": concurrency, "sampled_share": 0.6, "cpus": 2}
        return [p for p in BuiltinPlanner().propose(space, RUN, [defaults(share)], facts, k=5)
                if "speculative-config.method" in p.params]

    (move,) = spec(gpu, 0.72, 32)
    assert move.params["speculative-config.method"] == "ngram_gpu" and move.params["async-scheduling"] is True
    assert move.params["speculative-config.num_speculative_tokens"] == 4 and not gpu.problems(move.params)
    assert "32 stream(s)" in move.rationale and "72% of their words" in move.rationale
    assert spec(gpu, 0.9, 32)[0].params["speculative-config.num_speculative_tokens"] == 4   # short under load
    assert not spec(gpu, 0.43, 32) and not spec(gpu, 0.65, 32)
    assert not spec(SPACE, 0.95, 8)   # the CPU lost 32% at concurrency 8


def test_on_a_cpu_without_native_bf16_the_ngram_move_serves_float32_and_says_why():
    """Issue 56: on a 2-core host whose cores have AVX-512 but neither avx512_bf16 nor AMX, binding plus
    n-gram k=4 read 17.02 tok/s in bf16 (1.11x the defaults, each verify step about 190 ms) and 25.73 in
    float32 (1.68x). There the move serves float32; where the cores compute bf16, it keeps the default."""
    def defaults(share):
        return Trial(number=0, params={}, metrics={}, figure=10, status="ok", source="baseline",
                     measured={"repeat_share": share})

    def ngram(**facts):
        return [p for p in propose([defaults(0.86)], sampled_share=0.0, **facts)
                if "speculative-config.method" in p.params]

    (plain,) = ngram(native_bf16=False)
    assert plain.params["speculative-config.method"] == "ngram" and plain.params["dtype"] == "float32"
    assert "neither avx512_bf16 nor AMX" in plain.rationale and not SPACE.problems(plain.params)
    (native,) = ngram(native_bf16=True)
    assert "dtype" not in native.params and "float32" not in native.rationale
    (unknown,) = ngram()   # an older run's facts: as before
    assert "dtype" not in unknown.params


def test_the_run_facts_say_whether_this_hosts_cores_compute_bf16():
    from agent.gate import GateSettings
    from agent.request import facts
    from agent.space import host_cpu_flags
    from sandbox.workload import load_workload

    cpu = facts({"kind": "cpu"}, load_workload("smoke"), GateSettings())
    assert cpu["native_bf16"] == bool(host_cpu_flags() & {"avx512_bf16", "amx_bf16"})
    assert facts({"kind": "gpu"}, load_workload("smoke"), GateSettings())["native_bf16"] is None


def test_every_rule_is_a_function_of_one_situation_that_yields_proposals_and_reads_metrics_by_name():
    import inspect
    from typing import get_type_hints

    from agent import rules
    from agent.rules import Proposal, Situation

    for rule in rules.RULES:
        (param,) = inspect.signature(rule).parameters.values()
        hints = get_type_hints(rule)
        assert hints[param.name] is Situation and "Proposal" in str(hints["return"]), rule.__name__
    source = inspect.getsource(rules)
    assert ".get(\"requests_waiting_max\"" not in source and "metrics.get(" not in source
    # a measured config whose queue waited while the KV cache idled: the batching rule moves max-num-seqs
    seen = trial(0, {}, metrics={"requests_waiting_max": 6, "kv_cache_usage_max": 0.2, "requests_running_mean": 120})
    moves = list(rules.batching(Situation(SPACE, {}, "the defaults", [], seen, {"kind": "cpu"})))
    assert moves and all(isinstance(m, Proposal) for m in moves) and moves[0].params["max-num-seqs"] == 256
