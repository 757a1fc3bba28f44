"""Draft children: the answer a child writes from a partial chain of thought. On a sequence
engine a child is forked from the parent, bootstrapped from the previous stage's draft, grown a
token per parent pass and finished at EOS, m tokens or the CoT's end."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..config import GenerationConfig
from ..metrics import Metrics, StageClock
from ..pricing.drafting import Plan
from ..verifying.sampling import sample, target_probs
from .sequences import Sequences
from .verifier import Verifier

if TYPE_CHECKING:
    from ..engines.vllm import Request


@dataclass
class Draft:
    seq: int | None  # engine handle while the child is alive
    token_ids: list[int] = field(default_factory=list)  # answer tokens (EOS kept): bootstrapped + written
    probs: list[np.ndarray] = field(default_factory=list)  # sampling: the child's q, [vocab] per token
    forked_at: int = 0  # CoT tokens the child saw
    started_s: float = 0.0  # request clock when it forked
    bootstrapped: int = 0  # tokens taken over from the previous stage's draft (accepted on this child)
    bootstrap_s: float = 0.0  # seconds of that verify pass
    written: int = 0  # tokens this child decoded itself, one per batched step
    seconds: float = 0.0  # the child's lifetime

    def stage(self, accepted: int | None) -> dict:
        """Per-stage metrics; accepted: how many of its tokens the next stage (or the parent) kept."""
        per_token = (self.seconds - self.bootstrap_s) / self.written if self.written else 0.0
        without = self.seconds - self.bootstrap_s + self.bootstrapped * per_token  # decoding them instead
        return {"forked_at": self.forked_at, "tokens": len(self.token_ids), "bootstrapped": self.bootstrapped,
                "written": self.written, "accepted": accepted, "seconds": self.seconds,
                "bootstrap_s": self.bootstrap_s, "seconds_without_bootstrap": without}


def stage_metrics(metrics: Metrics, drafts: list[Draft]) -> None:
    """Every stage's metrics, once the parent has verified the latest draft."""
    accepted = [later.bootstrapped for later in drafts[1:]] + [metrics.accepted_prefix_tokens]
    metrics.stages = [draft.stage(kept) for draft, kept in zip(drafts, accepted)]
    metrics.draft_tokens = len(drafts[-1].token_ids) if drafts else 0


class DraftChildren:
    """A request's children on a sequence engine; `drafts` holds one per stage, the latest last
    (only the latest can be alive)."""

    def __init__(self, seqs: Sequences, verifier: Verifier, config: GenerationConfig, plan: Plan,
                 forced_ids: list[int], eos_ids: frozenset[int], clock: StageClock, output_limit: int) -> None:
        self.seqs = seqs  # forks the children off the parent; their steps ride in the parent's passes
        self.verifier = verifier  # bootstraps (a previous draft verified on the new child), samples
        self.config = config
        self.m = min(plan.draft_tokens, config.max_answer_tokens or plan.draft_tokens)  # m: tokens a child writes
        self.limit = self.m  # at most; a child forked late writes no more than the parent's output may hold
        self.output_limit = output_limit  # the parent's output tokens at most (CoT, forced, answer)
        self.first_chunk = plan.verify_chunk  # a bootstrap's first verify chunk
        self.forced_ids = forced_ids  # the end marker and answer prefix forced on a child
        self.eos_ids = eos_ids
        self.clock = clock  # the request's: a child's lifetime and the "draft" stage seconds
        self.drafts: list[Draft] = []

    @property
    def alive(self) -> Draft | None:
        """The child whose step rides in the parent's next pass, if any."""
        return self.drafts[-1] if self.drafts and self.drafts[-1].seq is not None else None

    def fork(self, pending: int, cot_len: int) -> Draft:
        """A child forked from the parent, the end of thinking forced. With a previous stage's
        draft it is bootstrapped: that draft is verified on the child in chunks (as the parent
        verifies at its end) and the child goes on from the accepted prefix."""
        previous = self.drafts[-1] if self.drafts else None
        if previous is not None and previous.seq is not None:  # superseded: its tokens are all we need
            self.finish(previous)
        self.limit = max(1, min(self.m, self.output_limit - cot_len - len(self.forced_ids)))
        draft = Draft(seq=self.seqs.fork(self.seqs.parent), forked_at=cot_len, started_s=self.clock.now())
        self.drafts.append(draft)
        fed = [pending] + self.forced_ids
        if previous is None or not previous.token_ids:
            rows = self.seqs.score(draft.seq, fed)
            self.grow(draft, rows[-1])
            return draft
        old_ids = previous.token_ids[: self.limit - 1]  # room for the token after them
        start = self.seqs.now()
        num_accepted, verdict, rows = self.verifier.chunked(self.seqs, draft.seq, fed, old_ids, previous.probs,
                                                            self.first_chunk,
                                                            keep_rows=not self.config.sampling.greedy)
        draft.bootstrap_s = self.seqs.now() - start
        draft.bootstrapped = num_accepted
        draft.token_ids = old_ids[:num_accepted]
        if rows:  # sampling: the new child's distribution q at every position it now holds
            draft.probs = [target_probs(row, self.config.sampling) for row in rows[:num_accepted]]
        if draft.token_ids and draft.token_ids[-1] in self.eos_ids:  # the whole answer, EOS too
            self.finish(draft)
        else:
            self.grow(draft, rows[num_accepted] if rows else None, token=verdict.next_token)
        return draft

    def grow(self, draft: Draft, scores: np.ndarray | None, token: int | None = None) -> None:
        """The child's next token from its scores [vocab] (or the token id the engine chose), or
        `token`, chosen by a bootstrap verdict from them; the child ends at EOS or m tokens."""
        sampling = self.config.sampling
        if not sampling.greedy:
            probs = target_probs(scores, sampling)  # the draft distribution q
            draft.probs.append(probs)
            token = sample(probs, self.verifier.rng) if token is None else token
        elif token is None:
            token = int(np.argmax(scores)) if np.ndim(scores) else int(scores)
        draft.token_ids.append(token)
        if token in self.eos_ids or len(draft.token_ids) >= self.limit:
            self.finish(draft)

    def stepped(self, draft: Draft, scores: np.ndarray) -> None:
        """The child's step rode in a parent pass: its scores [vocab] (or token id)."""
        draft.written += 1
        self.grow(draft, scores)

    def finish(self, draft: Draft) -> None:
        self.seqs.drop(draft.seq)
        draft.seq = None
        draft.seconds = self.clock.now() - draft.started_s
        self.seqs.metrics.seconds["draft"] += draft.seconds

    def finish_all(self) -> None:
        """Outstanding children end with the parent's CoT."""
        for draft in self.drafts:
            if draft.seq is not None:
                self.finish(draft)


@dataclass
class RequestChild(Draft):
    """A draft child that is a vLLM request (loop/vllm_walk.py)."""

    request: Request | None = None  # while it runs
    cached_tokens: int = 0  # of its prompt, read from vLLM's prefix cache
    context_ids: list[int] = field(default_factory=list)  # prompt + CoT[:b] + forced tokens
    carried_ids: list[int] = field(default_factory=list)  # draft tokens in its prompt after the context
    carried_rows: list[dict[int, float]] = field(default_factory=list)  # sampled: their rows, as drafted
    checked: bool = True  # the carried tokens were scored under this child's CoT (or there are none)
    rows: list[dict[int, float]] = field(default_factory=list)  # sampled: one top-k row per draft token


def latest_usable(drafts: list[RequestChild]) -> RequestChild | None:
    """The latest draft that wrote anything (a child forked just before the end may not have)."""
    return next((draft for draft in reversed(drafts) if draft.token_ids), None)


def through_eos(token_ids: list[int], eos_ids) -> list[int]:
    """Tokens up to and including the first end token."""
    end = next((i for i, token in enumerate(token_ids) if token in eos_ids), None)
    return list(token_ids) if end is None else list(token_ids[: end + 1])
