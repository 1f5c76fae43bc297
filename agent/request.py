"""`agent run`'s request: its options as one dataclass, checked and turned into the run's row.

A RunRequest holds every option by name, with what the command line shows for it (flag, help,
bounds) in the field's metadata; the command line builds one from its flags and hands it to
prepare_run, which checks every option, prepares the model and the traffic, and writes the run's
row: everything a resume and every worker need is in it. A bad option is a RunError naming the
option and the value, raised before anything is written (the command line prints it as one line and
exits with its code). Tests build a RunRequest directly, without typer.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import git

from agent import budget, crew, devices, gitops, hub
from agent import ledger as ledgers
from agent import space as spaces
from agent.context import Inputs, Settings, inputs_of, settings_of, stored
from agent.gate import GateSettings
from agent.stats import Noise
from sandbox.contract import QualitySet, Traffic, Workload, default_model_dir, model_is_ready, prepare_model

G, S = GateSettings, Settings  # every default lives on these two dataclasses


class RunError(Exception):
    """A run that cannot start or go on: one line for the user, and the exit status (2: bad input)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def option(default: Any, help: str, *flags: str, **bounds: Any) -> Any:
    """A request field, with what the command line shows for it: its flags (default: the name with
    dashes), help and bounds (min, max, envvar)."""
    return field(default=default, metadata={"help": help, "flags": flags, **bounds})


@dataclass(frozen=True)
class RunRequest:
    """`agent run`'s options. Each name is kept as the run's settings keep it (agent.context.stored)."""
    budget_text: str | None = option(None, "Wall-clock budget: 24h, 90m, 1h30m.", "--budget")
    resume: str | None = option(None, "Continue an interrupted run, to its original deadline.")
    model: str = option("embedded", "Model folder or Hugging Face id; 'embedded' is Gemma 3 270M.")
    space_name: str | None = option(None, "Space file or shipped name (default: vllm-cpu or vllm-gpu).", "--space")
    workload: str | None = option(None, "Workload profile: the shipped traffic default-cpu or default (the default), "
                                        "chat-cpu, the challenge meters challenge-cpu, challenge-short, challenge, "
                                        "or a YAML file.")
    traffic: Path | None = option(None, "Your requests: OpenAI request bodies (JSONL), ShareGPT conversations, or a "
                                        "timestamped trace (docs/traffic.md); measured with the workload's "
                                        "concurrency and request counts.")
    chat_template: Path | None = option(None, "A Jinja chat template for chat requests, when the model has none.")
    multi_turn: bool = option(False, "Replay --traffic ShareGPT conversations turn by turn with their history (chat "
                                     "requests), not their first turn only.")
    quality_text: Path | None = option(None, "Plain text for perplexity, paragraphs apart (default: the shipped "
                                             "public-domain passages).")
    quality: str | None = option(None, "Quality set: quick (CPU default) or default (GPU default).")
    repo: Path | None = option(None, "Git repository to propose branches into (default: runs/proposals).")
    ppl_tolerance: float = option(G.ppl_tolerance, "Allowed relative perplexity increase.")
    ppl_max: float | None = option(G.ppl_max, "Optional absolute perplexity bound.")
    min_gain: float = option(G.min_gain, "The held-out ratio's lower bound must clear 1 + this.")
    baseline_instances: int = option(S.baseline_instances, "Server instances of the defaults before the A/A check "
                                                           "(more follow on a noisy host).", min=2, max=10)
    max_instances: int = option(G.max_instances, "Fresh candidate instances at most in one held-out decision.",
                                min=1, max=30)
    exact: bool = option(G.exact, "Serve every trial batch-invariant (VLLM_BATCH_INVARIANT=1, NVIDIA GPUs) and "
                                  "require greedy outputs token for token.")
    drift_every: int = option(S.drift_every, "Candidate trials between re-measurements of the defaults (0: never).",
                              min=0)
    one_knob_start: bool = option(S.one_knob_start, "Start the sampler with one-knob changes from the engine's "
                                                    "defaults instead of random points (slower to the best on the "
                                                    "simulated engine: docs/results.md).")
    recheck: bool = option(S.recheck, "Decide on fresh servers and held-out prompts (off: on the search instance "
                                      "alone).")
    kl_max: float | None = option(G.kl_max, "Refuse configs whose mean KL divergence from the defaults' top-5 "
                                            "next-token distributions is above this (nats).", min=0)
    kl_max_lossy: float = option(G.kl_max_lossy, "The KL bound for lossy configs (fp8 and the like) when --kl-max "
                                                 "is not given (nats).", min=0)
    slo_ttft_p99_ms: float | None = option(G.slo_ttft_p99_ms, "SLO: refuse configs whose p99 time to first token "
                                                              "is above this.", min=0)
    slo_itl_p99_ms: float | None = option(G.slo_itl_p99_ms, "SLO: refuse configs whose p99 inter-token latency is "
                                                            "above this.", min=0)
    slo_tpot_p99_ms: float | None = option(G.slo_tpot_p99_ms, "SLO: refuse configs whose p99 time per output token "
                                                              "of a request (vllm bench serve's TPOT) is above this; "
                                                              "it replaces the latency guard's TPOT bound (n-gram "
                                                              "speculation slows requests whose drafts fail).", min=0)
    slo_e2e_p99_ms: float | None = option(None, "SLO for --objective goodput: p99 end-to-end latency.", min=0)
    max_model_len: int | None = option(None, "The context length every trial serves and the branch ships (default: "
                                             "the model's own maximum).", min=64)
    arrivals: str | None = option(None, "How requests arrive: concurrency (the workload's), rate:R[,burstiness=B]"
                                        "[,seed=S] or poisson:R (requests/s, as vllm bench serve), trace[:SCALE] "
                                        "(the traffic's timestamps); docs/arrivals.md.")
    objective: str | None = option(None, "What ranks configs: tps (output tokens/s at a fixed concurrency), goodput "
                                         "(the highest request rate whose p99 SLOs hold; open-loop arrivals and at "
                                         "least one --slo-*), or a latency percentile at the arrivals given: ttft, "
                                         "itl, e2e or tpot with -p50, -p90 or -p99.")
    repeats: int = option(S.repeats, "Measured repeats per server instance.", min=1, max=20)
    num_prompts: int | None = option(None, "Requests in a measured phase, or in a goodput rate point (default: the "
                                           "workload's; a sound point wants tens on a CPU, 100 for a true p99).",
                                     min=1, max=100_000)
    seed: int = option(S.seed, "Sampler seed.")
    sampler_per_planner: int = option(S.sampler_per_planner, "Sampler trials between two planner trials.",
                                      min=0, max=100)
    planner: str | None = option(None, "A litellm model string (anthropic/claude-sonnet-4-5, hosted_vllm/...), or "
                                       "'off' for the sampler alone; default: the built-in planner.")
    planner_base_url: str | None = option(None, "API base URL for the planner model.")
    sampler: str = option(S.sampler, "Optuna sampler for the non-planner trials: tpe or random.")
    max_trials: int | None = option(None, "Stop after this many candidate trials, even with budget left.", min=1)
    draft_model: list[str] | None = option(None, "A draft model speculative decoding may use (repeatable); checked "
                                                 "for the target's vocabulary.", "--draft-model")
    workers: int = option(1, "Trials at once on this host: a GPU each, or on a CPU host a share of its cores each "
                             "(docs/scale-out.md).", min=1, max=64)
    capacity: str | None = option(None, "After the night's first branch, measure what it and the defaults are worth "
                                        "on fresh servers up a ladder of loads: streams 1,2,4,8 or rate:0.5,1,2 "
                                        "(requests/s), as `agent capacity` does; written into the branch's "
                                        "results.json (its cost is in the plan line).")
    price_per_hour: float | None = option(None, "With --capacity: a server's price an hour, for the cost per "
                                                "million tokens.", min=0)
    target_rate: float | None = option(None, "With --capacity: requests/s to serve, for the servers each config "
                                             "needs.", min=0.001)
    storage: str | None = option(None, "postgresql://user:password@host/db: ledger and study in one database that "
                                       "`agent worker` on other hosts joins (default: SQLite files under runs/).",
                                 "--storage", envvar="AGENT_STORAGE", show_envvar=False)




def prepare_run(request: RunRequest, ledger: ledgers.Ledger, home: Path, gpus: int, storage_kind: str,
                say: Callable[[str], None]) -> ledgers.Run:
    """Check every option, prepare the model, and write the run's row: everything a resume needs is in it.
    gpus: the GPUs this host shows; storage_kind: sqlite or postgresql (the run's settings keep it)."""
    checked = check_options(request, home, gpus)
    prepared = prepare_inputs(request, checked, home, say)
    return ledger.add(run_row(request, checked, prepared, home, storage_kind))


@dataclass
class Checked:
    """What the options are, checked before anything is prepared or written."""
    budget_s: float
    space: spaces.Space
    meter: Workload         # with --num-prompts
    quality: str
    quality_set: QualitySet
    proposals: git.Repo     # the repository branches go into


@dataclass
class Prepared:
    """What preparing the run made: the model and drafts here, the run's copies of the user's files, the
    traffic as the run measures it, and the context every trial serves."""
    run_id: str
    now: datetime
    model: str
    revision: str | None
    drafts: list[str]
    space: spaces.Space
    meter: Workload
    quality_set: QualitySet
    source: Traffic | None  # the user's --traffic file as prepared (agent.traffic), or None
    context: int | None
    longest: int | None


def check_options(r: RunRequest, home: Path, gpus: int) -> Checked:
    """Every option checked, the ones that name files and profiles read: a RunError names the first bad one;
    nothing is written but a new --repo's first commit (a folder the run would propose into)."""
    from sandbox.contract import TrafficError, load_quality, load_workload

    budget_s = _check_flags(r, home, gpus)
    gpu = gpus > 0
    space = load_space(r.space_name or ("vllm-gpu" if gpu else "vllm-cpu"), [], exact=r.exact)
    try:
        meter = load_workload(r.workload or ("default" if gpu else "default-cpu"))
        meter = replace(meter, num_prompts=r.num_prompts or meter.num_prompts)
    except ValueError as e:
        raise RunError(f"--workload: {e}") from None
    _check_files(r)
    if r.arrivals or r.objective:
        try:   # the profile, the objective and a trace's timestamps, before the model is prepared
            with_arrivals(replace(meter, traffic=str(r.traffic.resolve()) if r.traffic else meter.traffic), r)
        except TrafficError as e:
            raise RunError(str(e)) from None
    quality = r.quality or ("default" if gpu else "quick")
    try:
        quality_set = load_quality(quality, str(r.quality_text.resolve()) if r.quality_text else None)
    except ValueError as e:
        raise RunError(f"--quality: {e}") from None
    model_given(r.model)
    try:
        proposals = gitops.open_repo(r.repo or home / "proposals", create=r.repo is None)
    except gitops.RepoError as e:
        raise RunError(f"--repo: {e}") from None
    if clash := gitops.namespace_clash(proposals):   # before the model, so a night cannot end unbranched
        raise RunError(f"--repo: {clash}")
    return Checked(budget_s, space, meter, quality, quality_set, proposals)


def _check_flags(r: RunRequest, home: Path, gpus: int) -> float:
    """The options that stand alone: the budget (its seconds returned), workers, --exact, the sampler,
    the planner's URL, --capacity and its prices, --multi-turn."""
    if not r.budget_text:
        raise RunError("--budget is required (or --resume RUN_ID)")
    try:
        budget_s = budget.parse_duration(r.budget_text)
    except ValueError as e:
        raise RunError(f"--budget: {e}") from None
    try:
        devices.slots(r.workers, gpus, home)
    except devices.DeviceError as e:
        raise RunError(str(e)) from None
    if r.exact and not gpus:
        raise RunError("--exact: batch-invariant serving (VLLM_BATCH_INVARIANT) needs an NVIDIA GPU; vllm-cpu's "
                       "softmax fails under it")
    if r.sampler not in ("tpe", "random"):
        raise RunError(f"--sampler: {r.sampler!r} is not tpe or random")
    if url_secret(r.planner_base_url):
        raise RunError("--planner-base-url: it carries a credential (a user:password@ or a key in its query); the "
                       "run stores its settings in the ledger, so give the key in the provider's environment "
                       "variable (OPENAI_API_KEY, ...) instead")
    if r.capacity is not None:
        from agent.capacity import ladder_of

        try:
            ladder_of(r.capacity)
        except ValueError as e:
            raise RunError(str(e)) from None
    for flag, value in (("--price-per-hour", r.price_per_hour), ("--target-rate", r.target_rate)):
        if value is not None and r.capacity is None:
            raise RunError(f"{flag}: {value:g} is for --capacity's figures; give --capacity too")
    if r.multi_turn and not r.traffic:
        raise RunError("--multi-turn: replays a --traffic file's conversations turn by turn; give --traffic FILE")
    return budget_s


def _check_files(r: RunRequest) -> None:
    from sandbox.contract import TrafficError, load_traffic

    for flag, path in (("--traffic", r.traffic), ("--chat-template", r.chat_template),
                       ("--quality-text", r.quality_text)):
        if path is not None and not path.is_file():
            raise RunError(f"{flag}: {path} is not a file")
    if r.traffic:
        try:   # the file's form, every line, before the model is prepared (ShareGPT's lengths come later)
            load_traffic(r.traffic, multi_turn=r.multi_turn)
        except TrafficError as e:
            raise RunError(f"--traffic: {e}") from None


def prepare_inputs(r: RunRequest, checked: Checked, home: Path, say: Callable[[str], None]) -> Prepared:
    """The model and drafts made available here, the run's copies of the user's files, the traffic
    checked against the model, and the context every trial serves."""
    from agent import traffic as traffics
    from sandbox.contract import load_quality

    model, revision = model_ready(r.model, say)
    drafts, space = _drafts(r, checked.space, served_model(model, revision), say)
    now = datetime.now(UTC)
    run_id = now.strftime("%Y%m%d-%H%M%S")
    try:
        tokens = traffics.Tokens(served_model(model, revision),
                                 str(r.chat_template or checked.meter.chat_template or "") or None)
    except traffics.NoTokenizer as e:   # the server may still load it (a remote tokenizer): nothing to count with
        tokens = None
        say(f"note: {e}: request lengths are not checked here and the space's max-model-len is served")
    # The run's own copies of the user's template and perplexity text, as of the traffic: every trial and
    # the branch read these, so an edit to the user's file in the night changes nothing measured.
    chat_template = _keep(r.chat_template, home / run_id / "inputs") if r.chat_template else None
    quality_set = (load_quality(checked.quality, str(_keep(r.quality_text, home / run_id / "inputs")))
                   if r.quality_text else checked.quality_set)
    meter, source, longest = _traffic(r, checked.meter, chat_template, tokens, quality_set, home / run_id)
    context = served_context(r.max_model_len, tokens.limit if tokens else None,
                             traffics.context_length(longest, quality_set, None) if longest else None)
    if context:
        space = space.with_fixed_flag("max-model-len", context)
    whose = "--max-model-len" if r.max_model_len else "the model's maximum"
    say(f"traffic: {meter.summary_line()}"
        + (f"; max-model-len {context} ({whose}; longest request {longest} tokens)" if context and longest else ""))
    return Prepared(run_id, now, model, revision, drafts, space, meter, quality_set, source, context, longest)


def _drafts(r: RunRequest, space: spaces.Space, target: str, say: Callable[[str], None]) -> tuple[list[str],
                                                                                                   spaces.Space]:
    """--draft-model's models made available here and checked for the target's vocabulary; the space with
    them as choices."""
    drafts = [draft_ready(d, say) for d in r.draft_model or []]
    if not drafts:
        return drafts, space
    from agent import drafts as checks

    try:
        for draft in drafts:
            checks.check_vocab(target, draft)
    except checks.DraftError as e:
        raise RunError(str(e)) from None
    return drafts, load_space(space.path, drafts, exact=r.exact)


def _traffic(r: RunRequest, meter, chat_template: Path | None, tokens, quality_set, folder: Path):
    """The meter with the run's copy of --traffic (and the user's template), its arrivals, checked for
    the repeats and against the model: (meter, the prepared source or None, the longest request)."""
    from agent import traffic as traffics
    from sandbox.contract import TrafficError

    source = None
    try:
        if chat_template and not r.traffic:   # a chat workload served with the user's template
            meter = replace(meter, chat_template=str(chat_template.resolve()))
        if r.traffic:   # the run's own copy, read by every trial (docs/traffic.md)
            copy = folder / "traffic" / r.traffic.name
            source = traffics.prepare(r.traffic, copy, tokens.count if tokens else None, r.multi_turn)
            meter = traffics.with_traffic(meter, copy, str(chat_template.resolve()) if chat_template else None)
            requests, named = list(source.requests), str(r.traffic)
        else:
            requests, named = [*meter.pool("search"), *meter.pool("heldout")], meter.traffic or "the shipped prompts"
        meter = with_arrivals(meter, r)
        meter.check(r.repeats)
        longest = (traffics.check_against_model(requests, tokens, named, quality_set.greedy_max_tokens)
                   if tokens else None)
    except TrafficError as e:
        shutil.rmtree(folder, ignore_errors=True)   # the copy of a run that never started
        raise RunError(str(e) if str(e).startswith("--") else f"--traffic: {e}" if r.traffic else f"--workload: {e}") \
            from None
    return meter, source, longest


def run_row(r: RunRequest, checked: Checked, prepared: Prepared, home: Path, storage_kind: str) -> ledgers.Run:
    """The run's row: its settings and inputs, everything a resume and every worker read."""
    from sandbox.contract import engine_info, file_digest, hardware

    engine, host = engine_info(), hardware()
    p, space, meter = prepared, prepared.space, prepared.meter
    gate = gate_from(r, Noise(*space.noise_prior))
    used = settings_from(r, model=p.model, workload=meter.as_dict(), quality=checked.quality,
                         quality_text=p.quality_set.text_path, home=home, gate=gate, facts=facts(host, meter, gate))
    text_hash = file_digest(p.quality_set.text_path) if p.quality_set.text_path and r.quality_text else None
    return ledgers.Run(
        id=p.run_id, deadline_at=budget.deadline_after(checked.budget_s, p.now).isoformat(timespec="seconds"),
        model=p.model, model_revision=p.revision, engine=engine["name"], engine_version=engine["version"],
        hardware=host, space_path=space.path, space_hash=space.hash, workload=meter.name, workload_hash=meter.hash,
        repo=str(checked.proposals.working_dir), owner=crew.token(),
        settings=stored(used, Inputs(
            budget=r.budget_text or "", budget_s=checked.budget_s, workers=r.workers, planner=r.planner or "builtin",
            planner_base_url=r.planner_base_url, draft_models=p.drafts, model_given=r.model,
            max_model_len=p.context, longest_request=p.longest, choices=choices(space), quality_text_hash=text_hash,
            traffic=meter.summary(), traffic_source=p.source.summary() if p.source else None, storage=storage_kind,
            arrivals=r.arrivals, objective=r.objective, num_prompts=r.num_prompts, slo_e2e_p99_ms=r.slo_e2e_p99_ms,
            capacity=r.capacity, price_per_hour=r.price_per_hour, target_rate=r.target_rate)))


# Where each option lands: the gate's settings, the run's settings (both by gate_from and settings_from),
# or what prepare_run reads itself and keeps in the run's Inputs or its row (test_request holds every
# RunRequest field to one of these).
TO_GATE = ("ppl_tolerance", "ppl_max", "min_gain", "max_instances", "exact", "kl_max", "kl_max_lossy",
           "slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_tpot_p99_ms")
TO_SETTINGS = ("baseline_instances", "drift_every", "one_knob_start", "recheck", "repeats", "seed",
               "sampler_per_planner", "sampler", "max_trials")
PREPARED = ("budget_text", "resume", "model", "space_name", "workload", "traffic", "chat_template", "multi_turn",
            "quality_text", "quality", "repo", "slo_e2e_p99_ms", "max_model_len", "arrivals", "objective",
            "num_prompts", "planner", "planner_base_url", "draft_model", "workers", "capacity", "price_per_hour",
            "target_rate", "storage")


def gate_from(r: RunRequest, noise_prior: Noise) -> GateSettings:
    """The gate's settings from the options (TO_GATE), each named: a renamed option fails the type check."""
    return GateSettings(ppl_tolerance=r.ppl_tolerance, ppl_max=r.ppl_max, min_gain=r.min_gain,
                        max_instances=r.max_instances, exact=r.exact, kl_max=r.kl_max, kl_max_lossy=r.kl_max_lossy,
                        slo_ttft_p99_ms=r.slo_ttft_p99_ms, slo_itl_p99_ms=r.slo_itl_p99_ms,
                        slo_tpot_p99_ms=r.slo_tpot_p99_ms, noise_prior=noise_prior)


def settings_from(r: RunRequest, *, model: str, workload: dict, quality: str, quality_text: str | None, home: Path,
                  gate: GateSettings, facts: dict) -> Settings:
    """The run's settings from the options (TO_SETTINGS) and what prepare_run prepared."""
    return Settings(model=model, workload=workload, quality=quality, quality_text=quality_text, gate=gate,
                    baseline_instances=r.baseline_instances, repeats=r.repeats, seed=r.seed,
                    sampler_per_planner=r.sampler_per_planner, sampler=r.sampler, max_trials=r.max_trials,
                    recheck=r.recheck, drift_every=r.drift_every, facts=facts, one_knob_start=r.one_knob_start,
                    home=home)


# Open-loop arrivals on a closed-loop workload (docs/arrivals.md):
OPEN_LOOP_CAP = 64       # requests in flight at most
OPEN_LOOP_WARMUPS = 32   # warm-ups at once before the rate points (docs/arrivals.md: after one, the
                         # first point broke its TTFT SLO; after 32 the points held)


def with_arrivals(meter, request: RunRequest):
    """--arrivals and --objective on the workload; under goodput its SLOs are the run's --slo-* bounds."""
    from sandbox.contract import TrafficError, check_objective

    if not (request.arrivals or request.objective):
        return meter
    closed = meter.arrivals == "concurrency"
    meter = replace(meter, arrivals=request.arrivals or meter.arrivals, objective=request.objective or
                    ("goodput" if request.arrivals and request.arrivals != "concurrency" else meter.objective))
    if closed and meter.arrivals != "concurrency":   # a closed-loop shape sent open loop: its concurrency becomes
        meter = replace(meter, concurrency=max(meter.concurrency, OPEN_LOOP_CAP))   # a cap, not the load
    if meter.arrivals != "concurrency":   # warm the server with a batch like the load (OPEN_LOOP_WARMUPS)
        meter = replace(meter, warmup_requests=max(meter.warmup_requests, min(meter.num_prompts, OPEN_LOOP_WARMUPS)))
    if meter.objective == "goodput":   # the run's --slo-* bounds, where given, over the workload's own
        slos = {"slo_ttft_p99_ms": request.slo_ttft_p99_ms, "slo_itl_p99_ms": request.slo_itl_p99_ms,
                "slo_e2e_p99_ms": request.slo_e2e_p99_ms}
        meter = replace(meter, **{k: v for k, v in slos.items() if v is not None})
    try:
        check_objective(meter, "--objective", "--arrivals")
    except ValueError as e:   # TrafficError: the caller removes the run's copy of the traffic and says it
        message = str(e)
        for name in ("slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_e2e_p99_ms"):   # named as the options are
            message = message.replace(name, "--" + name.replace("_", "-"))
        raise TrafficError(message) from None
    return meter


def model_given(model: str) -> str:
    """--model as given: 'embedded', a folder, or a Hugging Face id."""
    if model != "embedded" and not Path(model).is_dir() and not hub.is_hub_id(model):
        raise RunError(f"--model: {model!r} is neither a folder nor a Hugging Face id like org/name")
    return model


def model_ready(model: str, say: Callable[[str], None]) -> tuple[str, str | None]:
    """The model made available here: the embedded one prepared (its folder), a Hub id fetched once
    (the id and the commit it resolved to), a folder as given."""
    if model == "embedded":
        if not model_is_ready(default_model_dir()):
            say("preparing the embedded model (once; about 2 minutes)...")
        return str(prepare_model(say=lambda s: say(f"  {s}"))), None
    if Path(model).is_dir():   # a folder, absolute: trials run from the agent's own source root, not here
        return str(Path(model).resolve()), None
    if not hub.is_hub_id(model):
        return model, None
    try:
        revision = hub.fetch(model, say=say).revision
    except hub.ModelUnavailable as e:
        raise RunError(f"--model: {e}") from None
    say(f"  {model} at {revision}")
    return model, revision


def draft_ready(draft: str, say: Callable[[str], None]) -> str:
    """A draft as every trial loads it: a folder here made absolute (a trial's working directory differs),
    a Hub id fetched now and served from its snapshot's folder, which names the commit (offline trials
    load it; the branch records it)."""
    if Path(draft).is_dir():
        return str(Path(draft).resolve())
    if not hub.is_hub_id(draft):
        return draft
    try:
        fetched = hub.fetch(draft, say=say)
    except hub.ModelUnavailable as e:
        raise RunError(f"--draft-model: {e}") from None
    say(f"  draft {draft} at {fetched.revision}: {fetched.path}")
    return fetched.path


def served_model(model: str, revision: str | None) -> str:
    try:
        return hub.served(model, revision)
    except hub.ModelUnavailable as e:
        raise RunError(f"the run's model: {e}") from None


def served_context(chosen: int | None, model_limit: int | None, needed: int | None) -> int | None:
    """The max-model-len every trial serves and the branch ships: the user's --max-model-len, else the
    model's own maximum (None where the model's is unknown: vLLM's default, which is the model's). A
    limit the traffic's longest request (or the quality phase) does not fit is refused."""
    if chosen and needed and needed > chosen:
        raise RunError(f"--max-model-len: {chosen} is below the {needed} tokens the traffic's longest request and "
                       f"the quality phase need (prompt plus max_tokens, rounded up)")
    if chosen and model_limit and chosen > model_limit:
        raise RunError(f"--max-model-len: {chosen} is beyond the model's own maximum of {model_limit}")
    return chosen or model_limit


def load_space(name: str, draft_models: list[str], exact: bool = False,
               max_model_len: int | None = None) -> spaces.Space:
    try:
        space = spaces.load(name)
    except spaces.SpaceError as e:
        raise RunError(str(e)) from None
    if exact:  # every trial, the defaults' included, served batch-invariant
        space = space.with_fixed_env("VLLM_BATCH_INVARIANT", "1")
    if draft_models:
        from agent import drafts

        space = drafts.add_drafts(space, draft_models)
    # the context length the run's traffic needs (agent.traffic.context_length), last as at the start
    if max_model_len:
        space = space.with_fixed_flag("max-model-len", max_model_len)
    return space


def choices(space: spaces.Space) -> dict[str, list]:
    """The categorical choices as this host expands them ({last_cpu} is its own last core): a joining
    host must draw from the same ones, or the shared study's distributions would not match."""
    return {n: [str(c) for c in k.choices] for n, k in space.knobs.items() if k.choices}


def facts(hardware: dict, meter, gate: GateSettings) -> dict:
    """What the planner knows of the host, the traffic and the user's SLOs."""
    from agent.space import host_cpu_flags

    # Whether the cores compute bf16 natively (avx512_bf16 or AMX): without, a bf16 step costs several
    # float32 ones, most where a step verifies a draft (agent.rules.speculation).
    bf16 = bool(host_cpu_flags() & {"avx512_bf16", "amx_bf16"}) if hardware.get("kind") == "cpu" else None
    return {**hardware, "native_bf16": bf16, "concurrency": meter.concurrency,
            "max_tokens": max(r.max_tokens for r in meter.measured(0)),
            "sampled_share": meter.summary()["sampled_share"],
            "slo": {"ttft_p99_ms": gate.slo_ttft_p99_ms, "itl_p99_ms": gate.slo_itl_p99_ms}}


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


class Stopped(RunError):
    """The run or worker was stopped (Ctrl-C, SIGTERM, SIGHUP) and what was in flight recorded: the line
    says how to go on; exit status 130."""

    def __init__(self, message: str):
        super().__init__(message, 130)


def run_space(row: ledgers.Run) -> spaces.Space:
    """The space a run searches, as its row has it: its file (the shipped one of that name where the
    path is another host's), its drafts, its exactness and its context length."""
    space_path = row.space_path if Path(row.space_path).exists() else Path(row.space_path).stem  # the shipped one
    inputs = inputs_of(row)
    return load_space(space_path, inputs.draft_models, exact=settings_of(row).gate.exact,
                      max_model_len=inputs.max_model_len)
