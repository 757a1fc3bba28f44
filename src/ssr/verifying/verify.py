"""Verification of proposed tokens: pure functions of arrays.

Vocabulary (as in vLLM's rejection sampler): the *draft* proposes `draft_ids`; the
*target* (the parent under the full CoT) gives one row of logits/probs per draft
position plus one; the longest acceptable prefix is *accepted*; at the first
rejection a *recovered* token is drawn, and when every draft token is accepted the
last target row gives a *bonus* token.
"""
from __future__ import annotations

from collections.abc import Sequence

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # draft tokens kept, a prefix of draft_ids
    next_token: int  # recovered token (on rejection) or bonus token (all accepted)
    recovered: bool  # True: next_token replaces draft_ids[num_accepted]


def verify_greedy(draft_ids: np.ndarray | list[int], target: np.ndarray) -> Verdict:
    """Accept while the target's argmax equals the draft.

    draft_ids: [k] (an array or a list); target: logits [k + 1, vocab] (row i predicts position
    i), or the target's argmax token ids [k + 1] (engines that pick them where the logits live).
    """
    num_draft = len(draft_ids)
    _check_rows(num_draft, target, ids=True)
    target_ids = (target if target.ndim == 1 else np.argmax(target, axis=-1)).tolist()  # [k + 1]
    num_accepted = 0  # a short Python walk: cheaper than array operations at these sizes
    drafted_ids = draft_ids.tolist() if isinstance(draft_ids, np.ndarray) else draft_ids
    for drafted, chosen in zip(drafted_ids, target_ids):
        if drafted != chosen:
            break
        num_accepted += 1
    return Verdict(num_accepted, target_ids[num_accepted], num_accepted < num_draft)


def verify_tree_greedy(token_ids: Sequence[int], paths: Sequence[Sequence[int]], target: np.ndarray) -> list[Verdict]:
    """verify_greedy of every candidate of a token tree from one pass over its nodes.

    token_ids: [n] node tokens (tree.TokenTree); paths: [c] each candidate's nodes, the root
    first; target: logits [n, vocab] (row i predicts the token after node i) or the argmax ids
    [n]. Candidate c's verdict is verify_greedy(its span, target[paths[c]]): one argmax over
    the nodes, then a walk down each path while its tokens are the ones predicted."""
    if len(target) != len(token_ids):
        raise ValueError(f"target has {len(target)} rows for {len(token_ids)} tree nodes")
    target_ids = (target if target.ndim == 1 else np.argmax(target, axis=-1)).tolist()  # [n]
    verdicts = []  # a walk over lists, not verify_greedy per path: 4-5x less host time a tree pass
    for path in paths:
        num_accepted, last = 0, len(path) - 1
        while num_accepted < last and token_ids[path[num_accepted + 1]] == target_ids[path[num_accepted]]:
            num_accepted += 1
        verdicts.append(Verdict(num_accepted, target_ids[path[num_accepted]], num_accepted < last))
    return verdicts


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


def verify_tree_sampled(spans: list[list[int]], target_probs: list[np.ndarray],
                        rng: np.random.Generator) -> tuple[int, Verdict]:
    """Several point-mass candidates verified as one token tree, exactly (lossless tree
    verification with one-hot drafts): at each depth the target samples once from the row
    every candidate still alive shares (same prefix, same context) and the walk follows the
    candidates whose next token is that sample; the first sample no candidate holds is the
    recovered token, a sample after a candidate's last token its bonus. Every emitted token is a
    draw from the target given the tokens before it, whichever candidates were proposed; keeping
    the branch that accepted most after verifying each apart would not be.

    spans[i]: candidate i's tokens [k_i]; target_probs[i]: [k_i + 1, vocab], row j predicting
    position j after span[i][:j]. Returns (the candidate whose sequence holds the accepted
    tokens, the verdict: accepted count, next token, recovered)."""
    from .sampling import sample

    alive = list(range(len(spans)))
    depth = 0
    while True:
        lead = alive[0]  # every alive candidate holds the same tokens before `depth`
        token = sample(target_probs[lead][depth], rng)
        following = [i for i in alive if len(spans[i]) > depth and spans[i][depth] == token]
        if not following:
            return lead, Verdict(depth, token, any(len(spans[i]) > depth for i in alive))
        alive, depth = following, depth + 1


def common_prefix(span: Sequence[int], emitted: Sequence[int]) -> int:
    """How many of span's first tokens equal the emitted tokens (the tokens two spans share)."""
    count = 0
    for mine, theirs in zip(span, emitted):
        if mine != theirs:
            break
        count += 1
    return count


def _check_rows(num_draft: int, target_rows: np.ndarray, ids: bool = False) -> None:
    if target_rows.ndim not in ((1, 2) if ids else (2,)) or target_rows.shape[0] != num_draft + 1:
        raise ValueError(
            f"target needs {num_draft + 1} rows for {num_draft} draft tokens, got {target_rows.shape}"
        )


def row_probs(row: dict[int, float], params) -> dict[int, float]:
    """A logprob row that holds the top-k tokens of a distribution (raw log-softmax values, as
    vLLM returns them) -> the sampling distribution `params` makes of it (temperature, top-p).

    Exact when params.top_k equals the row's size (top-k keeps exactly these tokens) or the
    row is the whole vocabulary; tokens outside the row have probability 0.
    """
    from dataclasses import replace

    from .sampling import target_probs

    tokens = list(row)
    probs = target_probs(np.array([row[t] for t in tokens]), replace(params, top_k=0))  # [k]: already the top k
    return dict(zip(tokens, probs.tolist()))


def verify_sampled_rows(
    draft_ids: list[int],
    draft_rows: list[dict[int, float]],
    target_rows: list[dict[int, float]],
    bonus_token: int,
    params,
    rng: np.random.Generator,
    approx: bool = False,
) -> Verdict:
    """`verify_sampled` on top-k rows instead of whole vocabularies (what vLLM returns).

    draft_rows[i]: the draft's top-k at drafted position i (the distribution draft_ids[i] was
    sampled from); target_rows[i]: the target's top-k at the same position; bonus_token: the
    target's own sample after the whole draft. Rows become distributions by `row_probs`, on a
    local vocabulary (every token that appears), so the verdict is exactly verify_sampled's.
    """
    local = sorted({*draft_ids, bonus_token, *(t for row in (*draft_rows, *target_rows) for t in row)})
    index = {token: i for i, token in enumerate(local)}
    draft = np.zeros((len(draft_ids), len(local)))  # [k, local vocab]
    target = np.zeros((len(draft_ids) + 1, len(local)))  # [k + 1, local vocab]
    for position, (draft_row, target_row) in enumerate(zip(draft_rows, target_rows, strict=True)):
        for token, prob in row_probs(draft_row, params).items():
            draft[position, index[token]] = prob
        for token, prob in row_probs(target_row, params).items():
            target[position, index[token]] = prob
    target[len(draft_ids), index[bonus_token]] = 1.0  # the target sampled it itself
    verdict = verify_sampled(np.array([index[t] for t in draft_ids], dtype=np.int64), draft, target, rng, approx)
    return Verdict(verdict.num_accepted, local[verdict.next_token], verdict.recovered)


NO_TOKEN = -1  # stands for a bonus vLLM did not return


def verify_greedy_rows(draft_ids: list[int], rows: list[dict], bonus: int | None) -> tuple[int, int | None]:
    """`verify_greedy` on vLLM's logprob rows ({token: Logprob}, one per draft position): (tokens
    accepted while each is its row's argmax, the argmax at the first mismatch or `bonus`, the
    target's own token after a fully accepted draft; None where vLLM returned no bonus)."""
    target_ids = [_row_argmax(row) for row in rows[: len(draft_ids)]] + [NO_TOKEN if bonus is None else bonus]
    verdict = verify_greedy(draft_ids, np.asarray(target_ids, dtype=np.int64))
    return verdict.num_accepted, None if verdict.next_token == NO_TOKEN else verdict.next_token


def _row_argmax(row: dict) -> int:
    """The greedy token of a logprob row {token: Logprob}: rank 1, lowest id on ties."""
    return min(token for token, logprob in row.items() if logprob.rank == 1)


def exact_row_size(sampling, max_logprobs: int) -> int | None:
    """Tokens per vLLM logprob row that make sampled verification on rows exact: the row must hold
    every token the sampler may pick. top_k where vLLM may return that many, -1 (whole
    vocabularies) where it returns all (max_logprobs -1), else None (it cannot be exact)."""
    if sampling.greedy:
        return 1
    if sampling.top_k > 0 and (max_logprobs == -1 or sampling.top_k <= max_logprobs):
        return sampling.top_k
    return -1 if max_logprobs == -1 else None
