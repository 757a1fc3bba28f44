"""The variable-order Markov source (proposing/markov.py) against a brute-force oracle that reads
the whole text for every token: the commonest continuation of the longest context of at most
ORDER tokens that occurred before with one, of equals the one whose count was reached last; the
context's commonest token where the last token is new."""
import random

import pytest

from ssr.config import GenerationConfig
from ssr.proposing import markov
from ssr.proposing.history import ResponseHistory
from ssr.proposing.markov import ORDER, EarlierResponses, MarkovModel, MarkovProposer
from ssr.proposing.proposers import request_proposer
from ssr.proposing.source import Source


def oracle_next(texts, tail, top=ORDER):
    """(token, n) over `texts` (each its own sequence) for the context `tail`, or None."""
    for n in range(min(top, ORDER, len(tail)), -1, -1):
        context = tail[len(tail) - n:]
        reached = {}  # token -> [count, where its count last grew]
        order = 0
        for text in texts:
            for end in range(n, len(text)):
                order += 1
                if text[end - n:end] == context:
                    seen = reached.setdefault(text[end], [0, 0])
                    seen[0] += 1
                    seen[1] = order
        if reached:
            return max(reached, key=lambda token: (reached[token][0], reached[token][1])), n
    return None


def oracle_draft(texts, context, limit):
    tail, span, first = list(context), [], 0
    while len(span) < min(limit, markov.SPAN):
        found = oracle_next(texts, tail)
        if found is None:
            break
        if not span:
            first = found[1]
        span.append(found[0])
        tail.append(found[0])
    return span, first


@pytest.mark.parametrize("text, expected", [
    ([5, 6, 7, 5, 6], (7, 2)),  # "5 6" went on to 7
    ([5, 6, 7, 5, 6, 8, 5, 6], (8, 2)),  # 7 and 8 once each: the later one
    ([5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6], (7, 2)),  # 7 twice beats 8 once
    ([6, 8, 6, 8, 5, 6, 7, 5, 6], (7, 2)),  # "6" went on to 8 more often, but "5 6" to 7: the longer
    ([4, 4, 4, 2], (4, 0)),  # 2 is new: the commonest token
    ([1, 2, 3, 9], (9, 0)),  # all once: the latest
    ([], None),  # nothing at all
])
def test_a_table_of_hand_made_texts(text, expected):
    model = MarkovModel()
    assert model.next_token(model.add(text), ORDER) == expected == oracle_next([text], text)


@pytest.mark.parametrize("seed", range(60))
def test_every_token_is_the_oracles(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 20])
    prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
    proposer, output = MarkovProposer(prompt), []
    for _ in range(8):
        limit = rng.randrange(1, 30)
        span, first = proposer.draft(limit)
        assert (span, first) == oracle_draft([prompt + output], prompt + output, limit)
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
        proposer.observe(tokens)
        output += tokens


def test_candidates_are_named_by_their_first_match():
    text = list(range(30)) + list(range(10))  # 9 follows 0..9 again: a match of 8 (ORDER) and more
    [(source, span)] = MarkovProposer(text).candidates(5)
    assert str(source) == "markov/4" and span == [10, 11, 12, 13, 14]
    [(source, span)] = MarkovProposer([1, 2, 3, 1]).candidates(3)  # "1" went on to 2
    assert str(source) == "markov/1" and span[0] == 2
    [(source, span)] = MarkovProposer([7, 7, 8, 9]).candidates(1)  # 9 is new: the commonest token
    assert str(source) == "markov" and span == [7] and source.prior == 0.1


@pytest.mark.parametrize("seed", range(20))
def test_earlier_responses_win_on_a_longer_match_only(seed):
    rng = random.Random(seed)
    earlier = [[rng.randrange(4) for _ in range(rng.randrange(5, 40))] for _ in range(3)]
    history = ResponseHistory()
    history.add(earlier[0])
    prompt = [rng.randrange(4) for _ in range(rng.randrange(2, 30))]
    proposer = MarkovProposer(prompt, history)  # made from what the history holds, then grown
    for response in earlier[1:]:
        history.add(response)
    tail = list(prompt)
    for _ in range(10):
        mine = oracle_next([tail], tail)
        theirs = oracle_next(earlier, tail)
        expected = theirs if theirs is not None and (mine is None or theirs[1] > mine[1]) else mine
        span, first = proposer.draft(1)
        assert (span[0], first) == expected
        token = rng.randrange(4)
        proposer.observe([token])
        tail.append(token)


def test_the_earlier_responses_are_bounded(monkeypatch):
    monkeypatch.setattr(markov, "HISTORY_TOKENS", 100)
    kept = EarlierResponses()
    for start in range(0, 300, 30):
        kept.add(list(range(start, start + 30)))
    assert kept.model.tokens <= 100 and kept.responses[-1] == list(range(270, 300))
    assert kept.responses == [list(range(270, 300))]  # past the bound, down to half of it: the newest
    assert sum(len(each) for each in kept.responses) == kept.model.tokens
    assert ResponseHistory(0).markov() is None  # a history that keeps nothing keeps no model


def test_one_chain_offers_it_and_a_token_tree_does_not():
    config = GenerationConfig(mode="ssr")
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    chain = request_proposer(config, 0.1, prompt, None, several=True, wide=True)
    tree = request_proposer(config, 0.1, prompt, None, several=True, wide=True, trie=True)
    assert any(source.kind == "markov" for source, _ in chain.candidates(8))
    assert not any(source.kind == "markov" for source, _ in tree.candidates(8))


def test_one_chain_looks_up_in_the_prompts_last_tokens_and_the_others_in_all_of_it(monkeypatch):
    """Inside vLLM's step the batch waits while a request's sources index its prompt: one chain's
    n-gram lookup takes its last CHAIN_LOOKUP_PROMPT tokens (the suffix tree all of them); a token
    tree and forks keep all of it."""
    import ssr.proposing.proposers as proposers

    monkeypatch.setattr(proposers, "CHAIN_LOOKUP_PROMPT", 5)
    config, prompt = GenerationConfig(mode="ssr"), list(range(12))
    looked = {name: request_proposer(config, 0.1, prompt, None, several=True, **kw).proposers["lookup"].tokens
              for name, kw in (("chain", dict(wide=True)), ("tree", dict(wide=True, trie=True)), ("forks", {}))}
    assert looked == {"chain": prompt[-5:], "tree": prompt, "forks": prompt}


def test_only_the_prompts_last_tokens_are_counted(monkeypatch):
    prompt = [1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 1, 2]  # "1 2" went on to 3, before the last 6 tokens
    assert MarkovProposer(prompt).candidates(1) == [(Source.of("markov", 2), [3])]
    monkeypatch.setattr(markov, "PROMPT_TOKENS", 6)
    assert MarkovProposer(prompt).candidates(1) == [(Source.of("markov"), [9])]  # "2" is new there


def test_the_prompt_is_counted_only_when_a_span_is_first_drafted():
    """vLLM's drafter at a full batch drafts from the suffix tree alone: the Markov source made
    for a request counts nothing till asked, then drafts what it would have drafted counting at once."""
    prompt = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2]
    lazy = MarkovProposer(prompt)
    assert lazy.model.tokens == 0
    lazy.observe([3, 1])
    span, first = oracle_draft([prompt + [3, 1]], prompt + [3, 1], 4)
    assert lazy.model.tokens == 0 and lazy.candidates(4) == [(Source.of("markov", min(first, 4)), span)]
    assert lazy.model.tokens == len(prompt) + 2
