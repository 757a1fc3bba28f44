"""A draft child: the answer it wrote from a partial chain of thought, and its stage metrics;
the child's life on a sequence engine (fork, bootstrap, grow, finish) for decode.Generation."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .metrics import StageClock
from .sampling import sample, target_probs


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


class DraftChildren:
    """The draft children of decode.Generation: forked from the parent, bootstrapped from the
    previous stage's draft, grown a token per parent pass, finished at EOS, m tokens or the
    CoT's end. Needs the generation's engine, parent, config, plan, rng, metrics and its _score,
    _verify_chunked, _own, _drop and _now."""

    def _fork_draft(self, pending: int, cot_len: int, clock: StageClock, previous: Draft | None) -> Draft:
        """A child forked from the parent (self.parent), the end of thinking forced. With a previous
        stage's draft it is bootstrapped: that draft is verified on the child in chunks
        (as the parent verifies at its end) and the child goes on from the accepted prefix."""
        if previous is not None and previous.seq is not None:  # superseded: its tokens are all we need
            self._finish_draft(previous, clock)
        draft = Draft(seq=self._own(self.engine.fork(self.parent)), forked_at=cot_len, started_s=clock.now())
        fed = [pending] + self.forced_end_ids + self.answer_prefix_ids
        if previous is None or not previous.token_ids:
            rows = self._score(draft.seq, fed)
            self._grow_draft(draft, rows[-1], clock)
            return draft
        old_ids = previous.token_ids[: self._draft_limit() - 1]  # room for the token after them
        start = self._now()
        num_accepted, verdict, rows = self._verify_chunked(draft.seq, fed, old_ids, previous.probs,
                                                           keep_rows=not self.config.sampling.greedy)
        draft.bootstrap_s = self._now() - start
        draft.bootstrapped = num_accepted
        draft.token_ids = old_ids[:num_accepted]
        if rows:  # sampling: the new child's distribution q at every position it now holds
            draft.probs = [target_probs(row, self.config.sampling) for row in rows[:num_accepted]]
        if draft.token_ids and draft.token_ids[-1] in self.engine.eos_ids:  # the whole answer, EOS too
            self._finish_draft(draft, clock)
        else:
            self._grow_draft(draft, rows[num_accepted] if rows else None, clock, token=verdict.next_token)
        return draft

    def _grow_draft(self, draft: Draft, logits: np.ndarray | None, clock: StageClock, token: int | None = None) -> None:
        """Choose the child's next token from its logits [vocab] (or take `token`, chosen by a
        bootstrap verdict from these logits); finish the child at EOS or m tokens."""
        sampling = self.config.sampling
        if not sampling.greedy:
            probs = target_probs(logits, sampling)  # the draft distribution q
            draft.probs.append(probs)
            token = sample(probs, self.rng) if token is None else token
        elif token is None:  # logits [vocab], or the token id the engine chose
            token = int(np.argmax(logits)) if np.ndim(logits) else int(logits)
        draft.token_ids.append(token)
        if token in self.engine.eos_ids or len(draft.token_ids) >= self._draft_limit():
            self._finish_draft(draft, clock)

    def _draft_limit(self) -> int:
        return min(self.plan.draft_tokens, self.config.max_tokens)

    def _finish_draft(self, draft: Draft, clock: StageClock) -> None:
        self._drop(draft.seq)
        draft.seq = None
        draft.seconds = clock.now() - draft.started_s
        self.metrics.seconds["draft"] += draft.seconds

    def _close_metrics(self, drafts: list[Draft]) -> None:
        metrics = self.metrics
        accepted = [later.bootstrapped for later in drafts[1:]] + [metrics.accepted_prefix_tokens]
        metrics.stages = [draft.stage(kept) for draft, kept in zip(drafts, accepted)]
        metrics.draft_tokens = len(drafts[-1].token_ids) if drafts else 0

