"""Tool calls: how a model family writes them, how they are read back from its answer, and
how the tools and earlier calls reach its chat template.

A family's tool-call format is a row of `FORMATS`, detected from the chat template as the
thinking format is (thinking.py). Reading is exact text work, never a guess: a call whose JSON
does not parse, or that names no offered tool, stays in the content with the reason kept.

- `render_tools(...)`: the chat template's own `tools` argument when the template renders tools
  (Qwen2.5, Hermes, ...), else a Hermes-style block in the system message (documented in
  docs/agents.md, "Tools in `ssr serve`").
- `parse_call(body, ...)`: one call's text -> a ToolCall, or the reason it is none. Reading an
  answer, whole or as it streams, is tool_stream.py's (`read_calls`, `CallStream`).
- `escaped_views(texts)`: the prompt's texts as a call's JSON arguments would write them, for
  the proposers to copy from.
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
    # the bare form. Such an answer is a call or content once it ends, as it can only be read whole
    # (tool_stream.py streams it as a call meanwhile when it opens as one).
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


def new_call_id() -> str:
    import uuid

    return f"call_{uuid.uuid4().hex[:24]}"


def parse_call(body: str, fmt: ToolCallFormat, offered: frozenset[str], call_id: str | None = None) -> ToolCall | str:
    """One call's text between the markers -> a ToolCall (with `call_id`, or a new id), or the
    reason it is not one."""
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
    return ToolCall(call_id or new_call_id(), name, json.dumps(arguments, ensure_ascii=False))


def unfenced(text: str) -> str:
    """The text inside one ``` fence (```json or bare), or the text itself."""
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and text.count("```") == 2:
        text = text[3:-3]
        text = text[text.index("\n") + 1:] if "\n" in text and not text.lstrip().startswith("{") else text
    return text.strip()


# -- the prompt: tools and earlier calls into the chat template ------------------------------


def escaped_views(texts) -> list[str]:
    """Each text as a JSON string writes it (quotes, backslashes, newlines and other control
    characters escaped; other characters as they are), where that differs from the text. A
    call's arguments are JSON: an agent that edits or writes a file a tool showed it writes that
    file's lines escaped, and a copy from the raw text breaks at every newline and quote; from
    these views it does not (docs/agents.md, "Copying into a call's arguments")."""
    views = []
    for text in texts:
        escaped = json.dumps(text, ensure_ascii=False)[1:-1]
        if escaped != text:
            views.append(escaped)
    return views


def message_texts(messages: list[dict]) -> list[str]:
    """The text of each message's content (a string, or its text parts joined)."""
    texts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        if isinstance(content, str) and content:
            texts.append(content)
    return texts


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
