"""Text traces of reasoning models as a workload: what a model wrote (prompt, CoT, answer),
read from JSONL files (gzip or not) and tokenized for the replay (bench/trace_replay.py).

One trace a line, in any of these shapes:
- a reasoning trace: {"prompt", "cot", "answer", "model", "task_id", ...} (the shared traces'
  format; `setting` and `run` tell repeated items apart);
- an OpenAI chat-completions pair, as a deployment logs it:
  {"request": {"model", "messages": [...]}, "response": {"model", "choices": [{"message":
  {"content", "reasoning_content"}}]}} (vLLM's and `ssr serve`'s reasoning field; "reasoning"
  is read too);
- a served request: {"messages": [...], "reasoning", "answer", "model", "tool_calls"?} (`ssr serve
  --log-requests`; requests that did not finish — cancelled, timed out — are skipped);
- an agent conversation: {"messages": [...], "model", "task_id"} with assistant turns (their
  `reasoning`, `content` and `tool_calls`) and tool results: every assistant turn is a trace
  whose prompt is the conversation before it (bench/conversations.py renders it);
- token ids: {"prompt_token_ids", "generated_token_ids", "id"?, "model"?} (a benchmark's greedy
  outputs in the model's own vocabulary, its chat template applied): replayed as they are, no
  tokenizer; a model that does not reason: the output is all answer. A GPU run's recorded
  acceptance beside them ({"acc_ngram": {"acc_len": [...]}, "acc_eagle": ...}) replays as the
  reference modes recorded-ngram and recorded-eagle (bench/recorded.py).

Prompts are rendered as ChatML (the Qwen family's format: `<|im_start|>role ... <|im_end|>`,
the assistant turn opened with `<think>`); the CoT ends with one end-of-thinking token (as
Qwen3's `</think>`), an id outside the vocabulary standing for it.
"""
from __future__ import annotations

import gzip
import json
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path

from ..config import ConfigError
from ..formats.tools import escaped_views
from .conversations import answer_parts, calls_of, conversation_turns, offers_tools, render_messages


@dataclass(frozen=True)
class TraceDraft:
    """What a draft child wrote, forked from this trace's own partial CoT and forced to end it."""

    budget_tokens: int  # the CoT tokens it forked after, in the model's own count
    cot_chars: int  # the CoT's characters it saw: cot[:cot_chars]
    answer: str  # its whole answer


@dataclass(frozen=True)
class TextTrace:
    set: str  # the file's name without .jsonl(.gz): the benchmark set
    model: str  # the model that wrote it, short (up to the first " (")
    item: str  # unique within (set, model): task id, setting / run, a repeat number
    messages: tuple[tuple[str, str], ...]  # the prompt: (role, content) per message
    cot: str  # the reasoning, without its markers
    answer: str  # the text after the reasoning
    task: str = ""  # the task it answers (several traces may: prompt variants, runs)
    turn: int = 0  # its turn in an agent conversation, from 1 (0: a single request)
    parts: tuple[tuple[str, str], ...] = ()  # the answer as (part, text): content, call, arguments
    tools: bool = False  # tools were offered (an agent's conversation, a request with `tools`): calls may follow
    # recorded as token ids, no text (any model's vocabulary): (prompt, output); the output is all answer
    token_ids: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # a GPU run's acceptance per output position, by proposer ("ngram", "eagle"): bench/recorded.py
    acceptance: tuple[tuple[str, tuple[int, ...]], ...] = ()
    drafts: tuple[TraceDraft, ...] = ()  # draft children recorded beside it, by fork point

    @property
    def group(self) -> str:
        return f"{self.set} / {self.model}"


@dataclass(frozen=True)
class TokenTrace:
    trace: TextTrace
    prompt_ids: list[int]  # the rendered chat prompt, the assistant turn opened
    cot_ids: list[int]  # the CoT, its end-of-thinking token last
    answer_ids: list[int]  # the answer (EOS follows it)
    answer_parts: tuple[str, ...] = ()  # each answer token's part (content, call, arguments); () : all content
    views: tuple[list[int], ...] = ()  # tools offered: the messages' escaped views, for ssr to copy from
    # the recorded draft children: (CoT tokens they forked after, their answer's tokens), by fork point
    drafts: tuple[tuple[int, list[int]], ...] = ()


def set_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name


def jsonl_records(path: Path) -> Iterator[dict]:
    """The JSON objects of a JSONL file, gzip or not (blank lines skipped)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


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
                    found = parse_record(json.loads(line), set_name(path))
                except (json.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError) as error:
                    raise ConfigError(f"{path}:{number}: not a trace ({_reason(error)}); see `ssr traces --help` "
                                      f"for the shapes it reads") from error
                for trace in found:  # none: a served request that did not finish
                    key = (trace.model, trace.item)
                    seen[key] = seen.get(key, 0) + 1
                    if seen[key] > 1:  # the same item again: a repeat of its own
                        trace = replace(trace, item=f"{trace.item}#{seen[key]}")
                    yield trace
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read traces from {path}: {error}") from error


def _reason(error: Exception) -> str:
    return f"missing field {error}" if isinstance(error, KeyError) else str(error).split("\n")[0][:120]


def parse_record(data: dict, set_name: str) -> list[TextTrace]:
    """The traces of one JSON object: one, or one per assistant turn of an agent conversation;
    none for a served request that did not finish (cancelled, timed out, failed: its text is cut)."""
    if isinstance(data, dict) and "messages" in data and not {"answer", "reasoning"} & data.keys():
        model = _short(data.get("model") or "unknown")
        task = str(data.get("task_id") or data.get("id") or "")
        tools = offers_tools(data["messages"], data.get("tools"), data.get("tool_choice"))
        turns = [TextTrace(set_name, model, f"{task}/turn{turn}", messages, reasoning,
                           "".join(text for _, text in parts), task, turn, parts, tools)
                 for turn, messages, reasoning, parts in conversation_turns(data)]
        if not turns:
            raise ValueError("a conversation without an assistant turn (or a served request without its "
                             "answer): nothing to replay")
        return turns
    trace = parse_trace(data, set_name)
    return [] if trace is None else [trace]


def parse_trace(data: dict, set_name: str) -> TextTrace | None:
    """One JSON object in any of the single-request shapes the module docstring lists; None for
    a served request that did not finish (cancelled, timed out, failed: its text is cut)."""
    if not isinstance(data, dict):
        raise ValueError("a line must hold a JSON object")
    if "request" in data and "response" in data:  # a chat-completions pair
        request, response = data["request"], data["response"]
        message = response["choices"][0]["message"]
        cot = message.get("reasoning_content") or message.get("reasoning") or ""
        model = response.get("model") or request.get("model") or "unknown"
        item = str(data.get("id") or response.get("id") or "")
        parts = answer_parts(message.get("content") or "", calls_of(message, "message"))
        return TextTrace(set_name, _short(model), item, render_messages(request["messages"]), cot,
                         "".join(text for _, text in parts), parts=parts if message.get("tool_calls") else (),
                         tools=offers_tools(request["messages"], request.get("tools"), request.get("tool_choice")))
    if "prompt_token_ids" in data and "generated_token_ids" in data:  # token ids, no text
        item = str(data.get("id", ""))
        return TextTrace(set_name, _short(data.get("model") or "unknown"), item, (), "", "", item,
                         token_ids=(_ids(data["prompt_token_ids"]), _ids(data["generated_token_ids"])),
                         acceptance=_acceptance(data))
    if "messages" in data:  # a served request's log line
        if data.get("finish", "stop") not in ("stop", "length", "tool_calls"):
            return None
        parts = answer_parts(_text(data.get("answer") or ""), calls_of(data, "tool_calls"))
        reasoning = _text(data.get("reasoning") or "")
        return TextTrace(set_name, _short(data.get("model") or "unknown"), str(data.get("id", "")),
                         render_messages(data["messages"]), reasoning,
                         "".join(text for _, text in parts), parts=parts if data.get("tool_calls") else (),
                         tools=offers_tools(data["messages"], data.get("tools"), data.get("tool_choice")),
                         drafts=_drafts(data, reasoning))
    item = "/".join(str(data[key]) for key in ("task_id", "setting", "run") if data.get(key) is not None)
    cot = _text(data["cot"])
    return TextTrace(set_name, _short(data.get("model") or "unknown"), item, (("user", _text(data["prompt"])),),
                     cot, _text(data["answer"]), str(data.get("task_id", item)), drafts=_drafts(data, cot))


def _drafts(data: dict, cot: str) -> tuple[TraceDraft, ...]:
    """A trace's `drafts`: [{"budget_tokens", "cot_chars", "answer"}] (a draft child forked from
    cot[:cot_chars]); one ssr cannot use whole refuses the line."""
    found = data.get("drafts") or []
    if not isinstance(found, list):
        raise ValueError("drafts must be a list of {budget_tokens, cot_chars, answer}")
    drafts = []
    for draft in found:
        if not isinstance(draft, dict) or not {"budget_tokens", "cot_chars", "answer"} <= draft.keys():
            raise ValueError("a draft needs budget_tokens, cot_chars and answer")
        budget, chars = draft["budget_tokens"], draft["cot_chars"]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (budget, chars)) or budget < 1:
            raise ValueError("a draft's budget_tokens and cot_chars must be integers, budget_tokens >= 1")
        if not 0 < chars < len(cot):
            raise ValueError(f"a draft's cot_chars ({chars}) must cut the CoT ({len(cot)} characters) before "
                             "its end: a draft child forks from a partial CoT")
        drafts.append(TraceDraft(budget, chars, _text(draft["answer"])))
    return tuple(sorted(drafts, key=lambda d: d.cot_chars))


def _acceptance(data: dict) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """{"acc_ngram": {"acc_len": [...]}, "acc_eagle": ...} -> (("ngram", (...)), ("eagle", (...)))."""
    found = []
    for field_name in sorted(name for name in data if name.startswith("acc_")):
        record = data[field_name]
        lengths = record.get("acc_len") if isinstance(record, dict) else None
        if not isinstance(lengths, list) or not all(isinstance(n, int) and n >= 1 for n in lengths):
            raise ValueError(f"{field_name}.acc_len must be a list of integers >= 1")
        found.append((field_name.removeprefix("acc_"), tuple(lengths)))
    return tuple(found)


def _short(model: str) -> str:
    return str(model).split(" (")[0].strip() or "unknown"


def _ids(value) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise ValueError("token ids must be a non-empty list of integers >= 0")
    return tuple(value)


def _text(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__}")
    return value


def tokenize_trace(trace: TextTrace, vocab) -> TokenTrace:
    """Token ids of a trace: ChatML prompt, CoT + one end-of-thinking token, answer (a trace
    recorded as token ids: its own, no CoT)."""
    if trace.token_ids is not None:
        prompt_ids, output_ids = trace.token_ids
        return TokenTrace(trace, list(prompt_ids), [], list(output_ids))
    prompt: list[int] = []
    for role, content in trace.messages:
        prompt += vocab.tokenize(f"<|im_start|>{role}\n", special=True) + vocab.tokenize(content)
        prompt += vocab.tokenize("<|im_end|>\n", special=True)
    prompt += vocab.tokenize("<|im_start|>assistant\n", special=True) + vocab.tokenize("<think>\n")
    end_of_thinking = vocab.vocab_size  # an id outside the vocabulary: the marker as one token
    cot_ids, cot_starts = vocab.token_starts(trace.cot) if trace.drafts else (vocab.tokenize(trace.cot), [])
    cot = cot_ids + [end_of_thinking]
    # a draft forks after the CoT's tokens that begin before its cut (a token across the cut is in)
    drafts = tuple((bisect_left(cot_starts, draft.cot_chars), vocab.tokenize(draft.answer)) for draft in trace.drafts)
    texts = escaped_views(content for _, content in trace.messages) if trace.tools else []
    views = tuple(vocab.tokenize(text) for text in texts)  # as `ssr serve` makes them (api.SSR.start)
    if not trace.parts:
        return TokenTrace(trace, prompt, cot, vocab.tokenize(trace.answer), views=views, drafts=drafts)
    answer, starts = vocab.token_starts("".join(text for _, text in trace.parts))
    return TokenTrace(trace, prompt, cot, answer, part_labels(trace.parts, starts), views)


def part_labels(parts: tuple[tuple[str, str], ...], starts: list[int]) -> tuple[str, ...]:
    """Each answer token's part: the part its first character is in. The answer is tokenized whole,
    as a model writes it and as its earlier turns are tokenized in later prompts: a token may cross
    parts (`"}}\n` ends the arguments and begins the call's closing), where tokenizing each part on
    its own would split it into tokens the model never writes, and that no copy of an earlier call
    in the prompt holds."""
    ends = list(accumulate(len(text) for _, text in parts))
    return tuple(parts[min(bisect_right(ends, start), len(parts) - 1)][0] for start in starts)


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


def tokenized_traces(files: list[str], limit: int | None = None, groups: list[str] | None = None,
                     tasks: int | None = None) -> list[TokenTrace]:
    """load_traces of these files (ConfigError for a missing one), each tokenized with the default
    model's vocabulary, as `ssr traces` does: the input of the measuring scripts."""
    from ..engines.vocab import load_vocab
    from ..models import DEFAULT_MODEL

    vocab = load_vocab(DEFAULT_MODEL)
    return [tokenize_trace(trace, vocab) for trace in load_traces([Path(f) for f in files], limit, groups, tasks)]
