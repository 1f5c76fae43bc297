"""Quality through the served path: perplexity from prompt logprobs, and greedy output ids.

Both go through the same server process that was benchmarked, with the same config: a separate
path could be gamed (a server that scores perplexity text exactly but degrades generation).
Tokenization also comes from the server (/tokenize), so this needs no tokenizer of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx

from sandbox.failures import TrialFailure
from sandbox.traffic import ENDPOINTS
from sandbox.workload import Quality, Workload

# The server clamps -inf logprobs to this value; seeing it means broken numerics, not data.
CLAMPED_LOGPROB = -9999.0


@dataclass
class PerplexityResult:
    ppl: float
    nll: float
    tokens: int
    windows: int


def tokenize(client: httpx.Client, base_url: str, model: str, text: str, special: bool) -> list[int]:
    r = client.post(f"{base_url}/tokenize",
                    json={"model": model, "prompt": text, "add_special_tokens": special})
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def windows(doc_ids: list[list[int]], bos: list[int], window_tokens: int) -> list[list[int]]:
    """Split each document into windows that each start with BOS exactly once."""
    body = window_tokens - len(bos)
    out = []
    for ids in doc_ids:
        for i in range(0, len(ids), body):
            piece = ids[i:i + body]
            if len(bos) + len(piece) >= 2:
                out.append(bos + piece)
    return out


def score_window(client: httpx.Client, base_url: str, model: str, ids: list[int]) -> tuple[float, int]:
    """Negative log-likelihood of ids[1:] given their prefixes, and the count of scored tokens."""
    r = client.post(f"{base_url}/v1/completions", json={
        "model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0,
    })
    if r.status_code != 200:
        raise TrialFailure("request_errors", f"prompt_logprobs request failed: HTTP {r.status_code} {r.text[:300]}")
    plp = r.json()["choices"][0].get("prompt_logprobs")
    if not isinstance(plp, list) or len(plp) != len(ids):
        raise TrialFailure("bad_output", f"prompt_logprobs has {len(plp) if isinstance(plp, list) else plp!r} "
                                         f"entries for {len(ids)} prompt tokens")
    nll = 0.0
    for position in range(1, len(ids)):
        entry = (plp[position] or {}).get(str(ids[position]))
        logprob = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(logprob, (int, float)) or not math.isfinite(logprob) or logprob <= CLAMPED_LOGPROB:
            raise TrialFailure("bad_output", f"logprob of prompt token {position} is {logprob!r}")
        nll -= logprob
    return nll, len(ids) - 1


def perplexity(client: httpx.Client, base_url: str, model: str, quality: Quality) -> PerplexityResult:
    """Token-weighted corpus perplexity over the quality set's documents."""
    bos = tokenize(client, base_url, model, "", special=True)[:1]
    docs = [tokenize(client, base_url, model, d, special=False) for d in quality.documents()]
    total_nll, total_tokens = 0.0, 0
    pieces = windows(docs, bos, quality.window_tokens)
    for ids in pieces:
        nll, n = score_window(client, base_url, model, ids)
        total_nll += nll
        total_tokens += n
    if total_tokens == 0:
        raise TrialFailure("bad_output", "the perplexity text produced no scorable tokens")
    return PerplexityResult(ppl=round(math.exp(total_nll / total_tokens), 5), nll=round(total_nll, 4),
                            tokens=total_tokens, windows=len(pieces))


TOP_K = 5  # logprobs kept per generated position: near-tie margins and the KL divergence from the defaults


def _token_id(key: str) -> str | None:
    """A top-k key as the server sends it with return_tokens_as_token_ids: 'token_id:123' -> '123'.
    Ids, not texts: two tokens that decode to the same text would collapse into one key."""
    prefix, _, value = str(key).partition(":")
    return value if prefix == "token_id" and value.isdigit() else None


def _top_logprobs(choice: dict) -> list[dict[str, float]] | None:
    """Per position, the server's top-k {token id: logprob}; None when it sent none usable."""
    tops = (choice.get("logprobs") or {}).get("top_logprobs")
    if not isinstance(tops, list):
        return None
    out = []
    for top in tops:
        if not isinstance(top, dict):
            return None
        kept = {i: round(float(v), 5) for k, v in top.items()
                if (i := _token_id(k)) is not None and isinstance(v, (int, float)) and math.isfinite(v)}
        if not kept:
            return None
        out.append(kept)
    return out


def _chat_top_logprobs(choice: dict) -> list[dict[str, float]] | None:
    """The chat endpoint's logprobs ({"content": [{"top_logprobs": [{token, logprob}]}]}) in the
    completions' shape: per position, {token id: logprob}."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    return _top_logprobs({"logprobs": {"top_logprobs": [
        {t.get("token"): t.get("logprob") for t in (c.get("top_logprobs") or []) if isinstance(t, dict)}
        for c in content if isinstance(c, dict)]}})


def greedy_requests(quality: Quality, workload: Workload | None) -> list[tuple[str, str, dict]]:
    """(id, endpoint, body) of each greedy comparison: the user's own requests (a sample of the search
    split, their prompts or messages at temperature 0) when the workload has traffic, else the shipped
    prompts. Ids of the user's requests are their hashes, never their text."""
    count = quality.greedy_count or len(quality.greedy_prompts)
    if workload is None or not workload.traffic:
        return [(item["id"], "completions", {"prompt": item["prompt"]}) for item in quality.greedy_prompts[:count]]
    return [(r.key, r.endpoint, {k: r.body[k] for k in ("prompt", "messages") if k in r.body})
            for r in workload.quality_requests(count)]


def greedy_outputs(client: httpx.Client, base_url: str, model: str, quality: Quality,
                   workload: Workload | None = None) -> list[dict]:
    """Greedy completions of the comparison requests: output token ids and each position's top-k logprobs."""
    out = []
    for key, endpoint, body in greedy_requests(quality, workload):
        chat = endpoint == "chat"
        r = client.post(f"{base_url}{ENDPOINTS[endpoint]}", json={
            **body, "model": model, "max_tokens": quality.greedy_max_tokens, "temperature": 0.0,
            "return_token_ids": True, "return_tokens_as_token_ids": True,
            **({"logprobs": True, "top_logprobs": TOP_K} if chat else {"logprobs": TOP_K}),
        })
        if r.status_code != 200:
            raise TrialFailure("request_errors", f"greedy request {key} failed: HTTP {r.status_code} {r.text[:300]}")
        choice = r.json()["choices"][0]
        ids = choice.get("token_ids")
        if not isinstance(ids, list) or not ids:
            raise TrialFailure("bad_output", f"greedy request {key} returned no token ids")
        out.append({"id": key, "token_ids": [int(t) for t in ids],
                    "text": "" if workload is not None and workload.traffic else choice.get("text", ""),
                    "top_logprobs": _chat_top_logprobs(choice) if chat else _top_logprobs(choice)})
    return out
