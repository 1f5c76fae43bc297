"""The LLM planner: any litellm model proposes changes; its reply is data, checked strictly.

The prompt carries the space, the history as a compact table and the failures. The reply must be
JSON: {"proposals": [{"params": {...}, "rationale": "...", "expected": "..."}]}. Anything else in
it (unknown knobs, values out of range, extra fields, shell text, variables outside the space) is
rejected and recorded, never passed on. Transient errors are retried with backoff; when the model
stays unreachable or keeps answering badly, the run goes on with the built-in planner and says so.
API keys are read by litellm from the environment and never written anywhere by us.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.planner import BuiltinPlanner, Narrowing, Planner, Proposal
from agent.space import Space
from agent.states import Status
from agent.views import RunView, TrialView

MAX_TEXT = 300
MAX_REPLY = 64_000      # characters; a reply this long is not a plan, and decoding it costs memory
FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
SYSTEM = ("You tune vLLM serving configurations. Reply with JSON only, exactly "
          '{"proposals": [{"params": {<knob>: <value>}, "rationale": "<one line>", "expected": "<one line>"}]}, '
          'optionally with "narrow": [{"knob": <numeric knob>, "low": <n>, "high": <n>, "rationale": "<one line>"}] '
          "to keep the sampler to a range the history shows is worth searching. "
          "Use only knobs and values from the space. Knobs you leave out stay at engine defaults.")


class PlannerUnavailable(RuntimeError):
    pass


@dataclass
class Call:
    """One exchange with the model, as the ledger records it."""

    model: str
    prompt: str
    response: str | None = None
    error: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float = 0.0
    accepted: int = 0
    rejected: list = field(default_factory=list)


def _clean_text(value, name: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT or any(ord(c) < 32 for c in value):
        raise ValueError(f"{name} is not a single line of at most {MAX_TEXT} characters")
    return value


def parse(text: str, space: Space, k: int) -> tuple[list[Proposal], list[str]]:
    """Proposals that are valid points of the space, and why each other part was rejected."""
    proposals, _, rejected = parse_plan(text, space, k)
    return proposals, rejected


def parse_narrowings(data: dict, space: Space) -> tuple[list[Narrowing], list[str]]:
    out, rejected = [], []
    items = data.get("narrow", [])
    if not isinstance(items, list):
        return [], ["narrow is not a list"]
    for i, item in enumerate(items[:8]):
        try:
            if not isinstance(item, dict) or set(item) != {"knob", "low", "high", "rationale"}:
                raise ValueError("needs knob, low, high and rationale, and nothing else")
            knob = space.knobs.get(item["knob"]) if isinstance(item["knob"], str) else None
            if knob is None or knob.type not in ("int", "float"):
                raise ValueError(f"{item['knob']!r} is not a numeric knob of the space")
            for key in ("low", "high"):
                if (why := knob.check(item[key])) is not None:
                    raise ValueError(f"{key}: {why}")
            space.narrowed(knob.name, item["low"], item["high"])   # raises when the range is empty or outside
            out.append(Narrowing(knob.name, item["low"], item["high"], _clean_text(item["rationale"], "rationale")))
        except (ValueError, TypeError) as e:
            rejected.append(f"narrow {i}: {str(e)[:300]}")
    return out, rejected


def parse_plan(text: str, space: Space, k: int) -> tuple[list[Proposal], list[Narrowing], list[str]]:
    """Whatever the reply holds, this returns: a malformed reply of any kind is a rejection."""
    if not isinstance(text, str):
        return [], [], [f"reply is not text: {type(text).__name__}"]
    if len(text) > MAX_REPLY:
        return [], [], [f"reply is {len(text)} characters, more than {MAX_REPLY}: {text[:120]!r}"]
    try:
        data = json.loads(FENCE.sub("", text.strip()))
    except RecursionError:   # nesting deep enough for the decoder to give up is still a bad reply
        return [], [], [f"reply nests too deeply to decode: {text[:120]!r}"]
    except (ValueError, TypeError):
        return [], [], [f"reply is not JSON: {text[:120]!r}"]
    try:
        return _plan(data, space, k)
    except Exception as e:  # noqa: BLE001 - a reply is data: no shape of it may end the run
        return [], [], [f"reply could not be read: {type(e).__name__}: {str(e)[:200]}"]


def _plan(data, space: Space, k: int) -> tuple[list[Proposal], list[Narrowing], list[str]]:
    if (not isinstance(data, dict) or "proposals" not in data or set(data) - {"proposals", "narrow"}
            or not isinstance(data["proposals"], list)):
        return [], [], ["reply is not an object with a 'proposals' list (and optionally 'narrow'), nothing else"]
    narrowings, rejected = parse_narrowings(data, space)
    out = []
    for i, item in enumerate(data["proposals"][:k]):
        try:
            if not isinstance(item, dict) or set(item) - {"params", "rationale", "expected"} or "params" not in item:
                raise ValueError("needs params, rationale and expected, and nothing else")
            params = item["params"]
            if not isinstance(params, dict) or not params:
                raise ValueError("params is not a non-empty object")
            params = space.normal(params)   # a reply's 32.0 for an int knob is 32; a wrong type stays wrong
            if problems := space.problems(params):
                raise ValueError("; ".join(problems))
            out.append(Proposal(dict(params), _clean_text(item.get("rationale", ""), "rationale"),
                                _clean_text(item.get("expected", ""), "expected")))
        except (ValueError, TypeError) as e:   # TypeError: a value of a type no check expected
            rejected.append(f"proposal {i}: {str(e)[:300]}")
    return out, narrowings, rejected


def history_table(history: list[TrialView]) -> str:
    lines = ["number | source | status | search_ratio | ppl_change | agreement | gate | params | failure or metrics"]
    for t in history[-40:]:
        detail = (f"{t.failure_class}: {(t.failure_message or '')[:160]}" if t.status != Status.OK
                  else json.dumps({k: v for k, v in (t.metrics or {}).items() if v is not None and k != "samples"}))
        lines.append(f"{t.number} | {t.source} | {t.status} | {t.search_ratio} | {t.ppl_change} | {t.agreement} | "
                     f"{t.gate_passed} | {json.dumps(t.params)} | {detail}")
    return "\n".join(lines)


def prompt(space: Space, history: list[TrialView], facts: dict, k: int) -> str:
    knobs = {n: {"type": kn.type, "low": kn.low, "high": kn.high, "choices": list(kn.choices) or None,
                 "lossless": kn.lossless, "when": kn.when or None} for n, kn in space.knobs.items()}
    rules = [f"{r.require} when {r.when or 'always'}: {r.reason}" for r in space.rules]
    return (f"Engine: {space.engine} {space.engine_version}. Facts: {json.dumps(facts)}.\n"
            f"Space (knob -> type and bounds):\n{json.dumps(knobs)}\nRules:\n" + "\n".join(rules) +
            f"\nHistory (search_ratio is relative to engine defaults; gate False means rejected):\n"
            f"{history_table(history)}\nPropose {k} new configs likely to raise search_ratio "
            f"without raising perplexity.")


SECRET_NAMES = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)$", re.I)
SECRET_IN_URL = re.compile(r"(?i)((?:api[_-]?key|key|token|secret|password|sig)=)[^&\s'\"]+|(//[^/\s:@]+:)[^@\s/]+(@)")


def redact(text: str) -> str:
    """A provider's error as it may be recorded: the values of this process's secret variables (an API key
    the provider echoes back), credentials in URLs and key=... query parameters replaced by ***."""
    for name, value in os.environ.items():
        if SECRET_NAMES.search(name) and len(value) >= 8 and value in text:
            text = text.replace(value, "***")
    return SECRET_IN_URL.sub(lambda m: f"{m.group(1)}***" if m.group(1) else f"{m.group(2)}***{m.group(3)}", text)


class LLMPlanner:
    """Planner backed by litellm.completion (injectable for tests)."""

    def __init__(self, model: str, base_url: str | None = None, completion: Callable | None = None,
                 record: Callable[[Call], None] = lambda call: None, retries: int = 3, timeout_s: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep):
        self.name = f"llm:{model}"
        self.model, self.base_url, self.retries, self.timeout_s = model, base_url, retries, timeout_s
        self.completion, self.record, self.sleep = completion, record, sleep
        self.pending: list[Narrowing] = []

    def _complete(self, **kwargs):
        if self.completion is None:
            import litellm  # imported only when an LLM planner is configured (supply-chain care)

            self.completion = litellm.completion
        return self.completion(**kwargs)

    def propose(self, space: Space, run: RunView, history: list[TrialView], facts: dict, k: int) -> list[Proposal]:
        text = prompt(space, history, facts, k)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        last_error = "no attempt"
        for attempt in range(self.retries):
            call = Call(model=self.model, prompt=text)
            started = time.monotonic()
            try:
                reply = self._complete(model=self.model, messages=messages, api_base=self.base_url,
                                       timeout=self.timeout_s, temperature=0.0, num_retries=0)
                call.response = reply.choices[0].message.content or ""
                usage = getattr(reply, "usage", None)
                call.input_tokens = getattr(usage, "prompt_tokens", None)
                call.output_tokens = getattr(usage, "completion_tokens", None)
                call.cost_usd = (getattr(reply, "_hidden_params", None) or {}).get("response_cost")
            except Exception as e:  # noqa: BLE001 - litellm maps every provider error to its own classes
                call.error = redact(f"{type(e).__name__}: {e}")[:300]   # a provider may echo the key or URL
                call.latency_s = round(time.monotonic() - started, 3)
                self.record(call)
                last_error = call.error
                self.sleep(min(30.0, 2.0 ** attempt))
                continue
            call.latency_s = round(time.monotonic() - started, 3)
            proposals, narrowings, call.rejected = parse_plan(call.response, space, k)
            call.accepted = len(proposals)
            self.pending = narrowings
            self.record(call)
            if proposals:
                return proposals
            last_error = "; ".join(call.rejected)[:300] or "no proposals"
        raise PlannerUnavailable(f"{self.name}: {last_error}")

    def narrow(self, space: Space, history: list[TrialView]) -> list[Narrowing]:
        """The ranges the last reply asked for (validated with it), once."""
        out, self.pending = self.pending, []
        return out


class FallbackPlanner:
    """The configured planner while it works; the built-in one after it fails `patience` times."""

    def __init__(self, primary: Planner, say: Callable = lambda event, **info: None, patience: int = 2):
        self.primary, self.builtin, self.say, self.patience, self.failures = primary, BuiltinPlanner(), say, patience, 0
        self.name = primary.name

    def propose(self, space: Space, run: RunView, history: list[TrialView], facts: dict, k: int) -> list[Proposal]:
        if self.failures < self.patience:
            try:
                proposals = self.primary.propose(space, run, history, facts, k)
                self.failures = 0
                return proposals
            except PlannerUnavailable as e:
                self.failures += 1
                self.say("planner_fallback", planner=self.primary.name, reason=str(e),
                         permanent=self.failures >= self.patience)
        return self.builtin.propose(space, run, history, facts, k)

    def narrow(self, space: Space, history: list[TrialView]) -> list[Narrowing]:
        planner = self.primary if self.failures < self.patience else self.builtin
        return planner.narrow(space, history)
