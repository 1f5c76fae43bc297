"""What the terminal shows of a run: the end-of-run summary, the branch table and `agent report`'s
lines (the HTML page is agent/report_html.py). Text from ledger rows; nothing is read or written here."""

from __future__ import annotations

from collections.abc import Iterator

from rich.table import Table

from agent import budget, objective, refusals
from agent.gate import fmt_ms, geomean
from agent.ledger import LearnedRule, RangeChange, Trial
from agent.states import CANDIDATES, DEFAULTS_ON_SEARCH, Decision, Source, Status, branch_pending
from agent.views import RunView, TrialView

P99S = (("ttft_p99_ms", "TTFT"), ("itl_p99_ms", "ITL"))
# The latencies a trial shows, each labelled, as its row's measured figures keep them: what a reader waits
# for (first token, a token's pace, the whole answer) and the gaps between streamed chunks, whole and per
# token they bring (a speculating server's chunks carry several tokens).
LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("latency_ms", "e2e"), ("itl_token_ms", "ITL a token"),
             ("itl_ms", "chunk gap"))


def claim(t: Trial | TrialView) -> str:
    """A branch's claim as the morning reader needs it: held-out ratio and bounds, search ratio beside."""
    return f"{t.held_out_claim}, {t.search_ratio:.3f}x search" if t.held_out_claim else f"{t.search_ratio:.3f}x search"


def defaults_p99(trials: list[TrialView], attr: str) -> float | None:
    """The defaults' p99 of one latency: the geometric mean of their instances', as the latency guard takes it."""
    found = [getattr(t, attr) for t in trials
             if t.source in DEFAULTS_ON_SEARCH and t.status == Status.OK and (getattr(t, attr) or 0) > 0]
    return geomean(found) if found else None


def latencies(t: TrialView, trials: list[TrialView]) -> str:
    """A trial's p99 latencies beside the defaults', each labelled: a faster config may have bought its
    tokens/s with latency, and the ratio alone would not show it. A p99 of fewer than 100 requests says
    how many ("of 8"). A row from before these were kept shows its TTFT and ITL columns."""
    measured = t.measured or {}
    parts = []
    for key, name in LATENCIES:
        mine = (measured.get(key) or {}).get("p99")
        if mine is None:
            continue
        count = (measured.get(key) or {}).get("n")
        theirs = defaults_measured_p99(trials, key)
        parts.append(f"{name} {fmt_ms(mine)} ms" + (f" of {count}" if count is not None and count < 100 else "")
                     + (f" (defaults {fmt_ms(theirs)})" if theirs else ""))
    if not parts:
        for attr, name in P99S:
            mine, theirs = getattr(t, attr), defaults_p99(trials, attr)
            if mine is not None:
                parts.append(f"{name} {fmt_ms(mine)} ms" + (f" (defaults {fmt_ms(theirs)})" if theirs else ""))
    return "p99 " + ", ".join(parts) if parts else "no latencies measured"


def defaults_measured_p99(trials: list[TrialView], key: str) -> float | None:
    """The defaults' p99 of one latency from their rows' measured figures (geometric mean of their instances)."""
    rows = [(t.measured or {}).get(key) for t in trials if t.source in DEFAULTS_ON_SEARCH and t.status == Status.OK]
    found = [r["p99"] for r in rows if isinstance(r, dict) and r.get("p99")]
    return geomean(found) if found else None


def on_latency(t: TrialView) -> bool:
    """Refused by the gate for its latency: the latency guard or an SLO."""
    return t.decision == Decision.REFUSED and any(r.startswith(("latency:", "SLO:")) for r in t.gate_reasons or [])


def defaults_best(run: RunView, trials: list[TrialView]) -> Iterator[str]:
    """Where a run accepted nothing though it measured candidates: the defaults are the best config it
    found for this traffic, said with the best candidate's figure; on a GPU, with the levers the lever
    table measured winning on no shape (agent.rules.WON_NOWHERE), which were no first moves."""
    from agent.rules import WON_NOWHERE

    measured = [t for t in trials if t.source in CANDIDATES and t.search_ratio is not None]
    # Accepted but not yet branched (a commit that failed, settled at a resume), or still to be decided:
    # not a run the defaults won.
    open_or_won = (Decision.ACCEPTED, Decision.PUT_FORWARD, Decision.AWAITING_RECHECK)
    if any(t.branch or t.decision in open_or_won for t in trials) or not measured:
        return
    best = max(measured, key=lambda t: t.search_ratio or 0.0)
    decided = [t for t in measured if t.heldout_ratio is not None]
    yield (f"  the defaults are the best config this run found for this traffic: none of {len(measured)} "
           f"candidates measured beat them (the best, trial {best.number}, read {best.search_ratio:.3f}x on "
           f"the search prompts; {len(decided)} reached a held-out decision); nothing was branched")
    if (run.hardware or {}).get("kind") == "gpu":
        yield ("  on a GPU under load the lever table found no lever winning on the embedded model, and these "
               "were no first moves: " + "; ".join(f"{name}: {why}" for name, why in WON_NOWHERE.items())
               + ' (docs/results.md, "What binds under load on a GPU?")')


def summary(run: RunView, trials: list[TrialView]) -> Iterator[str]:
    """The lines a finished run ends with."""
    accepted = [t for t in trials if t.branch]
    failed = [t for t in trials if t.status == Status.FAILED]
    waiting = unbranched(trials)
    yield (f"finished: run {run.id}, {len(trials)} trials, {len(failed)} failed, {len(accepted) + len(waiting)} "
           f"accepted{f' ({len(waiting)} not branched yet)' if waiting else ''}; baseline {run.baseline_figure:.2f} "
           f"{objective.of_run(run).unit} (noise ±{run.noise:.1%} log-sd, {run.noise_df} df)")
    yield from defaults_best(run, trials)
    for t in sorted(accepted, key=lambda t: -t.claimed_ratio):
        yield (f"  {t.branch}: {t.figure:.2f} {objective.of(t.meter).unit}, {claim(t)}, ppl {t.ppl_change:+.2%}, "
               f"{latencies(t, trials)}")
    yield from waiting


def unbranched(trials: list[TrialView]) -> list[str]:
    """Accepted configs whose branch a git error kept from being committed: accepted, never called
    rejected, and the command that commits them."""
    return [f"  trial {t.number}: accepted ({claim(t)}) but not branched yet: "
            f"{next((r for r in reversed(t.gate_reasons or []) if r.startswith('not committed')), 'no branch')}; "
            f"agent run --resume {t.run_id} commits it"
            for t in trials if branch_pending(t)]


def branch_table(trials: list[TrialView]) -> Table | str:
    """Branches, best first, with TPS, the claim, p99 latencies beside the defaults', PPL change and
    greedy agreement."""
    rows = sorted((t for t in trials if t.branch), key=lambda t: -t.claimed_ratio)
    if not rows:
        return "no proposals yet"
    table = Table("branch", objective.of(rows[0].meter).unit, "claim (held-out vs defaults, bounds)", "search",
                  "latency", "ppl change", "agreement", "near-tie flips", "rule", "source", "commit")
    for t in rows:
        held = (f"{t.heldout_ratio:.3f}x [{t.heldout_interval[0]:.3f}, {t.heldout_interval[1]:.3f}]"
                if t.heldout_ratio is not None and t.heldout_interval else "")
        table.add_row(t.branch, f"{t.figure:.2f}", held, f"{t.search_ratio:.3f}x", latencies(t, trials),
                      f"{t.ppl_change:+.2%}",
                      f"{t.agreement:.0%}", str(len(t.flips or [])), t.rule or "", t.source, (t.commit or "")[:10])
    return table


def env_only_lines(trials: list[TrialView]) -> list[str]:
    """One line for each branch whose whole change is in the environment: config.yaml alone reproduces none of it."""
    return [f"{t.branch}: the whole gain is in the environment (serving/env: "
            f"{', '.join(f'{k}={t.env[k]}' for k in t.params)}); config.yaml alone does not reproduce it"
            for t in trials if t.branch and t.params and all(k in (t.env or {}) for k in t.params)]


def as_json(row: RunView, trials: list[TrialView]) -> dict:
    """`agent report --json`: the run's row and every trial's, as the ledger holds them (views)."""
    return {"run": dict(vars(row)), "trials": [dict(vars(t)) for t in trials]}


def report(row: RunView, trials: list[TrialView], rules: list[LearnedRule],
           narrowings: list[RangeChange]) -> Iterator[str]:
    """One run at a glance: where it stands, the baseline and noise, what was tried, what won."""
    yield from _heading(row, trials)
    yield from _what_was_tried(trials, rules, narrowings)
    yield from _what_won(row, trials)


def _heading(row: RunView, trials: list[TrialView]) -> Iterator[str]:
    """The run, its host, the baseline, the traffic, the gate's calibration and the budget's plan."""
    yield (f"run {row.id}: {row.status}; started {row.started_at}, deadline {row.deadline_at}"
           + (f", finished {row.finished_at}" if row.finished_at else ""))
    yield (f"  {row.model} on {row.engine} {row.engine_version}, {row.hardware.get('cpu')} "
           f"({row.hardware.get('cpus')} cores"
           f"{', ' + ', '.join(row.hardware['gpus']) if row.hardware.get('gpus') else ''})")
    if row.baseline_figure:
        yield (f"  baseline {row.baseline_figure:.2f} {objective.of_run(row).unit}, noise ±{row.noise:.1%} "
               f"log-sd ({row.noise_df} df), ppl {row.baseline_ppl:.4f}; workload {row.workload}")
        found = [f"{name} {fmt_ms(p)} ms" for attr, name in P99S if (p := defaults_p99(trials, attr))]
        if found:
            yield f"  the defaults' p99 {', '.join(found)} (geometric mean of their instances)"
    if (row.settings or {}).get("traffic"):
        from agent.proposal import run_meter, traffic_line

        yield f"  traffic: {traffic_line(run_meter(row), row.settings.get('traffic_source'))}"
    cal = row.calibration or {}
    if "rule" in cal:
        yield (f"  greedy rule {cal['rule']}: tau {cal['tau']:.3f} nats, up to {cal['flips_allowed']} near-tie flips, "
               f"KL up to {cal['kl_bound']:.4f} ({cal['reason']})")
    if cal.get("aa"):
        yield f"  {cal['aa']}"
    if cal.get("plan"):
        yield f"  {budget.plan_line(cal['plan'])}"
    if cal.get("capacity"):
        yield f"  --capacity: {cal['capacity']}"


def _what_was_tried(trials: list[TrialView], rules: list[LearnedRule], narrowings: list[RangeChange]) -> Iterator[str]:
    """Counts by status and source, what was cut short, failures, learned rules, narrowed ranges, drift."""
    by = lambda attr: ", ".join(f"{n} {k}" for k, n in sorted(  # noqa: E731
        {v: sum(1 for t in trials if getattr(t, attr) == v) for v in {getattr(t, attr) for t in trials}}.items()))
    yield f"  {len(trials)} trials: {by('status')}; sources: {by('source')}"
    cheap = [t for t in trials if t.decision in (Decision.PRUNED, Decision.SPEED_ONLY) or t.failed_phase == "preflight"
             or (t.failure_message or "").startswith("contains learned rule")]
    if cheap:
        saved = lambda pred: sum(1 for t in cheap if pred(t))  # noqa: E731
        yield (f"  cut short: {saved(lambda t: t.decision == 'pruned')} pruned, "
               f"{saved(lambda t: t.decision == 'speed-only')} speed-only (no quality phase), "
               f"{saved(lambda t: t.failed_phase == 'preflight')} refused at pre-flight, "
               f"{saved(lambda t: (t.failure_message or '').startswith('contains learned rule'))} "
               f"skipped by a learned rule")
    failures = [t.failure_class for t in trials if t.failure_class and t.status == Status.FAILED]
    if failures:
        yield "  failures: " + ", ".join(f"{n} {c}" for c, n in sorted(
            {c: failures.count(c) for c in set(failures)}.items()))
    for r in rules:
        skipped = sum(1 for t in trials if t.failure_message and f"learned rule {r.id} " in t.failure_message)
        yield (f"  learned rule {r.id} (trial {r.from_trial}, {r.stage}, {r.how}): vLLM refuses "
               f"{refusals.describe(r.settings)}: {r.message[:200]}; {skipped} point(s) skipped")
    for c in narrowings:
        yield f"  narrowed {c.knob} to [{c.low:g}, {c.high:g}] after trial {c.after_trial}: {c.rationale}"
    drift = [t for t in trials if t.source == Source.DRIFT]
    if drift:
        yield f"  drift checks: {', '.join(f'{t.search_ratio:.3f}x' for t in drift if t.search_ratio)}"


def _what_won(row: RunView, trials: list[TrialView]) -> Iterator[str]:
    """The branches best first, the dominated, those refused on latency, the unbranched, or why none won."""
    accepted = sorted((t for t in trials if t.branch), key=lambda t: -t.claimed_ratio)
    for t in accepted:
        yield (f"  {t.branch}: {claim(t)}, {latencies(t, trials)}, ppl {t.ppl_change:+.2%}, {len(t.flips or [])} "
               f"near-tie flip(s) [{t.source}] {', '.join(f'{k}={v}' for k, v in t.params.items())}")
    for t in (t for t in trials if t.decision == Decision.DOMINATED):
        yield f"  trial {t.number} dominated (not branched): {claim(t)}, {latencies(t, trials)}: {t.gate_reasons[-1]}"
    for t in (t for t in trials if on_latency(t)):   # faster, perhaps, but by holding requests longer
        yield (f"  trial {t.number} refused on latency: {t.search_ratio:.3f}x search, {latencies(t, trials)} "
               f"[{t.source}] {', '.join(f'{k}={v}' for k, v in t.params.items())}")
    yield from (waiting := unbranched(trials))
    if not accepted and not waiting:
        said = list(defaults_best(row, trials)) if row.status == "finished" else []
        yield from said or ["  no accepted config yet"]
