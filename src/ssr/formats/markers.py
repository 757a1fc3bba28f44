"""A thinking format's markers as token ids, and where they stand in a request's tokens: what
ssr's drafter and vLLM's thinking budget both read (a prompt that opens a CoT, one that closes it)."""
from __future__ import annotations

from collections.abc import Sequence


def marker_ids(tokenizer, fmt) -> tuple[list[int], list[int]]:
    """(start, end) ids of a ThinkingFormat's markers, encoded as vLLM encodes them (no special
    tokens added; an empty marker has none)."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False) if text else []  # noqa: E731
    return encode(fmt.start.strip()), encode(fmt.end)


def last_at(tokens: Sequence[int], marker: Sequence[int]) -> int:
    """Where the last occurrence of marker starts in tokens (-1: none, or an empty marker)."""
    size = len(marker)
    if not size:
        return -1
    marker = list(marker)
    for at in range(len(tokens) - size, -1, -1):
        if list(tokens[at:at + size]) == marker:
            return at
    return -1


def tokens_after(tokens: Sequence[int], marker: Sequence[int]) -> int | None:
    """Tokens after the last occurrence of marker (None: it does not occur, or is empty)."""
    at = last_at(tokens, marker)
    return None if at < 0 else len(tokens) - (at + len(marker))


def thinking_at_start(prompt_ids: Sequence[int], start_ids: Sequence[int], end_ids: Sequence[int]) -> bool:
    """Whether a request begins inside a CoT: its prompt opens one (the start marker) and does not
    close it after (the end marker); vLLM's thinking budget reads a prompt so too. ssr's own walk
    sends the CoT and the answer as separate requests; a client of stock vLLM sends one request
    that does both."""
    start, end = last_at(prompt_ids, start_ids), last_at(prompt_ids, end_ids)
    return start >= 0 and end < start
