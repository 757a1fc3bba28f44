"""Exact rejection sampling keeps the target distribution; chi-square over many draws."""
import numpy as np
import pytest
from scipy.stats import chisquare

from ssr.verify import Verdict, verify_sampled

TARGET = np.array([0.05, 0.40, 0.25, 0.20, 0.10])
DRAFT = np.array([0.30, 0.10, 0.40, 0.05, 0.15])
DRAWS = 10000


def first_token(verifier, draft_probs_given, seed):
    """Output token at position 0 after proposing one drafted token."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(TARGET))
    target = np.stack([TARGET, TARGET])  # [k + 1, vocab]
    for _ in range(DRAWS):
        drafted = int(rng.choice(len(DRAFT), p=DRAFT))
        draft_probs = DRAFT[None, :] if draft_probs_given else None
        verdict = verifier(np.array([drafted]), draft_probs, target, rng)
        token = drafted if verdict.num_accepted == 1 else verdict.next_token
        counts[token] += 1
    return counts


def p_value(counts):
    return chisquare(counts, TARGET * counts.sum()).pvalue


def test_exact_follows_target():
    assert p_value(first_token(verify_sampled, True, seed=1)) > 1e-3


def test_point_mass_proposals_follow_target():
    # suffix spans carry no probabilities; the drafted token is a point mass
    assert p_value(first_token(verify_sampled, False, seed=2)) > 1e-3


def test_approx_mode_is_biased_towards_the_draft():
    approx = lambda *a: verify_sampled(*a, approx=True)  # noqa: E731
    assert p_value(first_token(approx, True, seed=3)) < 1e-6


def test_broken_verifier_is_caught():
    def accept_always(draft_ids, draft_probs, target, rng):
        return Verdict(len(draft_ids), 0, False)

    assert p_value(first_token(accept_always, True, seed=4)) < 1e-6


@pytest.mark.parametrize("position", [0, 1, 2])
def test_multi_token_draft_each_position_follows_target(position):
    """A 3-token draft from a different distribution: every output position ~ target."""
    rng = np.random.default_rng(10 + position)
    target_rows = np.stack([TARGET, np.roll(TARGET, 1), np.roll(TARGET, 2), TARGET])
    draft_rows = np.stack([DRAFT, np.roll(DRAFT, 2), DRAFT])
    counts = np.zeros(len(TARGET))
    for _ in range(DRAWS):
        drafted = [int(rng.choice(5, p=row)) for row in draft_rows]
        verdict = verify_sampled(np.array(drafted), draft_rows, target_rows, rng)
        output = drafted[: verdict.num_accepted] + [verdict.next_token]
        while len(output) <= position:  # continue plainly from the target, as decoding would
            output.append(int(rng.choice(5, p=target_rows[len(output)])))
        counts[output[position]] += 1
    assert chisquare(counts, target_rows[position] * DRAWS).pvalue > 1e-3
