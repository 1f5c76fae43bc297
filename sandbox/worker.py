"""Run one trial on a real vLLM server and write its result as JSON.

    python -m sandbox.worker trial.yaml --out result.json [--log server.log] [--progress phase.json]

Phases, each with a deadline: start (until /health and /v1/models answer), warm-up, benchmark,
quality (perplexity and greedy outputs through the same server), teardown (the whole process
tree, then a check that nothing is left and the port is free). Whatever happens, the result file
is written and the server is gone: a failure is a classified value, never a hang.
Exit status: 0 when a result was written, 2 when the spec was refused (result written too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx

from sandbox import allowed, bench, goodput, host, ladders, metrics, quality
from sandbox import result as results
from sandbox import spec as specs
from sandbox.failures import TrialFailure, log_tail
from sandbox.result import Figures, Quality, TrialResult
from sandbox.server import Server
from sandbox.workload import latency_of


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the worker: end the trial, tear down, report."""


class PhaseTimeout(BaseException):
    pass


@contextlib.contextmanager
def deadline(seconds: float, phase: str):
    """A hard backstop for a phase: SIGALRM interrupts even a blocked socket read."""
    def expire(signum, frame):
        raise PhaseTimeout(phase)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def served(server) -> str:
    """The model name requests carry: what the server said it serves once up (Server.wait_ready), or
    what a script attached to a running server was given."""
    if server.model_name is None:
        raise RuntimeError("the server is not up: it has named no model yet")
    return server.model_name


async def _measure(server: Server, workload, requests: list, timeout_s: float,
                   pruner: bench.Pruner | None = None, offsets: list[float] | None = None
                   ) -> tuple[bench.BenchResult, dict]:
    async with httpx.AsyncClient(timeout=5.0) as client:
        before = await metrics.scrape(client, server.base_url)
    sampler = metrics.Sampler(server.base_url)
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    api_cpu = server.api_cpu_seconds()
    try:
        results, wall = await bench.run_requests(server.base_url, served(server), requests,
                                                 workload.concurrency, timeout_s, pruner, offsets)
    finally:
        stop.set()
        await sampling
    after_cpu = server.api_cpu_seconds()   # None: a server this process did not start (a script's --url)
    api_share = (after_cpu - api_cpu) / wall if wall > 0 and None not in (api_cpu, after_cpu) else None
    async with httpx.AsyncClient(timeout=5.0) as client:
        after = await metrics.scrape(client, server.base_url)
    window = workload.concurrency if offsets is None else 1   # closed loop: its steady window (sandbox.bench)
    return bench.summarize(results, wall, requests, window), metrics.summarize(before, after, sampler, api_share)


def _repeat(server: Server, workload, repeat: int, bench_s: float, pruner: bench.Pruner | None = None
            ) -> tuple[bench.BenchResult, dict]:
    """Measured phase `repeat` on fresh requests: closed loop at the workload's concurrency, or (a
    latency objective under open-loop arrivals) sent at the profile's own times for that phase."""
    requests = workload.measured(repeat)
    offsets = workload.offsets(len(requests), repeat)
    return asyncio.run(_measure(server, workload, requests, bench_s + (offsets[-1] if offsets else 0.0), pruner,
                                offsets))


def _span(workload, repeats: int) -> float:
    """The longest time over which one phase's requests arrive (0 closed loop)."""
    return max((workload.offsets(workload.num_prompts, r) or [0.0])[-1] for r in range(repeats))


def goodput_on(server: Server, workload, bench_s: float, phase: str,
               on_point: Callable[[str], None] = lambda detail: None,
               on_measured: Callable[[goodput.Point], None] = lambda point: None,
               start: float | None = None, give_up_below: float | None = None) -> Figures:
    """The objective goodput on one server: rate points, each a fresh draw of the workload's split on
    the same seeded arrival pattern scaled to its rate (sandbox.goodput), from `start`, a figure
    measured before (default: the profile's rate, doubling from there). The instance's figure is the highest rate
    that held its SLOs; the latencies
    shown are that point's. on_point hears of a point before it is measured, on_measured gets it
    once judged (a cut search keeps what it saw)."""
    draws = iter(range(workload.rate_points()))
    measured: list[bench.BenchResult] = []

    def measure(rate: float) -> bench.BenchResult:
        point = next(draws)
        on_point(f"rate point {point + 1} of at most {workload.rate_points()}, {rate:.3g} requests/s")
        requests = workload.measured(point)
        offsets = workload.offsets(len(requests), point, rate)
        # From the last request's send time, every request at 2 tok/s at least: a point that overruns it
        # is an overloaded server, a point that broke its SLOs, not a failed trial.
        budget = offsets[-1] + 60 + workload.longest_output() / 2
        with deadline(budget + 30, phase):
            try:
                result, _ = asyncio.run(_measure(server, workload, requests, budget, offsets=offsets))
            except TimeoutError:
                result = bench.summarize([bench.RequestResult(ok=False, error=f"not answered within {budget:.0f} s")
                                          for _ in requests], budget, requests)
        server.fail_if_dead(phase)
        measured.append(result)
        on_measured(goodput.point(rate, result, workload.slo()))
        return result

    if workload.rate_points() < 2:
        raise TrialFailure("bad_output", f"{workload.where(workload.prompt_split)}: goodput needs at least two "
                                         f"fresh draws of {workload.num_prompts} requests on one server")
    found = goodput.search(measure, workload.slo(), start or workload.start_rate(), max_points=workload.rate_points(),
                           give_up_below=give_up_below, near=start is not None)
    if found.pruned_at is not None:   # hopeless: its figure is the rate it broke at, an upper bound
        return Figures(**measured[-1].to_dict(), objective="goodput", figure=found.pruned_at, goodput=found.as_dict(),
                       repeat_figures=[found.pruned_at], points_tps=[m.tps for m in measured],
                       draw_hashes=[m.draw_hash for m in measured])
    if found.rate == 0 and found.burst:   # the first point held only as a burst: no load was judged
        raise TrialFailure("bad_output", f"goodput: {found.burst}")
    if found.rate == 0:   # no figure to compare: the SLOs are out of this config's reach on this host
        lowest = found.points[-1]
        raise TrialFailure("bad_output", f"no rate held the SLOs: the lowest tried, {lowest.rate:g} requests/s, "
                                         f"broke them ({'; '.join(lowest.misses)})")
    # No load broke (a burst above the last, or the split's points ran out): the figure is the last
    # load that held, a lower bound. It can only understate this config, so a candidate keeps it
    # (core binding on 2 cores held every load 24 requests could judge); the defaults' own must not
    # be one, or candidates would be judged against too little (agent.defaults refuses it).
    held = [m for m, p in zip(measured, found.points, strict=False) if p.held and p.rate == found.bounds[0]]
    shown = held[0] if held else measured[0]
    return Figures(**shown.to_dict(), objective="goodput", figure=found.rate, goodput=found.as_dict(),
                   repeat_figures=[found.rate], points_tps=[m.tps for m in measured],
                   draw_hashes=[m.draw_hash for m in measured])


class TrialRun:
    """One trial's phases, in order, each under its deadline: start, warm-up, benchmark (stopped
    early when hopeless), held-out benchmark, quality; teardown always. The progress file carries
    the phase in flight and the trial's marker from before the server exists, so whatever kills
    this worker, the agent can find and end the server (engine.reap)."""

    def __init__(self, spec: specs.TrialSpec, log_path: Path, progress: Path | None, launcher: tuple[str, ...] | None,
                 port: int | None):
        self.spec, self.log_path, self.progress = spec, log_path, progress
        workload = spec.workload
        args = (spec.server_args() + (["--trust-remote-code"] if spec.trust_remote_code else [])
                + (["--chat-template", workload.chat_template] if workload.chat_template else []))
        self.server = Server(spec.model, args, spec.env, log_path, port=port, launcher=launcher)
        self.result = TrialResult(
            started_at_utc=datetime.now(UTC).isoformat(timespec="seconds"),
            model=spec.model, flags=spec.flags, env=spec.env, engine=host.engine(), hardware=host.hardware(),
            workload={"name": workload.name, "meter_version": workload.meter_version, "hash": workload.hash,
                      "prompt_split": workload.prompt_split, **workload.summary()},
            quality_set={"name": spec.quality.name, "hash": spec.quality.hash} if spec.quality else None,
            log_path=str(log_path), argv=self.server.argv[1:], port=self.server.port)
        self.phase = "start"
        self.clock = time.monotonic()
        self.bench_s = spec.deadlines.bench_s or bench.bench_deadline_s(workload)

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.result.timings[f"{name}_s"] = round(now - self.clock, 2)
        self.clock = now

    def enter(self, name: str, detail: str | None = None) -> None:
        self.phase = name
        if self.progress:
            pid = self.server.proc.pid if self.server.proc else None
            # Enough for the agent to end this trial's processes if this worker dies without tearing down.
            write_json(self.progress, {"phase": name, "server_pid": pid, "server_started": self.server.started or None,
                                       "port": self.server.port,
                                       "log": str(self.log_path), "worker_pid": os.getpid(), "token": self.server.token,
                                       **({"detail": detail} if detail else {})})

    def start(self) -> None:
        self.enter("start")   # the marker first: a kill during Popen still leaves it findable
        self.server.start()
        self.enter("start")
        with deadline(self.spec.deadlines.start_s + 5, self.phase):
            self.server.wait_ready(self.spec.deadlines.start_s)
        self.lap("start")

    def warmup(self) -> None:
        self.enter("warmup")
        workload = self.spec.workload
        with deadline(self.spec.deadlines.warmup_s, self.phase):
            warm, _ = asyncio.run(bench.run_requests(self.server.base_url, served(self.server), workload.warmups(),
                                                     workload.concurrency, self.spec.deadlines.warmup_s))
        self.server.fail_if_dead(self.phase)
        if failed := [r for r in warm if not r.ok]:
            raise TrialFailure("bad_output" if all(r.bad_answer for r in failed) else "request_errors",
                               f"warm-up request failed: {failed[0].error}")
        self.lap("warmup")

    def benchmark(self) -> None:
        self.enter("benchmark")
        spec, workload = self.spec, self.spec.workload
        if workload.objective == "goodput":
            self.result.bench = found = self.goodput(workload, start=spec.stop_rules.goodput_start,
                                                     give_up_below=spec.stop_rules.prune_below)
            self.lap("benchmark")
            assert found.goodput is not None   # the goodput search records its points
            if found.goodput["pruned_at"] is not None:
                self.result.status = "pruned"
                self.result.pruned = {"after_requests": sum(p["requests"] for p in found.goodput["points"]),
                                      "of": workload.rate_points() * workload.num_prompts,
                                      "upper": found.figure, "below": spec.stop_rules.prune_below}
            return
        pruner = (bench.Pruner.for_workload(spec.stop_rules.prune_below, workload)   # it bounds tokens/s: tps only
                  if spec.stop_rules.prune_below is not None and workload.objective == "tps" else None)
        runs = []
        with deadline((self.bench_s + _span(workload, spec.repeats)) * spec.repeats + 10, self.phase):
            for repeat in range(spec.repeats):   # fresh requests each repeat: nothing replayed to this server
                runs.append(_repeat(self.server, workload, repeat, self.bench_s, pruner))
                self.server.fail_if_dead(self.phase)
                if runs[-1][0].errors or (pruner and pruner.pruned):
                    break
        measured, explained = sorted(runs, key=lambda r: r[0].tps)[len(runs) // 2]  # the median repeat's latencies
        self.result.bench = pooled([r[0] for r in runs], measured, workload.objective)
        self.result.metrics = explained
        self.lap("benchmark")
        last, figures = runs[-1][0], self.result.bench   # a repeat with errors, or pruned, is the last one
        if last.errors:
            raise TrialFailure("request_errors", f"{last.errors} of {last.requests} requests failed; "
                                                 f"first: {last.first_error}")
        if pruner and pruner.pruned:
            self.result.status = "pruned"
            self.result.pruned = {"after_requests": last.requests, "of": workload.num_prompts,
                                     "upper": round(pruner.upper_tps or 0.0, 3), "below": spec.stop_rules.prune_below}
            return
        if figures.output_tokens == 0 or figures.short_outputs:
            raise TrialFailure("bad_output", f"{figures.short_outputs} of {figures.requests} requests did not "
                                             f"return the max_tokens asked for with ignore_eos")

    def goodput(self, workload, start: float | None = None, give_up_below: float | None = None) -> Figures:
        return goodput_on(self.server, workload, self.bench_s, self.phase,
                          on_point=lambda detail: self.enter(self.phase, detail), start=start,
                          give_up_below=give_up_below)

    def heldout(self) -> None:
        """Same server, other prompts: the defaults' reference for held-out decisions."""
        spec = self.spec
        heldout = spec.workload.with_split("heldout")
        if heldout.objective == "goodput":
            # The held-out split allows few points (the shipped trace's 52 requests: 2 of 24), too few
            # to bracket from the profile's start (docs/history.md: no figure came of it):
            # this server's search figure is where its held-out goodput lies, so the search starts there.
            near = self.result.bench.figure if self.result.bench and self.result.bench.figure else None
            self.result.bench_heldout = dataclasses.replace(self.goodput(heldout, start=near), hash=heldout.hash)
            self.lap("heldout")
            return
        with deadline((self.bench_s + _span(heldout, spec.repeats)) * spec.repeats + 10, self.phase):
            reps = [_repeat(self.server, heldout, r, self.bench_s)[0] for r in range(spec.repeats)]
        self.server.fail_if_dead(self.phase)
        median = sorted(reps, key=lambda r: r.tps)[len(reps) // 2]
        self.result.bench_heldout = dataclasses.replace(pooled(reps, median, heldout.objective), hash=heldout.hash)
        self.lap("heldout")

    def ladder(self) -> None:
        """The spec's ladder of loads on this server (sandbox.ladders): at each rung warm-ups at its load,
        then `repeats` phases of fresh requests; the climb ends where the ladder says, and why is kept.
        The result holds every rung measured so far: a rung that overruns its deadline ends the climb, and
        a server that dies there fails the trial with the rungs below it kept."""
        spec, ladder = self.spec, self.spec.ladder
        assert ladder is not None   # run_trial climbs only a spec that gives one
        self.enter("ladder")
        cursor, rungs = ladders.Cursor(spec.workload), list[dict]()
        below: list[dict] = []   # the rung below's phases
        stopped = f"the loads given end at {ladder.loads[-1]:g}"
        self.result.ladder = {**ladder.as_dict(), "rungs": rungs, "stopped": stopped}
        for load in ladder.loads:
            at = f"{ladder.kind} {load:g}"
            w = ladder.at(spec.workload, load)
            warm, draws = cursor.take(w.warmup_count()), [cursor.take(w.num_prompts) for _ in range(spec.repeats)]
            if warm is None or any(d is None for d in draws):
                spent = f"the traffic's {len(cursor.pool)} distinct requests are spent before {at}"
                self.result.ladder["stopped"] = spent
                break
            self.enter("ladder", at)
            try:
                phases = self._rung(w, load if ladder.kind == "rate" else None, warm, draws)
            except (PhaseTimeout, TimeoutError):
                self.result.ladder["stopped"] = f"{at} overran its deadline: the server falls behind this load"
                break
            rungs.append({"load": load, "repeats": phases})
            failed = next((p for p in phases if p["errors"]), None)
            median = sorted(phases, key=lambda p: p["tps"])[len(phases) // 2]
            if failed:
                stopped = f"{failed['errors']} of {failed['requests']} requests failed at {at}: {failed['first_error']}"
            elif why := ladders.broken(median, ladder.slo):
                stopped = f"{why} at {at}"
            elif below and median["tps"] < ladders.median_tps(below) * (1 + ladders.RISING):
                stopped = f"output tokens/s stopped rising at {at} ({ladders.median_tps(below):g} -> {median['tps']:g})"
            else:
                below = phases
                continue
            self.result.ladder["stopped"] = stopped
            break
        self.lap("ladder")

    def _rung(self, w, rate: float | None, warm: list, draws: list) -> list[dict]:
        """One rung: the warm-ups, then each draw measured, at the rung's load (open loop: `rate`)."""
        bench_s = bench.bench_deadline_s(w)
        spans = [(w.offsets(len(d), r, rate=rate) or [0.0])[-1] for r, d in enumerate([warm, *draws])]
        phases = []
        with deadline(sum(bench_s + span for span in spans) + 10, self.phase):
            offsets = w.offsets(len(warm), 0, rate=rate)
            asyncio.run(bench.run_requests(self.server.base_url, served(self.server), warm, w.concurrency,
                                           bench_s + spans[0], offsets=offsets))
            for r, requests in enumerate(draws):
                offsets = w.offsets(len(requests), r, rate=rate)
                measured, _ = asyncio.run(_measure(self.server, w, requests, bench_s + spans[r + 1], None, offsets))
                self.server.fail_if_dead(self.phase)
                phases.append(measured.to_dict())
        return phases

    def quality(self) -> None:
        self.enter("quality")
        spec, server = self.spec, self.server
        assert spec.quality is not None   # run_trial measures quality only where the spec names a set
        with deadline(spec.deadlines.quality_s, self.phase), httpx.Client(timeout=spec.deadlines.quality_s) as client:
            ppl = quality.perplexity(client, server.base_url, served(server), spec.quality)
            greedy = quality.greedy_outputs(client, server.base_url, served(server), spec.quality,
                                            spec.workload if spec.workload.traffic else None)
        server.fail_if_dead(self.phase)
        self.result.quality = Quality(ppl=ppl.ppl, nll=ppl.nll, ppl_tokens=ppl.tokens, ppl_windows=ppl.windows,
                                      greedy=greedy)
        self.lap("quality")

    def teardown(self, device_before: list[int] | None) -> None:
        result, timings = self.result, self.result.timings
        if f"{self.phase}_s" not in timings:
            self.lap(self.phase)  # how long the failed phase ran before it ended
        cleanup = self.server.stop(self.spec.deadlines.teardown_s)
        self.lap("teardown")
        held = host.wait_device_memory(device_before)
        result.cleanup = {"leftover_pids": cleanup.leftover_pids, "port_free": cleanup.port_free,
                          "forced_kill": cleanup.forced_kill, "device_memory_held": held}
        if (not cleanup.clean or held) and result.failure is None:
            self.phase = "teardown"
            self.fail("unclean_teardown", held or f"processes {cleanup.leftover_pids} or port {self.server.port} "
                                                  "still held after teardown")
        result.failed_phase = self.phase if result.failure else None
        self.enter("done")

    def fail(self, klass: str, message: str, tail: str = "", cause: str | None = None) -> None:
        if not tail and self.log_path.exists():
            tail = log_tail(self.log_path.read_text(errors="replace"))
        self.result.fail(klass, message, tail, cause)


def pooled(reps: list[bench.BenchResult], median: bench.BenchResult, objective: str = "tps") -> Figures:
    """An instance's figure over all its repeats: each repeat draws other requests, and every config gets
    the same draws, so the instance's TPS is its counted tokens over its counted time on all of them
    (each repeat's steady window, or its whole phase where it has none: sandbox.bench; a median
    repeat could be one draw for one config and another draw for the next). Latencies: percentiles over
    every repeat's requests, each with its count. Under a latency objective the figure is 1000 / that
    percentile over every repeat's requests."""
    tokens, wall = sum(r.output_tokens for r in reps), sum(r.wall_s for r in reps)
    counted = sum((r.window_tokens or 0) if r.window_s else r.output_tokens for r in reps)
    span = sum(r.window_s or r.wall_s for r in reps)
    finish: dict[str, int] = {}
    for r in reps:
        for k, v in r.finish.items():
            finish[k] = finish.get(k, 0) + v
    windowed = all(r.window_s for r in reps)
    return Figures(**{**median.to_dict(), "tps": figure_of(reps, "tps"), "output_tokens": tokens,
                      "wall_s": round(wall, 3), "requests": sum(r.requests for r in reps), "finish": finish,
                      "phase_tps": round(tokens / wall, 3) if wall > 0 else 0.0,
                      "window_s": round(span, 3) if windowed else None,
                      "window_tokens": counted if windowed else None,
                      "objective": objective, "figure": figure_of(reps, objective),
                      "errors": sum(r.errors for r in reps), "short_outputs": sum(r.short_outputs for r in reps),
                      "repeat_hits": sum(r.repeat_hits for r in reps),
                      "repeat_words": sum(r.repeat_words for r in reps),
                      "input_tokens": sum(r.input_tokens for r in reps),
                      "repeat_figures": [figure_of([r], objective) for r in reps],
                      "draw_hashes": [r.draw_hash for r in reps],
                      **{key: bench.percentiles([v for r in reps for v in r.samples.get(key, [])])
                         for key in LATENCY_FIELDS if any(r.samples.get(key) for r in reps)}})


# The latencies an instance reports, each pooled over its repeats' requests (pooled).
LATENCY_FIELDS = ("ttft_ms", "itl_ms", "itl_token_ms", "tpot_ms", "latency_ms")


def figure_of(reps: list[bench.BenchResult], objective: str) -> float:
    """Repeats' figure under the objective: their counted tokens over their counted time, or 1000 / the
    objective's latency percentile over all their requests."""
    if latency := latency_of(objective):
        field_name, q = latency
        value = bench.percentiles([v for r in reps for v in r.samples.get(field_name, [])]).get(q)
        return round(1000 / value, 6) if value else 0.0
    counted = sum((r.window_tokens or 0) if r.window_s else r.output_tokens for r in reps)
    span = sum(r.window_s or r.wall_s for r in reps)
    return round(counted / span, 3) if span > 0 else 0.0


def run_trial(spec: specs.TrialSpec, log_path: Path, progress: Path | None = None,
              launcher: tuple[str, ...] | None = None, port: int | None = None) -> TrialResult:
    """Run every phase of one trial; never raises for a trial failure, always tears down.

    progress, when given, is rewritten with the phase in flight and the server's pid, for the
    agent's display and for tests that act on a phase.
    """
    run = TrialRun(spec, log_path, progress, launcher, port)
    device_before = host.gpu_memory_used_mib()
    try:
        run.start()
        if spec.ladder is not None:   # what a config is worth (agent capacity): the ladder, nothing else
            run.ladder()
            return run.result
        run.warmup()
        run.benchmark()
        if run.result.status != "pruned":
            if spec.heldout_bench:
                run.heldout()
            if spec.quality is not None:  # None: a speed re-check, quality was measured already
                above, figure = spec.stop_rules.quality_above, run.result.bench.value if run.result.bench else 0.0
                if above is None or figure > above:
                    run.quality()
                else:   # too slow to be accepted whatever its quality: the seconds go to the next trial
                    run.result.quality_skipped = f"{figure} is not above {above}"
    except TrialFailure as failure:
        run.fail(failure.klass, failure.message, failure.log_tail, failure.cause)
    except PhaseTimeout:
        if run.phase == "start":
            run.fail("start_timeout", f"server not ready after {spec.deadlines.start_s:.0f} s")
        else:
            run.fail("crashed", f"server stopped answering: {run.phase} passed its deadline")
    except Interrupted as e:
        run.fail("interrupted", f"worker received {e} during {run.phase}")
    except httpx.HTTPError as e:
        try:
            run.server.fail_if_dead(run.phase)
            run.fail("request_errors", f"{run.phase}: {type(e).__name__}: {e}")
        except TrialFailure as failure:
            run.fail(failure.klass, failure.message, failure.log_tail, failure.cause)
    except Exception as e:  # noqa: BLE001 - a worker bug must still become a result, not a hang
        run.fail("worker_error", f"{run.phase}: {type(e).__name__}: {e}")
    finally:
        # Let teardown finish before we go. A Python handler, not SIG_IGN: an ignored signal
        # would be inherited by every server started later from this process.
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        run.teardown(device_before)
        signal.signal(signal.SIGTERM, previous)
    return run.result


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)  # a reader never sees half a result


def cpu_list(text: str) -> set[int]:
    """2-3 or 0,2,5 (how vLLM and taskset write core lists)."""
    out: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.worker", description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="trial spec (YAML)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the result JSON")
    parser.add_argument("--log", type=Path, help="server log (default: next to --out)")
    parser.add_argument("--progress", type=Path, help="file rewritten with the phase in flight")
    parser.add_argument("--allowed", type=Path, help="the run's allow-list (sandbox.allowed): every flag, key and "
                        "variable of the spec must be in it")
    parser.add_argument("--allowed-sha", help="the allow-list's hash, as the agent wrote it")
    args = parser.parse_args(argv)
    log_path = args.log or args.out.with_suffix(".server.log")
    if cores := os.environ.get("AGENT_CPUS"):
        # One worker of several on this host: the server and its threads stay on this worker's cores.
        os.sched_setaffinity(0, cpu_list(cores))
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        spec = specs.load(args.spec)
        if args.allowed:
            allowed.check_spec(allowed.load(args.allowed, args.allowed_sha or ""), spec, str(args.spec))
    except specs.SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        results.write(args.out, results.failed("invalid_config", str(e)))
        return 2
    if spec.model == "embedded":
        from sandbox.model import prepare  # the embedded default is built on first use

        spec = dataclasses.replace(spec, model=str(prepare(say=lambda m: print(m, file=sys.stderr))))
    result = run_trial(spec, log_path, args.progress)
    results.write(args.out, result)
    line = (f"{result.status}: {result.failure.klass}: {result.failure.message}" if result.failure else
            f"pruned: {result.pruned}" if result.status == "pruned" else
            f"ok: {result.bench.tps if result.bench else None} tok/s, "
            f"ppl {result.quality.ppl if result.quality else None}")
    print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
