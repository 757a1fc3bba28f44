"""The engine as one request's loop sees it: the sequences the request holds (the parent, its
forks for a pass's other candidates, the draft children), every pass timed for the cost model,
and the CoT's banned tokens masked in one place."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from ..pricing.costs import CostModel
from ..engines.base import PassTimer
from ..metrics import Metrics

T = TypeVar("T")


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    """call's value and the wall seconds it took."""
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


class Sequences:
    """Scores are rows of logits [k, vocab], or token ids [k] where `ids` (greedy, on an engine
    that picks the argmax where its logits live: while thinking it never picks a banned id)."""

    def __init__(self, engine, costs: CostModel, metrics: Metrics, banned_ids: Sequence[int], ids: bool) -> None:
        self.engine = PassTimer(engine)  # timed: a request's host time is its wall time less this engine's
        self.costs = costs  # the request's cost model: solo steps and scores teach it
        self.metrics = metrics  # decode_steps, batched_steps counted here
        self.banned_ids = np.asarray(sorted(banned_ids), dtype=np.int64)  # -inf while thinking
        self.ids = ids  # scores come back as token ids, not rows
        modelled = engine.capabilities.modelled_clock  # the replay's
        self.now = engine.clock if modelled else time.perf_counter  # the request's clock
        # the cost model's: the engine's calls alone (a replay puts the loop's host time on its clock,
        # a figure per pass inside the next call, where a stopwatch around a real call never sees it)
        self.pass_now = engine.pass_clock if modelled else time.perf_counter
        self.parent = -1  # the parent's sequence (a winning fork's sequence takes its place)
        self.live: set[int] = set()  # every sequence the request holds now

    # -- holding ------------------------------------------------------------------------

    def prefill(self, token_ids: Sequence[int]) -> int:
        """The parent: a new sequence holding the prompt (its last token stays pending)."""
        self.parent = self.own(self.engine.prefill(token_ids))
        return self.parent

    def prefill_beside(self, token_ids: Sequence[int], build: Callable[[], T]) -> T:
        """prefill, with build() run meanwhile on another thread where the engine's prefill leaves
        the host free (Capabilities.prefill_frees_host), else after it; build's value. An engine
        that models its clock is told how long build ran (ModelledClock.beside_prefill)."""
        capabilities = self.engine.capabilities
        if not capabilities.prefill_frees_host:
            self.prefill(token_ids)
            return build()
        if capabilities.modelled_clock:  # a replay's prefill takes no wall time: build after it, and
            self.prefill(token_ids)  # what the prefill's modelled seconds cover of it is the
            value, seconds = _timed(build)  # prefill's, as inside a real prefill call's wall time
            self.engine.seconds += self.engine.beside_prefill(seconds)
            return value
        with ThreadPoolExecutor(1, thread_name_prefix="ssr-setup") as pool:
            built = pool.submit(build)
            self.prefill(token_ids)  # (should it raise, the pool still waits for build first)
            return built.result()

    def fork(self, seq: int) -> int:
        return self.own(self.engine.fork(seq))

    def own(self, seq: int) -> int:
        self.live.add(seq)
        return seq

    def drop(self, seq: int) -> None:
        self.live.discard(seq)
        self.engine.release(seq)

    def drop_all(self) -> None:
        for seq in list(self.live):
            self.drop(seq)

    def free(self) -> int:
        """Sequences the engine can still add, as it counts them (several requests may share it)."""
        return self.engine.max_sequences - self.engine.live_sequences()

    def length(self, seq: int) -> int:
        return self.engine.length(seq)

    def truncate(self, seq: int, length: int) -> None:
        self.engine.truncate(seq, length)

    # -- passes ---------------------------------------------------------------------------

    def want(self, thinking: bool) -> dict:
        """What to ask the engine for: token ids (while thinking the banned tokens are masked
        there, `banned`) or rows (no keywords)."""
        if not self.ids:
            return {}
        return {"ids": True, "banned": self.banned_ids} if thinking and len(self.banned_ids) else {"ids": True}

    def step(self, batch: list[tuple[int, int]], thinking: bool = False) -> np.ndarray:
        """One token fed to each (seq, token) in one pass -> scores [n, vocab] or [n]; solo steps
        teach the cost model."""
        start = self.pass_now()
        scores = self.engine.step(batch, **self.want(thinking))
        self.metrics.decode_steps += 1
        if len(batch) == 1:
            self.costs.observe_step(self.pass_now() - start)
        else:
            self.metrics.batched_steps += 1
        return scores

    def score(self, seq: int, token_ids: list[int], thinking: bool = False) -> np.ndarray:
        """k tokens fed to one sequence in one pass -> scores [k, vocab] or [k], timed for the
        cost model."""
        start = self.pass_now()
        scores = self.engine.score(seq, token_ids, **self.want(thinking))
        self.costs.observe_score(len(token_ids), self.pass_now() - start)
        return scores

    def score_batch(self, feeds: list[tuple[int, list[int]]], thinking: bool = False) -> list[np.ndarray]:
        """Each (seq, tokens) fed in one pass -> scores per feed (copies: the caller may mask them)."""
        return [each.copy() for each in self.engine.score_batch(feeds, **self.want(thinking))]

    def score_tree(self, seq: int, token_ids: list[int], parents: list[int], thinking: bool = False) -> np.ndarray:
        """A token tree after seq in one pass (tree attention) -> scores per node."""
        return self.engine.score_tree(seq, token_ids, parents, **self.want(thinking))

    def keep_path(self, seq: int, nodes: Sequence[int]) -> None:
        self.engine.keep_path(seq, nodes)

    def mask(self, rows: np.ndarray) -> np.ndarray:
        """The CoT's rule: rows with the banned tokens at -inf (in place; pass a copy). Token ids
        come back unchanged: the engine masked them."""
        if not self.ids:
            rows[..., self.banned_ids] = -np.inf
        return rows

    def seconds(self) -> tuple[float, int]:
        """(wall seconds inside the engine, forward passes) so far."""
        return self.engine.seconds, self.engine.passes
