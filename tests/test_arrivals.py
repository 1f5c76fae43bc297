"""How requests arrive (sandbox.arrivals) and goodput (sandbox.goodput): the arrival times against
vLLM's own `vllm bench serve` generator, the search at known answers, and a real worker measuring
goodput through real HTTP on a stand-in server whose latency rises with load (tests/fake_server.py)."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

import pytest

from sandbox import server as server_mod
from sandbox import spec as specs
from sandbox.arrivals import parse, unit_times
from sandbox.bench import BenchResult
from sandbox.goodput import search
from sandbox.traffic import Request, TrafficError
from sandbox.worker import run_trial
from sandbox.workload import Slo, load_workload

pytestmark = pytest.mark.process   # starts processes (tests/conftest.py: not in `pytest -m unit`)

FAKE = (str(Path(__file__).with_name("fake_server.py")),)
ROOT = Path(__file__).resolve().parents[1]


def requests(n: int, timestamps: list[float] | None = None) -> list[Request]:
    return [Request("completions", {"prompt": f"p{i}", "max_tokens": 4}, i + 1,
                    timestamps[i] if timestamps else None) for i in range(n)]


def vllm_send_times(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """When vLLM's own generator (vllm.benchmarks.serve.get_request) sends n requests, on a clock that
    moves only when it sleeps, after the seeding `vllm bench serve --seed` does."""
    import numpy as np
    from vllm.benchmarks import serve

    clock = [0.0]

    async def sleep(seconds):
        clock[0] += seconds

    class Clock:
        @staticmethod
        def time():
            return clock[0]

    sent = []

    async def collect():
        async for _request, _rate in serve.get_request(list(range(n)), rate, burstiness):
            sent.append(clock[0])

    real_sleep, real_time = serve.asyncio.sleep, serve.time
    serve.asyncio.sleep, serve.time = sleep, Clock
    try:
        np.random.seed(seed)
        asyncio.run(collect())
    finally:
        serve.asyncio.sleep, serve.time = real_sleep, real_time
    return sent


@pytest.mark.parametrize("text, rate, burstiness, seed", [("rate:4,seed=7", 4, 1.0, 7),
                                                            ("poisson:0.5", 0.5, 1.0, 0),
                                                            ("rate:20,burstiness=0.25,seed=3", 20, 0.25, 3)])
def test_open_loop_arrivals_are_the_ones_vllm_bench_serve_draws_for_that_seed(text, rate, burstiness, seed):
    profile = parse(text)
    mine = profile.offsets(40)
    assert mine == profile.offsets(40)   # reproducible from the seed alone
    theirs = vllm_send_times(40, rate, burstiness, seed)
    assert len(mine) == len(theirs) == 40
    assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
               for a, b in zip(mine, theirs, strict=False)), (mine[:3], theirs[:3])
    assert math.isclose(mine[-1], 40 / rate)   # n requests span n / rate seconds, as in vLLM
    assert parse(text.replace(f"seed={seed}", f"seed={seed + 1}") if "seed" in text else text + ",seed=9"
                 ).offsets(40) != mine


def test_one_pattern_serves_every_rate_and_burstiness_spreads_the_gaps():
    profile = parse("rate:2,burstiness=0.3,seed=1")
    at2, at8 = profile.offsets(200), profile.offsets(200, rate=8)
    assert all(math.isclose(a, 4 * b) for a, b in zip(at2, at8, strict=False))   # the same arrivals, four times as fast

    def spread(times):
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        mean = sum(gaps) / len(gaps)
        return (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean

    assert spread(at2) > 1.4 > 1.0 > spread(unit_times(200, 1.0, 1)) * 0.8 > spread(unit_times(200, 8.0, 1))


def test_a_trace_lends_its_timing_window_by_window_at_its_pace_scaled_or_rescaled_to_a_rate():
    trace = [100.0, 100.5, 103.0, 110.0, 111.0, 111.5]   # 5 gaps over 11.5 s
    assert parse("trace").offsets(3, trace=trace) == [0.0, 0.5, 3.0]
    assert parse("trace").offsets(3, window=1, trace=trace) == [0.0, 1.0, 1.5]   # the next phase: the next stretch
    assert parse("trace:0.5").offsets(3, trace=trace) == [0.0, 0.25, 1.5]
    # At a given rate every point replays the first stretch, rescaled: 3 requests at 1 a second span 2 s.
    at_one = parse("trace").offsets(3, rate=1.0, window=5, trace=trace)
    assert len(at_one) == 3 and all(math.isclose(a, b) for a, b in zip(at_one, [0.0, 2 / 6, 2.0], strict=False))
    # Past its end the trace repeats, one mean gap (11.5 / 5) after its last request.
    wrapped = parse("trace").offsets(4, window=1, trace=trace)
    assert all(math.isclose(a, b) for a, b in zip(wrapped, [0.0, 0.5, 0.5 + 2.3, 0.5 + 2.3 + 0.5], strict=False))
    assert parse("concurrency").offsets(3, trace=trace) is None
    for bad in (None, [5.0], [3.0, 3.0, 3.0]):
        with pytest.raises(TrafficError, match="two or more distinct timestamps"):
            parse("trace").offsets(3, trace=bad)


def test_a_trace_workload_takes_its_timing_from_the_file_and_its_requests_from_fresh_draws(tmp_path):
    shipped = load_workload({**load_workload("smoke").as_dict(), "max_tokens": None, "ignore_eos": None,
                             "temperature": None, "traffic": str(ROOT / "sandbox/data/traffic/trace.jsonl"),
                             "arrivals": "trace", "objective": "goodput", "slo_ttft_p99_ms": 1000.0})
    times = shipped.trace_times()
    assert len(times) == 248 and times == sorted(times) and times[0] == 0.0
    first, second = shipped.offsets(4, 0), shipped.offsets(4, 1)
    assert first == [t - times[0] for t in times[:4]] and second == [t - times[4] for t in times[4:8]]
    assert shipped.measured(0) != shipped.measured(1)   # the requests: fresh draws, as on every meter
    assert math.isclose(shipped.start_rate(), 3 / times[3])   # the pace of the stretch every rate point replays
    assert shipped.offsets(4, 7, rate=2.0) == shipped.offsets(4, 0, rate=2.0)


@pytest.mark.parametrize("text, needle", [
    ("rate:0", "above 0"), ("rate:fast", "'rate:fast'"), ("rate:2,burst=1", "unknown option 'burst'"),
    ("rate:2,0.5", "name=value"), ("uniform", "not one of concurrency"), ("trace:-1", "above 0"),
    ("concurrency:4", "takes no value"), ("rate:inf", "finite"), ("trace:inf", "finite number above 0"),
    ("rate:2,seed=-1", "the seed must be from 0"), ("rate:2,seed=4294967296", "the seed must be from 0"),
])
def test_bad_arrivals_are_one_line_naming_the_value(text, needle):
    with pytest.raises(TrafficError, match="--arrivals") as e:
        parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def figures(ttft_p99: float, itl_p99: float = 5.0, e2e_p99: float = 100.0, requests: int = 120) -> BenchResult:
    return BenchResult(tps=1.0, output_tokens=requests, wall_s=1.0, requests=requests, errors=0, short_outputs=0,
                       ttft_ms={"p99": ttft_p99}, itl_ms={"p99": itl_p99}, latency_ms={"p99": e2e_p99},
                       first_error=None)


@pytest.mark.parametrize("capacity, start", [(3.7, 1.0), (3.7, 50.0), (0.3, 0.25), (100.0, 1.0)])
def test_the_search_brackets_then_bisects_to_the_known_capacity_within_five_percent(capacity, start):
    measured = []

    def measure(rate):
        measured.append(rate)
        return figures(ttft_p99=50.0 if rate <= capacity else 900.0)

    found = search(measure, Slo(ttft_p99_ms=200), start=start)
    lo, hi = found.bounds
    assert found.converged and lo <= capacity < hi and (hi - lo) / hi <= 0.05 and lo <= found.rate <= hi
    # Between the bounds, where the p99 meets its bound: (200 - 50) / (900 - 50) of the way up.
    assert math.isclose(found.rate, lo + (hi - lo) * 150 / 850, rel_tol=1e-5)
    assert len(measured) == len(found.points) <= 12 and all(p.percentile == "p99" for p in found.points)
    assert [p.held for p in found.points] == [r <= capacity for r in measured]


@pytest.mark.parametrize("capacity, near_points, doubling_points", [(1.03, 3, 7), (0.97, 3, 6), (3.7, 9, 7),
                                                                    (0.3, 10, 7)])
def test_a_search_started_at_a_measured_figure_settles_a_config_near_it_in_three_points(capacity, near_points,
                                                                                         doubling_points):
    """From the defaults' figure (near): a first step of twice the tolerance, each next one its square
    up to doubling. A config within a few percent of the start is bracketed and settled in three points
    where doubling takes six or seven; one far from it is still settled, in two or three points more."""
    def measure(rate):
        return figures(ttft_p99=50.0 if rate <= capacity else 900.0)

    near, doubling = (search(measure, Slo(ttft_p99_ms=200), start=1.0, near=flag) for flag in (True, False))
    for found in (near, doubling):
        lo, hi = found.bounds
        assert found.converged and lo <= capacity < hi and (hi - lo) / hi <= 0.05
    assert (len(near.points), len(doubling.points)) == (near_points, doubling_points)
    assert near.points[1].rate == round(1.1 if capacity >= 1 else 1 / 1.1, 6)
    if capacity == 3.7:   # up by 1.1, then 1.21, 1.4641, then doubling
        assert [p.rate for p in near.points[:4]] == [1.0, 1.1, 1.331, 1.948717]
    # Fewer than four points (a held-out split's two): doubling, or two narrow steps would both hold.
    assert [p.rate for p in search(measure, Slo(ttft_p99_ms=200), start=1.0, near=True, max_points=2).points] == [
        1, 2 if capacity >= 1 else 0.5]


def test_the_search_says_what_it_could_not_settle_and_names_a_percentile_from_few_requests():
    always = search(lambda rate: figures(ttft_p99=10.0, requests=40), Slo(ttft_p99_ms=200), start=1.0, max_points=4)
    assert not always.converged and always.bounds == (8.0, None) and always.rate == 8.0
    assert always.points[0].percentile == "max of 40"
    never = search(lambda rate: figures(ttft_p99=10.0, e2e_p99=5000.0), Slo(e2e_p99_ms=1000), start=1.0, max_points=3)
    assert never.rate == 0.0 and never.bounds == (0.0, 0.25) and "e2e_p99_ms 5000 > 1000" in never.points[0].misses
    floor = search(lambda rate: figures(ttft_p99=900.0), Slo(ttft_p99_ms=200), start=64.0)
    assert floor.rate == 0.0 and [p.rate for p in floor.points] == [64, 32, 16, 8, 4, 2, 1]   # start / 64 at most
    with pytest.raises(ValueError, match="at least one SLO"):
        search(lambda rate: figures(1.0), Slo(), start=1.0)


def test_a_search_told_where_to_give_up_stops_at_the_first_rate_at_or_below_it_that_breaks():
    """A candidate whose goodput lies below the defaults' (less their noise) is stopped there: its figure
    is at most the rate that broke. One whose goodput lies above the bar is searched as before."""
    measure = lambda capacity: lambda rate: figures(ttft_p99=50.0 if rate <= capacity else 900.0)  # noqa: E731
    slo = Slo(ttft_p99_ms=200)
    slow = search(measure(1.0), slo, start=16.0, give_up_below=5.0)
    assert [p.rate for p in slow.points] == [16, 8, 4] and slow.pruned_at == 4 and slow.bounds == (0.0, 4)
    assert search(measure(1.0), slo, start=16.0).pruned_at is None   # without a bar: down to where it holds
    fast = search(measure(6.0), slo, start=16.0, give_up_below=5.0)
    assert fast.pruned_at is None and fast.converged and fast == search(measure(6.0), slo, start=16.0)
    # In the bisection too: held at 4, broke at 8, then broke at 6 <= 6.5: below the bar whatever follows.
    mid = search(measure(5.0), slo, start=4.0, give_up_below=6.5)
    assert [p.rate for p in mid.points] == [4, 8, 6] and mid.pruned_at == 6 and mid.bounds == (4, 6)


@pytest.mark.parametrize("fields, needle", [
    ({"arrivals": "rate:2"}, "objective 'tps' under arrivals 'rate:2'"),
    ({"objective": "goodput", "slo_ttft_p99_ms": 100.0}, "needs open-loop arrivals"),
    ({"objective": "goodput", "arrivals": "rate:2"}, "needs at least one SLO"),
    ({"objective": "latency"}, "'latency' is not tps, goodput or a latency percentile"),
    ({"objective": "e2e-p95", "arrivals": "rate:2"}, "-p50, -p90 or -p99"),
    ({"arrivals": "trace", "objective": "goodput", "slo_ttft_p99_ms": 100.0}, "needs a traffic file with a timestamp"),
    ({"arrivals": "rate:2", "objective": "goodput", "slo_ttft_p99_ms": -1.0},
     "slo_ttft_p99_ms: -1.0 is not a positive"),
])
def test_a_workload_whose_objective_cannot_rank_under_its_arrivals_is_refused(fields, needle):
    with pytest.raises(ValueError) as e:
        load_workload({**load_workload("smoke").as_dict(), **fields})
    assert needle in str(e.value)


def goodput_trial(tmp_path: Path, monkeypatch, slots: int, rate: str, ttft_ms: float = 300.0,
                  heldout: bool = False, prune_below: float | None = None, start: float | None = None,
                  out: str = "") -> dict:
    """One real worker on the stand-in: 10 tokens of 10 ms a request, `slots` decoding at once, so
    its capacity is slots * 10 requests a second."""
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_SLOTS", "FAKE_TOKEN_S"))
    monkeypatch.setenv("FAKE_SLOTS", str(slots))
    monkeypatch.setenv("FAKE_TOKEN_S", "0.01")
    traffic = tmp_path / f"t{slots}.jsonl"
    traffic.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 10}) + "\n" for i in range(400)))
    workload = {"name": "rated", "meter_version": 3, "concurrency": 64, "num_prompts": 24, "warmup_requests": 1,
                "prompt_split": "search", "traffic": str(traffic), "arrivals": f"{rate},burstiness=1000,seed=1",
                "objective": "goodput", "slo_ttft_p99_ms": ttft_ms}
    spec = specs.from_dict({"model": "fake", "workload": workload, "deadlines": {"start_s": 30},
                            "heldout_bench": heldout, "stop_rules": {"prune_below": prune_below,
                                                                     **({"goodput_start": start} if start else {})}})
    out = tmp_path / f"s{slots}{out}"
    out.mkdir()
    return run_trial(spec, out / "server.log", out / "progress.json", launcher=FAKE)


def test_two_servers_equal_in_tokens_per_second_at_one_rate_differ_in_goodput(tmp_path, monkeypatch):
    """At 5 requests a second both stand-ins serve the offered load (the same tokens/s); the one with
    two decoding slots holds the TTFT SLO to about twice the rate of the one with one."""

    one, two = (goodput_trial(tmp_path, monkeypatch, slots, "rate:5") for slots in (1, 2))
    for result in (one, two):
        assert result.status == "ok", result.failure
        assert result.bench.objective == "goodput" and result.bench.figure == result.bench.goodput["rate"]
    g1, g2 = one.bench.goodput, two.bench.goodput
    # At the start rate, 5 a second, both held and both served the offered load.
    first1, first2 = g1["points"][0], g2["points"][0]
    assert first1["rate"] == first2["rate"] == 5 and first1["held"] and first2["held"]
    assert math.isclose(first1["tps"], first2["tps"], rel_tol=0.1)
    # Capacity c = 10 and 20 requests a second. A point is 24 requests arriving at rate r; above c a
    # backlog of 24 (1 - c / r) builds, and the last request waits backlog / c for a slot, so the TTFT
    # bound of 0.3 s holds up to r = 24 c / (24 - 0.3 c): 11.4 and 26.7 requests a second.
    for g, c in ((g1, 10), (g2, 20)):
        bound = 24 * c / (24 - 0.3 * c)
        assert 0.7 * bound <= g["rate"] <= 1.05 * bound, (c, g["bounds"])
    assert 1.8 < g2["rate"] / g1["rate"] < 2.7
    assert all(p["percentile"] == "max of 24" for p in g1["points"])   # 24 requests a point: named, not "p99"
    assert one.workload["arrivals"] == "rate:5,burstiness=1000,seed=1"


def latency_trial(tmp_path: Path, monkeypatch, token_s: float, objective: str, arrivals: str) -> dict:
    """One real worker on the stand-in, every request 10 tokens of token_s each, under `arrivals`."""
    monkeypatch.setattr(server_mod, "PASSTHROUGH_ENV", (*server_mod.PASSTHROUGH_ENV, "FAKE_TOKEN_S"))
    monkeypatch.setenv("FAKE_TOKEN_S", str(token_s))
    traffic = tmp_path / f"l{token_s}.jsonl"
    traffic.write_text("".join(json.dumps({"prompt": f"request {i}", "max_tokens": 10}) + "\n" for i in range(200)))
    workload = {"name": "latency", "meter_version": 4, "concurrency": 64, "num_prompts": 20, "warmup_requests": 1,
                "prompt_split": "search", "traffic": str(traffic), "arrivals": arrivals, "objective": objective}
    spec = specs.from_dict({"model": "fake", "workload": workload, "repeats": 2, "deadlines": {"start_s": 30},
                            "heldout_bench": True,
                            "stop_rules": {"prune_below": 1e6}})   # a pruner bounds tokens/s: not under latency
    out = tmp_path / f"o{token_s}"
    out.mkdir()
    return run_trial(spec, out / "server.log", out / "progress.json", launcher=FAKE)


def test_a_latency_objective_ranks_two_servers_that_serve_one_rate_alike(tmp_path, monkeypatch):
    """At 10 requests a second, open loop, a server of 5 ms a token and one of 10 ms both serve the
    offered load (the same tokens/s, which is why tps is refused there); the objective e2e-p90 tells
    them apart: its figure is 1000 / the p90 end-to-end latency in ms over both repeats' requests,
    about twice as high for the faster server, on the held-out phase as on the search one."""
    fast, slow = (latency_trial(tmp_path, monkeypatch, t, "e2e-p90", "rate:10,burstiness=1000,seed=1")
                  for t in (0.005, 0.010))
    for result in (fast, slow):
        assert result.status == "ok", result.failure
        b = result.bench
        assert b.objective == "e2e-p90" and b.requests == 40   # (raw latencies: Figures has no field for them)
        assert b.figure > 0 and result.bench_heldout.objective == "e2e-p90"
    assert math.isclose(fast.bench.tps, slow.bench.tps, rel_tol=0.1), (fast.bench, slow.bench)
    ratio = fast.bench.figure / slow.bench.figure
    assert 1.5 < ratio < 2.5, ratio
    # Both repeats' requests arrived at 10 a second: no phase ran closed loop (20 requests, 2 s apart).
    assert all(r.bench.wall_s > 3.5 for r in (fast, slow))


def test_a_config_that_holds_the_slos_at_no_rate_fails_naming_the_lowest_rate_and_what_broke(tmp_path, monkeypatch):
    result = goodput_trial(tmp_path, monkeypatch, 1, "rate:200", ttft_ms=0.001)
    assert result.status == "failed" and result.failure.klass == "bad_output"
    assert "no rate held the SLOs: the lowest tried, 3.125 requests/s" in result.failure.message
    assert "ttft_p99_ms" in result.failure.message


def test_a_config_that_no_judgeable_load_breaks_keeps_its_last_held_load_as_a_lower_bound(tmp_path, monkeypatch):
    """A TTFT bound no load reaches: the search doubles from 5 requests a second until a point holds
    only as a burst (24 requests within 3 of their latencies). The figure is the last load that held,
    a lower bound, not a failure: core binding on 2 cores, 2026-12-04, failed so and lost the run's
    best config."""
    result = goodput_trial(tmp_path, monkeypatch, 8, "rate:5", ttft_ms=1e6)
    assert result.status == "ok", result.failure
    g = result.bench.goodput
    rates = [p["rate"] for p in g["points"]]
    assert all(p["held"] for p in g["points"]) and rates == [5 * 2 ** i for i in range(len(rates))]
    assert len(rates) >= 2 and g["bounds"] == [rates[-2], None] and g["rate"] == rates[-2] and not g["converged"]
    assert f"at {rates[-1]:g} requests/s" in g["burst"] and result.bench.figure == rates[-2]


def test_a_trial_told_the_defaults_goodput_starts_there_and_settles_it_in_fewer_points(tmp_path, monkeypatch):
    """The stand-in's goodput bisected from the profile's rate, then a fresh server told that figure
    (as the agent tells every instance after the defaults' first, and every candidate): its first
    point is there, its second one step of twice the tolerance away, and it settles in fewer points
    on about the same figure."""
    first = goodput_trial(tmp_path, monkeypatch, 1, "rate:5")
    assert first.status == "ok", first.failure
    figure = first.bench.figure
    again = goodput_trial(tmp_path, monkeypatch, 1, "rate:5", start=figure, out="again")
    assert again.status == "ok", again.failure
    rates = [p["rate"] for p in again.bench.goodput["points"]]
    assert rates[0] == round(figure, 6) and round(rates[1] / rates[0], 3) in (1.1, round(1 / 1.1, 3))
    assert len(rates) < len(first.bench.goodput["points"]), (rates, first.bench.goodput["points"])
    assert again.bench.goodput["converged"] and abs(again.bench.figure / figure - 1) < 0.15


def test_the_held_out_goodput_search_starts_at_the_same_servers_search_figure(tmp_path, monkeypatch):
    """The held-out split allows few rate points; started where this server's search split found its
    goodput, two points bracket it (from the profile's start they held, then burst: 2026-12-04)."""
    result = goodput_trial(tmp_path, monkeypatch, 1, "rate:40", heldout=True)
    assert result.status == "ok", result.failure
    found, held_out = result.bench.goodput, result.bench_heldout.goodput
    assert held_out["points"][0]["rate"] == round(found["rate"], 6) != 40
    assert None not in held_out["bounds"] and held_out["rate"] > 0


def test_a_candidate_whose_goodput_cannot_reach_the_bar_is_pruned_where_a_load_below_it_broke(tmp_path, monkeypatch):
    """One decoding slot holds the TTFT bound to about 11 requests a second: from 40 a second, the
    point at 20 breaks at or below the bar of 25, so the trial is pruned there (no held-out split, no
    quality), its figure at most 20."""
    result = goodput_trial(tmp_path, monkeypatch, 1, "rate:40", heldout=True, prune_below=25.0)
    assert result.status == "pruned", result.failure
    assert [p["rate"] for p in result.bench.goodput["points"]] == [40, 20] and result.bench.figure == 20
    # of: the 11 fresh draws of 24 that the search split allows (about 4 in 5 of 400, less a warm-up and 32 for quality)
    assert result.pruned == {"after_requests": 48, "of": 11 * 24, "upper": 20, "below": 25.0}
    assert result.bench_heldout is None and result.quality is None


def test_the_defaults_goodput_as_a_lower_bound_ends_the_run_with_what_to_change(tmp_path):
    from agent import budget
    from agent import space as spaces
    from agent.context import RunContext, Seams, Settings
    from agent.defaults import BaselineFailed, run_defaults
    from agent.ledger import Ledger, Run
    from sandbox.result import Figures, TrialResult

    class Engine:   # the seam: one result whose goodput never broke
        def evaluate(self, spec, trial_dir, timeout_s, on_phase=lambda phase: None):
            figures = Figures(tps=1.46, objective="goodput", figure=1.46, goodput={
                "rate": 1.46, "bounds": [1.46, None], "converged": False, "points": [{}, {}, {}],
                "burst": "at 2.93 requests/s the point's 24 requests arrived over 8.2 s ...: a burst, not a load"})
            return TrialResult(status="ok", bench=figures, timings={})

    with pytest.raises(BaselineFailed, match=r"held the SLOs at every load measured, up to 1.46 requests/s \(at "
                                             r"2.93 requests/s.*only a lower bound.*--num-prompts"):
        ledger = Ledger(tmp_path / "ledger.sqlite")
        space = spaces.load("vllm-cpu", cpu_flags={"avx512f"})
        run = ledger.add(Run(id="r", deadline_at=budget.deadline_after(600).isoformat(), model="m",
                             space_path=space.path, space_hash=space.hash, workload="smoke", repo=str(tmp_path),
                             settings={"home": str(tmp_path)}))
        run_defaults(RunContext(run, Settings(model="m", workload="smoke"), space), Seams(ledger, Engine()),
                     "baseline", "engine defaults")


def test_a_goodput_run_tells_optuna_decides_and_claims_in_requests_per_second(tmp_path, embedded_model):
    """A real `agent run --traffic TRACE --arrivals trace` (the deterministic engine at its seam, whose
    goodput is its tokens/s / 20): the ledger, the console and the branch carry the goodput figure."""
    import os
    import subprocess
    import sys

    import optuna

    from agent.ledger import Ledger

    home = tmp_path / "home"
    env = {**os.environ, "AGENT_HOME": str(home), "AGENT_TEST_TRIAL_S": "0.05", "COLUMNS": "300"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "agent_with_seam_engine.py"), "run", "--budget", "90s",
                           "--model", str(embedded_model),
                           "--traffic", str(ROOT / "sandbox/data/traffic/trace.jsonl"), "--arrivals", "trace",
                           "--slo-ttft-p99-ms", "2000", "--max-trials", "4"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = " ".join((proc.stdout + proc.stderr).split())   # the console's own line breaks do not matter here
    assert proc.returncode == 0, out[-3000:]
    assert "objective goodput (the highest rate whose TTFT p99 <= 2000 ms holds)" in out
    assert "baseline: 0.9" in out and "req/s goodput (instances" in out and "tok/s" not in out
    (run,) = Ledger(home / "ledger.sqlite").runs()
    spec = run.settings["workload"]
    assert spec["objective"] == "goodput" and spec["arrivals"] == "trace" and spec["slo_ttft_p99_ms"] == 2000
    assert 0.8 < run.baseline_figure < 1.0   # 18 tok/s / 20: the figure, not tokens/s
    trials = Ledger(home / "ledger.sqlite").trials(run.id)
    assert all(t.meter["objective"] == "goodput" and t.meter["arrivals"] == "trace:1" for t in trials if t.meter)
    study = optuna.load_study(study_name=run.id, storage=f"sqlite:///{home / 'optuna.sqlite'}")
    told = [ft.value for ft in study.trials if ft.value is not None]
    branched = [t for t in trials if t.branch]
    assert told and branched and all(t.figure < 2 for t in branched)
    message = subprocess.run(["git", "-C", str(home / "proposals"), "log", "-1", "--format=%B", branched[0].branch],
                             capture_output=True, text=True, check=True).stdout
    assert f"{branched[0].figure:.2f} req/s goodput" in message


def test_open_loop_latency_counts_from_arrival_so_a_wait_for_a_free_slot_is_seen(tmp_path):
    """Closed loop, one in flight: each request is timed from its send and waits for nothing. Open
    loop above capacity, one in flight at most: the requests that arrived while the slot was busy
    are timed from their arrival, and their TTFT shows the queue."""
    import os
    import subprocess
    import sys

    from test_traffic import wait_up

    from sandbox import bench

    port = 18640
    proc = subprocess.Popen([sys.executable, FAKE[0], "--model", "m", "--host", "127.0.0.1", "--port", str(port)],
                            env={**os.environ, "FAKE_TOKEN_S": "0.01"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url)
        sent = requests(10)   # 4 tokens of 10 ms each: 25 requests a second through one slot
        closed, wall = asyncio.run(bench.run_requests(url, "fake-model", sent, 1, 60))
        times = parse("rate:100,burstiness=1000").offsets(10)   # 100 a second, four times the capacity
        opened, _ = asyncio.run(bench.run_requests(url, "fake-model", sent, 1, 60, offsets=times))
    finally:
        proc.kill()
        proc.wait()
    closed_ttft = bench.summarize(closed, wall, sent).ttft_ms["p99"]
    opened_ttft = bench.summarize(opened, wall, sent).ttft_ms["p99"]
    assert closed_ttft < 40 and opened_ttft > 200, (closed_ttft, opened_ttft)


@pytest.mark.parametrize("args, needle", [
    (["--arrivals", "rate:0", "--slo-ttft-p99-ms", "100"], "--arrivals: 'rate:0': the rate and the burstiness"),
    (["--arrivals", "rate:2"], "needs at least one SLO (--slo-ttft-p99-ms, --slo-itl-p99-ms, --slo-e2e-p99-ms)"),
    (["--objective", "goodput", "--slo-ttft-p99-ms", "100"], "needs open-loop arrivals"),
    (["--arrivals", "trace", "--slo-ttft-p99-ms", "100"], "default.jsonl:1 has none"),
    (["--workload", "trace-cpu", "--slo-itl-p99-ms", "0", "--arrivals", "trace"],
     "--slo-itl-p99-ms: 0.0 is not a positive"),
])
def test_run_with_arrivals_it_cannot_rank_under_stops_with_one_line_and_writes_nothing(tmp_path, args, needle):
    from test_traffic import agent_run, no_run_written

    proc = agent_run(tmp_path / "home", *args)
    assert proc.returncode == 2 and needle in " ".join(proc.stderr.split()), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and no_run_written(tmp_path / "home")


def test_a_split_too_small_for_two_goodput_rate_points_is_refused_naming_the_minimum():
    w = load_workload({**load_workload("trace-cpu").as_dict(), "num_prompts": 40})
    with pytest.raises(TrafficError, match="2 goodput rate points of 40 requests need at least 81 search"):
        w.check(repeats=1)
    load_workload("trace-cpu").check(repeats=1)


def test_a_point_that_held_only_as_a_burst_stops_the_search_naming_the_requests_needed():
    """4 requests of 10 s each at 1 a second arrive within 4 s: whatever held there was a burst, not a
    load (on 2 cores such points let core binding "hold" 4.5 requests/s and a trace 462)."""
    def measure(rate):
        r = figures(ttft_p99=100.0, requests=4)
        return BenchResult(**{**r.__dict__, "latency_ms": {"p50": 10_000.0, "p99": 12_000.0}})

    found = search(measure, Slo(ttft_p99_ms=200), start=1.0)
    assert found.rate == 0 and found.bounds == (0.0, None) and len(found.points) == 1
    assert re.search(r"4 requests arrived over 4.0 s, less than 3 of their median latencies \(10.0 s\): a burst, not "
                     r"a load; measure about 60 or more", found.burst)
    def slow(rate):
        return BenchResult(**{**figures(100.0, requests=4).__dict__, "latency_ms": {"p50": 100.0}})

    assert search(slow, Slo(ttft_p99_ms=200), start=1.0, max_points=3).points[0].held   # 4 s of arrivals, 0.1 s each


def test_a_burst_above_a_bracket_of_loads_keeps_the_bracket():
    """A fast config: loads held at 0.5 and 1 requests/s and broke at 2; at 1.5 its 4 requests arrived
    within 3 of their latencies, a burst. The bracket [1, 2] the loads gave stands (core binding on
    2 cores, 2026-12-03: held 1.2 as a load, broke 2.4, held 1.8 only as a burst)."""
    def measure(rate):
        r = figures(ttft_p99=100.0 if rate < 2 else 400.0, requests=4)
        return BenchResult(**{**r.__dict__, "latency_ms": {"p50": 1000.0 * rate, "p99": 1200.0 * rate}})

    found = search(measure, Slo(ttft_p99_ms=200), start=0.5)
    assert [p.rate for p in found.points] == [0.5, 1.0, 2.0, 1.5] and found.bounds == (1.0, 2.0)
    assert not found.converged and 1.0 <= found.rate < 2.0 and "at 1.5 requests/s" in found.burst
    assert search(lambda rate: figures(100.0 if rate < 2 else 400.0), Slo(ttft_p99_ms=200), start=0.5).burst is None
