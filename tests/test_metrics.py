"""Prometheus metrics: gauges sampled during the phase, counters as differences."""

from sandbox import metrics

BEFORE = """# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
"""
AFTER = BEFORE.replace("} 2.0", "} 5.0").replace("} 10.0", "} 110.0").replace("} 40.0", "} 440.0") \
    .replace("} 20.0", "} 320.0")


def test_counters_are_differences_and_acceptance_is_derived():
    sampler = metrics.Sampler("http://unused", kv_usage=[0.1, 0.4, 0.2], waiting=[0, 3], running=[1, 1])
    out = metrics.summarize(metrics.parse(BEFORE), metrics.parse(AFTER), sampler)
    assert out["preemptions"] == 3.0
    assert out["spec_acceptance_rate"] == 0.75          # 300 accepted of 400 drafted
    assert out["spec_mean_acceptance_length"] == 4.0    # 1 + 300 / 100 drafts
    assert out["kv_cache_usage_max"] == 0.4 and out["requests_waiting_max"] == 3
    assert out["prefix_cache_hits"] is None             # absent metrics stay unknown, not zero


def test_labels_are_summed():
    text = ('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{a="1"} 2\n'
            'vllm:num_requests_waiting{a="2"} 3\n')
    assert metrics.parse(text)["vllm:num_requests_waiting"] == 5.0


def test_lookup_hits_counts_the_words_prompt_lookup_would_draft_right():
    from sandbox.bench import lookup_hits

    loop = "the cat sat on the mat. " * 6
    hits, words = lookup_hits("Write about cats.", loop)
    # a greedy loop of 6 words, 6 times: all but its first pass and the two words that first close it
    assert (hits, words) == (28, 36)
    assert lookup_hits("Write about cats.", "Quiet rivers bend where old stones gather moss") == (0, 8)
    # the prompt's own bigram "about cats" followed by "and": an answer that copies it scores that word
    assert lookup_hits("tell me about cats and dogs", "about cats and") == (1, 3)
    assert lookup_hits("", "") == (0, 0)
    # the first answer word continues the prompt's last bigram as its earlier occurrence did
    assert lookup_hits("x y z w x y", "z") == (1, 1)
