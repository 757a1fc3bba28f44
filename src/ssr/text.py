"""Incremental detokenisation for streaming."""
from __future__ import annotations

import codecs


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
        return self._emit(len(self._held) - self._partial_marker_len())

    def flush(self) -> str:
        if not self.stopped:
            self._held += self._decoder.decode(b"", final=True)
        return self._emit(len(self._held))

    def _partial_marker_len(self) -> int:
        for size in range(min(len(self._marker) - 1, len(self._held)), 0, -1):
            if self._marker.startswith(self._held[-size:]):
                return size
        return 0

    def _emit(self, upto: int) -> str:
        out, self._held = self._held[:upto], self._held[upto:]
        self.text += out
        return out
