"""Reference modes of the trace replay: a speculative decoder's acceptance as a GPU run recorded
it (`ssr traces --modes recorded-ngram,recorded-eagle`).

A benchmark that ran vLLM with a proposer records, per generated position i, `acc_len[i]`: 1 +
the draft tokens vLLM accepted (or would have) had a verify step started at position i, the bonus
token counted (bench/acceptance.py checks the n-gram record against ssr's replay of that
proposer). The reference proposer plays that record back on the trace's own output: each step
proposes k tokens, the first min(acc_len[i] - 1, k) of them the output's next tokens and the rest
tokens the model never writes, so the loop verifies a pass of k + 1 tokens and accepts what the
GPU run accepted; a step then emits min(acc_len[i], k + 1) tokens, as SpecDecode-Bench's
simulator counts it. Its cost: the verify pass at the replay's cost table, plus the drafter's own
(CostTable.drafting, the mode's `drafter`) where the table has it.

Where the record says nothing was accepted, an n-gram proposer may have found no match (no draft,
a plain step) or a draft that was rejected whole (a pass of k + 1 tokens): the record cannot tell
them apart, so `recorded-ngram` takes a plain step there (the cheaper of the two; the `ngram-v1`
peer replays the real search). EAGLE drafts at every step.

A record longer than the output counts positions past its end; one shorter (the run with the
drafter wrote another output: bf16 numerics differ with the pass's shape) leaves the output's last
positions unrecorded, where the step accepts nothing.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..proposing.proposers import CHAIN
from ..proposing.source import Source


@dataclass(frozen=True)
class Recorded:
    """A reference mode: whose record it plays and how its drafter behaves."""

    record: str  # the trace's field: "ngram" for acc_ngram, "eagle" for acc_eagle
    drafter: str  # its drafting cost in the cost table (CostTable.drafting)
    drafts_always: bool  # a draft of k every step (a trained drafter), or only where the record accepted one


RECORDED = {"recorded-ngram": Recorded("ngram", "ngram", drafts_always=False),
            "recorded-eagle": Recorded("eagle", "eagle", drafts_always=True)}
DEFAULT_K = 3  # draft tokens a step: SpecDecode-Bench's k = 3 (their n-gram runs took 3 and 5)


class RecordedProposer:
    """The proposer protocol playing a recorded acceptance back over the trace's output."""

    shape = CHAIN
    implementation = None

    def __init__(self, output: Sequence[int], acc_len: Sequence[int], k: int, wrong: int,
                 drafts_always: bool, name: str) -> None:
        self.output = list(output)  # the trace's output, known in hindsight
        self.acc_len = list(acc_len)  # per position: 1 + the draft tokens accepted there
        self.k = k  # draft tokens a step
        self.wrong = wrong  # a token the model never writes: a draft token the record rejected
        self.drafts_always = drafts_always
        self.source = Source(name)
        self.seen = 0  # output tokens committed so far

    def observe(self, token_ids: Sequence[int]) -> None:
        self.seen += len(token_ids)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """A trace replay forks no draft."""

    def prepare(self) -> None:
        """Nothing deferred."""

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        limit = min(self.k, max_tokens)
        accepted = min(limit, self.accepted_at(self.seen))
        if accepted == 0 and not self.drafts_always or limit <= 0:
            return [], None
        span = self.output[self.seen:self.seen + accepted]
        span += [self.wrong] * (limit - len(span))
        return span, [1.0] * accepted + [0.0] * (limit - accepted)

    def accepted_at(self, position: int) -> int:
        """Draft tokens the record accepted at a step starting at this output position."""
        return self.acc_len[position] - 1 if position < len(self.acc_len) else 0

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        span, _ = self.propose(max_tokens)
        return [(self.source, span)] if span else []
