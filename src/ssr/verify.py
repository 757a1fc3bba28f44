"""Verification of proposed tokens: pure functions of arrays.

Vocabulary (as in vLLM's rejection sampler): the *draft* proposes `draft_ids`; the
*target* (the parent under the full CoT) gives one row of logits/probs per draft
position plus one; the longest acceptable prefix is *accepted*; at the first
rejection a *recovered* token is drawn, and when every draft token is accepted the
last target row gives a *bonus* token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # draft tokens kept, a prefix of draft_ids
    next_token: int  # recovered token (on rejection) or bonus token (all accepted)
    recovered: bool  # True: next_token replaces draft_ids[num_accepted]


def verify_greedy(draft_ids: np.ndarray, target_logits: np.ndarray) -> Verdict:
    """Accept while the target's argmax equals the draft.

    draft_ids: [k]; target_logits: [k + 1, vocab] (row i predicts position i).
    """
    num_draft = len(draft_ids)
    _check_rows(num_draft, target_logits)
    target_ids = np.argmax(target_logits, axis=-1)  # [k + 1]
    matches = target_ids[:num_draft] == np.asarray(draft_ids)
    num_accepted = num_draft if matches.all() else int(np.argmin(matches))
    return Verdict(num_accepted, int(target_ids[num_accepted]), num_accepted < num_draft)


def verify_sampled(
    draft_ids: np.ndarray,
    draft_probs: np.ndarray | None,
    target_probs: np.ndarray,
    rng: np.random.Generator,
    approx: bool = False,
) -> Verdict:
    """Rejection sampling: the output follows target_probs exactly (approx=False).

    draft_ids: [k]; draft_probs: [k, vocab], the distribution each draft token was
    sampled from, or None for proposals without probabilities (suffix spans), which
    are point masses; target_probs: [k + 1, vocab].
    Token i is accepted with probability min(1, target/draft); on rejection the
    recovered token is drawn from normalise(max(0, target - draft)) (exact) or from
    the target row itself (approx: biased towards the draft, faster to explain).
    """
    from .sampling import sample

    num_draft = len(draft_ids)
    _check_rows(num_draft, target_probs)
    for position, token in enumerate(np.asarray(draft_ids)):
        target_prob = target_probs[position, token]
        draft_prob = 1.0 if draft_probs is None else draft_probs[position, token]
        if draft_prob > 0 and rng.random() * draft_prob < target_prob:
            continue  # accepted
        if approx:
            residual = target_probs[position]
        elif draft_probs is None:
            residual = target_probs[position].copy()
            residual[token] = 0.0
        else:
            residual = np.maximum(target_probs[position] - draft_probs[position], 0.0)
        if not residual.sum() > 0:  # only when target == draft, where rejection cannot happen
            residual = target_probs[position]
        return Verdict(position, sample(residual, rng), True)
    return Verdict(num_draft, sample(target_probs[num_draft], rng), False)


def _check_rows(num_draft: int, target_rows: np.ndarray) -> None:
    if target_rows.ndim != 2 or target_rows.shape[0] != num_draft + 1:
        raise ValueError(
            f"target needs {num_draft + 1} rows for {num_draft} draft tokens, got {target_rows.shape}"
        )
