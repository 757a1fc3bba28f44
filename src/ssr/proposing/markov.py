"""One more source for one chain a pass: the greedy path of a variable-order Markov model of the
text. Each token is the commonest continuation of the longest of the context's last ORDER tokens
(the span's own tokens so far included) that occurred before with a continuation, the most
recently seen of equals; where even the last token occurred nowhere before, the context's
commonest token. The match is made again after every token, never longer than ORDER, where the
suffix tree's span follows one match down its tree (SuffixTree.propose_from) and n-gram lookup
copies what followed one occurrence.

Why (docs/chain.md): it is the candidate one chain was missing. GPU preset,
`ssr traces <the five non-agentic dev files> --limit 30 --candidates chain --modes
ar,ssr,suffix`, ssr / suffix (geometric mean of the medians), with lookup's commonest tokens and
other ways out of the chain: cold 0.9067 -> 0.8975, deployment order 0.9250 -> 0.9079. Ties
broken towards the earliest instead: 0.9054 cold; the most recent continuation alone, no counts:
0.9036; the suffix tree's own counts (arctic's speculate, which breaks ties by its map's order):
0.9050.

The counts live in one dict keyed by a rolling hash of each n-gram (a collision costs a worse
guess, never a wrong output: every span is verified): n-gram -> (the commonest token after it,
that token's count, the n-gram's own count). How often a context went on to a token is the count
of the n-gram one longer, so the one dict is all it needs: about ORDER + 2 entries a token of
new text at most, ~80 bytes each.
"""
from __future__ import annotations

from collections.abc import Sequence

from .proposers import OneSource
from .source import Source

ORDER = 8  # the longest context matched (on the development traces 12 did no better, 4 lost 0.5-1.5%)
SPAN = 12  # tokens drafted at most (the span policy cuts them to what pays; 24 did no better)
# the prompt's last tokens the model is built from: on a 110,863-token prompt the whole took 1.0 s
# and 67 MB (5.4 entries a token), its last 16,384 0.12 s (inside vLLM's step, which the batch
# waits for); the suffix tree copies from all of it (proposers.CHAIN_LOOKUP_PROMPT says what
# 4,096 instead of 16,384 changed)
PROMPT_TOKENS = 4096
HISTORY_TOKENS = 200_000  # earlier responses' tokens the deployment's model keeps
_MOD = (1 << 61) - 1  # rolling hashes of n-grams, modulo a Mersenne prime
_BASE = 1_000_003
_BITS = 24  # a packed entry: token | count after << 24 | count << 48 (the count after saturates at 2^24 - 1)
_FULL = (1 << _BITS) - 1


class MarkovModel:
    """Counts of every n-gram of at most ORDER + 1 tokens of the texts added, each text apart."""

    def __init__(self) -> None:
        # n-gram hash -> packed: the commonest token after it | its count << 24 | the n-gram's count << 48
        # (a count of 0 after it: it never went on)
        self.entries: dict[int, int] = {}
        self.tokens = 0  # tokens added

    def add(self, token_ids: Sequence[int], hashes: list[int] | None = None) -> list[int]:
        """Add a text's tokens; `hashes` (from the last call, for a text that goes on) are the
        hashes of its last n-grams, n = 0 .. ORDER + 1 ([0]: the empty one). Returns them."""
        entries = self.entries
        hashes = hashes if hashes is not None else [0]
        for token in token_ids:
            grown = grow(hashes, token)
            for gram in grown[1:]:  # each n-gram ending here occurred once more
                entries[gram] = entries.get(gram, 0) + (1 << 48)
            for n in range(min(len(hashes), ORDER + 1)):  # the n-gram before `token` went on to it
                count = entries[grown[n + 1]] >> 48  # as often as context + token occurred
                packed = entries.get(hashes[n], 0)
                if count >= packed >> _BITS & _FULL:  # the commonest, of equals the latest to get there
                    entries[hashes[n]] = packed >> 48 << 48 | min(count, _FULL) << _BITS | token
            hashes = grown
        self.tokens += len(token_ids)
        return hashes

    def next_token(self, hashes: list[int], top: int, floor: int = -1) -> tuple[int, int] | None:
        """(the commonest token after the longest of the n-grams `hashes` stands for, floor < n <=
        top, that went on before; n), None where none did (n = 0 counts: the commonest token)."""
        entries = self.entries
        for n in range(min(top, ORDER, len(hashes) - 1), floor, -1):
            packed = entries.get(hashes[n], 0)
            if packed >> _BITS & _FULL:
                return packed & _FULL, n
        return None


def grow(hashes: list[int], token: int) -> list[int]:
    """The n-gram hashes after `token` is appended (n = 0 .. ORDER + 1)."""
    return [0] + [(h * _BASE + token + 1) % _MOD for h in hashes[: ORDER + 1]]


class MarkovProposer(OneSource):
    """The model's greedy path as a candidate each pass ("markov/<n>" by the match its first token
    followed, 1-4 and more; "markov" for the commonest token), from the request's own text (prompt
    and output) or, on a longer match only, from the deployment's earlier responses (`history`)."""

    def __init__(self, prompt: Sequence[int], history=None) -> None:
        self.model = MarkovModel()  # the request's prompt (its last PROMPT_TOKENS) and output
        self.hashes: list[int] | None = None  # the context's last n-grams (None: nothing counted yet)
        # tokens not counted yet, the prompt's first: counted when a span is next drafted (drafted
        # per step, vLLM's drafter offers one span a pass from other sources while its batch is
        # full, and pays for counting them only when it drafts from this source: a 95,249-token
        # agent prompt's last 16,384 tokens take 0.12 s, inside vLLM's step)
        self._pending: list[int] = list(prompt[-PROMPT_TOKENS:])
        # the deployment's earlier responses (ResponseHistory.markov: EarlierResponses), None: none kept
        self.earlier = history.markov() if history is not None else None

    def observe(self, token_ids: Sequence[int]) -> None:
        self._pending.extend(token_ids)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Drafts are the suffix tree's and lookup's to copy from."""

    def prepare(self) -> None:
        """The pending tokens counted (the loop's proposer, built beside a prefill; vLLM's drafter
        leaves them till it drafts from this source)."""
        if self._pending:
            self.hashes, self._pending = self.model.add(self._pending, self.hashes), []

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        span, first = self.draft(max_tokens)
        return [(Source.of("markov", min(first, 4)) if first else UNMATCHED, span)] if span else []

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        return self.draft(max_tokens)[0], None

    def draft(self, limit: int) -> tuple[list[int], int]:
        """(span of at most `limit` and SPAN tokens, the match its first token followed)."""
        self.prepare()
        earlier = self.earlier.model if self.earlier is not None and self.earlier.model.tokens else None
        hashes, span, first, top = self.hashes, [], 0, ORDER
        while len(span) < min(limit, SPAN):
            found = self.model.next_token(hashes, top)
            if earlier is not None:  # a longer match there only
                found = earlier.next_token(hashes, top, found[1] if found is not None else -1) or found
            if found is None:
                break
            token, match = found
            if not span:
                first = match
            span.append(token)
            top = match + 1  # a match is at most one longer than the last: hashes up to it are enough
            hashes = grow(hashes[: min(top, ORDER) + 1], token)
        return span, first


UNMATCHED = Source.of("markov")


class EarlierResponses:
    """The deployment's earlier responses as one MarkovModel, each response a text of its own,
    kept to HISTORY_TOKENS: past it the model is made again from the newer half."""

    def __init__(self) -> None:
        self.model = MarkovModel()
        self.responses: list[list[int]] = []  # oldest first

    def add(self, token_ids: Sequence[int]) -> None:
        if not token_ids:
            return
        self.responses.append(list(token_ids))
        self.model.add(token_ids)
        if self.model.tokens > HISTORY_TOKENS:  # as ResponseHistory.add bounds the Python trees
            tokens = self.model.tokens
            while tokens > HISTORY_TOKENS // 2:
                tokens -= len(self.responses.pop(0))
            self.model = MarkovModel()
            for response in self.responses:
                self.model.add(response)
