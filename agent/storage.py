"""Where a run's ledger and Optuna study live: two SQLite files under the home (one host, the
default), or one PostgreSQL database that workers on several hosts share (`--storage`).

In PostgreSQL the ledger keeps its table names in the public schema and Optuna's tables go to a
schema of their own, `optuna`: both have a table called `trials`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import optuna
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from agent.ledger import PG_CONNECT, safe_url

OPTUNA_SCHEMA = "optuna"
SQLITE_TIMEOUT_S = 60   # several local writers wait for each other's (short) transactions


class StorageError(ValueError):
    pass


@dataclass(frozen=True)
class Storage:
    ledger_url: str
    study_url: str
    kind: str   # sqlite or postgresql

    @property
    def shared(self) -> bool:
        """Workers on other hosts can join: the database is a server, not a file of this host."""
        return self.kind == "postgresql"

    def describe(self) -> str:
        """The URL as it may be printed or logged: never its password."""
        return safe_url(self.ledger_url)

    def study(self) -> optuna.storages.RDBStorage:
        """Optuna's storage for this run's study (an object: so a URL's password never reaches a log line)."""
        if self.kind == "sqlite":
            return optuna.storages.RDBStorage(self.study_url, engine_kwargs={
                "connect_args": {"timeout": SQLITE_TIMEOUT_S}})
        return optuna.storages.RDBStorage(self.study_url, engine_kwargs={
            "pool_pre_ping": True, "connect_args": {"options": f"-c search_path={OPTUNA_SCHEMA}", **PG_CONNECT}})


def resolve(url: str | None, home: Path) -> Storage:
    """--storage (or AGENT_STORAGE), else the two SQLite files under home."""
    url = url or os.environ.get("AGENT_STORAGE") or None
    if not url:
        return Storage(f"sqlite:///{home / 'ledger.sqlite'}", f"sqlite:///{home / 'optuna.sqlite'}", "sqlite")
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as e:   # ValueError: a port that is no number, an '@' in a password
        why = "has a port that is not a number" if isinstance(e, ValueError) else "is not a database URL"
        raise StorageError(f"--storage: {shown(url)!r} {why} (postgresql://user:password@host:5432/db; an '@', "
                           f"':' or '/' in a password is written %40, %3A, %2F)") from None
    if parsed.get_backend_name() != "postgresql":
        raise StorageError(f"--storage: {parsed.get_backend_name()!r} is not supported; give a PostgreSQL URL "
                           f"(postgresql://user:password@host:5432/db), or leave it out for SQLite under {home}")
    # psycopg (3) is the driver this project installs; a plain postgresql:// would ask for psycopg2.
    parsed = parsed.set(drivername="postgresql+psycopg")
    rendered = parsed.render_as_string(hide_password=False)
    try:   # the driver reads the query's options (a port given as ?port=) when the engine is made, not before
        create_engine(rendered, connect_args=PG_CONNECT).dispose()
    except (ArgumentError, ValueError, TypeError):   # its message may hold the URL: never printed
        raise StorageError(f"--storage: {shown(url)!r}: the PostgreSQL driver cannot read its options (a port "
                           f"or a query parameter); postgresql://user:password@host:5432/db") from None
    return Storage(rendered, rendered, "postgresql")


def shown(url: str) -> str:
    """What of a URL that did not parse may be printed: its scheme and what follows its last '@' (the
    host, port and database), without a query; nothing of a user or password, wherever an '@' fell."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<not a URL>"
    if "@" in rest:
        return f"{scheme[:40]}://***@{rest.rpartition('@')[2].split('?')[0][:120]}"
    host = rest.split("?")[0]
    return f"{scheme[:40]}://{'***' if ':' in host.split('/')[0] else host[:120]}"   # user:password, no host


def prepare(storage: Storage) -> None:
    """Make sure the database answers and Optuna's schema exists (PostgreSQL); one clear error if not."""
    if storage.kind != "postgresql":
        return
    engine = create_engine(storage.ledger_url, pool_pre_ping=True, connect_args=PG_CONNECT)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
    except Exception as e:  # noqa: BLE001 - any driver error means the same to the user
        raise StorageError(f"--storage: cannot reach {storage.describe()}: {first_line(e)}") from None
    finally:
        engine.dispose()


def first_line(error: BaseException) -> str:
    text_ = str(getattr(error, "orig", None) or error).strip()
    return text_.splitlines()[0][:300] if text_ else type(error).__name__
