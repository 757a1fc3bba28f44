"""Logits -> target distribution, applied identically by every decoding path."""
from __future__ import annotations

import numpy as np

from ..config import SamplingParams


def target_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Temperature, then top-k, then top-p; rows renormalised.

    logits: [vocab] or [num_rows, vocab] -> probs of the same shape (float64).
    """
    if params.greedy:
        raise ValueError("target_probs is for sampling; greedy decoding uses argmax")
    scaled = np.atleast_2d(np.asarray(logits, dtype=np.float64))  # [num_rows, vocab]
    # shifted before dividing: no inf - inf for tiny temperatures (the max stays 0, the rest -inf)
    with np.errstate(over="ignore"):
        scaled = (scaled - scaled.max(axis=-1, keepdims=True)) / params.temperature
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        kth = np.partition(scaled, vocab - params.top_k, axis=-1)[:, vocab - params.top_k]
        scaled = np.where(scaled < kth[:, None], -np.inf, scaled)
    scaled -= scaled.max(axis=-1, keepdims=True)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")  # [num_rows, vocab]
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        mass_before = np.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep_sorted = mass_before < params.top_p  # always keeps the most likely token
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs if np.ndim(logits) == 2 else probs[0]


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from an unnormalised distribution [vocab] (inverse CDF, one uniform)."""
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0:
        raise ValueError("cannot sample from an all-zero distribution")
    index = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    # guard the float edge u*total == total; skip zero-probability ids at the top end
    index = min(index, len(probs) - 1)
    while probs[index] == 0:
        index -= 1
    return index


def next_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Plain decoding's choice from one row of logits [vocab]."""
    if params.greedy:
        return int(np.argmax(logits))
    return sample(target_probs(logits, params), rng)
