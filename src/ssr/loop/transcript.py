"""What a request has written so far, as tokens and as streamed text: the CoT (its reasoning
text, how it ended), the tokens forced between CoT and answer, the answer (its text, why it
stopped). Both walks (the sequence engines' and vLLM's) commit through it, so the rules for
when a CoT or an answer ends are written once."""
from __future__ import annotations

from dataclasses import dataclass

from ..formats.text import LoopGuard, TextStream
from ..formats.thinking import ThinkingFormat


@dataclass(frozen=True)
class Chunk:
    channel: str  # "reasoning" or "answer"
    text: str
    token_ids: tuple[int, ...]


class Transcript:
    """The request's output: cot_ids + forced_ids + answer_ids, and their text."""

    def __init__(self, fmt: ThinkingFormat, eos_ids: frozenset[int], token_bytes, limit: int,
                 max_answer_tokens: int | None, repetition_stop: int) -> None:
        self.fmt = fmt  # the thinking format: end marker, steer text, answer prefix and stop text
        self.eos_ids = eos_ids  # tokens that end the CoT (not kept) or the answer
        self.token_bytes = token_bytes  # token id -> the bytes it decodes to
        self.limit = limit  # output tokens at most: CoT + forced + answer
        self.max_answer_tokens = max_answer_tokens  # answer tokens at most (None: only the limit)
        self.cot_ids: list[int] = []  # the CoT, end marker included where the model wrote it
        self.forced_ids: list[int] = []  # forced after the CoT: end marker (unless written) + answer prefix
        self.answer_ids: list[int] = []  # the answer so far
        self.reasoning = TextStream(fmt.end, shown=fmt.steer)  # the CoT's text, the end marker held back
        self.answer = TextStream(shown=fmt.answer_prefix.lstrip())  # the answer's text, its prefix shown
        self.stop = ""  # why the answer stopped (commit), "" while it goes on
        self._cot_loop = LoopGuard(repetition_stop)  # runaway repetition ends the CoT
        self._answer_loop = LoopGuard(repetition_stop)  # ... and the answer

    @property
    def written(self) -> int:
        """Output tokens so far: CoT, forced, answer."""
        return len(self.cot_ids) + len(self.forced_ids) + len(self.answer_ids)

    def answer_room(self) -> int:
        """Answer tokens the request may still write (the limit, and the answer's own cap)."""
        room = self.limit - self.written
        if self.max_answer_tokens is not None:
            room = min(room, self.max_answer_tokens - len(self.answer_ids))
        return max(0, room)

    def opening(self) -> Chunk | None:
        """The reasoning's steer text (prefilled by the prompt), shown first."""
        return Chunk("reasoning", self.fmt.steer, ()) if self.fmt.steer else None

    def cot_token(self, token: int) -> tuple[Chunk | None, str]:
        """One CoT token -> (its reasoning text, if any; how the CoT ends: "eos" (token not kept),
        "natural" (it completed the end marker), "repetition" (it completed a loop, LoopGuard)
        or "" (it goes on))."""
        if token in self.eos_ids:
            return None, "eos"
        self.cot_ids.append(token)
        text = self.reasoning.push(self.token_bytes(token))
        chunk = Chunk("reasoning", text, (token,)) if text else None
        if self.reasoning.stopped:
            return chunk, "natural"
        return chunk, ("repetition" if self._cot_loop.push(text) else "")

    def close_reasoning(self) -> Chunk | None:
        """The reasoning text held back at the CoT's end."""
        tail = self.reasoning.flush()
        return Chunk("reasoning", tail, ()) if tail else None

    def force(self, end_ids: list[int], prefix_ids: list[int]) -> Chunk | None:
        """The tokens forced after the CoT (the end marker where the CoT did not write it, then
        the answer prefix); the answer prefix's text is shown."""
        self.forced_ids = end_ids + prefix_ids
        prefix = self.fmt.answer_prefix.lstrip()
        return Chunk("answer", prefix, tuple(prefix_ids)) if prefix else None

    def commit(self, token_ids: list[int]) -> tuple[list[int], Chunk | None]:
        """Append answer tokens one by one up to a stop -> (the tokens kept, their text). Sets
        `stop`: "eos", "max_tokens" (the output's limit or the answer's cap), "answer_stop" (the
        token completed the format's stop text, e.g. the code block's closing fence; it is kept)
        or "repetition" (LoopGuard)."""
        committed, texts = [], []
        stop_text = self.fmt.answer_stop
        for token in token_ids:
            if token in self.eos_ids:
                self.stop = "eos"
                break
            committed.append(token)
            self.answer_ids.append(token)
            texts.append(self.answer.push(self.token_bytes(token)))
            if stop_text and stop_text in self.answer.text[-(len(texts[-1]) + len(stop_text)):]:
                self.stop = "answer_stop"
            elif self._answer_loop.push(texts[-1]):
                self.stop = "repetition"
            elif not self.answer_room():
                self.stop = "max_tokens"
            if self.stop:
                break
        text = "".join(texts)
        return committed, (Chunk("answer", text, tuple(committed)) if text else None)

    def close_answer(self) -> Chunk | None:
        """The answer text held back at the end."""
        tail = self.answer.flush()
        return Chunk("answer", tail, ()) if tail else None
