"""The ledger's schema changes, named and applied once each, in order (as simonw/llm's migrations):
the `migrations` table lists the ones a ledger has had. A ledger created today has the whole schema
and every name recorded; one written by an older agent (tests/data/ledgers holds one from each commit
that changed the schema) gets the ones it lacks when it is opened, each in its own transaction.

A new column or a change of what a column holds is a new function at the end of MIGRATIONS; never
edit one that has shipped.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Connection, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

MIGRATIONS: list[Callable[[Connection, dict], None]] = []   # each takes a connection and the tables
FRESH_TOO: set[str] = set()   # the migrations a fresh ledger runs as well (what create_all cannot make)


def migration(fn: Callable[[Connection, dict], None]) -> Callable[[Connection, dict], None]:
    MIGRATIONS.append(fn)
    return fn


def fresh_too(fn: Callable[[Connection, dict], None]) -> Callable[[Connection, dict], None]:
    FRESH_TOO.add(fn.__name__)
    return fn


def apply(engine, fresh: bool, tables: dict, record) -> list[str]:
    """Each migration the ledger has not had: run (not on a fresh ledger, created whole) and recorded
    in one transaction, so two processes opening one ledger apply it once. The names applied now."""
    done = []
    for fn in MIGRATIONS:
        try:
            with engine.begin() as conn:
                if conn.execute(select(record.c.name).where(record.c.name == fn.__name__)).first():
                    continue
                # the claim: a second opener waits, then finds it
                conn.execute(record.insert().values(name=fn.__name__))
                if not fresh or fn.__name__ in FRESH_TOO:
                    fn(conn, tables)
            done.append(fn.__name__)
        except IntegrityError:   # another process recorded it between our read and our insert
            continue
    return done


def _add_missing(conn: Connection, table, names: list[str]) -> None:
    have = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for name in names:
        if name not in have:
            kind = table.c[RENAMED.get(table.name, {}).get(name, name)].type.compile(conn.dialect)
            conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{name}" {kind}'))


@migration
def m001_columns_added_before_names(conn: Connection, tables: dict) -> None:
    """The columns added between the first ledger (2026-11-29) and named migrations (2026-12-06),
    which the ledger's opening added, unnamed, where they were missing."""
    _add_missing(conn, tables["runs"], ["model_revision", "noise_df", "calibration"])
    _add_missing(conn, tables["trials"], [
        "failure_cause", "failed_phase", "tps_interval", "drift", "tps_corrected", "heldout_tps", "heldout_ratio",
        "heldout_instances", "heldout_interval", "search_interval", "greedy", "top_logprobs", "kl", "flips", "rule",
        "decision", "constraint", "measured", "worker_id"])


@migration
def m002_run_owner(conn: Connection, tables: dict) -> None:
    """runs.owner: the coordinator that last took the run up, for one resume to win (2026-12-06)."""
    _add_missing(conn, tables["runs"], ["owner"])


# The gate's options as `agent run` kept them flat before 2026-12-03, and the names they have now.
_FLAT_GATE = {"ppl_tolerance": "ppl_tolerance", "ppl_max": "ppl_max", "min_gain": "min_gain", "kl_max": "kl_max",
              "kl_max_lossy": "kl_max_lossy", "ttft_p99_ms_max": "slo_ttft_p99_ms",
              "itl_p99_ms_max": "slo_itl_p99_ms", "level": "level", "detect": "detect",
              "max_instances": "max_instances", "exact": "exact", "noisy": "noisy", "max_defaults": "max_defaults",
              # between 480ecef and the settings stored as used (2026-12-03) the SLOs were kept flat under these
              "slo_ttft_p99_ms": "slo_ttft_p99_ms", "slo_itl_p99_ms": "slo_itl_p99_ms"}


@migration
def m003_settings_as_used(conn: Connection, tables: dict) -> None:
    """Run rows written before 2026-12-03 kept `agent run`'s options flat: the gate's among the rest,
    the workload under `workload_spec`, the noise prior as [sd, df]. Each is rewritten in the shape
    a run stores now (the gate's under `gate`, the prior as {sd, df}), so one reader serves every run;
    the model its row names where they lack one; the newer settings stay absent and read as their defaults. A row
    whose values have another shape
    is left as it was (agent.context.settings_of reads what it lacks as the defaults)."""
    runs = tables["runs"]
    for id_, settings, workload, model in conn.execute(select(runs.c.id, runs.c.settings, runs.c.workload,
                                                              runs.c.model)).all():
        if not isinstance(settings, dict) or "gate" in settings:
            continue
        try:
            gate = {new: settings[old] for old, new in _FLAT_GATE.items() if old in settings}
            if "noise_prior" in settings:
                sd, df = settings["noise_prior"]
                gate["noise_prior"] = {"sd": float(sd), "df": int(df)}
        except (TypeError, ValueError):
            continue
        kept = {k: v for k, v in settings.items() if k not in _FLAT_GATE and k not in ("noise_prior", "workload_spec")}
        conn.execute(update(runs).where(runs.c.id == id_).values(
            settings={"model": model, **kept, "workload": settings.get("workload_spec") or workload, "gate": gate}))


# Columns named "tps" held whatever the run's objective measured (requests/s under goodput), so they
# were renamed for what they hold; each old name stays as a read-only generated column of the new
# one, so saved SQL (`SELECT tps, tps_ratio FROM trials`) reads what it read before.
RENAMED = {
    "runs": {"baseline_tps": "baseline_figure"},
    "trials": {"tps": "figure", "tps_interval": "figure_interval", "tps_ratio": "search_ratio",
               "tps_corrected": "figure_corrected", "heldout_tps": "heldout_figure"},
    "repeats": {"tps": "figure"},
}


@fresh_too
@migration
def m004_figures_named_by_unit(conn: Connection, tables: dict) -> None:
    """tps -> figure, tps_ratio -> search_ratio, ... (RENAMED), each old name kept as an alias
    (2026-12-06). A fresh ledger gets the aliases too."""
    stored = "STORED" if conn.dialect.name == "postgresql" else "VIRTUAL"   # SQLite adds only virtual ones
    for table, names in RENAMED.items():
        have = {c["name"] for c in inspect(conn).get_columns(table)}
        for old, new in names.items():
            if old in have and new not in have:
                conn.execute(text(f'ALTER TABLE {table} RENAME COLUMN "{old}" TO "{new}"'))
            kind = tables[table].c[new].type.compile(conn.dialect)
            if old not in have or new not in have:
                conn.execute(text(f'ALTER TABLE {table} ADD COLUMN "{old}" {kind} '
                                  f'GENERATED ALWAYS AS ("{new}") {stored}'))


@migration
def m005_flat_slos_into_the_gate(conn: Connection, tables: dict) -> None:
    """m003 as first shipped left `slo_ttft_p99_ms` and `slo_itl_p99_ms` of a flat row beside the gate
    instead of in it (the run read no SLO): each moves into the gate where the gate lacks it."""
    runs = tables["runs"]
    for id_, settings in conn.execute(select(runs.c.id, runs.c.settings)).all():
        if not isinstance(settings, dict) or not isinstance(settings.get("gate"), dict):
            continue
        moved = {k: settings[k] for k in ("slo_ttft_p99_ms", "slo_itl_p99_ms")
                 if k in settings and k not in settings["gate"]}
        if moved:
            kept = {k: v for k, v in settings.items() if k not in moved}
            conn.execute(update(runs).where(runs.c.id == id_)
                         .values(settings={**kept, "gate": {**settings["gate"], **moved}}))


@migration
def m006_capacity(conn: Connection, tables: dict) -> None:
    """The `capacity` table: each config's ladder of loads and what it is worth (`agent capacity`,
    2026-12-07). The ledger's opening creates a missing table; this names the change and makes sure."""
    tables["capacity"].create(conn, checkfirst=True)


class UnknownState(ValueError):
    """A stored state no member of its kind has: the ledger cannot be read as typed until it is settled."""


@migration
def m007_states_typed(conn: Connection, tables: dict) -> None:
    """States became typed columns (agent.states, sandbox.failures.FailureClass: 2026-12-07), stored as
    the same strings. A failure class no member has is settled as a new result's is (FailureClass.of:
    `worker_error`, its old name at the head of the message); any other state no member has stops the
    opening, naming it. Read and written as plain text here: the typed columns would refuse the very
    values this looks for."""
    from sqlalchemy import Enum

    from sandbox.contract import FailureClass

    for table in tables.values():
        for column in (c for c in table.columns if isinstance(c.type, Enum)):
            name = f'"{column.name}"'
            stored = {v for (v,) in conn.execute(text(f"SELECT DISTINCT {name} FROM {table.name}")) if v is not None}
            for value in sorted(stored - set(column.type.enums)):
                if column.name != "failure_class":
                    raise UnknownState(f"{table.name}.{column.name} holds {value!r}, which no version of the agent "
                                       f"wrote; set it to one of {', '.join(column.type.enums)} and open it again")
                rows = conn.execute(text(f"SELECT id, failure_message FROM {table.name} WHERE failure_class = :v"),
                                    {"v": value}).all()
                for id_, message in rows:   # few: a class no agent wrote
                    klass, message = FailureClass.of(value, message)
                    conn.execute(text(f"UPDATE {table.name} SET failure_class = :k, failure_message = :m "
                                      f"WHERE id = :id"), {"k": klass.value, "m": message, "id": id_})
