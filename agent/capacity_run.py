"""`agent capacity`: the defaults and a run's branches, each on fresh servers of the real engine, up a
ladder of loads on the run's own traffic (sandbox.ladders); each curve judged (agent.capacity), stored
in the ledger's `capacity` table, printed side by side, and written as a `vllm bench sweep` folder
where asked (agent.sweep). A sweep folder a user ran by hand joins the table with --import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent import capacity, hub, morning
from agent.capacity import Curve, Rung, Worth
from agent.context import inputs_of, settings_of
from agent.ledger import Capacity, Ledger, Run
from agent.states import Source

TIMEOUT_S = 4 * 3600   # one server's whole ladder


class CapacityError(ValueError):
    pass


@dataclass(frozen=True)
class Ask:
    """What `agent capacity` was asked: the ladder, how many servers and repeats, the bounds and prices."""
    kind: str = "concurrency"
    loads: tuple[float, ...] = (1, 2, 4, 8)
    instances: int = 1
    slo: dict = field(default_factory=dict)
    price_per_hour: float | None = None
    target_rate: float | None = None
    devices: int = 1


@dataclass(frozen=True)
class Subject:
    name: str                  # defaults, or the branch
    trial: int | None
    flags: dict
    env: dict


def subjects(ledger: Ledger, run: Run, branches: list[str], every: bool) -> list[Subject]:
    """The defaults as the run measured them, then each branch asked for (with --all: each the run
    committed), its config as its serving/results.json says it was measured."""
    from agent import gitops

    base = next((t for t in ledger.trials(run.id) if t.source == Source.BASELINE), None)
    if base is None:
        raise CapacityError(f"run {run.id} has no measurement of the defaults")
    found = [Subject("defaults", None, dict(base.flags), dict(base.env))]
    names = list(branches)
    if every:
        names += [t.branch for t in ledger.trials(run.id) if t.branch and t.branch not in names]
    if not names:
        return found
    try:
        repo = gitops.open_repo(Path(run.repo))
    except gitops.RepoError as e:
        raise CapacityError(str(e)) from None
    for name in names:
        parts = name.split("/")
        if len(parts) != 3 or parts[:2] != ["agent", run.id] or not parts[2].isdigit():
            raise CapacityError(f"{name!r} is not a branch agent/{run.id}/<trial> of run {run.id}")
        try:
            results = morning.read(repo, name)
        except morning.BranchError as e:
            raise CapacityError(str(e)) from None
        found.append(Subject(name, int(parts[2]), dict(results.serving.flags), dict(results.serving.env)))
    return found


def measure(run: Run, subject: Subject, ask: Ask, engine, out_dir: Path, say: Callable[[str], None],
            timeout_s: float = TIMEOUT_S) -> Curve:
    """The subject's ladder on `ask.instances` fresh servers; their repeats pooled rung by rung (a rung
    one server did not reach has the others' repeats). timeout_s: every server's ladder together."""
    import time

    until = time.monotonic() + timeout_s
    from sandbox.contract import Ladder, SpecFile, load_workload

    used = settings_of(run)
    meter = load_workload(used.workload)
    try:
        model = hub.served(run.model, run.model_revision)
    except hub.ModelUnavailable as e:
        raise CapacityError(str(e)) from None
    spec = SpecFile.speed_only(model, subject.flags, subject.env, meter, used.repeats,
                               Ladder(ask.kind, tuple(ask.loads), dict(ask.slo))).as_dict()
    rungs: dict[float, list] = {}
    stopped = []
    for i in range(ask.instances):
        loads = ", ".join(f"{x:g}" for x in ask.loads)
        say(f"{subject.name}: fresh server {i + 1}/{ask.instances}, {ask.kind} {loads}")
        folder = out_dir / subject.name.replace("/", "_") / f"instance{i + 1}"
        result = engine.evaluate(spec, folder, timeout_s=max(1.0, until - time.monotonic()))
        if result.ladder is None or (not result.ok and not result.ladder["rungs"]):
            raise CapacityError(f"{subject.name}: server {i + 1} failed: {result.why()}")
        for rung in result.ladder["rungs"]:
            rungs.setdefault(rung["load"], []).extend(capacity.repeat_from_bench(b) for b in rung["repeats"])
        stopped.append(result.ladder["stopped"] if result.ok else f"the server failed above the rungs kept: "
                                                                   f"{result.why()}")
        say(f"{subject.name}: server {i + 1}: {len(result.ladder['rungs'])} rung(s); {result.ladder['stopped']}")
    return Curve(subject.name, ask.kind, tuple(Rung(load, tuple(reps)) for load, reps in sorted(rungs.items())),
                 "; ".join(dict.fromkeys(stopped)), ask.devices)


def store(ledger: Ledger, run: Run, curve: Curve, worth: Worth, ask: Ask, trial: int | None, source: str) -> None:
    point = worth.point
    ledger.add(Capacity(
        run_id=run.id, subject=curve.subject, trial_number=trial, source=source, kind=curve.kind,
        curve=capacity.as_dict(curve), slo=dict(ask.slo), price_per_hour=ask.price_per_hour,
        target_rate=ask.target_rate, knee=worth.knee.load if worth.knee else None,
        slo_limit=worth.slo_limit.load if worth.slo_limit else None, point=point.load if point else None,
        point_is=worth.point_is, output_tps=point.median.output_tps if point else None,
        tokens_per_device_hour=worth.tokens_per_device_hour, cost_per_m_output=worth.cost_per_m_output,
        cost_per_m_input=worth.cost_per_m_input, servers=worth.servers))


def _ms(figures: dict, p: str) -> str:
    return f"{figures[p]:.0f}" if p in figures else "-"


def _load(kind: str, load: float) -> str:
    return f"{load:g} stream(s)" if kind == "concurrency" else f"{load:g} req/s"


def table(curves: list[Curve], worths: list[Worth], ask: Ask, noise_sd: float) -> list[str]:
    """The curves side by side, rung by rung, then each one's knee, SLO limit, operating point and worth,
    with each config's ratio to the first (the defaults) where both have a figure."""
    lines = ["| config | load | output tok/s (spread) | total tok/s | req/s | TTFT p50/p90/p99 ms | "
             "ITL p50/p99 ms | e2e p50/p90/p99 ms (n) | vs defaults |", "|---" * 9 + "|"]
    first = {(curves[0].kind, r.load): r for r in curves[0].rungs} if curves else {}
    for curve in curves:
        for rung in curve.rungs:
            m, (low, high), same = rung.median, rung.spread, first.get((curve.kind, rung.load))
            ratio = f"{m.output_tps / same.median.output_tps:.3f}x" \
                if curve is not curves[0] and same is not None and same.median.output_tps else ""
            spread = f" ({low:.1f}-{high:.1f}{', repeats disagree' if rung.disagrees(noise_sd) else ''})" \
                if len(rung.repeats) > 1 else ""
            lines.append(
                f"| {curve.subject} | {_load(curve.kind, rung.load)} | {m.output_tps:.2f}{spread} | "
                f"{m.total_tps:.1f} | "
                f"{m.request_rate:.3f} | {_ms(m.ttft_ms, 'p50')}/{_ms(m.ttft_ms, 'p90')}/{_ms(m.ttft_ms, 'p99')} | "
                f"{_ms(m.itl_ms, 'p50')}/{_ms(m.itl_ms, 'p99')} | {_ms(m.latency_ms, 'p50')}/"
                f"{_ms(m.latency_ms, 'p90')}/{_ms(m.latency_ms, 'p99')} ({m.latency_ms.get('n', '-')}) | {ratio} |")
    lines.append("")
    base = worths[0] if worths else None
    for curve, worth in zip(curves, worths, strict=True):
        knee = _load(curve.kind, worth.knee.load) if worth.knee else "none within the ladder"
        limit = ("no SLO given" if not ask.slo else
                 _load(curve.kind, worth.slo_limit.load) if worth.slo_limit else "none: the lowest load breaks it")
        line = f"{curve.subject}: knee {knee}; SLO limit {limit}"
        if worth.point is None:
            lines.append(line + "; no operating point")
            continue
        line += (f"; at its {worth.point_is} ({_load(curve.kind, worth.point.load)}) "
                 f"{worth.point.median.output_tps:.2f} output tok/s, "
                 f"{worth.tokens_per_device_hour:,.0f} output tokens a device-hour")
        if base is not None and worth is not base and base.tokens_per_device_hour and worth.tokens_per_device_hour:
            line += f" ({worth.tokens_per_device_hour / base.tokens_per_device_hour:.3f}x the defaults')"
        if worth.cost_per_m_output is not None:
            line += f"; ${worth.cost_per_m_output:.2f} per million output tokens"
        if worth.cost_per_m_input is not None:
            line += f", ${worth.cost_per_m_input:.2f} per million input tokens"
        if worth.servers is not None:
            line += f"; {worth.servers} server(s) for {ask.target_rate:g} req/s"
        lines.append(line)
        if curve.stopped:
            lines.append(f"  the ladder ended: {curve.stopped}")
    return lines


def slo_of(run: Run) -> dict[str, float]:
    """The run's own SLO bounds, as a ladder judges them: its gate's TTFT and ITL p99, and its e2e p99."""
    gate, given = settings_of(run).gate, inputs_of(run)
    return {k: v for k, v in (("ttft_p99_ms", gate.slo_ttft_p99_ms), ("itl_p99_ms", gate.slo_itl_p99_ms),
                              ("e2e_p99_ms", given.slo_e2e_p99_ms)) if v is not None}


def command(ledger: Ledger, run_id: str | None, ask: Ask, branches: list[str], every: bool,
            export_dir: Path | None, import_dir: Path | None, say: Callable[[str], None], engine=None) -> list[str]:
    """`agent capacity`: measure (or, with import_dir, read) the curves, judge, store and tabulate them.
    The lines to print; RunError (one line) where it cannot. engine: the real engine's seam
    (agent.engine.WorkerEngine) unless a test gives its own."""
    from agent import paths, sweep
    from agent.engine import WorkerEngine
    from agent.recording import allowed
    from agent.request import RunError, run_space

    run = ledger.run(run_id) if run_id else next(iter(ledger.runs()), None)
    if run is None:
        raise RunError(f"no run {run_id!r} in the ledger" if run_id else "no run in the ledger yet: agent run first")
    gate = settings_of(run).gate
    slo = ask.slo or slo_of(run)
    ask = Ask(ask.kind, ask.loads, ask.instances, slo, ask.price_per_hour, ask.target_rate, ask.devices)
    def judged(curve: Curve) -> Worth:
        return capacity.worth(curve, slo, ask.price_per_hour, ask.target_rate)

    curves: list[Curve] = []
    trials: list[int | None] = []
    try:
        if import_dir is not None:
            latest = {c.subject: c for c in ledger.capacities(run.id) if c.source == "measured"}
            curves = [capacity.from_dict(c.curve) for c in latest.values()]
            trials = [c.trial_number for c in latest.values()]
            imported = sweep.read(import_dir, ask.devices)
            for curve in imported:
                store(ledger, run, curve, judged(curve), ask, None, f"imported from {import_dir}")
            curves, trials = curves + imported, trials + [None] * len(imported)
        else:
            engine = engine or WorkerEngine()
            try:
                engine.allow(allowed(run_space(run), settings_of(run), hub.served(run.model, run.model_revision)))
                for subject in subjects(ledger, run, branches, every):
                    curve = measure(run, subject, ask, engine, paths.home() / run.id / "capacity", say)
                    store(ledger, run, curve, judged(curve), ask, subject.trial, "measured")
                    curves.append(curve)
                    trials.append(subject.trial)
            finally:
                engine.close()
    except (CapacityError, sweep.SweepError, hub.ModelUnavailable) as e:
        raise RunError(str(e), 1) from None
    worths = [judged(c) for c in curves]
    noise = run.noise if run.noise is not None else gate.noise_prior.sd
    lines = table(curves, worths, ask, noise)
    if export_dir is not None:
        written = sweep.export(curves, export_dir, run.model)
        users = "max_concurrency" if ask.kind == "concurrency" else "request_rate"
        lines.append(f"written as a `vllm bench sweep serve` folder: {export_dir} ({len(written)} load points); draw "
                     f"it with python -m vllm.benchmarks.sweep.plot_pareto {export_dir} --user-count-var {users}")
    return lines
