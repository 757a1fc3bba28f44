"""What the two request walks share (decode.py on sequence engines, decode_vllm.py on
vLLM requests): the chunks they stream, the result they leave, iteration and committing
answer tokens."""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from .metrics import Metrics
from .text import LoopGuard


@dataclass(frozen=True)
class Chunk:
    channel: str  # "reasoning" or "answer"
    text: str
    token_ids: tuple[int, ...]


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

    @property
    def output_ids(self) -> list[int]:
        """Every token after the prompt, as the model saw them."""
        return self.cot_ids + self.forced_ids + self.answer_ids


class Walk:
    """Iterate for chunks as they are decoded; `result` is set when iteration ends.
    A subclass supplies `_run`, `metrics` and `_answer_text`."""

    result: Result | None = None

    def __init__(self, engine, fmt, config, prompt_ids, stats=None) -> None:
        from .config import ConfigError

        if not prompt_ids:
            raise ConfigError("the prompt is empty")
        self.engine, self.fmt, self.config = engine, fmt, config
        self.prompt_ids = list(prompt_ids)
        self.forced_end_ids = engine.tokenize(fmt.forced_end)  # forced when the CoT did not end itself
        self.answer_prefix_ids = engine.tokenize(fmt.answer_prefix)  # forced after the end marker
        self.stats = stats  # earlier requests (updated when this one ends), for the policy
        self.answer_ids: list[int] = []
        self._cot_loop = LoopGuard(config.repetition_stop)  # runaway repetition ends the CoT
        self._answer_loop = LoopGuard(config.repetition_stop)  # ... and the answer

    def _check_context(self, extra_tokens: int = 0, extra_what: str = "") -> None:
        """The request must fit the engine: prompt + b_v + forced tokens + max tokens, plus
        what the walk needs besides (`extra_tokens`, named by `extra_what`)."""
        from .config import ConfigError

        config = self.config
        need = (len(self.prompt_ids) + config.thinking_budget + len(self.forced_end_ids)
                + len(self.answer_prefix_ids) + config.max_tokens + extra_tokens)
        if need > self.engine.context_size:
            raise ConfigError(
                f"prompt ({len(self.prompt_ids)} tokens) + thinking budget + max tokens{extra_what} need {need} "
                f"tokens, more than the context holds ({self.engine.context_size}); lower the budgets or raise "
                f"--context-size"
            )

    def _finish(self, cot_ids: list[int], draft_ids: list[int]) -> None:
        """The result, and the policy statistics told about this request. Needs the walk's
        `_reasoning_text`, `_forced_ids` and `_trace`."""
        self.result = Result(
            reasoning=self._reasoning_text.text.strip(), answer=self._answer_text.text.strip(),
            cot_ids=cot_ids, answer_ids=self.answer_ids, draft_ids=draft_ids, forced_ids=self._forced_ids,
            metrics=self.metrics, trace=self._trace)
        if self.stats is not None:
            self.stats.observe(self.metrics, draft_ids, self.answer_ids, self.prompt_ids + cot_ids,
                               getattr(self, "costs", None))

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

    def _engine_time(self) -> tuple[float, int]:
        """(wall seconds inside the engine, forward passes) of this walk so far."""
        raise NotImplementedError

    def run(self) -> Result:
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def _cot_token(self, token: int, cot_ids: list[int], stream) -> tuple[Chunk | None, str]:
        """One CoT token -> (its reasoning text, if any; how the CoT ends: "eos" (token not kept),
        "natural" (it completed the end marker), "repetition" (it completed a loop, LoopGuard)
        or "" (it goes on))."""
        if token in self.engine.eos_ids:
            return None, "eos"
        cot_ids.append(token)
        text = stream.push(self.engine.token_bytes(token))
        chunk = Chunk("reasoning", text, (token,)) if text else None
        if stream.stopped:
            return chunk, "natural"
        return chunk, ("repetition" if self._cot_loop.push(text) else "")

    def _commit(self, token_ids: list[int], proposer=None) -> Iterator[Chunk]:
        """Append answer tokens one by one up to a stop; sets metrics.stop when done: "eos",
        "max_tokens", "answer_stop" (the token completed the format's stop text, e.g. the
        code block's closing fence; it is kept) or "repetition" (LoopGuard)."""
        committed, texts = [], []
        stop_text = self.fmt.answer_stop
        for token in token_ids:
            if token in self.engine.eos_ids:
                self.metrics.stop = "eos"
                break
            committed.append(token)
            self.answer_ids.append(token)
            texts.append(self._answer_text.push(self.engine.token_bytes(token)))
            shown = self._answer_text.text
            if stop_text and stop_text in shown[-(len(texts[-1]) + len(stop_text)):]:
                self.metrics.stop = "answer_stop"
            elif self._answer_loop.push(texts[-1]):
                self.metrics.stop = "repetition"
            elif len(self.answer_ids) >= self.config.max_tokens:
                self.metrics.stop = "max_tokens"
            if self.metrics.stop:
                break
        self.metrics.answer_tokens = len(self.answer_ids)
        if proposer is not None and not self.metrics.stop:
            proposer.observe(committed)
        text = "".join(texts)
        if text:
            yield Chunk("answer", text, tuple(committed))
