"""`agent ledger`: every trial of every run as a table, JSON or CSV, one trial in full, or read-only SQL."""

from __future__ import annotations

import csv
import json
import sys

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from agent import ledger as ledgers
from agent import storage as storages
from agent import views
from agent.cli_base import fail, open_ledger
from agent.states import Status
from agent.terminal import out

ledger_app = typer.Typer(help="Every trial of every run: table, JSON, CSV, one trial in full, or SQL.")


@ledger_app.callback(invoke_without_command=True)
def ledger_list(
    ctx: typer.Context,
    run_id: str = typer.Option(None, "--run", help="Only this run (default: all)."),
    status: Status = typer.Option(None, help="Only the trials whose process ended so."),
    best: bool = typer.Option(False, help="Only accepted trials, best first."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table."),
    as_csv: bool = typer.Option(False, "--csv", help="CSV instead of a table."),
) -> None:
    """Trials as a table (default), JSON or CSV."""
    if ctx.invoked_subcommand:
        return
    rows = open_ledger().trials(run_id, status)
    if best:
        rows = sorted((t for t in rows if t.gate_passed), key=lambda t: -(t.figure or 0))
    if as_json:
        out.print_json(ledgers.to_json(rows))
        return
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(views.LISTED)
        writer.writerows([[getattr(t, c) for c in views.LISTED] for t in rows])
        return
    table = Table(*views.LISTED)
    for t in rows:
        table.add_row(*("" if getattr(t, c) is None else str(getattr(t, c)) for c in views.LISTED))
    out.print(table)


@ledger_app.command("show")
def ledger_show(number: int, run_id: str = typer.Option(None, "--run", help="Run id (default: the latest).")) -> None:
    """One trial in full: config, figures, gate verdict, failure and log tail, rationale."""
    ledger = open_ledger()
    runs = ledger.runs()
    if not runs:
        raise fail("the ledger has no runs yet")
    run_id = run_id or runs[0].id
    trial = ledger.trial(run_id, number)
    if trial is None:
        raise fail(f"run {run_id} has no trial {number}")
    data = ledgers.as_dict(trial)
    by_instance: dict[int, list[float]] = {}
    for r in ledger.repeats(trial.id):   # 0: the trial's own server; 1, 2, ...: its held-out servers
        by_instance.setdefault(r.instance, []).append(r.figure)
    data["repeat_figures"] = by_instance.get(0, [])
    data["heldout_repeat_figures"] = [by_instance[k] for k in sorted(by_instance) if k > 0]
    out.print_json(json.dumps(data, default=str))


@ledger_app.command("sql")
def ledger_sql(query: str) -> None:
    """Read-only SQL over the ledger (tables: runs, trials, workers, repeats, planner_calls, narrowings,
    learned_rules, capacity)."""
    import sqlite3

    from sqlalchemy.exc import DBAPIError

    try:
        columns, rows = open_ledger().sql(query)
    except (sqlite3.Error, DBAPIError, ValueError) as e:
        raise fail(f"sql: {storages.first_line(e)}") from None
    table = Table(*(escape(str(c)) for c in columns))
    for r in rows:   # cells are data: "[rank0]: CUDA error" is printed as it is, never read as markup
        table.add_row(*(Text("" if v is None else str(v)) for v in r))
    out.print(table)
