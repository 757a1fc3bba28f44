"""Suffix tree against a brute-force oracle on random token streams."""
import random
import numpy as np
import pytest

from ssr.proposing.lookup import FrequentTokens, LookupProposer, PromptLookupProposer, vllm_ngram
from ssr.proposing.proposers import SuffixProposer
from ssr.config import SuffixParams
from ssr.proposing.suffix_tree import SuffixTree
from ssr.proposing.source import Source


def brute_count(sequences, pattern, max_depth):
    """Occurrences of pattern (length <= max_depth) inside any one sequence."""
    if len(pattern) > max_depth:
        return 0
    n = len(pattern)
    return sum(
        1 for seq in sequences for i in range(len(seq) - n + 1) if list(seq[i : i + n]) == list(pattern)
    )


def brute_follow(sequences, pattern, limit, min_prob, max_depth, vocab):
    """The most frequent continuation of pattern (ties: smallest token) while the product of
    count(path + t) / count(path) stays >= min_prob."""
    span, probs, prob = [], [], 1.0
    while len(span) < limit:
        path = pattern + span
        counts = {t: brute_count(sequences, path + [t], max_depth) for t in vocab}
        top = max(counts, key=lambda t: (counts[t], -t))
        if counts[top] == 0:
            break
        prob *= counts[top] / brute_count(sequences, path, max_depth)
        if prob < min_prob:
            break
        span.append(top)
        probs.append(prob)
    return span, probs


def brute_propose(sequences, context, max_depth, max_span, span_factor, min_prob, extend_prob=None):
    """The proposal rule spelled out with brute-force counts: match lengths L, L - s, ... with
    L the longest suffix found and s = ceil(L / 8) propose; the most expected accepted tokens
    (sum of probabilities) win, the longer match on ties. extend_prob: the winner then follows
    its continuation up to max_span (within the depth) while its probability stays >= it."""
    vocab = sorted({t for seq in sequences for t in seq})
    best, best_score = ([], [], 0), 0.0
    found = [n for n in range(1, min(len(context), max_depth - 1) + 1)
             if brute_count(sequences, list(context[len(context) - n:]), max_depth)]
    longest = max(found, default=0)
    for match_len in range(longest, 0, -max(1, -(-longest // 8))):
        pattern = list(context[len(context) - match_len :])
        count = brute_count(sequences, pattern, max_depth)
        if count == 0:
            continue
        limit = min(max_span, int(span_factor * match_len), max_depth - match_len)
        span, probs = brute_follow(sequences, pattern, limit, min_prob, max_depth, vocab)
        if span and sum(probs) > best_score:
            best, best_score = (span, probs, match_len), sum(probs)
    match_len = best[2]
    if extend_prob is not None and match_len:
        pattern = list(context[len(context) - match_len:])
        span, probs = brute_follow(sequences, pattern, min(max_span, max_depth - match_len), extend_prob,
                                   max_depth, vocab)
        if len(span) > len(best[0]):
            best = (span, probs, match_len)
    return best


def random_streams(rng, num, length, vocab):
    # low-entropy streams (a repeated motif with noise) so that matches are long
    motif = rng.integers(0, vocab, size=12)
    streams = []
    for _ in range(num):
        seq = np.resize(motif, length).copy()
        noise = rng.random(length) < 0.2
        seq[noise] = rng.integers(0, vocab, size=noise.sum())
        streams.append(seq.tolist())
    return streams


@pytest.mark.parametrize("seed", range(6))
def test_counts_match_oracle(seed):
    rng = np.random.default_rng(seed)
    max_depth = int(rng.integers(2, 7))
    streams = random_streams(rng, 3, 40, vocab=5)
    tree = SuffixTree(max_depth)
    for stream in streams:
        handle = tree.add_sequence(stream[:10])
        tree.extend(handle, stream[10:25])  # online growth in pieces
        tree.extend(handle, stream[25:])
    tree.check_integrity()
    assert tree.root.count == sum(len(s) for s in streams)
    for _ in range(200):
        pattern = rng.integers(0, 5, size=int(rng.integers(1, max_depth + 2))).tolist()
        node = tree.find(pattern)
        expected = brute_count(streams, pattern, max_depth)
        assert (node.count if node else 0) == expected, pattern


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_depth", [8, 24])  # 24: long matches, candidates strided
@pytest.mark.parametrize("extend_prob", [None, 0.0, 0.2])  # not None: spans past the match length
def test_proposals_match_oracle(seed, max_depth, extend_prob):
    rng = np.random.default_rng(100 + seed)
    max_span = int(rng.integers(1, 10)) if extend_prob is None else int(rng.integers(8, 20))
    span_factor, min_prob = float(rng.choice([0.5, 1.0, 2.0])), float(rng.choice([0.0, 0.1, 0.4]))
    streams = random_streams(rng, 3, 50, vocab=4)
    tree = SuffixTree(max_depth)
    for stream in streams:
        tree.add_sequence(stream)
    for _ in range(60):
        context = rng.integers(0, 4, size=int(rng.integers(1, 12))).tolist() if max_depth == 8 else \
            streams[0][: int(rng.integers(20, 50))]  # a context copied from a stream: long matches
        got = tree.propose(context, max_span, span_factor, min_prob, extend_prob)
        expected = brute_propose(streams, context, max_depth, max_span, span_factor, min_prob, extend_prob)
        assert got[0] == expected[0] and got[2] == expected[2]
        assert got[1] == pytest.approx(expected[1])


def test_extended_spans_go_past_the_match_length():
    text = list(range(40))  # seen once: every continuation is certain
    tree = SuffixTree(64)
    tree.add_sequence(text)
    span, _, match_len = tree.propose([7, 8], max_span=30, span_factor=1.0, min_prob=0.1)
    assert (span, match_len) == ([9, 10], 2)  # cut to the match length
    span, _, match_len = tree.propose([7, 8], max_span=30, span_factor=1.0, min_prob=0.1, extend_prob=0.0)
    assert (span, match_len) == (list(range(9, 39)), 2)  # the same match, followed on to max_span
    span, _, _ = tree.propose([37, 38], max_span=30, span_factor=1.0, min_prob=0.1, extend_prob=0.0)
    assert span == [39]  # the end of the text


def test_integrity_check_catches_corruption():
    tree = SuffixTree(4)
    tree.add_sequence([1, 2, 3, 1, 2, 4])
    tree.check_integrity()
    tree.root.get(1).count = 0  # break it: a node with no occurrences
    with pytest.raises(AssertionError):
        tree.check_integrity()


def test_suffix_proposer_replays_draft_after_divergence():
    draft = [10, 11, 12, 13, 14, 15, 16, 17]
    proposer = SuffixProposer(SuffixParams(max_depth=16, max_span=8), seeds=[[1, 2, 3], draft])
    proposer.observe([10, 11, 12])
    assert proposer.propose(8)[0][:3] == [13, 14, 15]
    proposer.observe([99, 14, 15])  # one token differs, the draft is found again
    assert proposer.propose(2)[0] == [16, 17]


def test_prompt_lookup_proposer():
    proposer = PromptLookupProposer([5, 6, 7, 8, 9, 5, 6], max_ngram=2, num_tokens=3)
    assert proposer.propose(10) == ([7, 8, 9], None)
    assert proposer.propose(1) == ([7], None)
    proposer.observe([42])
    assert proposer.propose(3) == ([], None)


def _prompt_lookup_oracle(tokens, max_ngram, num_tokens, min_ngram=1):
    """transformers' search (and vLLM's ngram, min_ngram = max_ngram), written plainly: n from
    max_ngram down to min_ngram, earliest match first."""
    for size in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        for start in range(len(tokens) - size):
            if tokens[start:start + size] == tokens[-size:]:
                return tokens[start + size:start + size + num_tokens]
    return []


@pytest.mark.parametrize("seed", range(20))
def test_prompt_lookup_matches_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
    proposer = PromptLookupProposer(tokens)
    for _ in range(40):
        assert proposer.propose(10)[0] == _prompt_lookup_oracle(proposer.tokens, 2, 10)
        proposer.observe([rng.randrange(6) for _ in range(rng.randrange(1, 3))])


@pytest.mark.parametrize("seed", range(20))
def test_vllm_ngram_matches_brute_force(seed):
    """vLLM's ngram as its docs configure it: the 4-gram ending the context, earliest, 5 tokens."""
    rng = random.Random(seed)
    tokens = [rng.randrange(4) for _ in range(rng.randrange(5, 60))]
    peer = vllm_ngram(tokens[:3])
    peer.observe(tokens[3:])
    assert peer.propose(100)[0] == _prompt_lookup_oracle(tokens, 4, 5, min_ngram=4)


def _lookup_oracle(tokens, max_ngram, num_tokens):
    """ssr's lookup written plainly: the longest n <= max_ngram whose last n tokens occurred
    before; the continuation after the earliest occurrence, then after the latest one before the
    end (when it is another occurrence), after the one before that (when its next token is new),
    then after the latest occurrence of the longest shorter n-gram whose next token is new."""
    out = []
    for size in range(min(max_ngram, len(tokens) - 1), 0, -1):
        starts = [start for start in range(len(tokens) - size) if tokens[start:start + size] == tokens[-size:]]
        if not starts:
            continue
        after = [tokens[start + size:start + size + num_tokens] for start in starts]
        if not out:
            out = [(Source("lookup", size), after[0])]
            if len(starts) > 1:
                out.append((Source("recent", size), after[-1]))
            if len(starts) > 2 and all(span[0] != after[-2][0] for _, span in out):
                out.append((Source("recent", size), after[-2]))
        elif all(span[0] != after[-1][0] for _, span in out):
            return out + [(Source("recent", size), after[-1])]
    return out


@pytest.mark.parametrize("seed", range(20))
def test_lookup_matches_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
    proposer = LookupProposer(tokens, max_ngram=3, num_tokens=6)
    for _ in range(40):
        limit = rng.randrange(0, 9)
        expected = [(source, span[:limit]) for source, span in _lookup_oracle(proposer.tokens, 3, 6)] if limit else []
        assert proposer.candidates(limit) == expected
        assert proposer.propose(limit)[0] == (expected[0][1] if expected else [])
        proposer.observe([rng.randrange(5) for _ in range(rng.randrange(1, 3))])


def test_lookup_offers_the_latest_occurrence_beside_the_earliest():
    proposer = LookupProposer([1, 2, 3, 9, 1, 2, 4, 8, 2, 7], max_ngram=2, num_tokens=2)
    proposer.observe([1, 2])
    # "1 2" went on "3 9" first and "4 8" last; "2" alone last went on "7 1"
    assert [(str(source), span) for source, span in proposer.candidates(5)] == [("lookup/2", [3, 9]), ("recent/2", [4, 8]), ("recent/1", [7, 1])]
    proposer = LookupProposer([1, 2, 5, 1, 2, 6, 1, 2, 7, 1, 2], max_ngram=2, num_tokens=2)
    # "1 2" went on "5" first, "7" last, "6" the time before; "2" alone last went on "7" too
    assert [(str(source), span) for source, span in proposer.candidates(5)] == [("lookup/2", [5, 1]), ("recent/2", [7, 1]), ("recent/2", [6, 1])]


def _other_ways_oracle(tokens, max_ngram, num_tokens, offered, others):
    """The lookup's further candidates written plainly: for the longest n-gram ending the context
    down to 1, every token that followed an earlier occurrence of it and no candidate offers yet,
    the most recently seen first, each after the latest occurrence followed by it."""
    out, offered = [], set(offered)
    for size in range(min(max_ngram, len(tokens) - 1), 0, -1):
        starts = [start for start in range(len(tokens) - size) if tokens[start:start + size] == tokens[-size:]]
        latest = {}  # next token -> latest start followed by it
        for start in starts:
            latest[tokens[start + size]] = start
        for token, start in sorted(latest.items(), key=lambda item: -item[1]):
            if len(out) < others and token not in offered:
                offered.add(token)
                out.append((Source("other", size), tokens[start + size:start + size + num_tokens]))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_lookup_other_ways_match_brute_force(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]
    proposer = LookupProposer(tokens, max_ngram=3, num_tokens=6, others=3)
    plain = LookupProposer(tokens, max_ngram=3, num_tokens=6)
    for _ in range(40):
        limit = rng.randrange(1, 9)
        first = plain.candidates(limit)
        expected = first + _other_ways_oracle(proposer.tokens, 3, min(limit, 6), [span[0] for _, span in first], 3) \
            if first else []
        assert proposer.candidates(limit) == expected
        new = [rng.randrange(6) for _ in range(rng.randrange(1, 3))]
        proposer.observe(new)
        plain.observe(new)


def test_lookup_offers_every_other_way_an_n_gram_went():
    proposer = LookupProposer([1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 6, 1, 2], max_ngram=2, num_tokens=1, others=4)
    # "1 2" went on 3 (earliest), 6 (latest), 5 (the time before); then the other ways: 4
    assert [(str(source), span) for source, span in proposer.candidates(1)] == [("lookup/2", [3]), ("recent/2", [6]), ("recent/2", [5]), ("other/2", [4])]


def _frequent_oracle(tokens, size):
    """The `size` most frequent tokens, most first; among equal counts the one that reached its
    count first."""
    counts, reached = {}, {}
    for at, token in enumerate(tokens):
        counts[token] = counts.get(token, 0) + 1
        reached[token] = at
    return sorted(counts, key=lambda token: (-counts[token], reached[token]))[:size]


@pytest.mark.parametrize("seed", range(20))
def test_frequent_tokens_match_brute_force(seed):
    rng = random.Random(seed)
    size = rng.randrange(1, 6)
    frequent, tokens = FrequentTokens(size), []
    for _ in range(200):
        token = int(rng.paretovariate(1.2)) % 12  # skewed: a few common tokens, a tail of rare ones
        frequent.count(token)
        tokens.append(token)
        assert frequent.top == _frequent_oracle(tokens, size)


def test_frequent_tokens_off_counts_nothing():
    frequent = FrequentTokens(0)
    frequent.count(3)
    assert frequent.top == [] and frequent.counts == {}


@pytest.mark.parametrize("seed", range(20))
def test_lookup_frequent_candidates_match_brute_force(seed):
    """With `frequent`, the n-gram candidates come first as without it, then the context's
    commonest tokens no candidate starts with, each with what followed its latest occurrence,
    named by its rank's band (the 8 commonest "frequent", the next 8 "frequent@9", then
    "frequent@17"); where no n-gram matches, those alone."""
    rng = random.Random(seed)
    vocab, size = (8, 3) if seed % 2 else (28, 20)
    tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
    proposer = LookupProposer(tokens, max_ngram=3, num_tokens=6, others=2, frequent=size)
    plain = LookupProposer(tokens, max_ngram=3, num_tokens=6, others=2)
    for _ in range(80):
        limit = rng.randrange(1, 9)
        first, context = plain.candidates(limit), proposer.tokens
        offered = {span[0] for _, span in first}
        latest = {token: at for at, token in enumerate(context)}
        expected = first + [(Source("frequent", band=0 if rank < 8 else 1 if rank < 16 else 2),
                             context[latest[token]: latest[token] + min(limit, 6)])
                            for rank, token in enumerate(_frequent_oracle(context, size)) if token not in offered]
        assert proposer.candidates(limit) == expected
        new = [rng.randrange(vocab) for _ in range(rng.randrange(1, 3))]
        proposer.observe(new)
        plain.observe(new)


def _skip_oracle(context):
    """Tokens that came two after the context's second-to-last token, the latest first, each with
    where it last came so: [(token, position)] (brute force)."""
    found = {}
    for i in range(len(context) - 2):
        if context[i] == context[-2]:
            found[context[i + 2]] = i + 2
    return sorted(found.items(), key=lambda item: -item[1])


@pytest.mark.parametrize("seed", range(20))
def test_lookup_skip_candidates_match_brute_force(seed):
    """With `skips`, after the n-gram candidates and the other ways, the tokens that came two
    after the second-to-last token that no candidate starts with, the latest first, each with
    what followed where it last came so; where no n-gram matches, those alone."""
    rng = random.Random(seed)
    vocab = 4 + seed % 8
    tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
    proposer = LookupProposer(tokens, max_ngram=3, num_tokens=6, others=2, skips=2)
    plain = LookupProposer(tokens, max_ngram=3, num_tokens=6, others=2)
    for _ in range(60):
        limit = rng.randrange(1, 9)
        first, context = plain.candidates(limit), proposer.tokens
        offered = {span[0] for _, span in first}
        skipped = [(Source("skip"), context[at: at + min(limit, 6)])
                   for token, at in _skip_oracle(context) if token not in offered][:2]
        assert proposer.candidates(limit) == first + skipped
        new = [rng.randrange(vocab) for _ in range(rng.randrange(1, 3))]
        proposer.observe(new)
        plain.observe(new)


def test_lookup_skips_a_word():
    """"the red dog ... the big": the last token ("big") went nowhere before, but what came two
    after "the" did: "dog", and what followed it."""
    the, red, dog, ran, big = 1, 2, 3, 4, 5
    proposer = LookupProposer([the, red, dog, ran, the, big], max_ngram=2, num_tokens=2, skips=2)
    assert proposer.candidates(2) == [(Source("skip"), [dog, ran])]


def test_lookup_offers_frequent_tokens_where_no_n_gram_matches():
    proposer = LookupProposer([5, 1, 5, 2, 5, 3], max_ngram=2, num_tokens=2, frequent=2)
    proposer.observe([9])  # 9 occurs nowhere before: no n-gram matches
    # 5 is the commonest (latest at 4: "5 3"), then 1 (reached 1 first of the tokens counted once)
    assert proposer.candidates(2) == [(Source("frequent"), [5, 3]), (Source("frequent"), [1, 5])]
