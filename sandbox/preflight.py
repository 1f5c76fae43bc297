"""Pre-flight: vLLM's own argument parser and config classes judge candidates before any server starts.

    python -m sandbox.preflight MODEL
        stdin:  one JSON object per line, {"flags": {...}, "env": {...}} (flags as a trial spec has them),
                with "effective": true to have the engine config vLLM built sent back
        stdout: one JSON object per line, {"ok": true} or {"ok": false, "message": "<vLLM's root cause>"};
                with "effective": {"section.field": "repr", ...} when asked (see `effective`)

What a server start would do first, without it: parse the command line as `vllm serve` does,
run its quick checks, and build the engine's whole config (pydantic validation of every section,
the model's config.json read, the device queried). No weights are loaded and no device memory is
taken, so one process answers many points, milliseconds each once vLLM is imported. A refusal
here is one the server would raise at start; a pass does not promise the start works (kernel and
backend checks happen only when the engine initialises).
"""

from __future__ import annotations

import contextlib
import enum
import io
import json
import os
import sys
import time
import traceback

from sandbox.failures import root_cause
from sandbox.spec import argv_of


def _vllm():
    try:   # vLLM 0.2x keeps the serve CLI under entrypoints.openai; later versions under launchers
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.engine.arg_utils import AsyncEngineArgs
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined, no-redef]  # vLLM before 0.11
    return make_arg_parser, validate_parsed_serve_args, AsyncEngineArgs, FlexibleArgumentParser


def effective(config) -> dict[str, str]:
    """The engine config vLLM built, flattened to its plain fields: {"scheduler_config.max_num_seqs":
    "8", ...}. What a knob changed is read here, after vLLM's own defaults and overrides (a flag it
    parses but then ignores or overrides leaves this unchanged)."""
    plain = (bool, int, float, str, type(None), enum.Enum)

    def shown(value) -> str | None:   # plain values, and short reprs that are not an object's address
        if isinstance(value, plain) or (isinstance(value, (list, tuple)) and len(value) <= 64
                                        and all(isinstance(v, plain) for v in value)):
            return repr(value)
        text = repr(value)
        return text if len(text) <= 200 and " at 0x" not in text else None   # torch.bfloat16, say

    out: dict[str, str] = {}
    for section, sub in vars(config).items():
        if isinstance(sub, plain):
            out[section] = repr(sub)
            continue
        for name, value in (vars(sub).items() if hasattr(sub, "__dict__") else ()):
            if (text := shown(value)) is not None:
                out[f"{section}.{name}"] = text
    return out


def check(model: str, flags: dict, env: dict, vllm=None, with_config: bool = False) -> dict:
    make_arg_parser, validate, engine_args, parser_class = vllm or _vllm()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    said = io.StringIO()
    started = time.monotonic()
    try:
        with contextlib.redirect_stderr(said):   # argparse writes its refusal there before exiting
            args = make_arg_parser(parser_class()).parse_args(["--model", model, *argv_of(flags)])
        validate(args)
        config = engine_args.from_cli_args(args).create_engine_config()
        return {"ok": True, "seconds": round(time.monotonic() - started, 3),
                **({"effective": effective(config)} if with_config else {})}
    except SystemExit:
        message = said.getvalue().strip().splitlines()[-1:] or ["the argument parser exited"]
        return {"ok": False, "message": message[0][:600], "seconds": round(time.monotonic() - started, 3)}
    except Exception as e:  # noqa: BLE001 - any refusal of vLLM's is the answer, not a crash of ours
        text = "".join(traceback.format_exception_only(e))
        return {"ok": False, "message": root_cause(text) or text.strip()[:600],
                "seconds": round(time.monotonic() - started, 3)}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(model: str) -> int:
    # vLLM logs to stdout: answers go to a private copy of it, everything else to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.monotonic()
    vllm = _vllm()
    answers.write(json.dumps({"ready": True, "import_s": round(time.monotonic() - started, 2)}) + "\n")
    answers.flush()
    for line in sys.stdin:
        try:
            point = json.loads(line)
            answer = check(model, point.get("flags") or {}, point.get("env") or {}, vllm, bool(point.get("effective")))
        except ValueError as e:
            answer = {"ok": None, "message": f"not a point: {e}"}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
