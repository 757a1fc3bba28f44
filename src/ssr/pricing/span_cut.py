"""The cut of one candidate span: how many of its tokens are worth verifying in one pass with the
pending token, from its acceptance curve S(1), S(2), .. and the engine's pass prices (expected
tokens per second, best_span). The span policy (span_policy.py) cuts every candidate with these."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate

from .costs import CostModel


def best_span_length(accept_probs: Sequence[float], costs: CostModel) -> int:
    """Length of the span prefix to verify; 0 means decode one token plainly.

    accept_probs[i]: estimated probability that the first i + 1 proposed tokens
    are all accepted (non-increasing). Maximises expected tokens per second,
    (1 + expected accepted(k)) / cost(k + 1).
    """
    return best_span(accept_probs, costs)[0]


def best_span(accept_probs: Sequence[float], costs: CostModel, priced: list[float] | None = None) -> tuple[int, float]:
    """(best length, its expected tokens per second); length 0 is a plain step. priced: the
    costs of passes over 1, 2, ... tokens (CostModel.costs), when the caller has them."""
    return best_spans(accept_probs, costs, priced)[-1]


def best_spans(accept_probs: Sequence[float], costs: CostModel, priced: list[float] | None = None,
               floors: list[float] | None = None) -> list[tuple[int, float]]:
    """best_span of every prefix of accept_probs in one walk: [L] is best_span(accept_probs[:L])
    (spans of one source cut at different lengths share their curve). floors: [k] the least of
    priced[k:] (pass_floors), when the caller has them. The walk stops where no longer span can
    do better: accept_probs never grows, so past length k a span adds at most accept_probs[k - 1]
    a token, and its pass costs at least floors[k + 1]."""
    if priced is None or len(priced) < len(accept_probs) + 1:
        priced, floors = costs.costs(len(accept_probs) + 1), None  # [k - 1]: a pass over k tokens
    if floors is None or len(floors) != len(priced):
        floors = pass_floors(priced)
    best_len, best_rate, length, expected, total = 0, 1.0 / priced[0], 0, 0.0, len(accept_probs)
    out = [(best_len, best_rate)]
    for prob, cost in zip(accept_probs, priced[1:]):  # pending token + span in one pass
        length += 1
        expected += prob
        rate = (1.0 + expected) / cost
        if rate > best_rate:  # the first of equals: the shortest
            best_len, best_rate = length, rate
        out.append((best_len, best_rate))
        if length < total and (1.0 + expected + (total - length) * prob) / floors[length + 1] <= best_rate:
            out.extend([(best_len, best_rate)] * (total - length))  # nothing longer beats it
            break
    return out


def best_length(curve: Iterable[float], length: int, priced: list[float], floors: list[float]) -> int:
    """best_spans(curve[:length], ..., priced, floors)[-1][0] without the list of every prefix's
    best (a lone candidate's cut, drafted per step for each request of vLLM's batch): the same
    walk, the same arithmetic, the same stop, reading the curve only as far as the walk goes.
    priced and floors reach length + 1 tokens."""
    best_len, best_rate, expected = 0, 1.0 / priced[0], 0.0
    for index, prob in zip(range(length), curve):  # pending token + span in one pass
        expected += prob
        rate = (1.0 + expected) / priced[index + 1]
        if rate > best_rate:  # the first of equals: the shortest
            best_len, best_rate = index + 1, rate
        if index + 1 < length and (1.0 + expected + (length - index - 1) * prob) / floors[index + 2] <= best_rate:
            break  # nothing longer beats it
    return best_len


def pass_floors(priced: list[float]) -> list[float]:
    """[k]: the least of priced[k:] (the cheapest pass over k + 1 tokens or more)."""
    return list(accumulate(reversed(priced), min))[::-1]
