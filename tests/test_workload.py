"""Workload profiles, prompt splits and the hash that ties every figure to its meter."""

import pytest

from sandbox.workload import DATA, load_quality, load_workload, split_prompts


PROFILES = ["challenge", "challenge-short", "challenge-cpu", "throughput", "throughput-cpu", "smoke"]


@pytest.mark.parametrize("name", PROFILES)
def test_shipped_profiles_load_greedy_with_their_prompt_count(name):
    workload = load_workload(name)
    assert len(workload.prompts()) == workload.num_prompts
    assert workload.temperature == 0.0 and workload.ignore_eos


def test_every_profile_and_split_has_its_own_hash():
    hashes = [load_workload(n).with_split(s).hash for n in PROFILES for s in ("search", "heldout")]
    assert len(set(hashes)) == len(hashes) == 2 * len(PROFILES)


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
    assert len(search) == 160 and len(held) == 48 and not search & held


def test_warmups_never_repeat_a_measured_prompt_in_shipped_profiles():
    for path in (DATA / "workloads").glob("*.yaml"):
        w = load_workload(path.stem)
        assert not set(w.warmup_prompts()) & set(w.prompts()), path.stem


@pytest.mark.parametrize("bad, needle", [
    ({"name": "x"}, "missing field"),
    ({**load_workload("smoke").__dict__, "concurrency": 0}, "concurrency"),
    ({**load_workload("smoke").__dict__, "concurrency": "4"}, "concurrency"),
    ({**load_workload("smoke").__dict__, "prompt_split": "train"}, "train"),
    ({**load_workload("smoke").__dict__, "colour": 1}, "colour"),
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
