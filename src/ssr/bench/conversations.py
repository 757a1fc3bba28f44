"""Agent conversations as replay requests: every assistant turn of a multi-turn, tool-calling
conversation is one request whose prompt is the conversation before it.

Turns are rendered as the Qwen family's chat template renders them (the replay's tokenizer is
Qwen2's; Qwen3's template, the one these models' chat formats resemble most):
- an assistant turn: its content, then each call as `\\n<tool_call>\\n{"name": ..., "arguments":
  ...}\\n</tool_call>`; an earlier turn after the last user query keeps its reasoning as
  `<think>\\n...\\n</think>\\n\\n` before the content (Qwen3 keeps the reasoning of the steps of a
  multi-step tool call);
- tool results: consecutive ones in one user turn, each `<tool_response>\\n...\\n</tool_response>`.

The turn's answer is its content and its calls, as parts (`content`, `call`: a call's frame,
`arguments`: its arguments' JSON), so that the replay can say how each part was speculated.
A record the reader cannot take whole (an unknown role, a call without a name, content that is
not text) is refused with the reason (ValueError), never read as an empty request.
"""
from __future__ import annotations

import json

ROLES = ("system", "developer", "user", "assistant", "tool")
Part = tuple[str, str]  # (part, text): "content", "call" or "arguments"


def _text(value, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, list):  # OpenAI's content parts
        if not all(isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in value):
            raise ValueError(f"{where}: content parts must be text")
        return "".join(p.get("text", "") for p in value)
    if not isinstance(value, str):
        raise ValueError(f"{where}: content must be text, got {type(value).__name__}")
    return value


def calls_of(message: dict, where: str) -> list[tuple[str, str]]:
    """A message's tool calls as (name, arguments JSON text): the shared traces' flat form
    {"name", "arguments"} or OpenAI's {"function": {"name", "arguments"}}."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError(f"{where}: tool_calls must be a list")
    out = []
    for index, call in enumerate(calls):
        body = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise ValueError(f"{where}: tool_calls[{index}] has no name")
        arguments = body.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append((body["name"], arguments))
    return out


def answer_parts(content: str, calls: list[tuple[str, str]]) -> tuple[Part, ...]:
    """A turn's answer as parts: its content, then each call (frame and arguments apart); a call
    opens a line of its own unless it is the first thing written (as Qwen3's template)."""
    parts: list[Part] = [("content", content)] if content else []
    for name, arguments in calls:
        opening = "\n" if parts else ""
        parts += [("call", opening + '<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '),
                  ("arguments", arguments), ("call", "}\n</tool_call>")]
    return tuple(parts)


def render_messages(messages: list[dict], where: str = "messages") -> tuple[tuple[str, str], ...]:
    """The conversation before a turn as (role, content) ChatML messages, tool calls and
    results rendered as the Qwen family's template renders them."""
    if not isinstance(messages, list):
        raise ValueError(f"{where} must be a list")
    last_query = max((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"
                      and not _is_tool_response(_text(m.get("content"), where))), default=-1)
    out: list[tuple[str, str]] = []
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"{at}: role must be one of {', '.join(ROLES)}")
        role, content = message["role"], _text(message.get("content"), at)
        if role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1][0] == "user" and index and messages[index - 1].get("role") == "tool":
                out[-1] = ("user", out[-1][1] + "\n" + response)
            else:
                out.append(("user", response))
            continue
        if role == "assistant":
            reasoning = _text(message.get("reasoning") or message.get("reasoning_content"), at)
            text = "".join(text for _, text in answer_parts(content, calls_of(message, at)))
            if reasoning and index > last_query:
                text = f"<think>\n{reasoning.strip()}\n</think>\n\n" + text.lstrip("\n")
            out.append(("assistant", text))
            continue
        out.append(("system" if role == "developer" else role, content))
    return tuple(out)


def offers_tools(messages, tools=None, choice=None) -> bool:
    """Whether the request offered tools: its `tools` (and a tool_choice other than "none"), or,
    where a record holds no definitions (the agent traces), a conversation that calls them."""
    if tools:
        return choice != "none"
    return isinstance(messages, list) and any(
        isinstance(message, dict) and (message.get("role") == "tool" or message.get("tool_calls"))
        for message in messages)


def _is_tool_response(content: str) -> bool:
    return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def conversation_turns(data: dict, where: str = "messages"):
    """Each assistant turn of a conversation record: (turn number from 1, the messages before
    it rendered, its reasoning, its answer parts)."""
    messages = data["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    render_messages(messages, where)  # the whole record is read, or refused, before any turn
    turn = 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"{where}[{index}] must be an object")
        if message.get("role") != "assistant":
            continue
        turn += 1
        at = f"{where}[{index}]"
        reasoning = _text(message.get("reasoning") or message.get("reasoning_content"), at)
        parts = answer_parts(_text(message.get("content"), at), calls_of(message, at))
        yield turn, render_messages(messages[:index], where), reasoning, parts
