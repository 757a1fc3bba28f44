"""Verification tables with hand-built logits (vLLM rejection-sampler style)."""
import numpy as np
import pytest

from ssr.verifying.verify import verify_greedy, verify_sampled

VOCAB = 6
EOS = 0


def logits_for(target_ids):
    """One row per position whose argmax is target_ids[i]: [len, VOCAB]."""
    rows = np.zeros((len(target_ids), VOCAB), dtype=np.float32)
    rows[np.arange(len(target_ids)), target_ids] = 5.0
    return rows


GREEDY_CASES = [
    # name, draft_ids, target argmax per row (len = k+1), num_accepted, next_token, recovered
    ("perfect match + bonus", [1, 2, 3], [1, 2, 3, 4], 3, 4, False),
    ("first token mismatch", [1, 2, 3], [5, 2, 3, 4], 0, 5, True),
    ("mismatch in the middle", [1, 2, 3], [1, 5, 3, 4], 1, 5, True),
    ("mismatch at the last token", [1, 2, 3], [1, 2, 5, 4], 2, 5, True),
    ("EOS inside the draft is accepted like any token", [1, EOS, 3], [1, EOS, 3, 2], 3, 2, False),
    ("EOS recovered where draft went on", [1, 2, 3], [1, EOS, 3, 2], 1, EOS, True),
    ("empty draft: bonus is plain decoding", [], [4], 0, 4, False),
]


@pytest.mark.parametrize("name,draft,targets,num_accepted,next_token,recovered", GREEDY_CASES,
                         ids=[c[0] for c in GREEDY_CASES])
def test_greedy_table(name, draft, targets, num_accepted, next_token, recovered):
    verdict = verify_greedy(np.array(draft, dtype=np.int64), logits_for(targets))
    assert (verdict.num_accepted, verdict.next_token, verdict.recovered) == (num_accepted, next_token, recovered)


def test_greedy_ties_break_to_lowest_id():
    rows = np.zeros((2, VOCAB), dtype=np.float32)
    rows[0, [2, 4]] = 1.0  # tie: argmax picks 2
    assert verify_greedy(np.array([4]), rows).num_accepted == 0
    assert verify_greedy(np.array([2]), rows).num_accepted == 1


def test_row_count_is_checked():
    with pytest.raises(ValueError, match="rows"):
        verify_greedy(np.array([1, 2]), logits_for([1, 2]))


def one_hot(ids):
    probs = np.zeros((len(ids), VOCAB))
    probs[np.arange(len(ids)), ids] = 1.0
    return probs


SAMPLED_CASES = [
    # deterministic tables: point-mass targets make every decision certain
    ("all accepted, bonus from last row", [1, 2], one_hot([1, 2, 3]), 2, 3, False),
    ("first rejected, recovered from target", [1, 2], one_hot([4, 2, 3]), 0, 4, True),
    ("second rejected", [1, 2], one_hot([1, 5, 3]), 1, 5, True),
    ("empty draft samples the target", [], one_hot([3]), 0, 3, False),
]


@pytest.mark.parametrize("name,draft,target,num_accepted,next_token,recovered", SAMPLED_CASES,
                         ids=[c[0] for c in SAMPLED_CASES])
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_sampled_table(name, draft, target, num_accepted, next_token, recovered, with_draft_probs):
    draft_probs = one_hot(draft) if with_draft_probs else None
    for seed in range(5):
        verdict = verify_sampled(np.array(draft, dtype=np.int64), draft_probs, target, np.random.default_rng(seed))
        assert (verdict.num_accepted, verdict.next_token, verdict.recovered) == (num_accepted, next_token, recovered)


def test_residual_never_returns_rejected_point_mass():
    # target puts 0.5 on the drafted token; on rejection the drafted token must not come back
    target = np.array([[0.0, 0.5, 0.5, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    for seed in range(200):
        verdict = verify_sampled(np.array([1]), None, target, np.random.default_rng(seed))
        if verdict.recovered:
            assert verdict.next_token == 2
