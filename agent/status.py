"""`agent status`: where a run stands, read while it runs, from another process.

Everything here is read without taking anything from the run: the ledger (SQLite in WAL mode, so a
reader never blocks the writer), the run's events.jsonl for the phase in flight, and the run lock's
file for who holds it (recovery.lock_holder, which never takes the lock).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from agent import crew, objective, refusals, report_text, views
from agent.budget import minutes, plan_line
from agent.ledger import Ledger, Run, Worker
from agent.recovery import lock_holder
from agent.states import Decision, Status
from agent.views import RunView, TrialView


def in_flight(events: Path) -> tuple[int, str, datetime] | None:
    """(trial number, phase, since when) of the phase going on now: the latest phase event, unless
    that trial's result came after it. Held-out instances run after a trial's row is written and
    before its result, so the ledger alone cannot tell that they are going on."""
    try:
        with events.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 256_000))   # the tail is enough: what is going on is recent
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    finished = set()
    for line in reversed(lines):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "result":
            finished.add(e.get("number") or (e.get("row") or {}).get("number"))
        elif e.get("event") == "phase":
            if e.get("number") in finished:
                return None
            return e["number"], e["phase"], datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
    return None


def describe_params(t: TrialView) -> str:
    return refusals.describe(t.params) or "engine defaults"


def crew_lines(workers: list[Worker], trials: list[TrialView]) -> list[str]:
    """A line per worker of a run on several devices; nothing for a run on one."""
    if len(workers) < 2:
        return []
    ran = Counter(t.worker_id for t in trials)
    waiting = Counter(t.worker_id for t in trials if t.decision == Decision.PUT_FORWARD)
    accepted = Counter(t.worker_id for t in trials if t.branch)
    lines = []
    for w in workers:
        alive = f", heartbeat {minutes(crew.age_s(w.heartbeat_at))} ago" if w.status == "running" else ""
        lines.append(f"  {w.role} {w.name} ({w.device}): {w.status}{alive}; {ran[w.id]} trial(s), "
                     f"{accepted[w.id]} accepted" + (f", {waiting[w.id]} put forward, not decided yet"
                                                     if waiting[w.id] else ""))
    return lines


def describe(run: RunView, trials: list[TrialView], home: Path, now: datetime | None = None,
             workers: Sequence[Worker] = ()) -> list[str]:
    workers = list(workers)
    now = now or datetime.now(UTC)
    started, deadline = datetime.fromisoformat(run.started_at), datetime.fromisoformat(run.deadline_at)
    pid = lock_holder(home) if run.status == "running" else None
    # A host that does not hold the run's lock (a worker's host, reading the shared database) knows
    # the run is going by its coordinator's heartbeat.
    remote = crew.coordinator(workers, now.isoformat()) if run.status == "running" and not pid else None
    if run.status == "running":
        state = (f"running, agent run pid {pid}" if pid else
                 f"running, agent run pid {remote.pid} on {remote.host}" if remote else
                 f"stopped without finishing (no process holds it): agent run --resume {run.id}")
    else:
        state = run.status
    if run.finished_at:
        ended = datetime.fromisoformat(run.finished_at)
        when = f"ran {minutes((ended - started).total_seconds())}, ended {run.finished_at}"
    else:
        left = (deadline - now).total_seconds()
        when = (f"{minutes((now - started).total_seconds())} elapsed, "
                + (f"{minutes(left)} left" if left > 0 else "past its deadline"))
    lines = [f"run {run.id} ({state}): {when}; {run.model}"]
    if run.baseline_figure:
        aa = (run.calibration or {}).get("aa") or "A/A check not judged yet"
        lines.append(f"  baseline {run.baseline_figure:.2f} {objective.of_run(run).unit} "
                     f"(noise ±{(run.noise or 0):.1%} log-sd); {aa}")
    if plan := (run.calibration or {}).get("plan"):
        lines.append(f"  {plan_line(plan)}")
    lines += crew_lines(list(workers), trials)
    flight = in_flight(home / run.id / "events.jsonl") if pid else None
    by_number = {t.number: t for t in trials}
    if flight and flight[0] in by_number:
        t, (_, phase, since) = by_number[flight[0]], flight
        lines.append(f"  trial {t.number} [{t.source}] {phase} for {minutes((now - since).total_seconds())}: "
                     f"{describe_params(t)}")
    if pid or remote:   # the workers' trials in flight too (their phases are in their own hosts' events)
        lines += [f"  trial {t.number} [{t.source}] in flight: {describe_params(t)}" for t in trials
                  if t.status == Status.RUNNING and not (flight and t.number == flight[0])]
    else:
        lines += [f"  trial {t.number} [{t.source}] interrupted (the resume records it): {describe_params(t)}"
                  for t in trials if t.status == Status.RUNNING]
    accepted = sorted((t for t in trials if t.branch), key=lambda t: -t.claimed_ratio)
    if accepted:
        b = accepted[0]
        lines.append(f"  best so far: {b.branch} {b.held_out_claim or f'{b.search_ratio:.3f}x'}, trial {b.number}")
    elif waiting := report_text.unbranched(trials):
        lines += waiting
    else:
        lines.append("  best so far: nothing accepted yet")
    done = [t for t in trials if t.status != Status.RUNNING]
    counts = Counter(t.status for t in done)
    failures = Counter(t.failure_class for t in done if t.status == Status.FAILED)
    if not done:
        lines.append("  no trial done yet")
        return lines
    lines.append(f"  {len(done)} trial(s) done: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
                 + (f"; failures: {', '.join(f'{n} {c}' for c, n in sorted(failures.items()))}" if failures else "")
                 + f"; {sum(1 for t in trials if t.decision == Decision.ACCEPTED)} accepted")
    return lines


def status(ledger: Ledger, run: Run, home: Path) -> list[str]:
    return describe(views.run(run), views.trials(ledger.trials(run.id)), home, workers=ledger.workers(run.id))
