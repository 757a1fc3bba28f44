"""Reading an answer's tool calls as it streams: content as it comes, each call's name as soon
as it is written and its arguments piece by piece, as OpenAI's API and vLLM's server stream them.

`CallStream.push(piece)` / `flush()` return events:
- ("content", text): answer text that is no call;
- ("delta", CallDelta): what a client is sent of a call (its first delta has the id and name);
- ("call", ToolCall): a call read whole and valid (the non-streamed reply, the request log);
- ("problem", reason): call-looking text that is no call; its text follows as content.

A call is streamed while it is written when it opens as `{"name": "<an offered tool>",
"arguments": {` (the Hermes order; `parameters` too): the arguments are then the model's own
text of that object, sent as it comes; so is a bare answer that opens so (alone, or after a
fence's first line). Any other call (its keys in another order, its arguments as a JSON
string) is sent in one delta once read whole. A streamed call whose
text turns out not to be a call (its JSON breaks, the answer ends inside it) cannot be taken
back: the reason is a problem, the text is content, and the call counts for nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .text import partial_marker
from .tools import ReadAnswer, ToolCall, ToolCallFormat, new_call_id, parse_call, unfenced

_SPACE = " \t\r\n"


@dataclass(frozen=True)
class CallDelta:
    """One `delta.tool_calls` entry: the call's index in the answer; the id and name on its
    first delta only; a piece of its arguments' JSON text (joined by index, the client has them)."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def as_openai(self) -> dict:
        out: dict = {"index": self.index}
        function: dict = {"arguments": self.arguments}
        if self.id is not None:
            out.update(id=self.id, type="function")
        if self.name is not None:
            function = {"name": self.name, **function}
        out["function"] = function
        return out


def call_head(text: str, fmt: ToolCallFormat) -> tuple[str, int] | bool | None:
    """How a call's text (after its opening marker) opens: (name, where its arguments' `{` is)
    once it reads `{"name": "<name>", "arguments": {`; None while it may still; False once it
    cannot."""
    at = 0
    for expected in ("{", (json.dumps(fmt.name_key),), ":", None, ",",
                     tuple(json.dumps(key) for key in fmt.argument_keys), ":"):
        while at < len(text) and text[at] in _SPACE:
            at += 1
        if expected is None:  # the name: a whole JSON string
            if text[at:at + 1] != '"':
                return None if at == len(text) else False
            end = _string_end(text, at)
            if end is None:
                return None
            try:
                name = json.loads(text[at:end])
            except ValueError:
                return False
            at = end
            continue
        literals = expected if isinstance(expected, tuple) else (expected,)
        rest = text[at:]
        matched = next((lit for lit in literals if rest.startswith(lit)), None)
        if matched is None:
            return None if any(lit.startswith(rest) for lit in literals) else False
        at += len(matched)
    while at < len(text) and text[at] in _SPACE:
        at += 1
    if at == len(text):
        return None
    return (name, at) if text[at] == "{" else False


def _string_end(text: str, start: int) -> int | None:
    """Just past the JSON string that opens at text[start] ('"'); None if it is not closed yet."""
    escaped = False
    for at in range(start + 1, len(text)):
        char = text[at]
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return at + 1
    return None


class _Arguments:
    """The arguments' JSON object of a call being streamed: how far it is read, and whether it has
    closed (depth back to 0; strings and escapes followed so braces inside them do not count)."""

    def __init__(self, index: int, call_id: str, name: str, start: int) -> None:
        self.index, self.id, self.name = index, call_id, name
        self.start = start  # where the object opens in the call's text
        self.read = start  # the call's text up to here is sent
        self.depth = 0  # open braces and brackets
        self.in_string = self.escaped = False
        self.closed = False  # the object's closing brace is read

    def advance(self, text: str, upto: int) -> str:
        """The arguments' text from where it was read up to `upto` (or its end, if sooner)."""
        begin, at = self.read, self.read
        while at < upto and not self.closed:
            char = text[at]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                self.closed = self.depth == 0
            at += 1
        self.read = at
        return text[begin:at]

    def text(self, call: str) -> str:
        return call[self.start:self.read]


class CallStream:
    """Reads an answer piece by piece (the module docstring). Text that might be the start of a
    call marker is held back; whitespace between calls is not sent as content."""

    def __init__(self, fmt: ToolCallFormat, offered: frozenset[str], limit: int | None = None) -> None:
        self.fmt, self.offered = fmt, offered
        self.limit = limit  # at most this many calls (parallel_tool_calls false: 1); None: any
        self.calls = 0  # valid calls read
        self.indices = 0  # calls a client has been sent a delta of (each delta names its index)
        self._held = ""  # text not yet sent: a possible marker start, or a call under way
        self._in_call = False
        self._head: _Arguments | bool | None = None  # the call under way: streamed, False (read whole), None (not known)
        self._blank = ""  # whitespace-only content held until real content follows
        self.full = False  # the limit is reached: the rest of the answer is not read
        self._bare: str | None = None  # the answer so far, held whole: it opened with "{" (fmt.bare)
        self._opened = False  # non-blank answer text has come

    def push(self, piece: str) -> list[tuple[str, object]]:
        events: list[tuple[str, object]] = []
        if self._bare is not None or (self.fmt.bare and not self._opened and piece.strip()
                                      and (self._held + piece).lstrip()[:1] in ("{", "`")):
            self._bare = (self._bare or self._held) + piece
            self._held = ""
            self._stream_bare(events)
            return events
        self._opened = self._opened or bool(piece.strip())
        self._held += piece
        while not self.full:
            marker = self.fmt.end if self._in_call else self.fmt.start
            at = self._held.find(marker)
            if at < 0:
                keep = partial_marker(self._held, marker)
                if self._in_call:  # stream what is surely the call's (not a possible end marker)
                    self._stream(self._held, 0, len(self._held) - keep, events)
                else:  # send all but a possible marker start
                    self._content(self._held[: len(self._held) - keep], events)
                    self._held = self._held[len(self._held) - keep:]
                break
            if self._in_call:
                self._close(self._held[:at], events)
            else:
                self._content(self._held[:at], events, before_call=True)
                self._in_call, self._head = True, None
            self._held = self._held[at + len(marker):]
        return events

    def flush(self) -> list[tuple[str, object]]:
        """The end of the answer: an unclosed call is read as if closed (vLLM's parsers do so)."""
        events: list[tuple[str, object]] = []
        if self.full:
            return events
        if self._bare is not None:  # the whole answer is one call, or it is content
            head, self._head = self._head, None
            read = self._read(self._bare, unfenced(self._bare), head)
            if isinstance(read, ToolCall):
                self.calls += 1
                return self._whole(read) if not head else [("call", read)]
            if head:  # its deltas were sent: a problem, and the answer is content
                return [("problem", read), ("content", self._bare)]
            self._held, self._bare = self._bare, None
            self._opened = True
            return self.push("") + self.flush()
        if self._in_call:
            self._close(self._held, events, closed=False)
        else:
            self._content(self._held, events)
        self._held, self._in_call = "", False
        if self._blank and not self.calls:
            events.append(("content", self._blank))
        self._blank = ""
        return events

    def _stream(self, text: str, begin: int, upto: int, events: list) -> None:
        """The call under way, its JSON from text[begin] read up to text[upto]: its first delta
        once its name is known and offered, then each new piece of its arguments."""
        if self._head is None:
            head = call_head(text[begin:upto], self.fmt)
            if head is None:
                return
            if head is False or head[0] not in self.offered:
                self._head = False
                return
            self._head = _Arguments(self.indices, new_call_id(), head[0], begin + head[1])
            self.indices += 1
            events.append(("delta", CallDelta(self._head.index, self._head.id, self._head.name, "")))
        if self._head:
            piece = self._head.advance(text, upto)
            if piece:
                events.append(("delta", CallDelta(self._head.index, None, None, piece)))

    def _stream_bare(self, events: list) -> None:
        """A bare answer (fmt.bare) streams as a call does once it opens as one, past a fence's
        first line (```json)."""
        if self._head is False:  # it opened as no call: nothing to stream
            return
        text, begin = self._bare, 0
        if self._head is None:  # where its JSON starts is still to be found
            begin = len(text) - len(text.lstrip())
            if "```".startswith(text[begin:]):  # a fence, or not yet known
                return
            if text.startswith("```", begin):
                begin = text.find("\n", begin) + 1
                if not begin:  # the fence's line is not written yet
                    return
        self._stream(text, begin, len(text), events)

    def _read(self, text: str, body: str, head: _Arguments | bool | None) -> ToolCall | str:
        """The call's JSON read whole (parse_call), with the id of its deltas when it streamed;
        a reason if its streamed arguments are not the ones read."""
        read = parse_call(body.strip(), self.fmt, self.offered, call_id=head.id if head else None)
        if isinstance(read, ToolCall) and head and not _same(head.text(text), read.arguments):
            return "the call's arguments key is repeated: the streamed arguments are not the ones read"
        return read

    def _content(self, text: str, events: list, before_call: bool = False) -> None:
        if not text:
            return
        if not text.strip():
            self._blank += text
            return
        if self._blank and not before_call:
            text, self._blank = self._blank + text, ""
        elif before_call:
            self._blank = ""
        events.append(("content", text))

    def _close(self, body: str, events: list, closed: bool = True) -> None:
        self._stream(body, 0, len(body), events)
        head, self._in_call, self._head = self._head, False, None
        read = self._read(body, body, head)
        if isinstance(read, ToolCall):
            self.calls += 1
            events.extend(self._whole(read) if not head else [("call", read)])
            self.full = self.limit is not None and self.calls >= self.limit
            self._blank = ""
            return
        events.append(("problem", read))
        events.append(("content", self.fmt.start + body + (self.fmt.end if closed else "")))  # as written

    def _whole(self, call: ToolCall) -> list[tuple[str, object]]:
        """A call read whole: its one delta, then the call."""
        self.indices += 1
        return [("delta", CallDelta(self.indices - 1, call.id, call.name, call.arguments)), ("call", call)]


def _same(streamed: str, arguments: str) -> bool:
    """Do the streamed arguments' text and the arguments read whole hold the same object?"""
    try:
        return json.loads(streamed) == json.loads(arguments)
    except ValueError:
        return False


def read_calls(text: str, fmt: ToolCallFormat, offered: frozenset[str], limit: int | None = None) -> ReadAnswer:
    """A whole answer -> its content, its valid calls and why any call-looking text is content."""
    stream = CallStream(fmt, offered, limit)
    read = ReadAnswer("")
    content = []
    for kind, value in stream.push(text) + stream.flush():
        if kind == "content":
            content.append(value)
        elif kind == "call":
            read.calls.append(value)
        elif kind == "problem":
            read.problems.append(value)
    read.content = "".join(content).strip()
    return read
