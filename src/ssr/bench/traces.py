"""Text traces of reasoning models as a workload: what a model wrote (prompt, CoT, answer),
read from JSONL files (gzip or not) and tokenized for the replay (bench/trace_replay.py).

One trace a line, in any of these shapes:
- a reasoning trace: {"prompt", "cot", "answer", "model", "task_id", ...} (the shared traces'
  format; `setting` and `run` tell repeated items apart);
- an OpenAI chat-completions pair, as a deployment logs it:
  {"request": {"model", "messages": [...]}, "response": {"model", "choices": [{"message":
  {"content", "reasoning_content"}}]}} (vLLM's and `ssr serve`'s reasoning field; "reasoning"
  is read too);
- a served request: {"messages": [...], "reasoning", "answer", "model"} (`ssr serve
  --log-requests`; requests that did not finish — cancelled, timed out — are skipped).

Prompts are rendered as ChatML (the Qwen family's format: `<|im_start|>role ... <|im_end|>`,
the assistant turn opened with `<think>`); the CoT ends with one end-of-thinking token (as
Qwen3's `</think>`), an id outside the vocabulary standing for it.
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError


@dataclass(frozen=True)
class TextTrace:
    set: str  # the file's name without .jsonl(.gz): the benchmark set
    model: str  # the model that wrote it, short (up to the first " (")
    item: str  # unique within (set, model): task id, setting / run, a repeat number
    messages: tuple[tuple[str, str], ...]  # the prompt: (role, content) per message
    cot: str  # the reasoning, without its markers
    answer: str  # the text after the reasoning
    task: str = ""  # the task it answers (several traces may: prompt variants, runs)

    @property
    def group(self) -> str:
        return f"{self.set} / {self.model}"


@dataclass(frozen=True)
class TokenTrace:
    trace: TextTrace
    prompt_ids: list[int]  # the rendered chat prompt, the assistant turn opened
    cot_ids: list[int]  # the CoT, its end-of-thinking token last
    answer_ids: list[int]  # the answer (EOS follows it)


def set_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def read_traces(path: Path) -> Iterator[TextTrace]:
    """The traces of one file, in its order (its deployment order); a line that is not a trace
    is an error naming the file and line."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as lines:
            seen: dict[tuple[str, str], int] = {}
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    trace = parse_trace(json.loads(line), set_name(path))
                    if trace is None:  # a served request that did not finish
                        continue
                except (json.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError) as error:
                    raise ConfigError(f"{path}:{number}: not a trace ({_reason(error)}); see `ssr traces --help` "
                                      f"for the shapes it reads") from error
                key = (trace.model, trace.item)
                seen[key] = seen.get(key, 0) + 1
                if seen[key] > 1:  # the same item again: a repeat of its own
                    trace = TextTrace(trace.set, trace.model, f"{trace.item}#{seen[key]}", trace.messages,
                                      trace.cot, trace.answer, trace.task)
                yield trace
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read traces from {path}: {error}") from error


def _reason(error: Exception) -> str:
    return f"missing field {error}" if isinstance(error, KeyError) else str(error).split("\n")[0][:120]


def parse_trace(data: dict, set_name: str) -> TextTrace | None:
    """One JSON object in any of the shapes the module docstring lists; None for a served
    request that did not finish (cancelled, timed out, failed: its text is cut)."""
    if not isinstance(data, dict):
        raise ValueError("a line must hold a JSON object")
    if "request" in data and "response" in data:  # a chat-completions pair
        request, response = data["request"], data["response"]
        message = response["choices"][0]["message"]
        cot = message.get("reasoning_content") or message.get("reasoning") or ""
        model = response.get("model") or request.get("model") or "unknown"
        item = str(data.get("id") or response.get("id") or "")
        return TextTrace(set_name, _short(model), item, _messages(request["messages"]), cot, message.get("content") or "")
    if "messages" in data:  # a served request's log line
        if data.get("finish", "stop") not in ("stop", "length"):
            return None
        return TextTrace(set_name, _short(data.get("model") or "unknown"), str(data.get("id", "")),
                         _messages(data["messages"]), data.get("reasoning") or "", data.get("answer") or "")
    item = "/".join(str(data[key]) for key in ("task_id", "setting", "run") if data.get(key) is not None)
    return TextTrace(set_name, _short(data.get("model") or "unknown"), item, (("user", _text(data["prompt"])),),
                     _text(data["cot"]), _text(data["answer"]), str(data.get("task_id", item)))


def _short(model: str) -> str:
    return str(model).split(" (")[0].strip() or "unknown"


def _text(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__}")
    return value


def _messages(messages) -> tuple[tuple[str, str], ...]:
    """(role, content) pairs; content parts (OpenAI's list form) joined by their text."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        out.append((str(message.get("role", "user")), _text(content)))
    return tuple(out)


def tokenize_trace(trace: TextTrace, vocab) -> TokenTrace:
    """Token ids of a trace: ChatML prompt, CoT + one end-of-thinking token, answer."""
    prompt: list[int] = []
    for role, content in trace.messages:
        prompt += vocab.tokenize(f"<|im_start|>{role}\n", special=True) + vocab.tokenize(content)
        prompt += vocab.tokenize("<|im_end|>\n", special=True)
    prompt += vocab.tokenize("<|im_start|>assistant\n", special=True) + vocab.tokenize("<think>\n")
    end_of_thinking = vocab.vocab_size  # an id outside the vocabulary: the marker as one token
    return TokenTrace(trace, prompt, vocab.tokenize(trace.cot) + [end_of_thinking], vocab.tokenize(trace.answer))


def load_traces(paths: list[Path], limit: int | None = None, groups: list[str] | None = None,
                tasks: int | None = None) -> list[TextTrace]:
    """Traces of every file, in file order; per (set, model) group the first `limit`, or every
    trace of its first `tasks` tasks (all their prompt variants and runs); `groups`: keep groups
    whose name holds one of these (case-insensitive)."""
    kept: list[TextTrace] = []
    counts: dict[str, int] = {}
    chosen: dict[str, set[str]] = {}  # group -> the tasks kept
    for path in paths:
        if not path.is_file():
            raise ConfigError(f"{path}: no such traces file")
        for trace in read_traces(path):
            if groups and not any(word.lower() in trace.group.lower() for word in groups):
                continue
            if limit is not None and counts.get(trace.group, 0) >= limit:
                continue
            if tasks is not None:
                picked = chosen.setdefault(trace.group, set())
                if trace.task not in picked and len(picked) >= tasks:
                    continue
                picked.add(trace.task)
            counts[trace.group] = counts.get(trace.group, 0) + 1
            kept.append(trace)
    if not kept:
        raise ConfigError("no traces to replay" + (f" in groups matching {', '.join(groups)}" if groups else ""))
    return kept
