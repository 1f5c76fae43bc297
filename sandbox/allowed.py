"""What a trial may set: an allow-list of flags, JSON sub-keys and environment variables with their
types and bounds, which the agent derives from the run's space (agent.space.Space.allowed) and hands
the worker as a file and its hash on the worker's command line, never inside the spec. The spec is
checked against it before anything starts; a spec check alone (sandbox.spec) only keeps away what the
worker owns, and a deny-list lets through what nobody thought of.

Beside the rules, `fixed` names the flags and variables the space fixes (a spec must carry them), and
`inputs` holds the run's own choices for every other key a spec has: the model, trust_remote_code,
repeats, the workloads' hashes (traffic, load and chat template; search and held-out splits) and the
quality sets' hashes (None: no quality phase). check_spec refuses a spec whose key differs from them;
deadlines and stop rules are the agent's per-trial instructions, typed and bounded by sandbox.spec.

A rule is one of: {"choices": [...]} (the value exactly, of the same type), {"int": [low, high]},
{"float": [low, high]}, {"bool": true}, {"keys": {sub: rule}} (a JSON flag: only these keys). An
environment variable's value is a string; an int or float rule reads it as one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from sandbox.spec import SpecError, TrialSpec

INT = re.compile(r"^-?\d+$")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load(path: Path, sha: str) -> dict:
    """The rules in `path`, whose hash must be `sha` (the agent's, given on the command line)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"--allowed {path}: cannot read ({e.strerror})") from None
    if digest(text) != sha:
        raise SpecError(f"--allowed {path}: its hash is {digest(text)}, not {sha}: the allow-list was changed")
    rules = json.loads(text)
    if (not isinstance(rules, dict) or not isinstance(rules.get("flags"), dict)
            or not isinstance(rules.get("env"), dict) or not isinstance(rules.get("inputs"), dict)):
        raise SpecError(f"--allowed {path}: not an allow-list (flags, env and the run's inputs)")
    return rules


def check_spec(rules: dict, spec: TrialSpec, source: str = "spec") -> None:
    """The whole spec against the run's allow-list: its flags and variables by their rules, the space's
    fixed ones present, and every other key the run's own (SpecError naming the first that is not)."""
    check(rules, spec.flags, spec.env, source)
    for part, given in (("flags", spec.flags), ("env", spec.env)):
        for name in rules.get("fixed", {}).get(part, []):
            if name not in given:
                raise SpecError(f"{source}.{part}: {name} is fixed by the run's space and missing")
    inputs = rules["inputs"]
    quality = spec.quality.hash if spec.quality else None
    quality_name = spec.quality.name if spec.quality else "none"
    for key, value, allowed_values, shown in (
            ("model", spec.model, [inputs.get("model")], repr(spec.model)),
            ("trust_remote_code", spec.trust_remote_code, [inputs.get("trust_remote_code", False)],
             repr(spec.trust_remote_code)),
            ("repeats", spec.repeats, [inputs.get("repeats")], repr(spec.repeats)),
            ("workload", spec.workload.hash, inputs.get("workloads", []),
             f"{spec.workload.name} (hash {spec.workload.hash}: traffic, load and chat template)"),
            ("quality", quality, inputs.get("quality", []), f"{quality_name} (hash {quality}: set and text)")):
        if value not in allowed_values:
            raise SpecError(f"{source}.{key}: {shown} is not the run's own")


def check(rules: dict, flags: dict, env: dict, source: str = "spec") -> None:
    """Raise SpecError naming the first flag, sub-key or variable the rules do not allow, with its value."""
    for part, given, what in (("flags", flags, "--{} is not a flag"), ("env", env, "{} is not a variable")):
        for name, value in given.items():
            rule = rules[part].get(name)
            why = f"{what.format(name)} of the run's space" if rule is None else _refused(rule, value, part == "env")
            if why:
                raise SpecError(f"{source}.{part}.{name}: {why}")


def _refused(rule: dict, value: Any, as_text: bool) -> str | None:
    if "keys" in rule:
        if not isinstance(value, dict):
            return f"{value!r} is not a JSON object"
        for sub, v in value.items():
            if sub not in rule["keys"]:
                return f"key {sub!r} is not one the run's space sets"
            if why := _refused(rule["keys"][sub], v, as_text):
                return f"{sub}: {why}"
        return None
    if "choices" in rule:
        ok = any(type(c) is type(value) and c == value for c in rule["choices"])
        return None if ok else f"{value!r} is not one of {rule['choices']}"
    if "bool" in rule:
        return None if isinstance(value, bool) or (as_text and value in ("True", "False")) else \
            f"{value!r} is not true or false"
    kind = "int" if "int" in rule else "float"
    low, high = rule[kind]
    if as_text:
        if not isinstance(value, str) or (kind == "int" and not INT.match(value)):
            return f"{value!r} is not a {'whole number' if kind == 'int' else 'number'}"
        try:
            value = int(value) if kind == "int" else float(value)
        except ValueError:
            return f"{value!r} is not a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "int" and not isinstance(value, int)):
        return f"{value!r} is not a {'whole number' if kind == 'int' else 'number'}"
    if not math.isfinite(value) or not low <= value <= high:
        return f"{value!r} is outside [{low}, {high}]"
    return None
