"""The user's traffic, made ready for a night before any server starts: read and checked
(sandbox.traffic), written once as the run's own copy, and measured against the model: its chat
template, each request's length in the model's tokens, and the context length the run serves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sandbox.contract import QualitySet, Request, Traffic, TrafficError, Workload, load_traffic

CONTEXT_STEP = 256   # the context length served is rounded up to a multiple of this


class NoTokenizer(RuntimeError):
    """The model's folder has no tokenizer transformers can load: lengths cannot be counted here."""


class Tokens:
    """The model's tokenizer, loaded once (transformers, from the model's folder: no network)."""

    def __init__(self, model_dir: str, chat_template: str | None = None):
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise NoTokenizer(f"no tokenizer in {model_dir} "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
        self.template = Path(chat_template).read_text() if chat_template else None
        self.limit = model_limit(model_dir)

    def count(self, text: str) -> int:
        """As vLLM's benchmark datasets count: the tokenizer's input ids of the text."""
        return len(self.tokenizer(text).input_ids)

    @property
    def has_template(self) -> bool:
        return bool(self.template or getattr(self.tokenizer, "chat_template", None))

    def prompt_tokens(self, request: Request) -> int:
        if request.endpoint == "completions":
            prompt = request.body["prompt"]
            return len(prompt) if isinstance(prompt, list) else self.count(prompt)
        ids = self.tokenizer.apply_chat_template(request.body["messages"], chat_template=self.template,
                                                 add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)  # type: ignore[call-overload, index]  # a BatchEncoding or a list


def model_limit(model_dir: str) -> int | None:
    """The model's own context limit, from its config.json (None when it names none)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for where in (config, config.get("text_config") or {}):
        if isinstance(where.get("max_position_embeddings"), int):
            return where["max_position_embeddings"]
    return None


def prepare(source: Path, out: Path, count_tokens: Callable[[str], int] | None, multi_turn: bool = False) -> Traffic:
    """Read the user's file (ShareGPT replies counted in the model's tokens; multi_turn: every turn of
    its conversations), and write the run's own copy of its requests as OpenAI bodies: the night
    measures that copy, whatever happens to the source later."""
    found = load_traffic(source, count_tokens=count_tokens, multi_turn=multi_turn)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({**r.body, **({"timestamp": r.timestamp} if r.timestamp is not None else {}),
                         **({"conversation": r.conversation} if r.conversation is not None else {})}) + "\n"
             for r in found.requests]
    out.write_text("".join(lines))
    return found


def check_against_model(requests: list[Request], tokens: Tokens, where: str, greedy_tokens: int = 0) -> int:
    """Every request fits the model, chat requests have a template; returns the longest request
    (prompt plus max_tokens, or plus greedy_tokens where the quality phase sends it greedily, in tokens).
    A request beyond the model's limit is named by its line."""
    longest = 0
    chat = next((r for r in requests if r.endpoint == "chat"), None)
    if chat is not None and not tokens.has_template:
        raise TrafficError(f"{where}:{chat.line}: a chat request (messages), but the model has no chat template: "
                           f"give --chat-template FILE (sandbox/data/traffic/gemma-chat.jinja fits Gemma)")
    for r in requests:
        need = tokens.prompt_tokens(r) + max(r.max_tokens or 0, greedy_tokens)
        if tokens.limit and need > tokens.limit:
            raise TrafficError(f"{where}:{r.line}: {need} tokens (prompt {tokens.prompt_tokens(r)} + max_tokens "
                               f"{r.max_tokens}) is beyond the model's context of {tokens.limit}")
        longest = max(longest, need)
    return longest


def context_length(longest: int, quality: QualitySet, limit: int | None) -> int:
    """The max-model-len the run serves: its longest request or the quality phase's, rounded up, and
    never beyond the model's own limit."""
    need = max(longest, quality.window_tokens + 1, 64 + quality.greedy_max_tokens)
    length = math.ceil(need / CONTEXT_STEP) * CONTEXT_STEP
    return min(length, limit) if limit else length


def with_traffic(workload: Workload, path: Path, chat_template: str | None) -> Workload:
    """The workload's shape (concurrency, requests a phase, warm-ups) on the run's copy of the traffic."""
    return replace(workload, traffic=str(path.resolve()), name=f"{workload.name}+traffic", max_tokens=None,
                   temperature=None, ignore_eos=None, chat_template=chat_template or workload.chat_template)
