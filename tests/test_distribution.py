"""Exact rejection sampling keeps the target distribution; chi-square over many draws."""
import numpy as np
import pytest
from scipy.stats import chisquare

from ssr.verifying.verify import Verdict, verify_sampled, verify_tree_sampled

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


# -- top-k rows, as vLLM returns them ---------------------------------------------------------

def _row(probs: np.ndarray, k: int, offset: int = 100) -> dict[int, float]:
    """The top-k of a distribution as raw logprobs, on token ids offset.. (ids need not be small)."""
    top = np.argsort(-probs)[:k]
    return {offset + int(t): float(np.log(probs[t])) for t in top}


def test_row_probs_applies_temperature_and_top_p_to_the_top_k():
    from ssr.config import SamplingParams
    from ssr.verifying.verify import row_probs

    row = _row(TARGET, 3)  # tokens 101 (.40), 102 (.25), 103 (.20)
    plain = row_probs(row, SamplingParams(temperature=1.0, top_k=3))
    assert plain == pytest.approx({101: 0.40 / 0.85, 102: 0.25 / 0.85, 103: 0.20 / 0.85})
    hot = row_probs(row, SamplingParams(temperature=2.0, top_k=3))
    root = np.sqrt([0.40, 0.25, 0.20])
    assert list(hot.values()) == pytest.approx(list(root / root.sum()))
    nucleus = row_probs(row, SamplingParams(temperature=1.0, top_k=3, top_p=0.5))
    assert nucleus[103] == 0 and nucleus[101] == pytest.approx(0.40 / 0.65)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.6, 0.95), (1.5, 0.8)])
def test_rows_verification_follows_the_target_exactly(temperature, top_p):
    """Drafts sampled from the draft's processed top-3, verified on rows: output ~ the target's
    processed top-3 (the distribution vLLM samples from with these parameters)."""
    from ssr.config import SamplingParams
    from ssr.verifying.verify import row_probs, verify_sampled_rows

    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=3)
    draft_row, target_row = _row(DRAFT, 3), _row(TARGET, 3)
    q, p = row_probs(draft_row, params), row_probs(target_row, params)
    rng = np.random.default_rng(7)
    counts = dict.fromkeys(p, 0)
    tokens, weights = list(q), np.array(list(q.values()))
    for _ in range(DRAWS):
        drafted = tokens[int(rng.choice(len(tokens), p=weights / weights.sum()))]
        bonus = list(p)[0]
        verdict = verify_sampled_rows([drafted], [draft_row], [target_row], bonus, params, rng)
        out = drafted if verdict.num_accepted == 1 else verdict.next_token
        counts[out] = counts.get(out, 0) + 1
    support = [t for t in p if p[t] > 0]
    assert sum(counts[t] for t in counts if t not in support) == 0
    observed = np.array([counts[t] for t in support])
    assert chisquare(observed, np.array([p[t] for t in support]) * observed.sum()).pvalue > 1e-3


def test_rows_verification_with_the_draft_probabilities_swapped_is_caught():
    """A verifier fed the wrong draft distribution (the target's own) is biased: the test can fail."""
    from ssr.config import SamplingParams
    from ssr.verifying.verify import row_probs, verify_sampled_rows

    params = SamplingParams(temperature=1.0, top_k=3)
    draft_row, target_row = _row(DRAFT, 3), _row(TARGET, 3)
    q, p = row_probs(draft_row, params), row_probs(target_row, params)
    rng = np.random.default_rng(8)
    counts = dict.fromkeys(set(p) | set(q), 0)
    tokens, weights = list(q), np.array(list(q.values()))
    for _ in range(DRAWS):
        drafted = tokens[int(rng.choice(len(tokens), p=weights))]
        verdict = verify_sampled_rows([drafted], [target_row], [target_row], list(p)[0], params, rng)
        counts[drafted if verdict.num_accepted == 1 else verdict.next_token] += 1
    support = [t for t in p if p[t] > 0]
    observed = np.array([counts[t] for t in support])
    assert chisquare(observed, np.array([p[t] for t in support]) * observed.sum()).pvalue < 1e-6


def test_rows_verdict_equals_the_dense_verdict():
    """On the same draws, rows on a local vocabulary give verify_sampled's verdict."""
    from ssr.config import SamplingParams
    from ssr.verifying.verify import row_probs, verify_sampled_rows

    params = SamplingParams(temperature=1.0, top_k=5)
    draft_rows = [_row(DRAFT, 5, offset=0), _row(np.roll(DRAFT, 1), 5, offset=0)]
    target_rows = [_row(TARGET, 5, offset=0), _row(np.roll(TARGET, 2), 5, offset=0)]
    dense = lambda rows: np.array([[row_probs(r, params)[t] for t in range(5)] for r in rows])  # noqa: E731
    for seed in range(200):
        drafted = [seed % 5, (seed // 5) % 5]
        rows_verdict = verify_sampled_rows(drafted, draft_rows, target_rows, 3, params, np.random.default_rng(seed))
        bonus = np.eye(5)[3][None, :]
        dense_verdict = verify_sampled(np.array(drafted), dense(draft_rows), np.vstack([dense(target_rows), bonus]),
                                       np.random.default_rng(seed))
        assert rows_verdict == dense_verdict


# two positions, three point-mass candidates as a token tree: [1, 2], [1, 3] share their first
# token, [3] differs; the target's second-position row depends on the first token
ROWS = {1: np.array([0.1, 0.2, 0.3, 0.3, 0.1]), 3: np.array([0.5, 0.1, 0.1, 0.2, 0.1]),
        "bonus": np.array([0.2, 0.2, 0.2, 0.2, 0.2])}


def tree_pairs(walk, seed, draws=DRAWS):
    """Counts of the first two emitted tokens [5, 5] after a tree walk (the second drawn plainly
    from the target when the walk emitted only one)."""
    rng = np.random.default_rng(seed)
    spans = [[1, 2], [1, 3], [3]]
    rows = [np.stack([TARGET, ROWS[1], ROWS["bonus"]]), np.stack([TARGET, ROWS[1], ROWS["bonus"]]),
            np.stack([TARGET, ROWS[3]])]  # [k_i + 1, vocab]: row j given span[:j]
    counts = np.zeros((5, 5))
    for _ in range(draws):
        won, verdict = walk(spans, rows, rng)
        emitted = spans[won][: verdict.num_accepted] + [verdict.next_token]
        if len(emitted) == 1:
            second = ROWS.get(emitted[0], ROWS["bonus"])
            emitted.append(int(rng.choice(5, p=second)))
        counts[emitted[0], emitted[1]] += 1
    return counts


def pair_p_value(counts):
    expected = np.array([[TARGET[a] * ROWS.get(a, ROWS["bonus"])[b] for b in range(5)] for a in range(5)])
    return chisquare(counts.ravel(), expected.ravel() * counts.sum()).pvalue


def test_tree_verification_of_several_candidates_follows_the_target():
    assert pair_p_value(tree_pairs(verify_tree_sampled, seed=5)) > 1e-3


def test_keeping_the_longest_of_independent_verifications_is_caught():
    def longest(spans, rows, rng):  # each candidate verified apart, the one that accepted most kept
        verdicts = [verify_sampled(np.array(span), None, np.asarray(row), rng) for span, row in zip(spans, rows)]
        won = max(range(len(spans)), key=lambda i: verdicts[i].num_accepted)
        return won, verdicts[won]

    assert pair_p_value(tree_pairs(longest, seed=6)) < 1e-6
