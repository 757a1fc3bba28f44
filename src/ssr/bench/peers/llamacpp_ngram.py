"""llama.cpp's speculative n-gram modes, for the trace replay (`llamacpp-ngram-simple`,
`llamacpp-ngram-mod`: llama-server's `--spec-type ngram-simple` / `ngram-mod`), read in the
llama.cpp that llama-cpp-python 0.3.36 (the version ssr pins) vendors, ggml-org/llama.cpp@0c1e570
(its CHANGELOG). The Python package builds that library but neither mode: they are llama-server's
(tools/server/server-context.cpp), so a user of ssr's default engine meets them there.

The server (server-context.cpp): the first token after the prompt is sampled without a draft;
then each step drafts from the history (prompt + output, `id_last` the token just sampled) and
verifies [id_last] + draft as one chain, no padding; --spec-draft-n-min/-max and --draft-p-min
apply to draft models only (common.h, arg.cpp), so a draft is what the mode returns.

- ngram-simple (common/ngram-map.cpp `common_ngram_simple_draft`, no state; common.h size_n 12,
  size_m 48): the last 12 tokens' most recent earlier occurrence, searched backwards from the
  history's end (not at position 0, not the window itself nor the one a token before), drafts up
  to 48 tokens that follow it in the history; fewer than 12 there, no draft. A history of 62
  tokens or fewer drafts nothing.
- ngram-mod (common/ngram-mod.cpp, common/speculative.cpp; common.h n_match 24, n_min 48, n_max 64):
  one pool of 4M slots shared by the server's slots and kept across requests, each slot the
  token that followed the last 24-gram hashed there (an LCG polynomial hash mod 2^64, slot = hash
  mod 4M; the latest write wins, collisions unchecked). The prompt is added at the request's
  begin (then, if over a quarter of the slots are used, the pool is emptied); later history is
  added when more than 32 tokens are pending. A draft re-hashes its last 24 tokens (its own
  drafted ones included) slot by slot up to 64, stops at an empty slot, and is dropped whole
  under 48. Five drafts in a row with under a quarter accepted empty the pool.
"""
from __future__ import annotations

from collections.abc import Sequence

from ...proposing.history import ResponseHistory
from ...proposing.proposers import OneSource
from ...proposing.source import Source

SIMPLE_N, SIMPLE_M = 12, 48  # common.h: speculative ngram_simple size_n, size_m
MOD_N, MOD_MIN, MOD_MAX = 24, 48, 64  # common.h: ngram_mod n_match, n_min, n_max
POOL_SLOTS = 4 * 1024 * 1024  # speculative.cpp: the pool's size
_MULTIPLIER, _MASK = 6364136223846793005, (1 << 64) - 1  # ngram-mod.cpp: the hash's LCG step, uint64


class NgramSimpleProposer(OneSource):
    """ngram-simple: stateless; every start of each 12-gram kept to find its latest occurrence."""

    source = Source("llamacpp-ngram-simple")  # one chain, as proposed (OneSource.shape)

    def __init__(self, prompt: Sequence[int]) -> None:
        self.tokens: list[int] = []  # prompt + output (the last is id_last)
        self.starts: dict[tuple[int, ...], list[int]] = {}  # 12-gram -> its starts, ascending
        self.output = 0
        self._add(prompt)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """llama.cpp's n-gram modes read the request's own history only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        self._add(token_ids)
        self.output += len(token_ids)

    def _add(self, token_ids: Sequence[int]) -> None:
        for token in token_ids:
            self.tokens.append(int(token))
            if len(self.tokens) >= SIMPLE_N:
                self.starts.setdefault(tuple(self.tokens[-SIMPLE_N:]), []).append(len(self.tokens) - SIMPLE_N)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        history = len(self.tokens) - 1  # the KV history, id_last not in it
        if not self.output or history <= SIMPLE_N + SIMPLE_M + 1 or max_tokens < 1:
            return [], None
        latest = history - SIMPLE_N - 1  # the search starts here, backwards, and stops before 0
        found = next((j for j in reversed(self.starts.get(tuple(self.tokens[-SIMPLE_N:]), ())) if 1 <= j <= latest),
                     None)
        if found is None:
            return [], None
        count = min(SIMPLE_M, history - (found + SIMPLE_N))
        if count < SIMPLE_N:
            return [], None
        start = found + SIMPLE_N
        return self.tokens[start: start + count][:max_tokens], None


def _hash(key: Sequence[int]) -> int:
    value = 0
    for token in key:
        value = (value * _MULTIPLIER + token) & _MASK
    return value % POOL_SLOTS


class NgramPool:
    """ngram-mod's pool (one per server) and its slot's counters (one slot serves the replay)."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}  # slot -> the token after the last 24-gram hashed there
        self.low = 0  # drafts in a row with under a quarter accepted (the slot's n_low; kept across requests)

    def add(self, tokens: Sequence[int], at: int) -> None:
        self.slots[_hash(tokens[at: at + MOD_N])] = tokens[at + MOD_N]


class NgramModProposer(OneSource):
    """ngram-mod over the shared pool."""

    source = Source("llamacpp-ngram-mod")  # one chain, as proposed (OneSource.shape)

    def __init__(self, prompt: Sequence[int], history: ResponseHistory | None = None) -> None:
        self.pool = history.kept("llamacpp-ngram-mod", NgramPool) if history is not None else NgramPool()
        self.tokens = [int(t) for t in prompt]
        self.output = 0
        self.indexed = 0  # i_last: n-grams starting before it are in the pool
        self.drafted = 0  # n_draft_last: the last draft's length (0: none verified)
        if len(self.tokens) >= MOD_N:  # begin(prompt)
            for at in range(len(self.tokens) - MOD_N):
                self.pool.add(self.tokens, at)
            self.indexed = len(self.tokens) - MOD_N
            if len(self.pool.slots) / POOL_SLOTS > 0.25:
                self.pool.slots.clear()

    def add_source(self, token_ids: Sequence[int]) -> None:
        """llama.cpp's n-gram modes read the request's own history only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        if self.drafted and token_ids:  # accept(): the draft tokens the step accepted
            if (len(token_ids) - 1) / self.drafted < 0.25:
                self.pool.low += 1
                if self.pool.low >= 5:
                    self.pool.slots.clear()
                    self.pool.low, self.indexed = 0, 0
            else:
                self.pool.low = 0
        self.drafted = 0
        self.tokens += [int(t) for t in token_ids]
        self.output += len(token_ids)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        self.drafted = 0
        history = len(self.tokens) - 1  # the KV history, id_last not in it
        if not self.output or history < MOD_N or max_tokens < 1:
            return [], None
        if self.indexed + 32 < history:
            for at in range(self.indexed, history - MOD_N):
                self.pool.add(self.tokens, at)
            self.indexed = history - MOD_N
        window, draft = self.tokens[-MOD_N:], []
        for i in range(MOD_MAX):
            token = self.pool.slots.get(_hash(window[i: i + MOD_N]))
            if token is None:
                if i < MOD_MIN:
                    return [], None
                break
            window.append(token)
            draft.append(token)
        self.drafted = len(draft)
        return draft[:max_tokens], None
