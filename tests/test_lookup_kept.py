"""A prompt's n-gram index kept for the conversation's next turn (LookupProposer.mark / rewind,
proposers.prompt_lookup): rewound and extended, it holds the same maps and offers the same
candidates as an index of the whole prompt made afresh, checked on random token streams."""
import random

import pytest

from ssr.config import GenerationConfig, SuffixParams
from ssr.proposing.history import ResponseHistory
from ssr.proposing.lookup import LookupProposer
from ssr.proposing.proposers import KEPT_TAIL, LOOKUP_INDEX, prompt_lookup, request_proposer

SETTINGS = [(3, 8, 0, 0, 0), (3, 8, 8, 32, 2), (2, 5, 4, 8, 1)]  # (max_ngram, num_tokens, others, frequent, skips)


def state(lookup: LookupProposer) -> tuple:
    """Everything its candidates read, the order of each n-gram's ways and skips included."""
    return (list(lookup.tokens), dict(lookup._first), dict(lookup._latest), list(lookup._before),
            {key: list(went.items()) for key, went in lookup._ways.items()},
            {key: list(went.items()) for key, went in lookup._skips.items()},
            dict(lookup.frequent.counts), list(lookup.frequent.top))


def stream(rng: random.Random, length: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("seed", range(12))
def test_a_rewound_index_extended_is_the_whole_prompts_index(settings, seed):
    rng = random.Random(seed)
    vocab = rng.choice([3, 6, 20])
    first = stream(rng, rng.randrange(0, 70), vocab)
    kept = LookupProposer(first, *settings)
    kept.mark()
    marked = state(kept)
    for _ in range(rng.randrange(1, 6)):  # the first turn's output, observed in pieces, candidates asked between
        kept.observe(stream(rng, rng.randrange(1, 15), vocab))
        kept.candidates(8)
    if len(kept.tokens) > 2 * len(first):  # more output than prompt: the journal stopped, nothing to rewind to
        assert kept.marked is None
        return
    assert kept.marked == len(first)
    kept.rewind()
    assert state(kept) == marked
    second = first + stream(rng, rng.randrange(0, 60), vocab)  # the next turn's prompt starts with the first's
    kept.observe(second[len(first):])
    kept.mark()
    fresh = LookupProposer(second, *settings)
    assert state(kept) == state(fresh)
    for _ in range(8):  # the second turn's output: the same candidates every pass
        tokens = stream(rng, rng.randrange(1, 4), vocab)
        kept.observe(tokens)
        fresh.observe(tokens)
        assert kept.candidates(8) == fresh.candidates(8)
    assert state(kept) == state(fresh)


def test_a_conversations_next_turn_borrows_the_index_and_gives_it_back():
    rng, history, settings = random.Random(7), ResponseHistory(), SETTINGS[1]
    prompt = stream(rng, KEPT_TAIL + 30, 6)
    lookup = prompt_lookup(prompt, settings, history)
    assert state(lookup) == state(LookupProposer(prompt, *settings))
    lookup.observe([1, 2, 3, 9])
    assert history.borrow(LOOKUP_INDEX) is None  # not given back yet: no other request may rewind it
    history.give_back(LOOKUP_INDEX, lookup)
    # the next turn renders the last 3 tokens of this one's prompt otherwise (its assistant turn's opening)
    turn_2 = prompt[:-3] + stream(rng, 40, 6)
    again = prompt_lookup(turn_2, settings, history)
    assert again is lookup and state(again) == state(LookupProposer(turn_2, *settings))
    history.give_back(LOOKUP_INDEX, again)
    other = [5] + turn_2  # another conversation: made afresh
    assert prompt_lookup(other, settings, history) is not lookup
    assert history.borrow(LOOKUP_INDEX) is None  # (and `lookup` was dropped: its maps were rewound for nothing)
    history.give_back(LOOKUP_INDEX, prompt_lookup(other, settings, history))
    assert prompt_lookup(other, (3, 9, 0, 0, 0), history).settings == (3, 9, 0, 0, 0)  # other settings: afresh


def test_an_output_longer_than_its_prompt_stops_the_journal_and_is_not_kept():
    history, settings = ResponseHistory(), SETTINGS[1]
    prompt = list(range(KEPT_TAIL + 40))
    lookup = prompt_lookup(prompt, settings, history)
    lookup.observe(list(range(24)))
    lookup.candidates(4)
    assert lookup.marked == 40  # the tail's 16 + 24 since the mark: not more than the 40 it holds
    lookup.observe([7] * 10)
    lookup.candidates(4)
    assert lookup.marked is None and lookup._journal is None
    history.give_back(LOOKUP_INDEX, lookup)
    again = prompt_lookup(prompt + [1, 2], settings, history)
    assert again is not lookup and state(again) == state(LookupProposer(prompt + [1, 2], *settings))


def test_ssrs_request_proposer_gives_its_index_back_at_the_end():
    history = ResponseHistory()
    config = GenerationConfig(mode="ssr", suffix=SuffixParams())
    proposer = request_proposer(config, None, [5, 6, 7, 5, 6], history, several=True, wide=True, trie=True)
    lookup = proposer.proposers["lookup"]
    proposer.end()
    proposer.end()  # once only
    assert history.borrow(LOOKUP_INDEX) is lookup and history.borrow(LOOKUP_INDEX) is None
    chain = request_proposer(config, None, [5, 6, 7, 5, 6], history, several=True, wide=True)
    assert chain.borrowed == []  # one chain looks up a window of the prompt's end: nothing to keep


def test_a_conversations_next_turn_through_the_loop_keeps_the_index_and_its_output():
    from ssr.engines.fake import FakeEngine
    from ssr.formats.thinking import FORMATS
    from ssr.loop import Generation

    prompt = [ord(c) for c in "Please complete the class Stack, and then the class Queue. " * 4]
    config, history = GenerationConfig(mode="ssr", thinking_budget=80, max_answer_tokens=60), ResponseHistory()
    first = Generation(FakeEngine(), FORMATS["code"], config, prompt, history=history).run()
    kept = history.borrow(LOOKUP_INDEX)
    assert kept is not None
    history.give_back(LOOKUP_INDEX, kept)
    turn_2 = prompt + first.output_ids + prompt  # the conversation so far, then the user again
    second = Generation(FakeEngine(), FORMATS["code"], config, turn_2, history=history).run()
    assert history.borrow(LOOKUP_INDEX) is kept  # borrowed, rewound, extended, given back
    assert second.output_ids == Generation(FakeEngine(), FORMATS["code"], config, turn_2).run().output_ids


def test_an_index_given_back_with_output_not_yet_indexed_is_rewound_without_indexing_it():
    history, settings = ResponseHistory(), SETTINGS[1]
    prompt = list(range(KEPT_TAIL + 40))
    lookup = prompt_lookup(prompt, settings, history)
    lookup.observe(list(range(20)))
    lookup.candidates(4)  # 36 journaled since the mark: within the 40 it holds
    lookup.observe([7] * 10)  # observed, not indexed: indexing it would stop the journal
    history.give_back(LOOKUP_INDEX, lookup)
    again = prompt_lookup(prompt + [1, 2], settings, history)
    assert again is lookup and state(again) == state(LookupProposer(prompt + [1, 2], *settings))


def indexed_token_by_token(tokens: list[int], settings) -> tuple:
    """The oracle: `state` of an index built one token at a time, each map updated for every
    n-gram size as the token comes (what LookupProposer did before it indexed size by size)."""
    max_ngram, _, others, frequent, skips = settings
    seen, first, latest, before = [], {}, {}, [(None, None)] * (max_ngram + 1)
    ways, skipped, counts = {}, {}, LookupProposer((), *settings).frequent
    for token in tokens:
        seen.append(token)
        end = len(seen)
        for size in range(1, min(max_ngram, end) + 1):
            gram = tuple(seen[end - size:])
            before[size] = last = latest.get(gram, (None, None))
            latest[gram] = (end - size, last[0])
            first.setdefault(gram, end - size)
            if others and end > size:
                went = ways.setdefault(tuple(seen[end - 1 - size: end - 1]), {})
                went.pop(token, None)
                went[token] = end - 1 - size
        counts.count(token)
        if skips and end > 2:
            went = skipped.setdefault(seen[end - 3], {})
            went.pop(token, None)
            went[token] = end - 1
    return (seen, first, latest, before, {key: list(went.items()) for key, went in ways.items()},
            {key: list(went.items()) for key, went in skipped.items()}, dict(counts.counts), list(counts.top))


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("seed", range(12))
def test_an_index_built_size_by_size_in_batches_is_the_token_by_token_index(settings, seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 5, 30])
    lookup = LookupProposer(stream(rng, rng.randrange(0, 40), vocab), *settings)
    for _ in range(rng.randrange(1, 8)):  # batches of 0 to 30 tokens, the index asked for between them
        lookup.observe(stream(rng, rng.randrange(0, 30), vocab))
        lookup.candidates(8)
        assert state(lookup) == indexed_token_by_token(lookup.tokens, settings)
