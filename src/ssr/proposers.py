"""Continuation proposers: they guess the next answer tokens for one verify pass.

One small protocol: `observe` committed tokens, `propose` up to n tokens.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .config import SuffixParams
from .suffix_tree import SuffixTree


class Proposer(Protocol):
    def observe(self, token_ids: Sequence[int]) -> None:
        """Tokens just committed to the output (forced answer prefix included)."""

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        """At most max_tokens guesses for the tokens that follow ([] for none), and the
        estimated probability that each prefix of them is right (None: no estimate)."""


class SuffixProposer:
    """Suffix decoding over seed sequences (prompt, CoT, draft) and the live answer."""

    def __init__(self, params: SuffixParams, seeds: Sequence[Sequence[int]]) -> None:
        self.params = params
        self.tree = SuffixTree(params.max_depth)
        for seed in seeds:
            self.tree.add_sequence(seed)
        self._live = self.tree.add_sequence()  # the answer as it is committed
        self._context: list[int] = []  # last max_depth committed tokens

    def observe(self, token_ids: Sequence[int]) -> None:
        self.tree.extend(self._live, token_ids)
        self._context = (self._context + list(token_ids))[-self.params.max_depth :]

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        span, probs, _ = self.tree.propose(
            self._context,
            min(max_tokens, self.params.max_span),
            self.params.span_factor,
            self.params.min_prob,
        )
        return span, probs


class PromptLookupProposer:
    """Prompt-lookup decoding (n-gram match over prompt + CoT + answer), as in transformers."""

    def __init__(self, seed: Sequence[int], max_ngram: int = 3, num_tokens: int = 10) -> None:
        self.tokens = list(seed)  # everything the model has seen
        self.max_ngram = max_ngram  # longest n-gram matched first
        self.num_tokens = num_tokens  # tokens proposed after the match

    def observe(self, token_ids: Sequence[int]) -> None:
        self.tokens.extend(token_ids)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        limit = min(max_tokens, self.num_tokens)
        tokens = self.tokens
        for size in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            ngram = tokens[-size:]
            # the most recent earlier occurrence of the n-gram
            for start in range(len(tokens) - size - 1, -1, -1):
                if tokens[start : start + size] == ngram:
                    return tokens[start + size : start + size + limit], None
        return [], None
