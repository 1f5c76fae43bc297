"""What every `agent` command shares: one-line errors, the run's storage and ledger, the run asked for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.markup import escape
from sqlalchemy.exc import OperationalError

from agent import ledger as ledgers
from agent import migrations, part, paths
from agent import storage as storages
from agent.request import RunError, Stopped
from agent.terminal import console


def fail(message: str, code: int = 2) -> typer.Exit:
    """One line, however long; the message is text, never markup (a table or run named "[/x]" is data)."""
    console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def told() -> Iterator[None]:
    """A RunError as one line and its exit status; a stop's line as it is, with 130."""
    try:
        yield
    except Stopped as e:
        console.print(str(e), highlight=False, markup=False)
        raise typer.Exit(e.code) from None
    except RunError as e:
        raise fail(str(e), e.code) from None


def where() -> storages.Storage:
    """The run's storage: AGENT_STORAGE (or --storage, which sets it), else SQLite files under the home."""
    with told():
        return part.where()


def open_ledger() -> ledgers.Ledger:
    found = where()
    if found.kind == "sqlite":
        try:
            return ledgers.Ledger(paths.home() / "ledger.sqlite")
        except migrations.UnknownState as e:
            raise fail(str(e), 1) from None
    try:
        storages.prepare(found)
        return ledgers.Ledger(found.ledger_url)
    except (storages.StorageError, migrations.UnknownState) as e:
        raise fail(str(e), 1) from None
    except OperationalError as e:
        raise fail(f"--storage: cannot use {found.describe()}: {storages.first_line(e)}", 1) from None


def chosen_run(ledger: ledgers.Ledger, run_id: str | None) -> ledgers.Run | None:
    """The run a command is about: --run's, else the latest."""
    if run_id:
        return ledger.run(run_id)
    runs = ledger.runs()
    return runs[0] if runs else None


def ledger_workload(row: ledgers.Run):
    from agent.context import settings_of

    return settings_of(row).workload
