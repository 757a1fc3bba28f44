"""A small deterministic engine for unit tests of the decoding loop.

Tokens are ASCII bytes (id 0 is EOS). The logits of a context are a fixed function
of its last `order` tokens plus a weak term of the whole context, so drafts from a
partial context mostly, but not always, agree with the full one. It is exactly
batch-invariant, so SSR must reproduce plain decoding token for token on it.
"""
from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .base import EngineError


class FakeEngine:
    vocab_size = 128
    eos_ids = frozenset({0})
    chat_template = None
    bos_text = ""
    eos_text = "<eos>"

    def __init__(self, order: int = 3, drift: float = 0.6, max_sequences: int = 4,
                 context_size: int = 1 << 16, eos_bias: float = 0.0) -> None:
        self.order = order  # tokens of context that set the logits
        self.drift = drift  # weight of the whole-context term (breaks exact repeats)
        self.eos_bias = eos_bias  # added to EOS logits in the answer, to end it sooner
        self.max_sequences = max_sequences
        self.context_size = context_size
        self.calls: Counter[str] = Counter()  # engine calls by name, for tests
        self._tokens: dict[int, list[int]] = {}
        self._next_id = 0

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        return [ord(ch) if 0 < ord(ch) < 128 else ord("?") for ch in text]

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id == 0 else bytes([token_id])

    def prefill(self, token_ids: Sequence[int]) -> int:
        self.calls["prefill"] += 1
        return self._new(list(token_ids))

    def fork(self, seq: int) -> int:
        self.calls["fork"] += 1
        return self._new(list(self._tokens[seq]))

    def step(self, batch: Sequence[tuple[int, int]]) -> np.ndarray:
        self.calls["step"] += 1
        self.calls[f"step_batch_{len(batch)}"] += 1
        rows = []
        for seq, token in batch:
            self._tokens[seq].append(token)
            rows.append(self._logits(self._tokens[seq]))
        return np.stack(rows)

    def score(self, seq: int, token_ids: Sequence[int]) -> np.ndarray:
        self.calls["score"] += 1
        tokens = self._tokens[seq]
        rows = []
        for token in token_ids:
            tokens.append(token)
            rows.append(self._logits(tokens))
        return np.stack(rows)

    def truncate(self, seq: int, length: int) -> None:
        del self._tokens[seq][length:]

    def release(self, seq: int) -> None:
        del self._tokens[seq]

    def length(self, seq: int) -> int:
        return len(self._tokens[seq])

    def live_sequences(self) -> int:
        return len(self._tokens)

    def _new(self, tokens: list[int]) -> int:
        if len(self._tokens) >= self.max_sequences:
            raise EngineError(f"more than {self.max_sequences} sequences")
        self._next_id += 1
        self._tokens[self._next_id] = tokens
        return self._next_id

    def _logits(self, tokens: list[int]) -> np.ndarray:
        local = zlib.crc32(bytes(tokens[-self.order :]))
        rng = np.random.default_rng(local)
        logits = rng.normal(0.0, 3.0, self.vocab_size)  # [vocab]
        glob = np.random.default_rng(sum(tokens) % 5).normal(0.0, self.drift, self.vocab_size)
        logits += glob
        logits[0] += self.eos_bias - 4.0  # EOS rare unless biased
        return logits.astype(np.float32)
