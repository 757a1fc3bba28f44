"""Copies realigned after the model changed them (proposing/realign.py): hand-built cases, a
brute-force oracle over random streams, and the request proposer that offers them on a token tree."""
import random

import pytest

from ssr.config import GenerationConfig
from ssr.proposing.proposers import request_proposer
from ssr.proposing.realign import REJOIN, RESUME, Realigner
from ssr.proposing.source import Source

OTHER = Source.of("lookup", 1)


def offers_after(spans, committed, chunks=1, least=1, max_tokens=64):
    realigner = Realigner(least)
    realigner.follow([(OTHER, span) for span in spans])
    step = max(1, len(committed) // chunks)
    for start in range(0, len(committed), step):  # the loop commits a pass at once, vLLM a token at once
        realigner.observe(committed[start:start + step])
    return realigner.candidates(max_tokens)


@pytest.mark.parametrize("spans, committed, expected", [
    # "the red dog ran" copied as "the big": past "red" (substituted)
    ([[1, 2, 3, 4]], [1, 9], [(RESUME, [3, 4])]),
    # the model left "red" out: it wrote the token after it, so the copy goes on after that
    ([[1, 2, 3, 4]], [1, 3], [(REJOIN, [4])]),
    # the change was at the copy's last token: nothing past it
    ([[1, 2]], [1, 9], []),
    # no token of it was right: not realigned (every unchosen candidate is wrong at its first)
    ([[1, 2, 3]], [9], []),
    # the copy was right to its end: nothing changed it
    ([[1, 2]], [1, 2, 7], []),
    # the change was a token before the last: the copy is not offered again
    ([[1, 2, 3, 4]], [1, 9, 3], []),
    # of several, the one right the furthest
    ([[1, 5, 6, 7], [1, 2, 3, 4]], [1, 2, 9], [(RESUME, [4])]),
    # ties: the first proposed
    ([[1, 5, 6], [1, 7, 8]], [1, 9], [(RESUME, [6])]),
])
def test_realigned_copies(spans, committed, expected):
    assert offers_after(spans, committed) == expected
    assert offers_after(spans, committed, chunks=len(committed)) == expected  # token by token alike


def test_realigned_copies_are_cut_to_the_room_and_need_enough_right():
    assert offers_after([[1, 2, 3, 4, 5]], [1, 9], max_tokens=2) == [(RESUME, [3, 4])]
    assert offers_after([[1, 2, 3, 4, 5]], [1, 9], least=2) == []
    assert offers_after([[1, 2, 3, 4, 5]], [1, 2, 9], least=2) == [(RESUME, [4, 5])]


def brute_force(spans, committed, least):
    """Each span's first wrong token; the span right the furthest (at least `least`) whose first
    wrong token is the last committed, realigned by the module's three rules."""
    last, best = len(committed) - 1, None
    for span in spans:
        wrong = next((i for i in range(min(len(span), len(committed))) if span[i] != committed[i]), None)
        if wrong == last and wrong >= least and (best is None or wrong > best[1]):
            best = (span, wrong)
    if best is None:
        return []
    span, at = best
    token = committed[-1]
    if at + 1 < len(span) and span[at + 1] == token:
        return [(REJOIN, span[at + 2:])] if span[at + 2:] else []
    return [(RESUME, span[at + 1:])] if span[at + 1:] else []


@pytest.mark.parametrize("seed", range(30))
def test_realigned_copies_match_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(40):
        spans = [[rng.randrange(4) for _ in range(rng.randrange(1, 7))] for _ in range(rng.randrange(1, 5))]
        committed = [rng.randrange(4) for _ in range(rng.randrange(1, 8))]
        least = rng.randrange(3)
        expected = brute_force(spans, committed, least)
        assert offers_after(spans, committed, least=least) == expected
        assert offers_after(spans, committed, chunks=len(committed), least=least) == expected


@pytest.mark.parametrize("trie", [True, False], ids=["token tree", "one chain"])
def test_a_wide_proposer_offers_a_copy_past_the_changed_token(trie):
    """The request proposer of a token tree, or of one chain picked among many candidates,
    follows its own candidates: after a pass whose copy of the prompt was right for two tokens and
    then changed, the copy past the change is offered; where one source's span is verified a pass
    (not `wide`), not."""
    prompt = list(range(100, 140))  # no token twice: lookup's only match is this copy
    proposer = request_proposer(GenerationConfig(mode="ssr"), None, prompt + [100], None, several=True, wide=True, trie=trie)
    spans = [span for _, span in proposer.candidates(8)]
    assert prompt[1:9] in spans
    proposer.observe([101, 102, 7])  # two right, then 7 instead of 103
    found = proposer.candidates(8)
    assert (RESUME, prompt[4:9]) in found  # the rest of that span
    narrow = request_proposer(GenerationConfig(mode="ssr"), None, prompt + [100], None, several=True)
    narrow.candidates(8)
    narrow.observe([101, 102, 7])
    assert not any(source in (RESUME, REJOIN) for source, _ in narrow.candidates(8))
