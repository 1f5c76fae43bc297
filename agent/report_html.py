"""`agent report --html FILE`: one run as one self-contained page, for the morning review.

Plots are plotly figures with plotly.js inlined once (no network needed to view the page); the
knob importances are Optuna's PED-ANOVA evaluator over the run's study (no scikit-learn needed).
Sections, in the order a reviewer asks: what won and how to serve it, the speed over the night
against the defaults' band, speed against quality and latency with the Pareto front, what failed
and what vLLM refused, which knobs mattered, and every trial with the planner's reason.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable, Sequence

from agent import objective
from agent.ledger import Capacity, LearnedRule
from agent.proposal import run_meter, traffic_line
from agent.refusals import describe
from agent.states import CANDIDATES, Decision, Source, Status
from agent.views import RunView, TrialView

SECTIONS = ["summary", "branches", "speed-over-time", "speed-vs-quality", "speed-vs-latency", "capacity",
            "failures", "importance", "speed-only", "trials"]


def pareto(points: list[tuple[float, float, int]]) -> set[int]:
    """Ids of the points no other point beats on both: higher first value, lower second value."""
    front = set()
    for x, y, i in points:
        if not any((x2 >= x and y2 <= y) and (x2 > x or y2 < y) for x2, y2, _ in points):
            front.add(i)
    return front


def _table(headers: list[str], rows: Sequence[Sequence[object]], raw: frozenset[int] = frozenset()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if i in raw else html.escape('' if c is None else str(c))}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(fig) -> str:
    fig.update_layout(template="plotly_white", height=420, margin=dict(l=60, r=20, t=40, b=50))
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def _claim(t: TrialView) -> str:
    return t.held_out_claim or (f"{t.search_ratio:.3f}x search" if t.search_ratio else "")


def _label(t: TrialView) -> str:
    params = describe(t.params) or "engine defaults"
    return f"trial {t.number} [{t.source}] {t.decision or t.status}<br>{html.escape(params)[:300]}"


def speed_over_time(run: RunView, trials: list[TrialView]) -> str:
    import plotly.graph_objects as go

    fig = go.Figure()
    measured = [t for t in trials if t.figure and t.finished_at]
    if run.baseline_figure and run.noise is not None:
        low, high = run.baseline_figure * math.exp(-2 * run.noise), run.baseline_figure * math.exp(2 * run.noise)
        fig.add_hrect(y0=low, y1=high, fillcolor="lightgray", opacity=0.4, line_width=0,
                      annotation_text="defaults ±2 noise", annotation_position="top left")
        fig.add_hline(y=run.baseline_figure, line_dash="dot", line_color="gray")
    groups = [("defaults (baseline, A/A, other devices)",
               lambda t: t.source in (Source.BASELINE, Source.AA, Source.DEVICE),
               "gray", "circle"),
              ("drift checks", lambda t: t.source == Source.DRIFT, "orange", "diamond"),
              ("accepted", lambda t: bool(t.branch), "green", "star"),
              ("pruned", lambda t: t.status == Status.PRUNED, "purple", "x"),
              ("other candidates", lambda t: t.source in CANDIDATES and not t.branch and t.status != Status.PRUNED,
               "steelblue", "circle")]
    for name, keep, color, symbol in groups:
        pts = [t for t in measured if keep(t)]
        if pts:
            fig.add_trace(go.Scatter(x=[t.finished_at for t in pts], y=[t.figure for t in pts], mode="markers",
                                     name=name, marker=dict(color=color, symbol=symbol, size=11),
                                     hovertext=[_label(t) for t in pts], hoverinfo="text+y"))
    fig.update_layout(title="Output tokens/s of every trial (search prompts) over the night",
                      xaxis_title="finished (UTC)", yaxis_title=objective.of_run(run).unit)
    return _figure(fig)


def _versus(trials: list[TrialView], x_of: Callable[[TrialView], float | None], x_title: str, title: str) -> str:
    import plotly.graph_objects as go

    pts = [t for t in trials if t.search_ratio and x_of(t) is not None and t.source in CANDIDATES]
    fig = go.Figure()
    if not pts:
        fig.add_annotation(text="no candidate has both figures yet", showarrow=False)
    front = pareto([(t.search_ratio or 0.0, x_of(t) or 0.0, t.number) for t in pts])
    rest = [t for t in pts if t.number not in front]
    fig.add_trace(go.Scatter(x=[x_of(t) for t in rest], y=[t.search_ratio for t in rest], mode="markers",
                             name="trials", marker=dict(color="steelblue", size=10),
                             hovertext=[_label(t) for t in rest], hoverinfo="text"))
    on = sorted((t for t in pts if t.number in front), key=lambda t: x_of(t) or 0.0)
    fig.add_trace(go.Scatter(x=[x_of(t) for t in on], y=[t.search_ratio for t in on], mode="lines+markers",
                             name="Pareto front", marker=dict(color="crimson", size=12, symbol="star"),
                             hovertext=[_label(t) for t in on], hoverinfo="text"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title="TPS / defaults (search prompts)")
    return _figure(fig)


def capacity_section(rows: list[Capacity]) -> str:
    """`agent capacity`'s curves (the latest of each config): p99 TTFT and ITL against output tokens/s
    rung by rung, the SLO bounds as lines, each knee starred, and cost per million output tokens."""
    import plotly.graph_objects as go

    from agent.capacity import from_dict

    if not rows:
        return ("<p>Not measured. <code>agent capacity --all</code> measures the defaults and every branch on a "
                "ladder of loads: the knee, the highest load within the SLOs, tokens per device-hour and cost.</p>")
    latest = list({r.subject: r for r in rows}.values())
    figures = []
    for latency, name, bound in (("ttft_ms", "time to first token", "ttft_p99_ms"),
                                 ("itl_ms", "inter-token latency", "itl_p99_ms")):
        fig = go.Figure()
        for row in latest:
            curve = from_dict(row.curve)
            unit = "streams" if curve.kind == "concurrency" else "req/s"
            pts = [(r.median.output_tps, r.p99(latency), r.load) for r in curve.rungs if r.p99(latency) is not None]
            fig.add_trace(go.Scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers+text",
                                     name=row.subject, text=[f"{p[2]:g}" for p in pts], textposition="top center",
                                     hovertext=[f"{row.subject}: {p[2]:g} {unit}" for p in pts], hoverinfo="text+x+y"))
            knee = next((p for p in pts if row.knee is not None and p[2] == row.knee), None)
            if knee:
                fig.add_trace(go.Scatter(x=[knee[0]], y=[knee[1]], mode="markers", name=f"{row.subject}: knee",
                                         marker=dict(symbol="star", size=16, color="crimson")))
        slos = {row.slo.get(bound) for row in latest} - {None}
        for value in slos:
            fig.add_hline(y=value, line_dash="dash", line_color="red", annotation_text=f"SLO {value:g} ms")
        fig.update_layout(title=f"p99 {name} against output tokens/s, load by load (labels: the load)",
                          xaxis_title="output tokens/s", yaxis_title=f"p99 {name} (ms)")
        figures.append(_figure(fig))
    priced = [r for r in latest if r.cost_per_m_output is not None]
    if priced:
        fig = go.Figure(go.Bar(x=[r.subject for r in priced], y=[r.cost_per_m_output for r in priced],
                               name="per million output tokens"))
        fig.add_trace(go.Bar(x=[r.subject for r in priced], y=[r.cost_per_m_input for r in priced],
                             name="per million input tokens"))
        fig.update_layout(title=f"Cost at each config's operating point (${priced[0].price_per_hour:g} an hour)",
                          yaxis_title="$", barmode="group")
        figures.append(_figure(fig))
    def cells(r: Capacity) -> list:
        return [r.subject, r.knee, r.slo_limit, r.point_is if r.point is None else f"{r.point_is} ({r.point:g})",
                f"{r.output_tps:.2f}" if r.output_tps else "",
                f"{r.tokens_per_device_hour:,.0f}" if r.tokens_per_device_hour else "",
                f"{r.cost_per_m_output:.2f}" if r.cost_per_m_output else "",
                f"{r.cost_per_m_input:.2f}" if r.cost_per_m_input else "", r.servers, r.source]

    table = _table(["config", "knee", "SLO limit", "operating point", "output tok/s there",
                    "output tokens a device-hour", "$ / M output", "$ / M input", "servers", "source"],
                   [cells(r) for r in latest])
    return table + "".join(figures)


def failures(trials: list[TrialView], rules: list[LearnedRule]) -> str:
    import plotly.graph_objects as go

    counts = Counter(t.failure_class or t.status for t in trials
                     if t.status in (Status.FAILED, Status.SKIPPED, Status.PRUNED))
    parts = []
    if counts:
        fig = go.Figure(go.Bar(x=list(counts), y=list(counts.values()), marker_color="indianred"))
        fig.update_layout(title="Trials that failed, were skipped or pruned, by class", yaxis_title="trials")
        parts.append(_figure(fig))
    else:
        parts.append("<p>No trial failed, was skipped or was pruned.</p>")
    failed = [t for t in trials if t.status in (Status.FAILED, Status.SKIPPED)]
    if failed:
        parts.append(_table(["trial", "status", "class", "phase", "vLLM's words / reason"],
                            [[t.number, t.status, t.failure_class, t.failed_phase,
                              (t.failure_cause or t.failure_message or "")[:400]] for t in failed]))
    parts.append("<h3>Learned rules (what vLLM refused, reduced to its cause)</h3>")
    parts.append(_table(["rule", "from trial", "stage", "how", "settings", "vLLM said"],
                        [[r.id, r.from_trial, r.stage, r.how, describe(r.settings),
                          r.message[:300]] for r in rules]) if rules else "<p>None: vLLM refused nothing.</p>")
    pruned = [t for t in trials if t.status == Status.PRUNED]
    parts.append("<h3>Pruned trials (stopped once they could not beat the defaults)</h3>")
    parts.append(_table(["trial", f"{objective.of(trials[0].meter if trials else None).unit} when stopped", "why"],
                        [[t.number, t.figure, "; ".join(t.gate_reasons)[:300]]
                         for t in pruned]) if pruned else "<p>None.</p>")
    return "".join(parts)


def importance(study) -> str:
    import plotly.graph_objects as go

    from agent import study as studies

    try:
        values = studies.importances(study)
    except (ValueError, RuntimeError) as e:
        return f"<p>Not enough finished trials to weigh the knobs yet ({html.escape(str(e))[:200]}).</p>"
    if not values:
        return "<p>Not enough finished trials to weigh the knobs yet.</p>"
    names = list(values)[::-1]
    fig = go.Figure(go.Bar(x=[values[n] for n in names], y=names, orientation="h", marker_color="teal"))
    fig.update_layout(title="How much each knob mattered to TPS (Optuna, PED-ANOVA)", xaxis_title="importance")
    return _figure(fig)


def branch_section(run: RunView, trials: list[TrialView], show: Callable[[str, str], str | None]) -> str:
    accepted = sorted((t for t in trials if t.branch), key=lambda t: -t.claimed_ratio)
    if not accepted:
        return "<p>No config was accepted in this run.</p>"
    parts = []
    for t in accepted:
        branch = t.branch or ""
        launch = show(branch, "serving/launch.sh") or ""
        flips = ", ".join(f"prompt {f.get('prompt')} pos {f.get('position')} ({f.get('margin', 0):.3f} nats)"
                          for f in (t.flips or [])[:12] if isinstance(f, dict))
        parts.append(
            f"<div class='branch'><h3>{html.escape(branch)}: {html.escape(_claim(t))}</h3>"
            f"<p>search {t.search_ratio:.3f}x, {t.figure:.2f} {objective.of(t.meter).unit} "
            f"against {run.baseline_figure:.2f}; perplexity "
            f"{(t.ppl_change or 0):+.2%}; greedy agreement {(t.agreement or 0):.0%} "
            f"under the {html.escape(t.rule or '')} "
            f"rule; {len(t.flips or [])} near-tie flip(s){': ' + html.escape(flips) if flips else ''}</p>"
            f"<p>{html.escape(t.rationale or '')}</p>"
            f"<p>Serve it exactly as measured (environment included; on the CPU build the win can be an "
            f"environment variable, which a bare <code>vllm serve</code> would miss):</p>"
            f"<pre>git -C {html.escape(run.repo or '')} worktree add /tmp/{html.escape(branch.replace('/', '-'))} "
            f"{html.escape(branch)}\nsh /tmp/{html.escape(branch.replace('/', '-'))}/serving/launch.sh</pre>"
            f"<details><summary>serving/launch.sh</summary><pre>{html.escape(launch)}</pre></details></div>")
    return "".join(parts)


def render(run: RunView, trials: list[TrialView], rules: list[LearnedRule], study,
           show: Callable[[str, str], str | None], capacities: list[Capacity] | None = None) -> str:
    """The page. `show(branch, path)` reads a file of a proposed branch (None when it cannot)."""
    from plotly.offline import get_plotlyjs

    cal = run.calibration or {}
    speed_only = [t for t in trials if t.decision == Decision.SPEED_ONLY]
    candidates = [t for t in trials if t.source in CANDIDATES]
    summary = (f"<p>{html.escape(run.model)} on "
               f"{html.escape(str((run.hardware or {}).get('gpus') or (run.hardware or {}).get('cpu')))}"
               f", {html.escape(run.engine or '')} {html.escape(run.engine_version or '')}; meter "
               f"{html.escape(run.workload)}; {run.status}, started {run.started_at}, deadline {run.deadline_at}.</p>"
               + (f"<p>Traffic: {html.escape(traffic_line(run_meter(run), run.settings.get('traffic_source')))}.</p>"
                  if (run.settings or {}).get("traffic") else "")
               + f"<p>Defaults: {run.baseline_figure or 0:.2f} {objective.of_run(run).unit}, "
               f"noise ±{(run.noise or 0):.1%} log-sd between server "
               f"instances ({run.noise_df or 0} df), perplexity {run.baseline_ppl or 0:.4f}. "
               f"{html.escape(cal.get('aa') or '')}. Greedy rule {html.escape(str(cal.get('rule', '')))}"
               f"{', tau ' + format(cal['tau'], '.3f') + ' nats' if 'tau' in cal else ''}.</p>"
               f"<p>{len(trials)} trials: {len(candidates)} candidates, {sum(1 for t in trials if t.branch)} accepted, "
               f"{sum(1 for t in trials if t.status == 'failed')} failed, "
               f"{sum(1 for t in trials if t.status == 'pruned')} "
               f"pruned, {len(speed_only)} measured for speed only.</p>")
    rows = [[t.number, t.source, t.status, t.decision, f"{t.figure:.2f}" if t.figure else "",
             f"{t.search_ratio:.3f}" if t.search_ratio else "", _claim(t) if t.heldout_ratio else "",
             f"{t.ppl_change:+.2%}" if t.ppl_change is not None else "",
             describe(t.params) or "engine defaults", t.rationale or ""]
            for t in trials]
    body = {
        "summary": ("What the night found", summary),
        "branches": ("Proposed branches", branch_section(run, trials, show)),
        "speed-over-time": ("Speed over the night", speed_over_time(run, trials)),
        "speed-vs-quality": ("Speed against quality", _versus(
            trials, lambda t: None if t.ppl_change is None else 100 * t.ppl_change, "perplexity change (%)",
            "TPS ratio against perplexity change (Pareto: faster and lower perplexity)")),
        "speed-vs-latency": ("Speed against latency", _versus(
            trials, lambda t: t.itl_p99_ms, "p99 inter-token latency (ms)",
            "TPS ratio against p99 inter-token latency (Pareto: faster and lower latency)")),
        "capacity": ("What each config is worth: load curves, knees, cost", capacity_section(capacities or [])),
        "failures": ("Failures, learned refusals, pruned trials", failures(trials, rules)),
        "importance": ("Which knobs mattered", importance(study) if study is not None else
                       "<p>The run's Optuna study is not in this storage.</p>"),
        "speed-only": ("Measured for speed only (no quality phase: too slow to be accepted)", _table(
            ["trial", objective.of_run(run).unit, "ratio", "why"],
            [[t.number, t.figure, t.search_ratio, "; ".join(t.gate_reasons)[:300]]
             for t in speed_only]) if speed_only else "<p>None.</p>"),
        "trials": ("Every trial, with the planner's reason", _table(
            ["#", "source", "status", "decision", objective.of_run(run).unit, "ratio", "held-out claim", "ppl",
             "config", "why"], rows)),
    }
    sections = "".join(f"<section id='{key}'><h2>{html.escape(title)}</h2>{content}</section>"
                       for key, (title, content) in ((k, body[k]) for k in SECTIONS))
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>agent run {html.escape(run.id)}</title><style>{STYLE}</style>"
            f"<script>{get_plotlyjs()}</script></head><body><h1>agent run {html.escape(run.id)}</h1>"
            f"{sections}</body></html>")


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
section { margin-bottom: 2.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; font-size: 13px; width: 100%; }
td, th { border: 1px solid #ddd; padding: 4px 6px; vertical-align: top; text-align: left; }
th { background: #f4f4f4; } pre { background: #f6f8fa; padding: .8em; overflow-x: auto; }
.branch { border-left: 4px solid #2a9d8f; padding-left: 1em; margin-bottom: 1.5em; }
"""
