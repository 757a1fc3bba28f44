"""ssr's suffix source on arctic-inference's C++ tree: every span it proposes is a real
continuation of the context's matched suffix in one of the texts it holds, with the length
bounds ssr's own tree keeps; the response history's C++ tree is bounded by requests."""
import random

import pytest

pytest.importorskip("arctic_inference.suffix_decoding")

from ssr.config import SuffixParams  # noqa: E402
from ssr.proposing.history import ResponseHistory  # noqa: E402
from ssr.proposing.proposers import SuffixProposer, ssr_suffix  # noqa: E402
from ssr.proposing.suffix_native import NativeSuffixProposer  # noqa: E402


def occurs(texts, pattern):
    return any(text[i:i + len(pattern)] == pattern for text in texts for i in range(len(text) - len(pattern) + 1))


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("extend", [None, 0.0])
def test_spans_continue_a_matched_suffix_in_one_text(seed, extend):
    rng = random.Random(seed)
    params = SuffixParams(max_depth=12, max_span=10)
    prompt = [rng.randrange(5) for _ in range(rng.randrange(5, 40))]
    earlier = [[rng.randrange(5) for _ in range(rng.randrange(5, 30))] for _ in range(2)]
    history = ResponseHistory()
    proposer = NativeSuffixProposer(params, prompt, history, extend)
    for response in earlier:  # responses of earlier requests join the history's tree as they end
        history.add(response)
    draft = [rng.randrange(5) for _ in range(8)]
    proposer.add_source(draft)
    output = []
    for _ in range(30):
        span, probs, match_len = proposer._best(rng.randrange(1, 12))
        context = (prompt + output)[-params.max_depth:]
        if span:
            pattern = context[len(context) - match_len:]
            assert 1 <= match_len <= len(context) and occurs([prompt, output, draft] + earlier, pattern + span)
            assert len(span) <= params.max_span and all(0 < p <= 1 for p in probs)
            assert probs == sorted(probs, reverse=True)
            if extend is None:
                assert len(span) <= params.span_factor * match_len
        token = rng.randrange(5)
        output.append(token)
        proposer.observe([token])


def test_ssr_suffix_is_native_where_arctic_is_installed_and_buckets_by_match_length():
    params = SuffixParams()
    text = list(range(100, 140))
    proposer, python = ssr_suffix(params, text, None, None), SuffixProposer(params, [text])
    assert isinstance(proposer, NativeSuffixProposer) and proposer.implementation == "arctic-inference"
    for each in (proposer, python):
        each.observe(text[:20])  # the output repeats the prompt
    [(source, span)] = proposer.candidates(64)
    assert str(source) == "suffix/3" and span == text[20:40]  # a 20-token match: the 16+ bucket
    assert python.candidates(64) == [(source, span)]  # ssr's own tree proposes the same


def test_history_tree_is_bounded_by_requests(monkeypatch):
    monkeypatch.setattr(ResponseHistory, "NATIVE_REQUESTS", 2)
    history = ResponseHistory()
    tree = history.native(8)
    for response in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        history.add(response)
    assert tree.num_seqs() == 2 and history._native_seqs == [1, 2]
    assert not tree.speculate([1, 2], 4, 1.0, 0.0, 0.0, False).token_ids  # the oldest was removed
    assert list(tree.speculate([9, 10], 4, 4.0, 0.0, 0.0, False).token_ids) == [11, 12]
    assert ResponseHistory(max_tokens=0).native(8) is None
