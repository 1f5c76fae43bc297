"""A trial's row: opened before its server starts, measured through the engine, written once with
what the worker found."""

from __future__ import annotations

from dataclasses import replace
from typing import Unpack

from agent import clock
from agent.context import RunContext, Seams, Settings
from agent.ledger import Ledger, Trial, TrialWrite, utcnow
from agent.space import Space
from agent.states import Source, Status, Superseded
from agent.stats import interval
from sandbox.contract import FailureClass, SpecFile, StopRules, TrialResult, Workload


def open_trial(ctx: RunContext, ledger: Ledger, point: dict, source: Source,
               optuna_number: int | None = None, rationale: str | None = None) -> Trial:
    flags, env = ctx.space.to_flags_env(point)
    return ledger.add_trial(Trial(run_id=ctx.run.id, source=source, optuna_number=optuna_number, params=point,
                                  flags=flags, env=env, lossless=ctx.space.lossless(point, ctx.defaults),
                                  rationale=rationale, worker_id=ctx.worker_id))


def spec_for(ctx: RunContext, row: Trial, stop_rules: StopRules, heldout_bench: bool = False,
             heldout_meter: Workload | None = None) -> SpecFile:
    """The worker's spec of a row's config on the run's meter and quality set; or, with `heldout_meter`,
    speed alone on that (a held-out instance)."""
    s = ctx.settings
    if heldout_meter is not None:
        return replace(SpecFile.speed_only(s.model, row.flags, row.env, heldout_meter, s.repeats),
                       stop_rules=stop_rules)
    return SpecFile(s.model, row.flags, row.env, s.workload, s.quality, s.quality_text, s.repeats, heldout_bench,
                    stop_rules)


def allowed(space: Space, settings: Settings, model: str | None = None) -> dict:
    """The allow-list a trial's worker checks its whole spec against (sandbox.allowed.check_spec): the
    space's rules, and the run's own inputs for every key spec_for writes beside flags and env: the
    model, repeats, the workload in either split (its hash covers traffic, load and chat template) and
    the quality set (or none, for a held-out or speed-only instance)."""
    from sandbox.contract import load_quality, load_workload

    meter = load_workload(settings.workload)
    quality = [None] if settings.quality == "none" else [None, load_quality(settings.quality,
                                                                            settings.quality_text).hash]
    return {**space.allowed(), "inputs": {
        "model": model or settings.model, "trust_remote_code": False, "repeats": settings.repeats,
        "workloads": sorted({meter.with_split(split).hash for split in ("search", "heldout")}), "quality": quality}}


def measure(ctx: RunContext, seams: Seams, row: Trial, timeout_s: float, stop_rules: StopRules, suffix: str = "",
            heldout_bench: bool = False, heldout_meter: Workload | None = None) -> TrialResult:
    """One trial process through the engine: a fresh server of the row's config, measured (spec_for)."""
    trial_dir = ctx.home / ctx.run.id / f"trial-{row.number:03d}{suffix}"
    for again in range(2, 100):   # a decision made again after a resume: fresh folders, no stale result
        if not trial_dir.exists():
            break
        trial_dir = ctx.home / ctx.run.id / f"trial-{row.number:03d}{suffix}-again{again}"
    t0 = clock.monotonic()
    spec = spec_for(ctx, row, stop_rules, heldout_bench, heldout_meter)
    result = seams.engine.evaluate(spec.as_dict(), trial_dir, timeout_s,
                                   on_phase=lambda phase: seams.say("phase", number=row.number, phase=phase))
    result.timings["total_s"] = round(clock.monotonic() - t0, 1)
    return result


def record(ledger: Ledger, row: Trial, result: TrialResult) -> Trial:
    """The worker's result into the row, once; the row as written is returned."""
    failure, bench, quality = result.failure, result.bench, result.quality
    klass, message = FailureClass.of(failure.klass, failure.message) if failure else (None, None)
    values = TrialWrite(
        status=Status(result.status), failure_class=klass,
        failure_message=message, failure_cause=failure.cause if failure else None,
        failed_phase=result.failed_phase, log_tail=(failure and failure.log_tail) or None,
        figure=bench.value if bench else None, ppl=quality.ppl if quality else None,
        heldout_figure=result.bench_heldout.value if result.bench_heldout else None,
        errors=bench.errors if bench else None,
        ttft_p99_ms=bench.ttft_ms.get("p99") if bench else None, itl_p99_ms=bench.itl_ms.get("p99") if bench else None,
        metrics=result.metrics or {}, greedy=(quality and quality.token_ids) or None,
        top_logprobs=(quality and quality.top_logprobs) or None,
        timings=result.timings, log_path=result.log_path,
        meter={**result.workload, "quality": result.quality_set}, finished_at=utcnow(),
        measured={**({"ttft_ms": bench.ttft_ms, "itl_ms": bench.itl_ms, "repeat_figures": bench.repeat_figures,
                      "finish": bench.finish, "tpot_ms": bench.tpot_ms, "latency_ms": bench.latency_ms,
                      "itl_token_ms": bench.itl_token_ms, "goodput": bench.goodput,
                      "repeat_share": bench.repeat_share, "phase_tps": bench.phase_tps, "window_s": bench.window_s}
                     if bench else dict.fromkeys(("ttft_ms", "itl_ms", "repeat_figures", "finish", "tpot_ms",
                                                  "latency_ms", "itl_token_ms", "goodput",
                                                  "repeat_share", "phase_tps", "window_s"))),
                  "engine": result.engine, "hardware": result.hardware, "device": result.device})
    repeats = [x for x in (bench.repeat_figures if bench else []) if x and x > 0]
    if len(repeats) >= 2:  # within one server only: the noise between instances is the run's `noise`
        values["figure_interval"] = [round(x, 3) for x in interval(repeats)]
    # Only while the row is still running: a worker declared lost mid-trial finds it interrupted.
    # The figures and the phases behind them in one transaction: a crash leaves both or neither.
    if not ledger.record_result(row, bench.repeat_figures if bench else [], **values):
        raise Superseded(f"trial {row.number}: recorded as interrupted by another process while it ran "
                         f"(this worker was silent past the grace); its result is dropped")
    return row


def finish(ledger: Ledger, row: Trial, **values: Unpack[TrialWrite]) -> Trial:
    values["finished_at"] = utcnow()
    return ledger.transition(row, **values)
