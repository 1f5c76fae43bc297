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
