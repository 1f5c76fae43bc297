"""Run events: one JSON line each in runs/<run>/events.jsonl (structlog), one human line on the console."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from agent import objective, refusals
from agent.budget import plan_line
from agent.states import Decision, Status
from sandbox.contract import goodput_lower_bound


def _run(info: dict) -> str:
    return f"run {info['id']}: budget {info['budget']} (until {info['deadline']}), {info['space']}, {info['workload']}"


def _trial(info: dict) -> str:
    params = refusals.describe(info["params"]) or "engine defaults"
    best = f"best {info['best']:.3f}x" if info.get("best") else "no accepted config yet"
    why = f"\n    why: {info['rationale']}" if info.get("rationale") and info["source"] == "planner" else ""
    line = f"trial {info['number']} [{info['source']}] ({info['left_s'] / 60:.0f} min left, {best}): {params}"
    return escape(line + why)


def _baseline(info: dict) -> str:
    instances = ", ".join(f"{x:.2f}" for x in info["instances"])
    cal = info["calibration"]
    rule = (f"greedy rule {cal['rule']}, tau {cal['tau']:.3f} nats, up to {cal['flips_allowed']} near-tie flips"
            if cal["rule"] == "calibrated" else "greedy rule exact")
    prior = (f"; with the space's prior ±{info['prior'][0]:.1%} worth {info['prior'][1]} df, bounds use "
             f"±{info['bound_noise']:.1%}" if info.get("prior") and info["prior"][1] else "")
    return escape(f"baseline: {info['figure']:.2f} {info.get('unit', 'tok/s')} "
                  f"(instances {instances}; noise ±{info['noise']:.1%} "
                  f"log-sd, {info['df']} df{prior}), ppl {info['ppl']:.4f}; {rule}")


def _verdict(t) -> str:
    """What became of a measured candidate: branched, dominated, waiting for its branch, or rejected."""
    if t.branch:
        return f"[green]accepted[/] {t.branch}"
    if t.decision == Decision.DOMINATED:
        return "accepted but " + escape(t.gate_reasons[-1][:200])
    if t.decision == Decision.ACCEPTED:   # a git error kept its branch: the resume commits it
        return ("[yellow]accepted, not branched yet[/]: " + escape(t.gate_reasons[-1][:200])
                + f" (agent run --resume {t.run_id} commits it)")
    return "rejected: " + escape("; ".join(t.gate_reasons)[:240])


def _result(info: dict) -> str:
    t = info["row"]
    u = objective.of(t.meter).unit
    if t.decision == Decision.SPEED_ONLY:
        return f"trial {t.number}: {t.figure:.2f} {u} ({t.search_ratio:.3f}x); rejected: {escape(t.gate_reasons[0])}"
    if t.status == Status.PRUNED:
        return f"trial {t.number} [yellow]pruned[/] at {t.figure:.2f} {u}: {escape((t.gate_reasons or [''])[0])}"
    if t.status != Status.OK:
        return f"trial {t.number} [red]{t.failure_class}[/]: {escape((t.failure_message or '')[:160])}"
    held = (f", held-out {t.heldout_ratio:.3f}x [{t.heldout_interval[0]:.3f}, {t.heldout_interval[1]:.3f}]"
            if t.heldout_ratio is not None and t.heldout_interval else "")
    flips = f", {len(t.flips)} near-tie flip(s)" if t.flips else ""
    floor = (" (a lower bound: no load this split could judge broke it)"
             if goodput_lower_bound((t.measured or {}).get("goodput")) else "")
    return (f"trial {t.number}: {t.figure:.2f} {u}{floor} ({t.search_ratio:.3f}x){held}, ppl {t.ppl_change:+.2%}, "
            f"agreement {t.agreement:.0%}{flips}; {_verdict(t)}")


def _fewer_defaults(info: dict) -> str:
    return (f"the defaults' noise, ±{info['noise']:.1%} log-sd over {info['instances']} instances, would call for "
            f"another instance of them, but {info.get('why') or 'then no first decision would fit the budget'}: "
            f"going on with these")


def _planner_fallback(info: dict) -> str:
    until = "for the rest of the run" if info["permanent"] else "for this round"
    return escape(f"planner {info['planner']} unavailable ({info['reason'][:160]}); built-in planner {until}")


# Each event's console line (events.jsonl keeps every event whole); an event not here has none.
LINES: dict[str, Callable[[dict], str]] = {
    "run": _run,
    "trial": _trial,
    "phase": lambda i: f"  [dim]trial {i['number']}: {i['phase']}[/]",
    "baseline": _baseline,
    "plan": lambda i: escape(plan_line(i)),
    "fewer_defaults": _fewer_defaults,
    "aa": lambda i: escape(i["line"]),
    "drift": lambda i: f"drift check: defaults at {i['factor']:.3f}x of the baseline; correction {i['applied']}",
    "result": _result,
    "learned": lambda i: escape(f"learned from trial {i['number']}: vLLM refuses {i['settings']} ({i['how']}); "
                                f"later points with these settings are skipped (rule {i['rule']})"),
    "preflight_off": lambda i: escape(f"pre-flight off for this run: it refused the defaults themselves "
                                      f"({i['reason'][:200]})"),
    "lost": lambda i: escape(i["line"]),          # another process's silence
    "superseded": lambda i: escape(i["line"]),    # this one's
    "capacity": lambda i: escape(i["line"]),      # agent run --capacity: what the first branch is worth
    "workers": lambda i: escape(f"{i['count']} workers: {', '.join(i['devices'])}"),
    "waiting": lambda i: escape(f"waiting for {i['what']}"),
    "planner_fallback": _planner_fallback,
}


def _line(event: str, info: dict) -> str | None:
    shown = LINES.get(event)
    return shown(info) if shown else None


class PhaseDisplay:
    """On a terminal, the phase in flight as one live line with a spinner and its elapsed time (a
    server start takes minutes; a person should see it is alive). It is cleared, not logged: the
    event lines above it stay one per event."""

    def __init__(self, console: Console):
        self.console = console
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def show(self, text: str) -> None:
        if self.progress is None:
            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                     console=self.console, transient=True)
            self.progress.start()
            self.task = self.progress.add_task(text)
        else:
            assert self.task is not None
            self.progress.reset(self.task, description=text)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def event_logger(path: Path, console: Console) -> Callable[..., None]:
    """say(event, **info): one JSON line in events.jsonl, one human line on the console. Phase events
    are lines too when the console is not a terminal (a log file), and a live line when it is;
    `say.close()` ends the live line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a")
    log = structlog.wrap_logger(
        structlog.WriteLogger(handle),
        processors=[structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.JSONRenderer(default=str)])
    live = PhaseDisplay(console) if console.is_terminal else None

    def say(event: str, **info) -> None:
        row = info.get("row")
        log.info(event, **({**info, "row": {"number": row.number, "status": row.status}} if row else info))
        handle.flush()
        if live is not None and event == "phase":
            live.show(f"trial {info['number']}: {escape(str(info['phase']))}")
            return
        line = _line(event, info)
        if line:
            try:
                console.print(line, highlight=False)
            except OSError:   # the terminal is gone (a dropped SSH session): events.jsonl still has it
                pass

    say.close = live.close if live is not None else (lambda: None)  # type: ignore[attr-defined]  # Part.close
    return say
