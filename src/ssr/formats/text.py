"""Incremental detokenisation for streaming."""
from __future__ import annotations

import codecs
import re


def partial_marker(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker` (text that
    may yet open it, held back by streams)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class TextStream:
    """Bytes of tokens in, complete UTF-8 text out.

    Text that could be the start of `stop_marker` is held back until it is known
    not to be; once the marker appears, it and everything after it is dropped.
    """

    def __init__(self, stop_marker: str = "", shown: str = "") -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._marker = stop_marker  # e.g. "</think>": never shown to the reader
        self._held = ""  # text not yet emitted
        self.stopped = False  # the marker was seen
        self.text = shown  # everything emitted so far (`shown`: emitted by the caller already)

    def push(self, data: bytes) -> str:
        if self.stopped:
            return ""
        self._held += self._decoder.decode(data)
        if self._marker and self._marker in self._held:
            self._held = self._held[: self._held.index(self._marker)]
            self.stopped = True
            return self._emit(len(self._held))
        return self._emit(len(self._held) - partial_marker(self._held, self._marker))

    def flush(self) -> str:
        if not self.stopped:
            self._held += self._decoder.decode(b"", final=True)
        return self._emit(len(self._held))

    def _emit(self, upto: int) -> str:
        out, self._held = self._held[:upto], self._held[upto:]
        self.text += out
        return out


_DIGITS = re.compile(r"\d+")


class LoopGuard:
    """Spots runaway repetition in decoded text: the last `lines` completed lines repeat a
    block of at most MAX_PERIOD lines, compared by shape (stripped, digits ignored: `* `,
    `if n == 118:` / `return False`, blank). A pure function of the text, so every mode
    trips it at the same token."""

    MAX_PERIOD = 4  # longest repeated block of lines

    def __init__(self, lines: int) -> None:
        self.lines = lines  # completed lines in the repeating window; 0 = off
        self._partial = ""  # the line being written
        self._shapes: list[str] = []  # shapes of the last `lines` completed lines
        self.tripped = False

    def push(self, text: str) -> bool:
        """Feed text; True once the loop is seen (and from then on)."""
        if not self.lines or self.tripped:
            return self.tripped
        *done, self._partial = (self._partial + text).split("\n")
        for line in done:
            self._shapes = (self._shapes + [_DIGITS.sub("0", line.strip())])[-self.lines:]
            if len(self._shapes) == self.lines and any(self._periodic(p) for p in range(1, self.MAX_PERIOD + 1)):
                self.tripped = True
                break
        return self.tripped

    def _periodic(self, period: int) -> bool:
        shapes = self._shapes
        return all(shapes[i] == shapes[i - period] for i in range(period, len(shapes)))
