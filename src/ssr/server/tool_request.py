"""The tool fields of a chat request, validated as the OpenAI API defines them: `tools`,
`tool_choice`, `parallel_tool_calls`, and the `tool_calls` of earlier assistant turns.

A field of the wrong JSON type is 422; a value the API does not allow is 400 naming the field.
"""
from __future__ import annotations

import json
import re

from ..formats.tools import ToolUse

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for a function's name
CHOICES = ("auto", "none", "required")


def _error(status: int, message: str, param: str):
    from .protocol import ApiError

    return ApiError(status, message, param=param)


def tool_use(body: dict) -> ToolUse | None:
    """The request's tools, or None when it offers none."""
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise _error(422, "tools must be a list of {type: function, function: {name, parameters}}", "tools")
    checked = tuple(_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools))
    names = [tool["function"]["name"] for tool in checked]
    for name in names:
        if names.count(name) > 1:
            raise _error(400, f"tools: the function name {name!r} is offered twice", "tools")
    choice = _choice(body.get("tool_choice"), set(names))
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise _error(422, "parallel_tool_calls must be a boolean", "parallel_tool_calls")
    if not checked:
        return None
    return ToolUse(checked, choice, parallel)


def _tool(tool, where: str) -> dict:
    if not isinstance(tool, dict):
        raise _error(422, f"{where} must be an object {{type: function, function: {{...}}}}", where)
    if tool.get("type", "function") != "function":
        raise _error(400, f"{where}.type must be 'function'", f"{where}.type")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _error(422, f"{where}.function must be an object with a name", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise _error(400, f"{where}.function.name must be 1-64 letters, digits, _ . or -", f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _error(422, f"{where}.function.description must be a string", f"{where}.function.description")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _error(400, f"{where}.function.parameters must be a JSON Schema object", f"{where}.function.parameters")
    if parameters is not None and parameters.get("type", "object") != "object":
        raise _error(400, f"{where}.function.parameters.type must be 'object'", f"{where}.function.parameters.type")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _error(422, f"{where}.function.strict must be a boolean", f"{where}.function.strict")
    kept = {"name": name}
    if description is not None:
        kept["description"] = description
    if parameters is not None:
        kept["parameters"] = parameters
    return {"type": "function", "function": kept}


def _choice(choice, names: set[str]) -> str:
    if choice is None:
        return "auto" if names else "none"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise _error(400, f"tool_choice must be one of {', '.join(CHOICES)} or a named function", "tool_choice")
        if choice == "required" and not names:
            raise _error(400, "tool_choice is 'required' but no tools are offered", "tool_choice")
        return choice
    if not isinstance(choice, dict) or not isinstance(choice.get("function"), dict):
        raise _error(422, "tool_choice must be a string or {type: function, function: {name}}", "tool_choice")
    if choice.get("type", "function") != "function":
        raise _error(400, "tool_choice.type must be 'function'", "tool_choice.type")
    name = choice["function"].get("name")
    if name not in names:
        raise _error(400, f"tool_choice names {name!r}, which is not among the offered tools",
                     "tool_choice.function.name")
    return name


def assistant_calls(message: dict, where: str) -> list[dict]:
    """An earlier assistant turn's tool calls, in the wire form (arguments a JSON string)."""
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise _error(422, f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    out = []
    for index, call in enumerate(calls):
        at = f"{where}.tool_calls[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise _error(422, f"{at} must be an object with a function", at)
        name, arguments = call["function"].get("name"), call["function"].get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise _error(422, f"{at}.function.name must be a string", f"{at}.function.name")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise _error(422, f"{at}.function.arguments must be a JSON string", f"{at}.function.arguments")
        try:
            json.loads(arguments)
        except ValueError:
            raise _error(400, f"{at}.function.arguments is not valid JSON", f"{at}.function.arguments") from None
        call_id = call.get("id", f"call_{index}")
        if not isinstance(call_id, str):
            raise _error(422, f"{at}.id must be a string", f"{at}.id")
        out.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out
