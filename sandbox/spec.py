"""The trial spec: what one trial runs, read from YAML and checked before anything starts.

The spec is untrusted input (it may come from a planner), so this module is the worker's last
line of defence: flag names are shape-checked and kept away from what the worker owns (model,
host, port, keys), values are scalars or JSON objects of scalars, and environment variables come
only from ENV_ALLOWLIST. Nothing here ever reaches a shell: flags become an argv list.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sandbox.ladders import Ladder
from sandbox.workload import Quality, Workload, load_quality, load_workload

# Environment variables a trial may set for the engine. Everything else in the server's
# environment is chosen by the worker (see server.minimal_env).
ENV_ALLOWLIST = frozenset(
    {
        "VLLM_CPU_OMP_THREADS_BIND",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "VLLM_CPU_ATTN_SPLIT_KV",
        "VLLM_CPU_MOE_PREPACK",
        "OMP_NUM_THREADS",
        "VLLM_USE_V2_MODEL_RUNNER",
        "VLLM_USE_FLASHINFER_SAMPLER",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_USE_AOT_COMPILE",
        "VLLM_BATCH_INVARIANT",
    }
)

# Flags the worker sets itself, or that would let a spec read files, open the server to the
# network or run remote code.
RESERVED_FLAGS = frozenset(
    {
        "model", "host", "port", "uds", "api-key", "served-model-name", "config",
        "trust-remote-code", "allowed-origins", "allowed-methods", "allowed-headers",
        "ssl-keyfile", "ssl-certfile", "ssl-ca-certs", "ssl-cert-reqs", "root-path",
        "middleware", "chat-template", "download-dir", "tokenizer", "hf-token",
        "response-role", "tool-parser-plugin", "logits-processors", "worker-cls",
        "worker-extension-cls", "disable-fastapi-docs", "enable-server-load-tracking",
    }
)

FLAG_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
MAX_VALUE_CHARS = 400
MAX_DEADLINE_S = 86400.0


class SpecError(ValueError):
    """A spec that must not run; the message names the key and the bad value."""


@dataclass(frozen=True)
class Deadlines:
    """Seconds each phase may take before the worker gives up on it."""

    start_s: float = 600.0
    warmup_s: float = 300.0
    bench_s: float | None = None  # None: derived from the workload size
    quality_s: float = 300.0
    teardown_s: float = 30.0


@dataclass(frozen=True)
class StopRules:
    """The agent's rules for cutting a trial short, which the worker obeys and never sets itself: each is
    a figure the run measured, in the objective's unit."""

    prune_below: float | None = None    # stop the benchmark once its figure cannot reach this (bench.Pruner;
    #                                     under goodput, in requests/s: goodput.search's give_up_below)
    quality_above: float | None = None  # measure quality only when the benchmark's figure is above this
    goodput_start: float | None = None  # under goodput: the search's start (the defaults' goodput, or a
    #                                     candidate's own for its held-out instance)


@dataclass(frozen=True)
class TrialSpec:
    model: str
    flags: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    workload: Workload = field(default_factory=lambda: load_workload("smoke"))
    quality: Quality | None = field(default_factory=load_quality)  # None: no quality phase (a speed re-check)
    heldout_bench: bool = False  # after the benchmark, measure the held-out prompts on the same server
    deadlines: Deadlines = field(default_factory=Deadlines)
    trust_remote_code: bool = False
    repeats: int = 1  # measured phases on the same server; the result reports their median
    stop_rules: StopRules = field(default_factory=StopRules)   # the agent's, obeyed here
    ladder: Ladder | None = None  # a ladder of loads instead of the trial's phases (agent capacity)

    def server_args(self) -> list[str]:
        """The flags as an argv tail, in the spec's order."""
        return argv_of(self.flags)


@dataclass(frozen=True)
class SpecFile:
    """A trial's spec as the agent writes it into the trial's folder: plain values, the one shape of
    the file. `from_dict` reads it back, checked, as the TrialSpec the worker runs."""
    model: str
    flags: dict[str, Any]
    env: dict[str, str]
    workload: str | dict[str, Any]   # a shipped profile's name, or a workload as a mapping
    quality: str = "default"         # a quality set's name, or "none": no quality phase
    quality_text: str | None = None
    repeats: int = 1
    heldout_bench: bool = False
    stop_rules: StopRules = field(default_factory=StopRules)
    ladder: Ladder | None = None

    @classmethod
    def speed_only(cls, model: str, flags: dict, env: dict, meter: Workload, repeats: int,
                   ladder: Ladder | None = None) -> SpecFile:
        """A config measured for speed alone on a workload already loaded (a held-out instance, a
        verify round, a capacity ladder): the workload inline, as loaded."""
        return cls(model, flags, env, inline(meter), "none", repeats=repeats, ladder=ladder)

    def as_dict(self) -> dict[str, Any]:
        rules = {k: v for k, v in asdict(self.stop_rules).items() if v is not None}
        return {"model": self.model, "flags": self.flags, "env": self.env, "workload": self.workload,
                "quality": self.quality, "repeats": self.repeats,
                **({"quality_text": self.quality_text} if self.quality_text else {}),
                **({"stop_rules": rules} if rules else {}),
                **({"heldout_bench": True} if self.heldout_bench else {}),
                **({"ladder": self.ladder.as_dict()} if self.ladder else {})}


def inline(meter: Workload) -> dict[str, Any]:
    """A loaded workload as the mapping a spec carries (its traffic's path in it)."""
    return {k: getattr(meter, k) for k in meter.__dataclass_fields__}


def argv_of(flags: dict) -> list[str]:
    """vLLM's command-line form of validated flags (the server and the pre-flight use this one)."""
    argv: list[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")
        elif isinstance(value, dict):
            argv += [f"--{name}", json.dumps(value, sort_keys=True)]
        else:
            argv += [f"--{name}", str(value)]
    return argv


def _check_scalar(where: str, value: Any) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS or any(c in value for c in "\0\n\r"):
            raise SpecError(f"{where}: value {value[:60]!r} is too long or holds control characters")
        return
    raise SpecError(f"{where}: value {value!r} is not a string, number or boolean")


def check_flags(flags: Any, trust_remote_code: bool = False, where: str = "flags") -> dict[str, Any]:
    if not isinstance(flags, dict):
        raise SpecError(f"{where}: expected a mapping of flag names to values, got {flags!r}")
    for name, value in flags.items():
        key = f"{where}.{name}"
        if not isinstance(name, str) or not FLAG_NAME.match(name):
            raise SpecError(f"{where}: flag name {name!r} is not a vLLM flag name (like max-num-seqs)")
        if name in RESERVED_FLAGS and not (name == "trust-remote-code" and trust_remote_code):
            raise SpecError(f"{key}: the worker sets --{name} itself; a trial may not")
        if isinstance(value, dict):
            for sub, subvalue in value.items():
                if not isinstance(sub, str):
                    raise SpecError(f"{key}: key {sub!r} is not a string")
                _check_scalar(f"{key}.{sub}", subvalue)
        else:
            _check_scalar(key, value)
    return dict(flags)


def check_env(env: Any, where: str = "env") -> dict[str, str]:
    if not isinstance(env, dict):
        raise SpecError(f"{where}: expected a mapping of variable names to values, got {env!r}")
    out = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name) or name not in ENV_ALLOWLIST:
            raise SpecError(f"{where}.{name}: not an allowed engine variable ({', '.join(sorted(ENV_ALLOWLIST))})")
        _check_scalar(f"{where}.{name}", value)
        if isinstance(value, (dict, bool)) or value is None:
            raise SpecError(f"{where}.{name}: value {value!r} must be a string or number")
        out[name] = str(value)
    return out


def from_dict(raw: Any, source: str = "spec") -> TrialSpec:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    known = {"model", "flags", "env", "workload", "quality", "deadlines", "trust_remote_code", "repeats",
             "heldout_bench", "stop_rules", "quality_text", "ladder"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    model = raw.get("model")
    if not isinstance(model, str) or not model or "\n" in model or model.startswith("-"):
        raise SpecError(f"{source}.model: {model!r} is not a model path or Hugging Face id")
    trust = raw.get("trust_remote_code", False)
    if not isinstance(trust, bool):
        raise SpecError(f"{source}.trust_remote_code: {trust!r} is not true or false")
    repeats = raw.get("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= 20:
        raise SpecError(f"{source}.repeats: {repeats!r} is not a whole number from 1 to 20")
    heldout = raw.get("heldout_bench", False)
    if not isinstance(heldout, bool):
        raise SpecError(f"{source}.heldout_bench: {heldout!r} is not true or false")
    given = raw.get("stop_rules")
    stop_rules = _stop_rules({} if given is None else given, f"{source}.stop_rules")
    quality_text = raw.get("quality_text")
    if quality_text is not None and not isinstance(quality_text, str):
        raise SpecError(f"{source}.quality_text: {quality_text!r} is not a file path")
    deadlines = raw.get("deadlines") or {}
    try:
        deadlines = Deadlines(**{k: float(v) for k, v in deadlines.items()})
    except (TypeError, ValueError, AttributeError) as e:
        raise SpecError(f"{source}.deadlines: {deadlines!r} is not a mapping of phase_s: seconds ({e})") from None
    for f in fields(Deadlines):   # a night's longest phase is hours, not days
        value = getattr(deadlines, f.name)
        if value is not None and not 0 < value <= MAX_DEADLINE_S:
            raise SpecError(f"{source}.deadlines.{f.name}: {value!r} is not a number of seconds above 0 and at most "
                            f"{MAX_DEADLINE_S:.0f}")
    try:
        ladder = None if raw.get("ladder") is None else Ladder.from_dict(raw["ladder"], f"{source}.ladder")
        workload = load_workload(raw.get("workload", "smoke"))
        quality = None if raw.get("quality") == "none" else load_quality(raw.get("quality", "default"), quality_text)
        workload.check(repeats, heldout=heldout)   # enough distinct requests that no server is sent one twice
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"{source}: {e}") from None
    return TrialSpec(
        model=model,
        flags=check_flags(raw.get("flags") or {}, trust, f"{source}.flags"),
        env=check_env(raw.get("env") or {}, f"{source}.env"),
        workload=workload,
        quality=quality,
        deadlines=deadlines,
        trust_remote_code=trust,
        repeats=repeats,
        heldout_bench=heldout,
        stop_rules=stop_rules,
        ladder=ladder,
    )


def _stop_rules(raw: Any, source: str) -> StopRules:
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: {raw!r} is not a mapping of rule: figure")
    known = [f.name for f in fields(StopRules)]
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise SpecError(f"{source}: unknown rule {unknown[0]!r} (known: {', '.join(known)})")
    for key in ("prune_below", "quality_above"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < 1e7):
            raise SpecError(f"{source}.{key}: {value!r} is not a figure from 0 to 1e7")
    start = raw.get("goodput_start")
    if start is not None and (isinstance(start, bool) or not isinstance(start, (int, float)) or not 0 < start <= 1000):
        raise SpecError(f"{source}.goodput_start: {start!r} is not a request rate above 0 and at most 1000")
    return StopRules(**{k: float(v) for k, v in raw.items() if v is not None})


def load(path: str | Path) -> TrialSpec:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    return from_dict(raw, str(path))
