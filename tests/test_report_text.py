"""The terminal report: a trial's ratio is shown with its p99 latencies beside the defaults', so a
config that bought tokens/s with latency is seen as such."""

from agent import report_text
from agent.ledger import Run, Trial


def rows() -> tuple[Run, list[Trial]]:
    run = Run(id="r", status="finished", started_at="2026-01-01T00:00:00", deadline_at="2026-01-01T01:00:00",
              model="m", engine="vllm", engine_version="0", hardware={"cpu": "x", "cpus": 2}, workload="smoke",
              settings={}, baseline_figure=100.0, baseline_ppl=8.0, noise=0.02, noise_df=2, calibration={})
    defaults = [Trial(number=n, source=source, status="ok", figure=100.0, ttft_p99_ms=ttft, itl_p99_ms=itl, params={})
                for n, (source, ttft, itl) in enumerate((("baseline", 128.0, 20.0), ("baseline", 132.0, 22.0),
                                                         ("aa", 130.0, 21.0)))]
    won = Trial(number=3, source="sampler", status="ok", figure=112.0, search_ratio=1.12, heldout_ratio=1.1,
                heldout_interval=[1.04, 1.16], ttft_p99_ms=118.0, itl_p99_ms=19.0, ppl_change=0.0, agreement=1.0,
                flips=[], params={"max_num_batched_tokens": 4096}, branch="agent/r/3", commit="abc", meter={})
    refused = Trial(number=4, source="sampler", status="ok", figure=107.0, search_ratio=1.07, ttft_p99_ms=131.0,
                    itl_p99_ms=87.0, decision="refused", params={"stream_interval": 8},
                    gate_reasons=["latency: p99 inter-token latency 87 ms is above the defaults' 21 ms beyond their "
                                  "noise (bound 26 ms; set --slo-itl-p99-ms to allow it)"])
    return run, [*defaults, won, refused]


def test_the_report_shows_latencies_beside_the_ratio_for_accepted_and_refused_candidates():
    run, trials = rows()
    lines = list(report_text.report(run, trials, [], []))
    assert "  the defaults' p99 TTFT 130 ms, ITL 21 ms (geometric mean of their instances)" in lines
    accepted = next(line for line in lines if line.startswith("  agent/r/3"))
    assert "1.120x search, p99 TTFT 118 ms (defaults 130), ITL 19 ms (defaults 21)" in accepted
    refused = next(line for line in lines if line.startswith("  trial 4"))
    assert refused.startswith("  trial 4 refused on latency: 1.070x search, p99 TTFT 131 ms (defaults 130), "
                              "ITL 87 ms (defaults 21)")
    summary = list(report_text.summary(run, trials))
    assert summary[1].endswith("p99 TTFT 118 ms (defaults 130), ITL 19 ms (defaults 21)")


def test_a_trial_without_latencies_says_so_rather_than_showing_none():
    _, trials = rows()
    bare = Trial(number=5, source="sampler", status="ok", params={})
    assert report_text.latencies(bare, trials) == "no latencies measured"
    assert report_text.latencies(trials[3], []) == "p99 TTFT 118 ms, ITL 19 ms"   # no defaults' rows yet


def test_the_branch_table_has_a_latency_column():
    from rich.console import Console

    _, trials = rows()
    console = Console(width=400, record=True)
    console.print(report_text.branch_table(trials))
    assert "p99 TTFT 118 ms (defaults 130), ITL 19 ms (defaults 21)" in console.export_text()


def test_a_run_that_beat_nothing_says_the_defaults_are_best_and_on_a_gpu_cites_the_lever_table():
    """Issue 44: a finished run that measured candidates and branched none says the defaults are the best
    it found for this traffic (the best candidate's figure beside it); on a GPU it names the levers the
    lever table measured winning nowhere (agent.rules.WON_NOWHERE), with their figures."""
    from agent.rules import WON_NOWHERE

    run, trials = rows()
    lost = [t for t in trials if not t.branch]   # the accepted trial 3 left out: nothing was branched
    lines = list(report_text.summary(run, lost))
    assert lines[1] == ("  the defaults are the best config this run found for this traffic: none of 1 candidates "
                        "measured beat them (the best, trial 4, read 1.070x on the search prompts; 0 reached a "
                        "held-out decision); nothing was branched")
    assert len(lines) == 2   # a CPU host: no lever table cited
    gpu = Run(**{**{c.name: getattr(run, c.name) for c in Run.__table__.columns},
                 "hardware": {"kind": "gpu", "gpus": ["NVIDIA H100 80GB HBM3"]}})
    cited = list(report_text.report(gpu, lost, [], []))[-1]
    assert cited.startswith("  on a GPU under load the lever table found no lever winning on the embedded model")
    assert all(f"{name}: {why}" in cited for name, why in WON_NOWHERE.items()) and "docs/results.md" in cited
    assert not [line for line in report_text.summary(run, trials) if "defaults are the best" in line]   # branched
    for pending in ("accepted", "put_forward", "awaiting_recheck"):   # accepted, its commit not yet made; undecided
        held = Trial(**{**{c.name: getattr(lost[-1], c.name) for c in Trial.__table__.columns}, "number": 5,
                        "decision": pending})
        assert not [line for line in report_text.summary(run, [*lost, held]) if "defaults are the best" in line]
    going = Run(**{**{c.name: getattr(run, c.name) for c in Run.__table__.columns}, "status": "running"})
    assert list(report_text.report(going, lost, [], []))[-1] == "  no accepted config yet"


def test_each_latency_is_labelled_and_a_p99_of_few_requests_says_how_many():
    """What a reader waits for (TTFT, TPOT, end to end) and the chunk gaps, whole and per token; a p99 of
    fewer than 100 requests carries its count."""
    from agent import views

    def measured(ttft, tpot, e2e, gap, n):
        return {"ttft_ms": {"p99": ttft, "n": n}, "tpot_ms": {"p99": tpot, "n": n}, "latency_ms": {"p99": e2e, "n": n},
                "itl_token_ms": {"p99": tpot, "n": 40 * n}, "itl_ms": {"p99": gap, "n": 40 * n}}

    defaults = [Trial(number=n, source="baseline", status="ok", figure=10.0, params={},
                      measured=measured(260.0, 70.0, 9000.0, 87.0, 8)) for n in range(2)]
    spec = Trial(number=2, source="planner", status="ok", figure=18.0, search_ratio=1.8, params={},
                 measured=measured(250.0, 40.0, 5000.0, 181.0, 8))
    line = report_text.latencies(views.trials([spec])[0], views.trials(defaults))
    assert line == ("p99 TTFT 250 ms of 8 (defaults 260), TPOT 40 ms of 8 (defaults 70), e2e 5000 ms of 8 (defaults "
                    "9000), ITL a token 40 ms (defaults 70), chunk gap 181 ms (defaults 87)")
