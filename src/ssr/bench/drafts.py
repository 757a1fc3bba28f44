"""Drafts for projections: the draft child a plan made under another cost model (a GPU's) would
have written, written by the real model, untimed, and kept in the rows.

On this CPU the policy declines to draft (a child costs ~1 step here), so CPU rows hold no
draft, and a GPU projection of them replays spans only. `ssr simulate --drafts planned`
re-plans drafting under the cost model; each draft that plan forks is looked up in the row
(`planned_drafts`, keyed by fork point and length) or, with `--record-drafts MODEL`, written now:
greedy, from the row's prompt + CoT up to the fork point + the forced end of thinking + the
answer prefix, as the child would have (the engines are batch-invariant, so the child's
tokens do not depend on riding in the parent's batch).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..config import ConfigError
from ..engines.base import Engine


def draft_key(forked_at: int, num_tokens: int) -> str:
    """A row's planned_drafts key: CoT tokens at the fork, tokens the draft may have."""
    return f"{forked_at}:{num_tokens}"


def greedy_continuation(engine: Engine, context: Sequence[int], num_tokens: int) -> list[int]:
    """The model's greedy tokens after context: at most num_tokens, ending with EOS if it writes one."""
    seq = engine.prefill(list(context[:-1]))
    token, out = context[-1], []
    try:
        while len(out) < num_tokens:
            token = int(np.argmax(engine.step([(seq, token)])[0]))  # [vocab] -> id
            out.append(token)
            if token in engine.eos_ids:
                break
    finally:
        engine.release(seq)
    return out


class DraftBook:
    """The planned drafts of bench rows: read from each row, written by `engine` when missing
    (none given: a missing draft is an error that says how to record it)."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine  # the rows' model, to write missing drafts (None: read only)
        self.written = 0  # drafts written by the engine
        self.read = 0  # drafts found in the rows

    def draft(self, row: dict, context: Sequence[int], forked_at: int, num_tokens: int) -> list[int]:
        """The draft of the child forked at `forked_at` CoT tokens (its input: `context`)."""
        book = row.setdefault("planned_drafts", {})
        key = draft_key(forked_at, num_tokens)
        if key in book:
            self.read += 1
        elif self.engine is None:
            raise ConfigError(
                f"{row['suite']} {row['item']} ({row['mode']}): the plan forks a draft the run did not write "
                f"(at {forked_at} CoT tokens, {num_tokens} tokens); record it with --record-drafts MODEL")
        else:
            book[key] = greedy_continuation(self.engine, context, num_tokens)
            self.written += 1
        return book[key]
