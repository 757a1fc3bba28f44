"""Thinking formats: where the chain of thought starts and ends, per model family.

Reasoning models bring their own markers (read from the chat template) and are left to
write what they write: no budget, nothing forced after their end marker, an EOS inside
the CoT ends the output (`native`). Instruct models that do not reason get a thinking
*template*: a system instruction to reason inside <think>...</think>, the assistant turn
prefilled with <think>, an answer prefix forced after the end marker and a thinking
budget. A template is a change of prompt, so its output is the model's own answer to that
prompt, not to the user's alone. Both `ar` and `ssr` use the same format, so the
comparison stays like for like.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import ConfigError

CODE_SYSTEM = (
    "You are an expert Python programmer. Before writing any code, think inside <think> and </think>. "
    "Thinking is a short plan in plain English only: for each method, one or two sentences on what it does "
    "and its edge cases. Never write code, signatures or code tags while thinking. After </think>, write the "
    "complete, correct and simple code in one ```python code block, using the standard library where it helps."
)
CPP_SYSTEM = CODE_SYSTEM.replace("expert Python programmer", "expert C++ programmer").replace(
    "```python", "```cpp")
CODE_PLAN_STEER = "Plan (plain English, no code):\n1."  # steers a prose plan from the first token
TRACE_SYSTEM = (
    "You are a careful assistant. Before answering, think inside <think> and </think>. Thinking is short notes "
    "in plain English only: the facts that matter and how they change. Never write the answer's formatted lines "
    "or braces while thinking. After </think>, write the complete answer exactly in the format of the examples."
)
TRACE_PLAN_STEER = "Notes (plain English, no formatted lines):\n1."
PLAIN_SYSTEM = (
    "You are a helpful assistant. First think step by step inside <think> and </think>, "
    "then give your final answer after </think>."
)


@dataclass(frozen=True)
class ThinkingFormat:
    name: str
    start: str  # text that opens the CoT (prefilled into the assistant turn)
    end: str  # text that closes the CoT, when the model writes it
    forced_end: str  # text forced when the budget runs out or a draft forks
    answer_prefix: str  # forced right after the CoT closes; the answer starts with it
    system: str | None = None  # system instruction (templates for non-reasoning models)
    banned_while_thinking: tuple[str, ...] = ()  # tokens containing these get -inf in the CoT
    steer: str = ""  # prefilled after the start marker; shown as the start of the reasoning
    answer_stop: str = ""  # the answer ends with the token that completes this text (a stop string)
    # CoT tokens before the end marker is forced where the request sets no budget (None: none). A
    # template keeps one: a model that was never taught to close its thinking may never write the
    # end marker, and then would never answer
    budget: int | None = None
    # the model's own format: an EOS inside the CoT ends the output (a template forces the end
    # marker and an answer instead)
    native: bool = False


TEMPLATE_BUDGET = 1024  # a thinking template's CoT tokens at most, unless the request sets its own


FORMATS = {
    # native reasoning models
    "think": ThinkingFormat("think", "<think>\n", "</think>", "\n</think>", "", native=True),
    "gemma4": ThinkingFormat(
        "gemma4", "<|channel>thought\n", "<channel|>", "\n<channel|>", "", native=True
    ),
    # templates for instruct models that do not reason by themselves
    "code": ThinkingFormat(
        "code",
        "<think>\n",
        "</think>",
        "\n</think>",
        "\n\n```python\n",
        system=CODE_SYSTEM,
        banned_while_thinking=("``",),
        steer=CODE_PLAN_STEER,
        answer_stop="\n```",  # the closing fence of the answer's code block
        budget=TEMPLATE_BUDGET,
    ),
    "plain": ThinkingFormat(
        "plain", "<think>\n", "</think>", "\n</think>", "\n\n", system=PLAIN_SYSTEM, budget=TEMPLATE_BUDGET
    ),
}
FORMATS["cpp"] = replace(FORMATS["code"], name="cpp", answer_prefix="\n\n```cpp\n", system=CPP_SYSTEM)
# answers in a line format shown by examples (LongProc tom_tracking): prose notes in the
# CoT, the format's braces banned there, the formatted trace after the end marker
FORMATS["trace"] = replace(FORMATS["code"], name="trace", answer_prefix="\n\n", system=TRACE_SYSTEM,
                           banned_while_thinking=("{", "}"), steer=TRACE_PLAN_STEER, answer_stop="")
# no thinking at all: the answer right after the prompt (tools on a model that does not reason by
# itself: a thinking template talks such a model out of its tool-call format); budget 0
FORMATS["none"] = ThinkingFormat("none", "", "", "", "", budget=0)
TEMPLATE_CHOICES = ("auto", "code", "cpp", "trace", "plain", "none")


def detect_format(chat_template: str | None, template: str = "auto") -> ThinkingFormat:
    """Native markers if the chat template has them, else the requested template.

    template: "auto" (native markers, else the code template), "code" or "plain";
    the latter two force the template even on reasoning models.
    """
    if template not in TEMPLATE_CHOICES:
        raise ConfigError(f"--template must be one of {', '.join(TEMPLATE_CHOICES)}, got {template!r}")
    if template != "auto":
        return FORMATS[template]
    text = chat_template or ""
    if "<|channel>" in text:
        return FORMATS["gemma4"]
    if "<think>" in text:
        return FORMATS["think"]
    return FORMATS["code"]


def build_messages(prompt: str, fmt: ThinkingFormat) -> list[dict[str, str]]:
    return with_system([{"role": "user", "content": prompt}], fmt)


def with_system(messages: list[dict[str, str]], fmt: ThinkingFormat) -> list[dict[str, str]]:
    """Chat messages with the format's system instruction first (merged into a system
    message the caller gave)."""
    if not fmt.system:
        return list(messages)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": fmt.system + "\n\n" + messages[0]["content"]}] + list(messages[1:])
    return [{"role": "system", "content": fmt.system}] + list(messages)


def render_chat(chat_template: str | None, messages: list[dict], bos: str, eos: str,
                tools: list[dict] | None = None) -> str:
    """Render a Hugging Face chat template (jinja) with a generation prompt, as transformers
    renders it (its `tojson` and `strftime_now`); `tools` go to the template's own argument.

    Models without a template get ChatML, the format both registry models use.
    """
    if not chat_template:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + "<|im_start|>assistant\n"
    import json
    import time

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ConfigError(f"chat template: {message}")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    env.filters["tojson"] = tojson
    extra = {"tools": tools} if tools else {}
    return env.from_string(chat_template).render(
        messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos, **extra
    )
