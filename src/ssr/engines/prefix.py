"""The last request's KV cache kept for the next one: turns of a conversation do not start over.

A sequence engine (one KV stream per sequence) that releases a request's longest sequence
keeps it instead, with the tokens it holds. The next prefill that shares a prefix with it takes
that sequence, cuts it back to the common prefix and feeds only the rest: turn N of an agent
conversation prefills its new messages, not the whole conversation again (vLLM's and
llama-server's prefix caches do the same across requests). A sequence needed for anything else
evicts the kept one first.

Lossless: the engines that keep a prefix give bit-identical logits whether tokens were fed one
at a time, in one pass or after a truncation (engines/llamacpp.py; tests/test_engine_contract.py),
so a reused prefix holds exactly what a cold prefill would.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..verifying.verify import common_prefix


MIN_SHARED_TOKENS = 16  # a shorter common prefix is not worth keeping (or taking) a stream for


class PrefixKeeper:
    """The tokens each live sequence holds, and the one released sequence kept for reuse."""

    def __init__(self, min_tokens: int = MIN_SHARED_TOKENS) -> None:
        self.min_tokens = min_tokens  # a shorter common prefix is not worth keeping a stream for
        self.tokens: dict[int, list[int]] = {}  # live sequence -> the tokens in its KV cache, in order
        self.kept: tuple[int, list[int]] | None = None  # (released sequence, its tokens), its KV intact
        self.reused = 0  # prompt tokens the last prefill took from the kept sequence (0: a cold prefill)

    # -- what the engine tells it --------------------------------------------------------------

    def fed(self, seq: int, tokens: Sequence[int]) -> None:
        self.tokens.setdefault(seq, []).extend(tokens)

    def truncated(self, seq: int, length: int) -> None:
        del self.tokens.setdefault(seq, [])[length:]

    def forked(self, source: int, target: int) -> None:
        self.tokens[target] = list(self.tokens.get(source, []))

    def released(self, seq: int) -> int | None:
        """seq is released: the sequence whose KV the engine must now clear and free — seq itself,
        or the one kept before it (seq, as long or longer, is kept instead) — or None."""
        tokens = self.tokens.pop(seq, [])
        if len(tokens) < self.min_tokens or (self.kept is not None and len(self.kept[1]) > len(tokens)):
            return seq
        previous = self.kept[0] if self.kept is not None else None
        self.kept = (seq, tokens)
        return previous

    # -- what the engine asks it ---------------------------------------------------------------

    def evict(self) -> int | None:
        """The kept sequence, given up because a sequence is needed (None: none is kept)."""
        if self.kept is None:
            return None
        seq, self.kept = self.kept[0], None
        return seq

    def take(self, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """For a prefill of token_ids: (the kept sequence, the common prefix length), or None."""
        self.reused = 0
        if self.kept is None:
            return None
        seq, tokens = self.kept
        shared = common_prefix(tokens, token_ids)
        if shared < self.min_tokens:
            return None
        self.kept = None
        self.tokens[seq] = tokens
        self.reused = shared
        return seq, shared
