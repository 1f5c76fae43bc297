"""Draft models: only listed ones, only with the target's vocabulary, and they reach vLLM's JSON flag."""

import optuna
import pytest

from agent import drafts
from agent import space as spaces
from sandbox.spec import argv_of

TARGET = {"<bos>": 2, "hello": 10, "world": 11}


def read(vocabs):
    return lambda model: vocabs[model]


def test_a_draft_with_another_vocabulary_is_refused_naming_the_first_difference():
    vocabs = {"target": TARGET, "same": dict(TARGET), "other": {**TARGET, "world": 12}}
    drafts.check_vocab("target", "same", read=read(vocabs))
    with pytest.raises(drafts.DraftError, match=r"'other'.*'world': 12 vs 11"):
        drafts.check_vocab("target", "other", read=read(vocabs))


@pytest.mark.engine  # needs the prepared model (2 minutes the first time), as the engine tests do
def test_the_real_tokenizer_of_the_embedded_model_matches_itself_and_a_missing_folder_is_named(
        embedded_model, tmp_path):
    folder = embedded_model
    drafts.check_vocab(str(folder), str(folder))
    with pytest.raises(drafts.DraftError, match="cannot read the tokenizer"):
        drafts.check_vocab(str(folder), str(tmp_path / "nothing"))


def test_listed_drafts_become_choices_and_reach_the_speculative_config_flag():
    space = drafts.add_drafts(spaces.load("vllm-cpu"), ["/models/draft-a", "/models/draft-b"])
    point = {"speculative-config.method": "draft_model", "speculative-config.model": "/models/draft-b",
             "speculative-config.num_speculative_tokens": 3}
    assert space.problems(point) == []
    flags, _ = space.to_flags_env(point)
    assert flags["speculative-config"] == {"method": "draft_model", "model": "/models/draft-b",
                                           "num_speculative_tokens": 3}
    assert space.problems({**point, "speculative-config.model": "/elsewhere"})  # not listed: refused
    # ngram keeps its own lookup knobs; a draft model does not take them.
    assert space.problems({**point, "speculative-config.prompt_lookup_min": 2})
    assert drafts.add_drafts(spaces.load("vllm-cpu"), []).hash == spaces.load("vllm-cpu").hash


def test_a_draft_model_point_keeps_every_layer_in_one_kv_cache_group_and_other_points_do_not():
    """vLLM refuses a draft whose layers fall into two KV cache groups (Gemma 3: sliding-window and
    full attention; seen on the H200), unless the hybrid KV cache manager is off for that server."""
    space = drafts.add_drafts(spaces.load("vllm-gpu"), ["/models/draft"])
    sampled = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    points = [space.sample(sampled.ask()) for _ in range(60)]
    drafting = [p for p in points if p["speculative-config.method"] == "draft_model"]
    others = [p for p in points if p["speculative-config.method"] != "draft_model"]
    assert drafting and others
    for point in drafting:
        assert "--disable-hybrid-kv-cache-manager" in argv_of(space.to_flags_env(point)[0])
    for point in others:
        assert not any("hybrid" in a for a in argv_of(space.to_flags_env(point)[0]))
    # a planner's proposal names its knobs only (agent.loop.candidate runs exactly those): the flag
    # still reaches the server, since the space sets a one-choice knob that applies whoever built the point
    proposed = {"speculative-config.method": "draft_model", "speculative-config.model": "/models/draft"}
    assert "--disable-hybrid-kv-cache-manager" in argv_of(space.to_flags_env(proposed)[0])
    assert space.problems(proposed) == []
