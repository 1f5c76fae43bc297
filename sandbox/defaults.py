"""The engine's own defaults for the knobs a space tunes, read from vLLM once per run.

    python -m sandbox.defaults MODEL NAME [NAME ...]     -> JSON {name: [equivalent values] or null}

A knob set to its engine default is no change, so it cannot break a lossless claim (a sampled
point names every knob, dtype and kv-cache-dtype included). The values come from vLLM's
EngineArgs dataclass and its table of environment variables, with no device touched. null means
vLLM leaves the value to be resolved at start (from the device or the model), so any value set
counts as a change. `dtype: auto` is also the model's own dtype, read from its config.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path


def engine_defaults(model: str, names: list[str]) -> dict[str, list | None]:
    from vllm import envs
    from vllm.engine.arg_utils import EngineArgs

    fields = {}
    for f in dataclasses.fields(EngineArgs):
        if f.default is not dataclasses.MISSING:
            fields[f.name.replace("_", "-")] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name.replace("_", "-")] = f.default_factory()
    out: dict[str, list | None] = {}
    for name in names:
        flag, _, key = name.partition(".")
        if name in envs.environment_variables:
            saved = os.environ.pop(name, None)
            try:
                value = envs.environment_variables[name]()
            finally:
                if saved is not None:
                    os.environ[name] = saved
            out[name] = None if value is None else [value]
        elif key:  # a JSON flag's key: the flag's absence is its default (speculative-config.method: none)
            out[name] = ["none"] if fields.get(flag, "absent") is None and key == "method" else None
        elif fields.get(flag) is None:
            out[name] = None
        else:
            out[name] = [fields[flag]]
    if out.get("dtype") == ["auto"]:
        config = Path(model) / "config.json"
        if config.is_file():
            raw = json.loads(config.read_text())
            own = raw.get("torch_dtype") or raw.get("dtype") or (raw.get("text_config") or {}).get("torch_dtype")
            if own:
                out["dtype"] = ["auto", str(own)]
    return out


if __name__ == "__main__":
    print(json.dumps(engine_defaults(sys.argv[1], sys.argv[2:]), default=str))
