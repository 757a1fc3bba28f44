"""The limit of copy-based speculation, for the trace replay (`ssr traces --modes oracle`).

With hindsight (the trace is known), every pass proposes the longest continuation of the trace
that occurs anywhere in what a copying proposer could read: the prompt, the output so far and,
in deployment order, the earlier responses. A proposer that copies from the context can do no
better in one chain; every span it proposes is accepted whole. Its ratio to `ar` under a cost
model is the ceiling ssr and the peers are measured against.

`oracle-anchored` (anchor=1) asks more: the copy must follow an occurrence of the context's
last token, as every proposer that matches the context's end does (n-gram lookup, suffix trees,
SGLang's trie). The plain oracle also counts copies whose first token no such proposer could
reach: a stretch that occurred before after another token. On the development traces most of
its tokens are of that kind (docs/limit.md).

The context is held in a suffix automaton (every substring of the sequences added, each added
token O(1) amortised), so the longest copy of the next k tokens is a walk of at most k steps.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..proposing.proposers import CHAIN
from ..proposing.source import Source


class CopyIndex:
    """A generalised suffix automaton over token sequences: `longest(tokens)` is the length of
    the longest prefix of tokens that occurs in one of them (no match runs across two)."""

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]  # [state]: token -> the state after it
        self.link: list[int] = [-1]  # [state]: suffix link (the longest suffix in another state)
        self.size: list[int] = [0]  # [state]: length of the longest string the state stands for
        self._last = 0  # the state of the whole sequence being extended

    def start(self) -> None:
        """Begin a new sequence (matches never span the boundary)."""
        self._last = 0

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self._add(int(token))

    def longest(self, tokens: Sequence[int]) -> int:
        state, length = 0, 0
        for token in tokens:
            state = self.next[state].get(int(token), -1)
            if state < 0:
                break
            length += 1
        return length

    def _add(self, token: int) -> None:
        """The standard online construction (Blumer et al.), generalised: a transition that
        exists already from the current state is reused (or split) instead of a new state."""
        last, nxt, link, size = self._last, self.next, self.link, self.size
        if token in nxt[last]:  # the new string occurs already (another sequence holds it)
            self._last = self._split(last, token)
            return
        current = self._state(size[last] + 1)
        state = last
        while state >= 0 and token not in nxt[state]:
            nxt[state][token] = current
            state = link[state]
        link[current] = 0 if state < 0 else self._split(state, token)
        self._last = current

    def _split(self, state: int, token: int) -> int:
        """The state for (string of `state`) + token, made its own where it stands for more."""
        nxt, link, size = self.next, self.link, self.size
        target = nxt[state][token]
        if size[state] + 1 == size[target]:
            return target
        clone = self._state(size[state] + 1)
        nxt[clone] = dict(nxt[target])
        link[clone] = link[target]
        while state >= 0 and nxt[state].get(token) == target:
            nxt[state][token] = clone
            state = link[state]
        link[target] = clone
        return clone

    def _state(self, length: int) -> int:
        self.next.append({})
        self.link.append(-1)
        self.size.append(length)
        return len(self.size) - 1


class OracleProposer:
    """The proposer protocol with hindsight: `future` is the output the trace holds (CoT, then
    answer); each proposal is the longest prefix of what comes next that the context holds, up
    to max_span tokens; with `anchor`, only a copy that follows the context's last `anchor`
    tokens where they occurred before. A CoT's copy ends with its end marker (`cot_len`: the loop
    commits a CoT pass up to it)."""

    source = Source("oracle")
    shape = CHAIN
    implementation = None

    def __init__(self, prompt: Sequence[int], future: Sequence[int], earlier: Sequence[Sequence[int]] = (),
                 max_span: int = 64, anchor: int = 0, cot_len: int = 0) -> None:
        self.future = list(future)  # the whole output, known in hindsight
        self.cot_len = cot_len  # the future's CoT tokens, its end marker last
        self.max_span = max_span
        self.anchor = anchor  # tokens of the context's end a copy must follow (0: none)
        self.tail = list(prompt[-anchor:]) if anchor else []  # the context's last `anchor` tokens
        self.seen = 0  # output tokens committed so far
        self.index = CopyIndex()
        for sequence in list(earlier) + [list(prompt)]:  # earlier responses, then the request
            self.index.start()
            self.index.extend(sequence)  # the request's sequence goes on with its output

    def observe(self, token_ids: Sequence[int]) -> None:
        self.index.extend(token_ids)
        self.seen += len(token_ids)
        if self.anchor:
            self.tail = (self.tail + list(token_ids))[-self.anchor:]

    def add_source(self, token_ids: Sequence[int]) -> None:
        """A trace replay forks no draft."""

    def prepare(self) -> None:
        """Nothing deferred: its index is made with it."""

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        end = self.seen + min(max_tokens, self.max_span)
        ahead = self.future[self.seen: min(end, self.cot_len) if self.seen < self.cot_len else end]
        if not self.anchor:
            span = ahead[: self.index.longest(ahead)]
        elif len(self.tail) < self.anchor:  # the context is shorter than the anchor
            span = []
        else:  # the tail's occurrence at the context's end has nothing after it: an earlier one's
            span = ahead[: max(0, self.index.longest(self.tail + ahead) - self.anchor)]
        return span, [1.0] * len(span) if span else None

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        span, _ = self.propose(max_tokens)
        return [(self.source, span)] if span else []


ORACLES = {"oracle": 0, "oracle-anchored": 1}  # the oracle modes -> the tokens of context a copy must follow
