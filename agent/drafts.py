"""Draft models for speculative decoding: only those the user lists, each checked against the target.

A draft model proposes tokens that the target verifies, so both must split text into the same
tokens with the same ids; a draft with another vocabulary would be refused by vLLM at best and
waste every draft at worst. The check runs once, before the run starts, and names the first
token that differs.
"""

from __future__ import annotations

from agent.space import Knob, Space

METHOD = "speculative-config.method"


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
    return space.with_knob(Knob(name="speculative-config.model", type="categorical", lossless=True,
                                choices=tuple(drafts), when={METHOD: "draft_model"}))
