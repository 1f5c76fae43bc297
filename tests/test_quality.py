"""Perplexity windows: one BOS per window, every other token scored exactly once."""

from sandbox.quality import windows


def test_each_window_starts_with_one_bos_and_tokens_are_scored_once():
    docs = [list(range(10, 25)), [99]]
    out = windows(docs, [2], window_tokens=6)
    assert all(w[0] == 2 and 2 not in w[1:] for w in out)
    assert [t for w in out for t in w[1:]] == list(range(10, 25)) + [99]
    assert max(len(w) for w in out) == 6


def test_without_bos_a_single_token_window_is_dropped():
    assert windows([[5, 6, 7], [8]], [], window_tokens=3) == [[5, 6, 7]]
