"""The engine protocol every adapter implements.

A *sequence* is a handle (int) to tokens held in the engine's KV cache. Decoding
keeps one *pending* token per sequence: chosen, committed, not yet fed. Feeding
tokens returns one row of logits per fed token, the row predicting what follows.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .prefix import PrefixKeeper


class EngineError(RuntimeError):
    """The engine could not do what was asked (context full, too many sequences)."""


class Engine(Protocol):
    vocab_size: int  # rows of logits are [vocab_size]
    eos_ids: frozenset[int]  # tokens that end generation
    max_sequences: int  # sequences that may be alive at once (parent + children)
    slots: int  # requests a server may decode at once on it (sequence engines: 1, one KV cache a request)
    context_size: int  # tokens the KV cache holds, all sequences together
    chat_template: str | None  # Hugging Face jinja chat template, if the model has one
    bos_text: str  # text of the BOS / EOS tokens, for chat templates
    eos_text: str

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        """Text -> token ids; special tokens in the text are parsed."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token decodes to (partial UTF-8 allowed)."""

    def prefill(self, token_ids: Sequence[int]) -> int:
        """New sequence holding these tokens; no logits are computed."""

    def fork(self, seq: int) -> int:
        """New sequence sharing seq's KV entries (no recompute)."""

    def step(self, batch: Sequence[tuple[int, int]]) -> np.ndarray:
        """Feed one token to each (seq, token) in one forward pass -> logits [len(batch), vocab]."""

    def score(self, seq: int, token_ids: Sequence[int]) -> np.ndarray:
        """Feed k tokens to one sequence in one pass -> logits [k, vocab]."""

    def truncate(self, seq: int, length: int) -> None:
        """Keep the first `length` tokens of seq."""

    def release(self, seq: int) -> None:
        """Free seq and its KV entries not shared with others."""

    def length(self, seq: int) -> int:
        """Tokens held for seq."""

    capabilities: Capabilities  # what it can do beyond this core, declared by its class

    def live_sequences(self) -> int:
        """Sequences holding KV entries now, every request's together (several may share it)."""


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond the core protocol, declared by its class (never probed); each
    flag names the optional protocol below that the engine then implements."""

    returns_ids: bool = False  # ReturnsIds: greedy passes return the argmax ids, no row crosses to the host
    shares_passes: bool = False  # SharesPasses: several sequences' tokens in one forward pass (score_batch)
    tree_attention: bool = False  # TreeAttention: a token tree on one sequence in one pass (score_tree, keep_path)
    keeps_prefix: bool = False  # KeepsPrefix: the last request's KV kept for the next prefill (`prefix`)
    modelled_clock: bool = False  # ModelledClock: it models its own seconds (`clock`), the replay engines
    requests: bool = False  # driven as requests (vLLM, loop/vllm_walk.py), not by sequence steps
    # DraftsPerStep: speculates as vLLM's drafter does (the replay of what vLLM runs): a chain is
    # drafted after each step's sampled tokens, so none before the prefill's own token and one right
    # after the CoT's end marker, priced on the cost table as given (the drafter times no pass)
    drafts_per_step: bool = False
    # its prefill runs off the host (an accelerator computes it while the host waits), so the loop
    # builds the request's proposer meanwhile (Sequences.prefill_beside); on a CPU engine the
    # prefill holds the cores the build would take, so it builds after
    prefill_frees_host: bool = False
    serves_metrics: bool = False  # ServesMetrics: its own Prometheus metrics (metrics_text), served on ssr's /metrics


class ReturnsIds(Protocol):
    """step(batch, ids=True, banned=None), score(seq, tokens, ids=True, banned=None) and, where it
    shares passes, score_batch(feeds, ids=True, banned=None): token ids [k] per feed instead of rows
    [k, vocab], the argmax taken where the logits live, a banned id never chosen."""


class SharesPasses(Protocol):
    def score_batch(self, feeds: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
        """Feed each (seq, tokens) in one pass -> logits [len(tokens), vocab] per feed."""


class DraftsPerStep(Protocol):
    batch: int  # requests in each of its steps (each one's drafting on the step's host time)


class TreeAttention(Protocol):
    def score_tree(self, seq: int, token_ids: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Feed n nodes after seq's tokens, node i seeing seq and its ancestors only (parents[i] <
        i; -1: the sequence's last token), at position length + depth -> logits [n, vocab]."""

    def keep_path(self, seq: int, nodes: Sequence[int]) -> None:
        """After score_tree: seq keeps the nodes of one root-first path, the others are dropped."""


class KeepsPrefix(Protocol):
    prefix: PrefixKeeper | None  # the kept sequence (None: keeping is off); `reused`: what the last prefill took


class ServesMetrics(Protocol):
    def metrics_text(self) -> bytes:
        """The engine's own metrics in Prometheus' text format (served after ssr's on /metrics)."""


class ModelledClock(Protocol):
    def clock(self) -> float:
        """The engine's modelled seconds so far."""

    def pass_clock(self) -> float:
        """The same less any of the loop's own time put on it: the seconds of its calls alone."""

    def beside_prefill(self, seconds: float) -> float:
        """The loop's host work of `seconds` ran beside the last prefill (prefill_frees_host): the
        part the prefill's modelled seconds cover (returned) is no host time of the request's."""


class PassTimer:
    """An engine seen through a stopwatch: the wall seconds spent inside its calls (passes,
    prefill, forks, KV edits), so that the rest of a request's wall time is the loop's own host
    time. Every attribute is the engine's; `score_batch` exists where the engine has it."""

    TIMED = frozenset({"prefill", "step", "score", "score_batch", "score_tree", "keep_path", "fork", "truncate",
                       "release"})
    PASSES = frozenset({"step", "score", "score_batch", "score_tree"})  # forward passes that return rows or ids

    def __init__(self, engine) -> None:
        self.engine = engine  # the adapter timed
        self.seconds = 0.0  # wall seconds inside timed calls
        self.passes = 0  # forward passes (prefill not counted: it returns nothing)
        for name in self.TIMED:  # bound once: the loop calls them every pass
            if callable(getattr(engine, name, None)):
                setattr(self, name, self._timed(getattr(engine, name), name in self.PASSES))

    def __getattr__(self, name: str):  # everything not timed is the engine's own
        return getattr(self.engine, name)

    def _timed(self, call, is_pass: bool):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.passes += is_pass
        return timed


def shares_passes(engine) -> bool:
    """Whether the engine (or engine class) feeds several sequences' tokens in one forward pass
    (`score_batch`): a parent's speculative pass and a child's step then cost one pass."""
    return engine.capabilities.shares_passes


def tree_passes(engine) -> bool:
    """Whether the engine verifies a token tree on one sequence in one pass (`score_tree` and
    `keep_path`: tree attention), so several candidates need no fork each."""
    return engine.capabilities.tree_attention


def argmax_ids(rows: np.ndarray, banned: np.ndarray | None = None) -> np.ndarray:
    """The greedy token of each row, [n, vocab] -> [n] int64 (the lowest id on ties, as
    np.argmax), never a banned one; reads the rows where they are (a view of the engine's
    buffer: nothing is copied unless a row's argmax is banned)."""
    ids = rows.argmax(axis=1).astype(np.int64)
    if banned is not None and len(banned):
        for i in np.flatnonzero(np.isin(ids, banned)):
            row = rows[i].copy()
            row[banned] = -np.inf
            ids[i] = int(row.argmax())
    return ids


def split_rows(rows: np.ndarray, feeds: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
    """Logits of one pass over the feeds, in order [sum of lengths, vocab] -> one array per feed."""
    bounds = np.cumsum([len(tokens) for _, tokens in feeds])[:-1]
    return np.split(rows, bounds)


class SequenceSlots:
    """Sequence handles 0 .. max_sequences-1 and the tokens each holds; engines whose KV
    cache is indexed by such handles build on it (llama.cpp sequence ids, transformers slots).

    prefill, fork, release and the kept prefix (engines/prefix.py: the last request's longest
    sequence kept for the next prefill) are written once here; an engine supplies `batch_size`,
    `_feed(seq, tokens)` (one pass, no logits), `_copy_entries(source, target)`, and calls
    `_fed` / `_truncated` as its KV cache changes; `_clear(seq)` drops a handle's entries."""

    batch_size: int  # most tokens one pass feeds
    slots = 1  # one request at a time: its parent and children fill the batch (docs/serve.md)
    prefix: PrefixKeeper | None  # KeepsPrefix: the kept sequence (None: keeping is off)

    def __init__(self, max_sequences: int, keep_prefix: bool = False) -> None:
        self.max_sequences = max_sequences
        self._free = list(range(max_sequences - 1, -1, -1))  # handles not in use, lowest last
        self._lengths: dict[int, int] = {}  # live sequence -> tokens in the KV cache
        self.prefix = PrefixKeeper() if keep_prefix else None  # the kept sequence (engines/prefix.py)

    def prefill(self, token_ids: Sequence[int]) -> int:
        """A new sequence holding token_ids: the kept sequence of an earlier request cut back to
        their common prefix and the rest fed, or a cold prefill."""
        found = self.prefix.take(token_ids) if self.prefix is not None else None
        if found is None:
            seq, shared = self.allocate(), 0
        else:
            seq, shared = found
            self._lengths[seq] = len(self.prefix.tokens[seq])
        try:
            if shared:
                self.truncate(seq, shared)
            for start in range(shared, len(token_ids), self.batch_size):
                self._feed(seq, list(token_ids[start : start + self.batch_size]))
        except EngineError:
            self.release(seq)
            raise
        return seq

    def fork(self, seq: int) -> int:
        child = self.allocate()
        self._copy_entries(seq, child)
        self._lengths[child] = self._lengths[seq]
        if self.prefix is not None:
            self.prefix.forked(seq, child)
        return child

    def release(self, seq: int) -> None:
        if seq not in self._lengths:
            return
        cleared = self.prefix.released(seq) if self.prefix is not None else seq
        del self._lengths[seq]  # no longer live (a kept sequence is not: it waits for a prefill)
        if cleared is not None:
            self._clear(cleared)

    def allocate(self) -> int:
        if not self._free and self.prefix is not None and self.prefix.kept is not None:
            self._clear(self.prefix.evict())  # the kept prefix gives its handle up
        if not self._free:
            raise EngineError(f"all {self.max_sequences} sequences are in use")
        seq = self._free.pop()
        self._lengths[seq] = 0
        return seq

    def _clear(self, seq: int) -> None:
        """seq's entries are no one's: its handle is free (a slot's old entries are masked, then
        overwritten by its next owner; an engine that must drop them overrides this)."""
        self._free.append(seq)

    def _fed(self, rows: Iterable[tuple[int, Sequence[int]]]) -> None:
        """Tokens the engine wrote to these sequences' KV caches, (seq, tokens) each."""
        if self.prefix is not None:
            for seq, tokens in rows:
                self.prefix.fed(seq, tokens)

    def _truncated(self, seq: int, length: int) -> None:
        self._lengths[seq] = min(self._lengths[seq], length)
        if self.prefix is not None:
            self.prefix.truncated(seq, length)

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def live_sequences(self) -> int:
        return len(self._lengths)


class TokenListTree:
    """score_tree's bookkeeping for engines whose sequences are token lists (`_tokens`: the fake
    engine, the replay): the tree last scored and `keep_path`."""

    _tree: tuple[int, list[int]] | None = None  # (sequence, node tokens) of the last score_tree

    def _hold_tree(self, seq: int, token_ids: Sequence[int]) -> None:
        self._tree = (seq, list(token_ids))

    def keep_path(self, seq: int, nodes: Sequence[int]) -> None:
        """After score_tree: seq keeps the tree's nodes along one path (root first)."""
        tree_seq, token_ids = self._tree or (None, [])
        if tree_seq != seq:
            raise EngineError("keep_path follows a score_tree on the same sequence")
        self._tokens[seq].extend(token_ids[node] for node in nodes)
        self._tree = None
