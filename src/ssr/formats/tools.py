"""Tool calls: how a model family writes them, how they are read back from its answer, and
how the tools and earlier calls reach its chat template.

A family's tool-call format is a row of `FORMATS`, detected from the chat template as the
thinking format is (thinking.py). Reading is exact text work, never a guess: a call whose JSON
does not parse, or that names no offered tool, stays in the content with the reason kept.

- `render_tools(...)`: the chat template's own `tools` argument when the template renders tools
  (Qwen2.5, Hermes, ...), else a Hermes-style block in the system message (documented in
  docs/agents.md, "Tools in `ssr serve`").
- `read_calls(text, ...)`: one finished answer -> content, calls, problems.
- `CallStream`: the same reading, piece by piece, for streaming (content is sent as it comes;
  a call is sent once its closing marker arrives).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    start: str  # the marker that opens one call
    end: str  # the marker that closes it
    # keys of the call's JSON object: the function's name, and its arguments (first found)
    name_key: str = "name"
    argument_keys: tuple[str, ...] = ("arguments", "parameters")
    # an answer that is, whole, one call's JSON object without the markers (bare, or alone in one
    # ``` fence) is that call: small Qwen2.5 models write it so; vLLM's llama3_json parser reads
    # the bare form. Such an answer is held until it ends, as it can only be read whole.
    bare: bool = False


FORMATS = {
    # Qwen2.5 / Qwen3 / Hermes 2 Pro: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    "hermes": ToolCallFormat("hermes", "<tool_call>", "</tool_call>", bare=True),
}


def detect_tool_format(chat_template: str | None) -> ToolCallFormat:
    """The family's format; Hermes where the template names none (ssr's own rendering is Hermes)."""
    return FORMATS["hermes"]


def template_renders_tools(chat_template: str | None) -> bool:
    """Does the chat template take a `tools` argument? (Declared by its text, as HF's do.)"""
    return bool(chat_template) and "tools" in chat_template


@dataclass(frozen=True)
class ToolCall:
    id: str  # call_<24 hex>, as OpenAI's and vLLM's
    name: str
    arguments: str  # the arguments as a JSON string (the OpenAI wire form)

    def as_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


@dataclass
class ReadAnswer:
    content: str  # the text that is not a valid call
    calls: list[ToolCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why a call-looking text stayed content


def _new_id() -> str:
    import uuid

    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str, fmt: ToolCallFormat, offered: frozenset[str]) -> ToolCall | str:
    """One call's text between the markers -> a ToolCall, or the reason it is not one."""
    try:
        value = json.loads(body)
    except ValueError as error:
        return f"the call is not valid JSON ({error})"
    if not isinstance(value, dict) or not isinstance(value.get(fmt.name_key), str):
        return f"the call has no {fmt.name_key!r} string"
    name = value[fmt.name_key]
    if name not in offered:
        return f"the call names {name!r}, which is not an offered tool"
    arguments = next((value[key] for key in fmt.argument_keys if key in value), {})
    if isinstance(arguments, str):  # some models write the arguments already as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError as error:
            return f"the call's arguments are not valid JSON ({error})"
    if not isinstance(arguments, dict):
        return "the call's arguments are not a JSON object"
    return ToolCall(_new_id(), name, json.dumps(arguments, ensure_ascii=False))


class CallStream:
    """Reads an answer piece by piece: `push(piece)` and `flush()` return events, each
    ("content", text), ("call", ToolCall) or ("problem", reason). Text that might be the start
    of a call marker is held back; whitespace between calls is not sent as content."""

    def __init__(self, fmt: ToolCallFormat, offered: frozenset[str], limit: int | None = None) -> None:
        self.fmt, self.offered = fmt, offered
        self.limit = limit  # at most this many calls (parallel_tool_calls false: 1); None: any
        self.calls = 0  # valid calls read
        self._held = ""  # text not yet sent: a possible marker start, or a call under way
        self._in_call = False
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
            return events
        self._opened = self._opened or bool(piece.strip())
        self._held += piece
        while not self.full:
            marker = self.fmt.end if self._in_call else self.fmt.start
            at = self._held.find(marker)
            if at < 0:
                if not self._in_call:  # send all but a possible marker start
                    keep = _partial(self._held, marker)
                    self._content(self._held[: len(self._held) - keep], events)
                    self._held = self._held[len(self._held) - keep:]
                break
            if self._in_call:
                self._close(self._held[:at], events)
            else:
                self._content(self._held[:at], events, before_call=True)
                self._in_call = True
            self._held = self._held[at + len(marker):]
        return events

    def flush(self) -> list[tuple[str, object]]:
        """The end of the answer: an unclosed call is read as if closed (vLLM's parsers do so)."""
        events: list[tuple[str, object]] = []
        if self.full:
            return events
        if self._bare is not None:  # the whole answer is one call, or it is content
            read = parse_call(_unfenced(self._bare), self.fmt, self.offered)
            if isinstance(read, ToolCall):
                self.calls += 1
                return [("call", read)]
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
        self._in_call = False
        read = parse_call(body.strip(), self.fmt, self.offered)
        if isinstance(read, ToolCall):
            self.calls += 1
            events.append(("call", read))
            self.full = self.limit is not None and self.calls >= self.limit
            self._blank = ""
            return
        events.append(("problem", read))
        events.append(("content", self.fmt.start + body + (self.fmt.end if closed else "")))  # as written


def _unfenced(text: str) -> str:
    """The text inside one ``` fence (```json or bare), or the text itself."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and text.count("```") == 2:
        text = text[3:-3]
        text = text[text.index("\n") + 1:] if "\n" in text and not text.lstrip().startswith("{") else text
    return text.strip()


def _partial(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


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
        else:
            read.problems.append(value)
    read.content = "".join(content).strip()
    return read


# -- the prompt: tools and earlier calls into the chat template ------------------------------


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as HF chat templates take them: a call's arguments as an object (the wire form
    is a JSON string; vLLM decodes it the same way before rendering), content never None."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("content") is None:
            message["content"] = ""
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": _as_object(call["function"]["arguments"])}}
                for call in message["tool_calls"]]
        out.append(message)
    return out


def _as_object(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


HERMES_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)


def hermes_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """For a chat template that renders no tools: the tools as a Hermes block in the system
    message, earlier calls as <tool_call> text, tool results as <tool_response> user turns."""
    out: list[dict] = []
    if tools:
        block = HERMES_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if messages and messages[0]["role"] == "system":
            out.append({"role": "system", "content": f"{messages[0]['content']}\n\n{block}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": block})
    for message in messages:
        content = message.get("content") or ""
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = "".join(
                "\n<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                "arguments": _as_object(c["function"]["arguments"])},
                                               ensure_ascii=False) + "\n</tool_call>"
                for c in message["tool_calls"])
            out.append({"role": "assistant", "content": (content + calls).strip()})
        elif message["role"] == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("tool_result"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + response}
            else:
                out.append({"role": "user", "content": response, "tool_result": True})
        else:
            out.append({"role": message["role"], "content": content})
    return [{k: v for k, v in m.items() if k != "tool_result"} for m in out]


def forced_call_prefix(fmt: ToolCallFormat, choice: str | None) -> str:
    """What the answer starts with under tool_choice: "required" opens a call up to its name (a
    model may end a bare open marker at once), a named function opens a call of it; "auto" and
    "none" force nothing. Forced text is the same for plain
    decoding and ssr (like the thinking format's answer prefix), so the output stays the model's."""
    if choice in (None, "auto", "none"):
        return ""
    if choice == "required":
        return fmt.start + "\n{" + json.dumps(fmt.name_key) + ": \""
    return fmt.start + "\n" + json.dumps({fmt.name_key: choice})[:-1] + ", \"arguments\": "


@dataclass(frozen=True)
class ToolUse:
    """A request's tools, as the OpenAI API gives them."""

    tools: tuple[dict, ...]  # [{"type": "function", "function": {"name", "description"?, "parameters"?}}]
    choice: str = "auto"  # "auto", "none", "required", or the name of the one function to call
    parallel: bool = True  # parallel_tool_calls: several calls in one answer

    @property
    def offered(self) -> frozenset[str]:
        return frozenset(tool["function"]["name"] for tool in self.tools)

    @property
    def active(self) -> bool:
        """Tools in the prompt and calls read from the answer (tool_choice "none": neither)."""
        return bool(self.tools) and self.choice != "none"
