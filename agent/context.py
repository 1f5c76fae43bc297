"""What a run's steps share: its settings, what the run knows (RunContext), and the outside systems
they act on (Seams: the ledger, the engine, the git repository, the display), one of each.

The context holds state, read once; the seams hold no state of the run. A step takes the two and
the row it works on, so no step needs a long parameter list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from agent.gate import GateSettings
from agent.ledger import Ledger, Run
from agent.space import Space
from agent.stats import Noise
from agent.views import RunView
from sandbox.contract import TrialResult, Workload


class Engine(Protocol):
    def evaluate(self, spec: dict, trial_dir: Path, timeout_s: float,
                 on_phase: Callable[[str], None] = ...) -> TrialResult: ...

    def defaults(self, model: str, names: list[str]) -> dict[str, list | None]: ...


# A point -> vLLM's refusal at pre-flight, or None (agent.refusals.preflight_check).
RefusalCheck = Callable[[dict], "str | None"]


@dataclass
class Settings:
    model: str
    workload: str | dict   # a shipped profile's name, or the run's workload as a mapping (its traffic path in it)
    quality: str = "default"
    quality_text: str | None = None   # the user's perplexity text (--quality-text)
    gate: GateSettings = field(default_factory=GateSettings)
    baseline_instances: int = 2    # before the A/A; more follow on a noisy host (GateSettings.noisy)
    repeats: int = 2
    seed: int = 0
    sampler_per_planner: int = 1   # sampler trials between two planner trials
    sampler: str = "tpe"           # tpe, or random (the benchmark's control arm)
    max_trials: int | None = None  # stop after this many candidate trials, even with budget left
    recheck: bool = True           # re-measure an accepted config on a fresh server and held-out prompts
    drift_every: int = 10          # candidate trials between two re-measurements of the baseline (0: never)
    facts: dict = field(default_factory=dict)  # hardware and workload facts for the planner
    # What keeps a night on configs that can run and might win (off only for bench/bench_search.py's
    # "before" arm): vLLM's pre-flight and learned refusals, pruning hopeless benchmarks. One-knob
    # changes in place of TPE's random start-up points are off by default: on the simulated engine
    # they took the search longer to its best (docs/results.md).
    preflight: bool = True
    prune: bool = True
    one_knob_start: bool = False
    home: Path | None = None       # where trial folders go (default: the run's home; a worker on another host: its own)


@dataclass(frozen=True)
class Inputs:
    """What a run's row keeps beside its Settings: the options no step reads from Settings, as given,
    and what preparing the run found. Kept flat beside the settings' own keys (`stored`), read back
    by `inputs_of`; what an older row lacks reads as its default."""
    budget: str = ""                       # --budget as given
    budget_s: float | None = None
    workers: int = 1                       # --workers: trials at once on the coordinator's host
    planner: str = "builtin"               # builtin, off, or a litellm model string
    planner_base_url: str | None = None
    draft_models: list[str] = field(default_factory=list)   # as every trial loads them (a folder each)
    model_given: str | None = None         # --model as given: embedded, a folder or a Hub id
    max_model_len: int | None = None       # the context every trial serves and the branch ships: --max-model-len,
                                           # else the model's own maximum (an older run: its traffic's longest)
    longest_request: int | None = None     # the traffic's longest request in tokens (prompt plus max_tokens)
    choices: dict[str, list] = field(default_factory=dict)  # categorical choices as the coordinator's host has them
    quality_text_hash: str | None = None   # the run's copy of --quality-text, as measured
    traffic: dict | None = None            # the meter's summary (Workload.summary)
    traffic_source: dict | None = None     # the user's --traffic file's summary
    storage: str = "sqlite"                # sqlite or postgresql
    arrivals: str | None = None            # --arrivals, --objective, --num-prompts and --slo-e2e-p99-ms as given
    objective: str | None = None
    num_prompts: int | None = None
    slo_e2e_p99_ms: float | None = None
    capacity: str | None = None            # --capacity: the ladder measured after the first branch (agent.branch_worth)
    price_per_hour: float | None = None    # --price-per-hour and --target-rate: what --capacity's figures cost
    target_rate: float | None = None


def stored(settings: Settings, inputs: Inputs | None = None) -> dict:
    """The settings as the run row keeps them: the dataclass as is, under its own field names (the
    `run` command's options carry the same names), so a resume and every worker read what was used;
    the run's Inputs beside them."""
    return {**asdict(settings), "home": str(settings.home) if settings.home else None,
            **(asdict(inputs) if inputs else {})}


def inputs_of(run: Run) -> Inputs:
    """The run's Inputs from its row."""
    o = run.settings or {}
    return Inputs(**{f.name: o[f.name] for f in fields(Inputs) if f.name in o})


def settings_of(run: Run | RunView) -> Settings:
    """The settings a run was started with, from its row (agent.migrations.m003 rewrote the rows older
    agents kept flat); what a row lacks reads as its default. On another host the model, the home and
    the facts are that host's: the caller replaces them."""
    o = run.settings or {}
    held: dict[str, Any] = o["gate"] if isinstance(o.get("gate"), dict) else {}
    known = {f.name for f in fields(GateSettings)}   # a gate kept by an older agent may lack the newer ones
    kept_gate: dict[str, Any] = {k: v for k, v in held.items() if k in known and k != "noise_prior"}
    if "noise_prior" in held:
        kept_gate["noise_prior"] = Noise(**held["noise_prior"])
    gate = GateSettings(**kept_gate)
    kept = {f.name: o[f.name] for f in fields(Settings) if f.name in o and f.name not in ("gate", "home")}
    return Settings(**{"model": "", "workload": run.workload, **kept, "gate": gate,
                       "home": Path(o["home"]) if o.get("home") else None})


def say_nothing(event: str, **info) -> None:
    pass


@dataclass
class Seams:
    """The outside systems: the ledger (every row), the engine (real servers), the repository (branches;
    None on a worker, which never branches) and the display."""
    ledger: Ledger
    engine: Engine
    repo: Any = None
    say: Callable[..., None] = say_nothing


@dataclass
class RunContext:
    """What the run knows, the same for every step: its row, settings and space, the engine's default
    for every knob (read once), and the pre-flight's check (None where it is off or untrusted)."""
    run: Run
    settings: Settings
    space: Space
    defaults: dict = field(default_factory=dict)
    refusal_check: RefusalCheck | None = None
    worker_id: int | None = None   # this process's row in the run's workers (agent.crew.join): its trials carry it

    @cached_property
    def meter(self) -> Workload:
        """The run's workload, loaded once (OSError or ValueError where its traffic cannot be read)."""
        from sandbox.contract import load_workload

        return load_workload(self.settings.workload)

    @cached_property
    def heldout_points(self) -> int:
        """The goodput rate points the held-out split allows (0 under any other objective): how long
        a held-out phase is, for the budget (agent.budget.heldout_share)."""
        try:
            meter = self.meter
        except (OSError, ValueError):   # a worker that cannot read the run's traffic: held-out phases as long
            return 0                    # as search ones, the estimate before this was kept
        return meter.with_split("heldout").rate_points() if meter.objective == "goodput" else 0

    @property
    def home(self) -> Path:
        """Where this process writes trial folders: the run's home, or a remote worker's own."""
        return Path(self.settings.home or self.run.settings["home"])
