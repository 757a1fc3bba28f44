"""What the two request walks share (loop/generation.py on sequence engines, loop/vllm_walk.py
on vLLM requests): the result they leave, iteration with the loop's own host time, the context
check and committing answer tokens. A walk supplies its stages (`_run`) and the engine's share
of its time (`_engine_time`)."""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..config import ConfigError, GenerationConfig
from ..metrics import Metrics
from ..formats.thinking import ThinkingFormat
from .transcript import Chunk, Transcript


@dataclass
class Result:
    reasoning: str
    answer: str
    cot_ids: list[int]
    answer_ids: list[int]
    draft_ids: list[int]
    forced_ids: list[int]  # tokens forced between CoT and answer (end marker, answer prefix)
    metrics: Metrics
    trace: list[dict]  # verify events: what was proposed and how much was accepted
    # every draft child, in stage order: (CoT tokens it saw, the answer tokens it held at the end)
    drafts: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def output_ids(self) -> list[int]:
        """Every token after the prompt, as the model saw them."""
        return self.cot_ids + self.forced_ids + self.answer_ids


class Walk:
    """Iterate for chunks as they are decoded; `result` is set when iteration ends."""

    result: Result | None = None

    def __init__(self, engine, fmt: ThinkingFormat, config: GenerationConfig, prompt_ids: Sequence[int],
                 stats=None) -> None:
        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        self.engine, self.fmt, self.config = engine, fmt, config
        self.prompt_ids = list(prompt_ids)
        self.forced_end_ids = engine.tokenize(fmt.forced_end)  # forced when the CoT did not end itself
        self.answer_prefix_ids = engine.tokenize(fmt.answer_prefix)  # forced after the end marker
        self.stats = stats  # earlier requests (updated when this one ends), for the policy
        # output tokens at most (CoT, forced, answer): max_tokens, else what the context holds
        self.limit = config.max_tokens if config.max_tokens is not None else \
            engine.context_size - len(self.prompt_ids)
        self.cot_cap = config.cot_cap(self.limit)  # CoT tokens at most
        self.text = Transcript(fmt, engine.eos_ids, engine.token_bytes, self.limit, config.max_answer_tokens,
                               config.repetition_stop)
        self.metrics = Metrics(mode=config.mode, prompt_tokens=len(self.prompt_ids))
        self.trace: list[dict] = []  # verify events: what was proposed, how much was accepted

    def check_context(self) -> None:
        """The request must fit the engine: the prompt and max tokens (speculation never passes
        the limit: spans and drafts are cut to the room left)."""
        need = len(self.prompt_ids) + (self.config.max_tokens or 1)
        if need > self.engine.context_size:
            raise ConfigError(
                f"prompt ({len(self.prompt_ids)} tokens) + max tokens need {need} tokens, more than the "
                f"context holds ({self.engine.context_size}); lower --max-tokens or raise --context-size"
            )

    @property
    def cap_end(self) -> str:
        """How a CoT that reaches its cap ends: "budget" (a thinking budget forces the end marker)
        or "length" (the output's limit ends the output)."""
        budget = self.config.thinking_budget
        return "budget" if budget is not None and budget < self.limit else "length"

    def length_end(self, cot_end: str) -> bool:
        """The CoT ended the output: it reached the output's limit (no budget forced its end), or
        wrote EOS in a model's own format (a template forces the end marker and an answer)."""
        if cot_end == "length" or (cot_end == "eos" and self.fmt.native):
            self.metrics.stop = "max_tokens" if cot_end == "length" else "eos"
            return True
        return False

    def commit(self, token_ids: list[int], proposer=None) -> Iterator[Chunk]:
        """Answer tokens, up to a stop (Transcript.commit; metrics.stop says which); the proposer
        sees the ones kept while the answer goes on."""
        committed, chunk = self.text.commit(token_ids)
        self.metrics.stop = self.text.stop
        self.metrics.answer_tokens = len(self.text.answer_ids)
        if proposer is not None and not self.text.stop:
            proposer.observe(committed)
        if chunk is not None:
            yield chunk

    def finish(self, draft_ids: list[int], costs=None, drafts=()) -> None:
        """The result, and the policy statistics told about this request; drafts: every child
        (Draft, in stage order)."""
        text = self.text
        self.result = Result(
            reasoning=text.reasoning.text.strip(), answer=text.answer.text.strip(), cot_ids=text.cot_ids,
            answer_ids=text.answer_ids, draft_ids=draft_ids, forced_ids=text.forced_ids, metrics=self.metrics,
            trace=self.trace, drafts=[(draft.forked_at, list(draft.token_ids)) for draft in drafts])
        if self.stats is not None:
            self.stats.observe(self.metrics, draft_ids, text.answer_ids, self.prompt_ids + text.cot_ids, costs)

    def __iter__(self) -> Iterator[Chunk]:
        """The chunks of `_run`; when it has ended, metrics.host_s holds the loop's own wall time
        (the request's, less the engine's, `_engine_time`, and the reader's between chunks)."""
        start, away = time.perf_counter(), 0.0
        for chunk in self._run():
            left = time.perf_counter()
            yield chunk
            away += time.perf_counter() - left
        engine_s, self.metrics.engine_passes = self._engine_time()
        self.metrics.host_s = max(0.0, time.perf_counter() - start - away - engine_s)

    def _run(self) -> Iterator[Chunk]:
        """The walk's stages, chunk by chunk; ends with `finish`."""
        raise NotImplementedError

    def _engine_time(self) -> tuple[float, int]:
        """(wall seconds inside the engine, forward passes) of this walk so far."""
        raise NotImplementedError

    def run(self) -> Result:
        for _ in self:
            pass
        assert self.result is not None
        return self.result
