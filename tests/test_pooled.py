"""One chain a pass: a candidate whose tokens other candidates propose too is priced with their
chance pooled in (span_policy.pooled_probs, SpanPolicy `one_chain`)."""
import itertools
import random

import pytest

from ssr.pricing.costs import CostModel
from ssr.pricing.span_policy import SpanPolicy, pooled_probs
from ssr.proposing.source import Source

GPU_LIKE = CostModel(step_s=0.020, token_s=0.0002)  # a pass of k tokens ~ one step

POOLED = [  # (name, own S(1..n), the others' S over the tokens they share, pooled)
    ("no other candidate shares its tokens", [0.5, 0.4, 0.3], [], [0.5, 0.4, 0.3]),
    ("one shares all three", [0.5, 0.4, 0.3], [[0.5, 0.5, 0.5]], [0.75, 0.7, 0.65]),
    ("one shares the first token only", [0.5, 0.4, 0.3], [[0.5]], [0.75, 0.4, 0.3]),
    ("two share, one further than the other", [0.5, 0.4], [[0.5, 0.5], [0.2]], [0.8, 0.7]),
    ("a sharer longer than the candidate counts as far as the candidate goes", [0.5], [[0.5, 0.5, 0.5]], [0.75]),
    ("a certain witness makes the prefix certain", [0.1, 0.05], [[1.0, 1.0]], [1.0, 1.0]),
    ("a witness never right adds nothing", [0.3, 0.2], [[0.0, 0.0]], [0.3, 0.2]),
]


@pytest.mark.parametrize("name,own,sharing,expected", POOLED, ids=[case[0] for case in POOLED])
def test_pooled_probs_table(name, own, sharing, expected):
    assert pooled_probs(own, sharing) == pytest.approx(expected)


def _any_right(chances: list[float]) -> float:
    """Brute force: the chance that at least one of independent witnesses is right, summed over
    every combination of outcomes."""
    total = 0.0
    for outcome in itertools.product((True, False), repeat=len(chances)):
        weight = 1.0
        for right, chance in zip(outcome, chances):
            weight *= chance if right else 1.0 - chance
        total += weight if any(outcome) else 0.0
    return total


def _survival(rng: random.Random, length: int) -> list[float]:
    out, prob = [], 1.0
    for _ in range(length):
        prob *= rng.random()
        out.append(prob)
    return out


def test_pooled_probs_against_brute_force_and_never_growing():
    rng = random.Random(7)
    for _ in range(200):
        own = _survival(rng, rng.randint(1, 6))
        sharing = [_survival(rng, rng.randint(1, 8)) for _ in range(rng.randint(0, 4))]
        pooled = pooled_probs(own, sharing)
        expected = [_any_right([own[i]] + [other[i] for other in sharing if i < len(other)])
                    for i in range(len(own))]
        assert pooled == pytest.approx(expected)
        assert all(later <= earlier + 1e-12 for earlier, later in zip(pooled, pooled[1:]))
        assert all(mine <= both + 1e-12 for mine, both in zip(own, pooled))


# one candidate of a source right 60% of the time at its first token, against two of sources right
# 50% each that propose the same tokens
ALONE, WITNESS_1, WITNESS_2 = Source.of("lookup", 3), Source.of("recent", 2), Source.of("other", 2)
CANDIDATES = [(ALONE, [1, 2, 3, 4]), (WITNESS_1, [7, 8, 9, 10]), (WITNESS_2, [7, 8, 9, 10])]


def test_one_chain_picks_the_tokens_two_sources_propose_over_a_stronger_single_one():
    assert ALONE.prior > WITNESS_1.prior == WITNESS_2.prior  # alone, each witness is worth less
    apart = SpanPolicy(GPU_LIKE).choose(CANDIDATES)
    chain = SpanPolicy(GPU_LIKE, one_chain=True).choose(CANDIDATES)
    assert apart[0] is ALONE
    assert chain[0] is WITNESS_1 and chain[1] == [7, 8, 9, 10][: len(chain[1])] and chain[1]


def test_only_the_shared_tokens_are_pooled():
    """Pooled with a witness that shares its whole span, a candidate is worth more than with one
    that shares only its first token (past it, it is priced alone), and that more than alone;
    a candidate is not its own witness."""
    parted = [(ALONE, [1, 2, 3, 4]), (WITNESS_1, [7, 8, 9, 10]), (WITNESS_2, [7, 0, 0, 0])]
    policy = SpanPolicy(GPU_LIKE, one_chain=True)
    shared_rate = policy._pooled_rate(WITNESS_1, CANDIDATES[1][1], 4, CANDIDATES[1:], policy.costs.costs(5))
    parted_rate = policy._pooled_rate(WITNESS_1, parted[1][1], 4, parted[1:], policy.costs.costs(5))
    alone_rate = (1.0 + sum(policy.stats[WITNESS_1].probs(4))) / policy.costs.costs(5)[4]
    assert shared_rate > parted_rate > alone_rate
    assert policy._pooled_rate(WITNESS_1, CANDIDATES[1][1], 4, CANDIDATES[1:2], policy.costs.costs(5)) == alone_rate
