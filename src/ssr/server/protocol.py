"""OpenAI-compatible request parsing and response shapes, free of any web framework.

Malformed bodies (not JSON, NaN/Infinity, not an object, a required field missing, a
field of the wrong type) raise `ApiError` 422; well-formed bodies with invalid values or
features ssr does not offer (logit_bias, logprobs, penalties) raise 400; an unknown
model 404. Tools (`tools`, `tool_choice`, `parallel_tool_calls`, `role: tool` messages) are read
by server/tool_request.py. SSR's own options ride in the body as `"ssr": {...}`.
"""
from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..config import MODES, ConfigError, GenerationConfig, SamplingParams
from ..formats.thinking import TEMPLATE_BUDGET
from ..formats.tools import ToolUse
from .tool_request import assistant_calls, tool_use

ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: OpenAI's newer name for system
# reasoning_effort -> thinking budget, as a multiple of the server's default budget (medium: the
# default). A server with no budget of its own lets the model think as long as it likes at medium and
# high, and below that takes the fractions of TEMPLATE_BUDGET
EFFORT = {"none": 0.0, "minimal": 0.125, "low": 0.25, "medium": 1.0, "high": 2.0}
# fields ssr does not act on: refused (400) unless they ask for nothing (the value a client sends by default)
UNSUPPORTED = {
    "functions": ("functions (the deprecated form of tools) are not supported: send tools",
                  lambda v: v in (None, [])),
    "function_call": ("function_call (the deprecated form of tool_choice) is not supported: send tool_choice",
                      lambda v: v in (None, "none", "auto")),
    "logit_bias": ("logit_bias is not supported: ssr answers exactly what the model would", lambda v: v in (None, {})),
    "logprobs": ("logprobs are not returned by ssr", lambda v: v in (None, False, 0)),
    "top_logprobs": ("logprobs are not returned by ssr", lambda v: v in (None, 0)),
    "frequency_penalty": ("frequency_penalty is not supported", lambda v: v in (None, 0, 0.0)),
    "presence_penalty": ("presence_penalty is not supported", lambda v: v in (None, 0, 0.0)),
    "response_format": ("response_format: only text", lambda v: v in (None, {"type": "text"})),
    "modalities": ("modalities: only text", lambda v: v in (None, ["text"])),
    "echo": ("echo is not supported", lambda v: v in (None, False)),
    "best_of": ("best_of must be 1", lambda v: v in (None, 1)),
    "suffix": ("suffix (insertion) is not supported", lambda v: v in (None, "")),
    # vLLM's own field counts the prompt's tokens after the start marker too: not ssr's budget
    "thinking_token_budget": ("thinking_token_budget (vLLM's) is not read: send ssr.thinking_budget, the CoT "
                              "tokens the model may write (on --engine vllm ssr hands it to vLLM's own budget), or "
                              "reasoning_effort", lambda v: v in (None, -1)),
}
SSR_OPTIONS = {"mode": str, "thinking_budget": int, "max_answer_tokens": int, "draft_at": int, "draft_tokens": int,
               "verify": str, "verify_chunk": int, "template": str, "draft_interval": int, "policy": str}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ParsedRequest:
    kind: str  # "chat" or "completion"
    prompt: str | list[dict]  # completion text, or chat messages
    config: GenerationConfig
    template: str | None
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    tools: ToolUse | None = None  # the request's tools (chat only)
    request_id: str = field(default_factory=lambda: f"ssr-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))


def field_message(error: ConfigError) -> str:
    """A ConfigError's message (written for the CLI) with flags named as body fields:
    `--draft-at` -> `draft_at`."""
    return re.sub(r"--([a-z-]+)", lambda m: m[1].replace("-", "_"), str(error))


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"", parse_constant=_not_json)
    except RecursionError as error:
        raise ApiError(422, "the body is not valid JSON: nested too deeply") from error
    except (ValueError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        raise ApiError(422, f"the body is not valid JSON: {error}") from error
    if not isinstance(body, dict):
        raise ApiError(422, "the body must be a JSON object")
    try:  # JSON may spell lone UTF-16 surrogates ("\\ud800"): valid JSON, not text
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(400, "the body holds a lone UTF-16 surrogate escape (such as \\ud800): not text") from error
    except RecursionError as error:
        raise ApiError(422, "the body is not valid JSON: nested too deeply") from error
    return body


def _typed(body: dict, name: str, kinds: type | tuple[type, ...], default: Any = None, where: str = "") -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join(k.__name__ for k in kinds)
        raise ApiError(422, f"{where}{name} must be {wanted}, got {type(value).__name__}", param=where + name)
    return value


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ApiError(422, "messages is required: a list of {role, content} objects", param="messages")
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    out = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or "role" not in message:
            raise ApiError(422, f"{where} must be an object with role and content", param=where)
        role = message["role"]
        if role == "function":
            raise ApiError(400, f"{where}: role function (the deprecated form) is not supported: use role tool",
                           param=f"{where}.role")
        if role not in ROLES:
            raise ApiError(400, f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role")
        calls = assistant_calls(message, where) if role == "assistant" else []
        if "content" not in message and not calls:
            raise ApiError(422, f"{where} must be an object with role and content", param=where)
        content = _content(message.get("content"), where, may_be_null=bool(calls))
        out.append({"role": "system" if role == "developer" else role, "content": content})
        if calls:
            out[-1]["tool_calls"] = calls
        if role == "tool":
            out[-1]["tool_call_id"] = _typed(message, "tool_call_id", str, "", where=f"{where}.")
    if not any(m["role"] == "user" and m["content"].strip() for m in out):
        raise ApiError(400, "messages need a user message with text", param="messages")
    return out


def _content(content, where: str, may_be_null: bool) -> str:
    if content is None and may_be_null:  # an assistant turn that only called tools
        return ""
    if isinstance(content, list):  # [{"type": "text", "text": ...}]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise ApiError(400, f"{where}.content: only text parts are supported", param=f"{where}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ApiError(422, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
    return content


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(422, "stop must be a string or a list of strings", param="stop")
    if len(stops) > 4 or any(not s for s in stops):
        raise ApiError(400, "stop: at most 4 non-empty strings", param="stop")
    return tuple(stops)


def parse_request(body: dict, kind: str, served: set[str], defaults: GenerationConfig) -> ParsedRequest:
    """Validate one chat or completion body into a ParsedRequest (ApiError otherwise)."""
    model = _typed(body, "model", str)
    if model is None:
        raise ApiError(422, "model is required", param="model")
    if model not in served:
        raise ApiError(404, f"model {model!r} is not served here (GET /v1/models)", param="model",
                       code="model_not_found")
    tools = None
    if kind == "chat":
        prompt: str | list[dict] = _messages(body)
        tools = tool_use(body)
    else:
        prompt = _typed(body, "prompt", str)
        if prompt is None:
            raise ApiError(422, "prompt is required (a string)", param="prompt")
        if not prompt.strip():
            raise ApiError(400, "prompt is empty", param="prompt")
    _refuse_unsupported(body)
    if kind != "chat" and body.get("tools") not in (None, []):
        raise ApiError(400, "tools are offered on /v1/chat/completions, not on /v1/completions", param="tools")
    _typed(body, "user", str)
    metadata = _typed(body, "metadata", dict, {})
    if not all(isinstance(value, str) for value in metadata.values()):
        raise ApiError(422, "metadata values must be strings", param="metadata")
    n = _typed(body, "n", int, 1)
    if n != 1:
        raise ApiError(400, "n must be 1", param="n")
    options = _typed(body, "ssr", dict, {})
    for name, value in options.items():
        if name not in SSR_OPTIONS:
            raise ApiError(400, f"ssr.{name} is not an option; use {', '.join(SSR_OPTIONS)}", param=f"ssr.{name}")
        _typed(options, name, SSR_OPTIONS[name], where="ssr.")
    if options.get("mode") is not None and options["mode"] not in MODES:
        raise ApiError(400, f"ssr.mode must be one of {', '.join(MODES)}", param="ssr.mode")
    stream_options = _typed(body, "stream_options", dict, {})
    return ParsedRequest(
        kind=kind, prompt=prompt, config=_generation_config(body, options, defaults),
        template=options.get("template"), stream=bool(_typed(body, "stream", bool, False)),
        include_usage=bool(_typed(stream_options, "include_usage", bool, False)), stop=_stop(body), tools=tools,
    )


def _refuse_unsupported(body: dict) -> None:
    for name, (message, harmless) in UNSUPPORTED.items():
        value = body.get(name)
        try:
            fine = harmless(value)
        except TypeError:  # an unhashable or odd value: not the harmless default
            fine = False
        if not fine:
            raise ApiError(400, message, param=name)


def _generation_config(body: dict, options: dict, defaults: GenerationConfig) -> GenerationConfig:
    """The request's config: its own fields over the server's defaults. A default never
    contradicts what the client set: a thinking budget at or below the default fork point
    moves the fork point to half the budget (and a budget of 0 forks nothing)."""
    max_tokens = _typed(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _typed(body, "max_tokens", int, defaults.max_tokens)
    effort = _typed(body, "reasoning_effort", str)
    if effort is not None and effort not in EFFORT:
        raise ApiError(400, f"reasoning_effort must be one of {', '.join(EFFORT)}", param="reasoning_effort")
    budget = options.get("thinking_budget")
    if budget is None:
        budget = _effort_budget(effort, defaults.thinking_budget)
    draft_at = options.get("draft_at")
    if draft_at is None:
        draft_at = defaults.draft_at if budget is None or defaults.draft_at < budget else max(0, budget // 2)
    mode = options.get("mode", defaults.mode)
    try:
        sampling = SamplingParams(
            temperature=float(_typed(body, "temperature", (int, float), 0.0)),
            top_p=float(_typed(body, "top_p", (int, float), 1.0)),
            top_k=_typed(body, "top_k", int, 0),
            seed=_typed(body, "seed", int, 0),
        )
        return GenerationConfig(
            mode=mode, sampling=sampling, max_tokens=max_tokens, thinking_budget=budget, draft_at=draft_at,
            max_answer_tokens=options.get("max_answer_tokens", defaults.max_answer_tokens),
            draft_tokens=options.get("draft_tokens", defaults.draft_tokens),
            verify=options.get("verify", defaults.verify),
            verify_chunk=options.get("verify_chunk", defaults.verify_chunk),
            draft_interval=options.get("draft_interval", defaults.draft_interval),
            policy=options.get("policy", defaults.policy),
            suffix=defaults.suffix, adaptive_spans=defaults.adaptive_spans,
            repetition_stop=defaults.repetition_stop,
        )
    except ConfigError as error:  # the CLI's messages name flags; here they name fields
        raise ApiError(400, field_message(error)) from error
    except OverflowError as error:  # a number too large for a float
        raise ApiError(400, f"a number is out of range: {error}") from error


def _effort_budget(effort: str | None, default: int | None) -> int | None:
    """The thinking budget reasoning_effort asks for (EFFORT); None: no budget."""
    if effort is None:
        return default
    if default is None:
        return None if EFFORT[effort] >= 1 else round(TEMPLATE_BUDGET * EFFORT[effort])
    return round(default * EFFORT[effort])


# -- responses ------------------------------------------------------------------------------


def usage(prompt_tokens: int, metrics: dict) -> dict:
    completion = metrics["cot_tokens"] + metrics["forced_tokens"] + metrics["answer_tokens"]
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "completion_tokens_details": {"reasoning_tokens": metrics["cot_tokens"]}}


def chat_chunk(request: ParsedRequest, model: str, delta: dict, finish_reason: str | None = None) -> dict:
    return {"id": request.request_id, "object": "chat.completion.chunk", "created": request.created,
            "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def completion_chunk(request: ParsedRequest, model: str, text: str, reasoning: str | None = None,
                     finish_reason: str | None = None) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    if reasoning is not None:
        choice["reasoning_content"] = reasoning
    return {"id": request.request_id, "object": "text_completion", "created": request.created,
            "model": model, "choices": [choice]}


def final_response(request: ParsedRequest, model: str, reasoning: str, answer: str, finish_reason: str,
                   usage_block: dict, metrics: dict, calls: list | None = None) -> dict:
    if request.kind == "chat":
        message = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
        if calls:  # as OpenAI's: content null when the answer is only calls
            message["content"] = answer or None
            message["tool_calls"] = [call.as_openai() for call in calls]
        body = {"id": request.request_id, "object": "chat.completion", "created": request.created, "model": model,
                "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}]}
    else:
        body = completion_chunk(request, model, answer, reasoning, finish_reason)
    body["usage"] = usage_block
    body["ssr"] = metrics
    return body
