"""Realigning a copy after the model changed it: where a pass's candidate was right for some tokens
and the model then wrote another token, the text often goes on copying the same place (an edit
of a file it read, a restated line with one word changed). The tokens after such a change follow
no occurrence of the context's last token, so no n-gram lookup or suffix tree finds them; the
copy's own position does. A candidate, from the candidate that went furthest before the change:

- "resume": past the token the model replaced (substituted: "the red dog" -> "the big dog");
- "rejoin": past the token the model wrote, where that was the one after the rejected one (it left
  one out).

Offered where the span policy picks among many candidates (proposers.request_proposer `wide`: a
token tree, one chain). GPU preset, `--limit 30`, ssr / SGLang, geometric mean over the 10
development groups: cold 0.807 -> 0.803, deployment order 0.793 -> 0.786. In one chain (ssr /
suffix) it took the one pick from a better candidate more often than it won (cold 0.922 ->
0.925) until the chain pooled what its candidates share (span_policy.pooled_probs); since,
cold 0.9083 -> 0.9067 and deployment order 0.9268 -> 0.9250. The rejected tail again (a token
put in) as a third: its first token right 1.5% of the times it was verified, 0.1% faster on
the development groups and 0.4% slower on nemo-gym in deployment order; left out
(docs/traces.md).
"""
from __future__ import annotations

from collections.abc import Sequence

from .source import Source

RESUME, REJOIN = Source.of("resume"), Source.of("rejoin")


class Realigner:
    """Follows the last pass's candidates through the tokens the model commits; right after the
    token where the furthest-going one (at least `least` tokens right) was first wrong, it offers
    that copy realigned. O(candidates) for the first token committed after a pass, O(still
    right) after."""

    def __init__(self, least: int = 1) -> None:
        self.least = least  # tokens a candidate must have had right before a change for it to be realigned
        self.live: list[tuple[list[int], int]] = []  # (span, index of its next token) of candidates right so far
        self.offers: list[tuple[Source, list[int]]] = []  # realigned copies, if the last token committed was a change

    def follow(self, candidates: Sequence[tuple[Source, list[int]]]) -> None:
        """The candidates just proposed: followed from the next token committed."""
        self.live = [(span, 0) for _, span in candidates if span]

    def observe(self, token_ids: Sequence[int]) -> None:
        for token in token_ids:
            best, live = None, []
            for span, at in self.live:
                if span[at] == token:
                    if at + 1 < len(span):
                        live.append((span, at + 1))
                elif at >= self.least and (best is None or at > best[1]):
                    best = (span, at)
            self.live = live
            self.offers = self._realigned(*best, token) if best is not None else []

    @staticmethod
    def _realigned(span: list[int], at: int, token: int) -> list[tuple[Source, list[int]]]:
        """The copy `span`, right up to `at`, where the model wrote `token` instead of span[at]."""
        if at + 1 < len(span) and span[at + 1] == token:  # span[at] left out
            return [(REJOIN, span[at + 2:])] if at + 2 < len(span) else []
        return [(RESUME, span[at + 1:])] if at + 1 < len(span) else []  # span[at] replaced

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        return [(source, span[:max_tokens]) for source, span in self.offers if max_tokens > 0]
