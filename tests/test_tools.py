"""Tool calls: the parser table (hand-written answers), the streaming reader against the whole
one (random splits), the prompt (tools and earlier calls through a chat template), and the
server's tool loop in-process on a fake engine that answers a scripted text."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from ssr.engines.fake import FakeEngine
from ssr.formats.thinking import render_chat
from ssr.formats.tool_stream import CallStream, call_head, read_calls
from ssr.formats.tools import (FORMATS, ToolUse, escaped_views, forced_call_prefix, hermes_messages, message_texts,
                               template_messages)

HERMES = FORMATS["hermes"]
OFFERED = frozenset({"get_weather", "search"})
WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SEARCH = '<tool_call>\n{"name": "search", "arguments": {"q": "a <b> c"}}\n</tool_call>'

READS = [  # (answer, content, [(name, arguments)], problems)
    ("It is sunny.", "It is sunny.", [], 0),
    (WEATHER, "", [("get_weather", {"city": "Paris"})], 0),
    ("\n\n" + WEATHER + "\n", "", [("get_weather", {"city": "Paris"})], 0),
    ("Let me check.\n" + WEATHER, "Let me check.", [("get_weather", {"city": "Paris"})], 0),
    (WEATHER + "\n" + SEARCH, "", [("get_weather", {"city": "Paris"}), ("search", {"q": "a <b> c"})], 0),
    ('<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>',
     '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>', [], 1),  # not offered
    ('<tool_call>\n{"name": "search", "arguments": {"q": }\n</tool_call>',
     '<tool_call>\n{"name": "search", "arguments": {"q": }\n</tool_call>', [], 1),  # not JSON
    ('<tool_call>{"name": "search", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "search", "arguments": [1]}</tool_call>', [], 1),  # arguments not an object
    ('<tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>', "", [("search", {"q": 1})], 0),
    ('<tool_call>{"name": "search", "parameters": {"q": 2}}</tool_call>', "", [("search", {"q": 2})], 0),
    ('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}', "", [("search", {"q": "x"})], 0),  # unclosed
    ('<tool_call>\n{"name": "search", "arg', '<tool_call>\n{"name": "search", "arg', [], 1),  # cut off
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})], 0),  # bare
    ('```json\n{"name": "search", "arguments": {"q": "y"}}\n```', "", [("search", {"q": "y"})], 0),  # fenced
    ('{"a": 1}', '{"a": 1}', [], 0),  # JSON, but no call: content, no problem
    ("```python\nprint(1)\n```", "```python\nprint(1)\n```", [], 0),
    ("Use <tool_call", "Use <tool_call", [], 0),  # a partial marker at the end is content
]


@pytest.mark.parametrize("answer, content, calls, problems", READS)
def test_read_calls_table(answer, content, calls, problems):
    read = read_calls(answer, HERMES, OFFERED)
    assert read.content == content
    assert [(c.name, json.loads(c.arguments)) for c in read.calls] == calls
    assert len(read.problems) == problems
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in read.calls)
    assert len({c.id for c in read.calls}) == len(read.calls)


def test_parallel_false_keeps_the_first_call_and_stops_reading():
    stream = CallStream(HERMES, OFFERED, limit=1)
    events = stream.push(WEATHER + "\n" + SEARCH) + stream.flush()
    assert [e[1].name for e in events if e[0] == "call"] == ["get_weather"] and stream.full


@pytest.mark.parametrize("answer", [row[0] for row in READS])
def test_streaming_reads_what_the_whole_answer_reads(answer):
    """Oracle: the answer read whole. Fed in random pieces, the stream sends the same content (in
    order) and the same calls, and never sends text of a call as content."""
    whole = read_calls(answer, HERMES, OFFERED)
    rng = random.Random(len(answer))
    for _ in range(20):
        stream, events, at = CallStream(HERMES, OFFERED), [], 0
        while at < len(answer):
            size = rng.randint(1, 7)
            events += stream.push(answer[at : at + size])
            at += size
        events += stream.flush()
        assert "".join(v for k, v in events if k == "content").strip() == whole.content
        assert [(v.name, v.arguments) for k, v in events if k == "call"] == \
            [(c.name, c.arguments) for c in whole.calls]


def test_forced_prefixes_per_tool_choice():
    assert forced_call_prefix(HERMES, "auto") == forced_call_prefix(HERMES, "none") == ""
    assert forced_call_prefix(HERMES, "required") == '<tool_call>\n{"name": "'
    named = forced_call_prefix(HERMES, "search")
    assert named == '<tool_call>\n{"name": "search", "arguments": '
    assert read_calls(named + '{"q": 1}}\n</tool_call>', HERMES, OFFERED).calls[0].name == "search"


# -- the prompt -------------------------------------------------------------------------------

QWEN_LIKE = (  # the tool parts of Qwen2.5's chat template (the default model's), cut down
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}"
    "{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}{{- '<|im_start|>assistant' }}"
    "{%- for tool_call in message.tool_calls %}{%- set tool_call = tool_call.function %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
    "'\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city: <é>",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
TURNS = [{"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}]


def test_template_renders_tools_and_calls_as_transformers_does():
    """Tools through the template's own argument with transformers' tojson (no HTML escapes,
    non-ASCII kept), earlier calls' arguments as objects."""
    text = render_chat(QWEN_LIKE, template_messages(TURNS), "", "<|im_end|>", tools=[TOOL])
    assert json.dumps(TOOL, ensure_ascii=False) in text  # not "\u003c" / "\u00e9"
    assert '{"name": "get_weather", "arguments": {"city": "Zürich"}}' in text
    assert text.endswith('<tool_response>\n{"sky": "clear"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n')


def test_a_template_without_tools_gets_a_hermes_block():
    messages = hermes_messages(TURNS, [TOOL])
    assert messages[0]["role"] == "system" and json.dumps(TOOL, ensure_ascii=False) in messages[0]["content"]
    assert messages[2] == {"role": "assistant",
                           "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
                                      '</tool_call>'}
    assert messages[3] == {"role": "user", "content": '<tool_response>\n{"sky": "clear"}\n</tool_response>'}


# -- the server's tool loop, in-process ---------------------------------------------------------


class ScriptedEngine(FakeEngine):
    """The fake model that answers each chat with the next scripted text (greedy), whatever the
    prompt: after the last "<|im_start|>assistant\\n" it predicts the script's next character."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__(max_sequences=4)
        self.answers = [self.tokenize(a) for a in answers]
        self.opened = self.tokenize("<|im_start|>assistant\n")

    def _logits(self, tokens):
        starts = [i for i in range(len(tokens)) if tokens[i : i + len(self.opened)] == self.opened]
        if not starts:  # no chat (the engine's cost measurement): the fake model's own logits
            return super()._logits(tokens)
        at = starts[-1] + len(self.opened)
        script = self.answers[min(len(starts) - 1, len(self.answers) - 1)]
        written = tokens[at:]
        row = np.full(self.vocab_size, -20.0, dtype=np.float32)
        row[script[len(written)] if written == script[: len(written)] and len(written) < len(script) else 0] = 20.0
        return row


def _app(answers):
    pytest.importorskip("fastapi")
    from ssr.api import SSR
    from ssr.config import GenerationConfig
    from ssr.server.app import create_app

    logged = []
    model = SSR("fake", engine=ScriptedEngine(answers))
    app = create_app(model, "fake", defaults=GenerationConfig(thinking_budget=24, draft_at=8, max_answer_tokens=256),
                     log=logged.append)
    return app, logged


def test_the_openai_tool_loop_in_process():
    """call -> result -> final answer, with the official client's shapes: tool_calls with ids,
    finish_reason tool_calls, the call and its result sent back in the next turn."""
    from starlette.testclient import TestClient

    app, _ = _app([WEATHER, "It is clear in Zurich."])
    with TestClient(app) as http:
        body = {"model": "fake", "messages": TURNS[:1], "tools": [TOOL]}
        first = http.post("/v1/chat/completions", json=body).json()
        choice = first["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"] == {"name": "get_weather",
                                                                   "arguments": '{"city": "Paris"}'}
        body["messages"] = TURNS[:1] + [choice["message"],
                                        {"role": "tool", "tool_call_id": call["id"], "content": "clear"}]
        second = http.post("/v1/chat/completions", json=body).json()
        assert second["choices"][0]["finish_reason"] == "stop"
        assert second["choices"][0]["message"]["content"] == "It is clear in Zurich."
        assert "tool_calls" not in second["choices"][0]["message"]


def test_streamed_tool_calls_and_a_bad_call_that_stays_content():
    from starlette.testclient import TestClient

    bad = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    app, _ = _app([WEATHER + "\n" + SEARCH])
    tools = [TOOL, {"type": "function", "function": {"name": "search"}}]
    with TestClient(app) as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={"model": "fake", "messages": TURNS[:1], "tools": tools, "stream": True}) as reply:
            chunks = [json.loads(line[6:]) for line in reply.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert [(c["index"], c["function"]["name"]) for c in calls if "id" in c] == [(0, "get_weather"), (1, "search")]
        joined = {i: "".join(c["function"]["arguments"] for c in calls if c["index"] == i) for i in (0, 1)}
        assert [json.loads(joined[i]) for i in (0, 1)] == [{"city": "Paris"}, {"q": "a <b> c"}]
        assert len(calls) > 2  # the arguments came as they were written, not in one piece
        assert not any(d.get("content") for d in deltas)
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    app, logged = _app([bad])
    with TestClient(app) as http:
        reply = http.post("/v1/chat/completions", json={"model": "fake", "messages": TURNS[:1], "tools": tools})
        message = reply.json()["choices"][0]
        assert reply.status_code == 200 and message["finish_reason"] == "stop"
        assert message["message"]["content"] == bad and "tool_calls" not in message["message"]
        assert reply.json()["ssr"]["tool_call_problems"] == ["the call names 'rm_rf', which is not an offered tool"]
        assert any("rm_rf" in line for line in logged)


def test_tool_choice_none_reads_no_calls_and_completions_refuse_tools():
    from starlette.testclient import TestClient

    app, _ = _app([WEATHER])
    with TestClient(app) as http:
        reply = http.post("/v1/chat/completions", json={"model": "fake", "messages": TURNS[:1], "tools": [TOOL],
                                                        "tool_choice": "none"}).json()
        assert "tool_calls" not in reply["choices"][0]["message"]
        reply = http.post("/v1/completions", json={"model": "fake", "prompt": "hi", "tools": [TOOL]})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools"


def test_tool_use_value():
    use = ToolUse((TOOL,), "none")
    assert use.offered == {"get_weather"} and not use.active


@pytest.mark.parametrize("text, view", [
    ("def add(a, b):\n    return a - b\n", "def add(a, b):\\n    return a - b\\n"),
    ('say "hi"\tnow', 'say \\"hi\\"\\tnow'),
    ("C:\\temp and ü", "C:\\\\temp and ü"),  # non-ASCII as written (what models write in JSON)
    ("one line, nothing to escape", None),
])
def test_escaped_views_write_each_text_as_a_json_string(text, view):
    assert escaped_views([text]) == ([] if view is None else [view])
    if view is not None:
        assert json.loads('"' + view + '"') == text


def test_message_texts_and_a_tool_calling_request_s_sources():
    """Tools offered, a request's sources are its messages' escaped views (a call writes the file a
    tool showed, escaped); tool_choice none, or a mode without ssr's proposer, none."""
    from ssr.api import SSR
    from ssr.config import GenerationConfig

    messages = [{"role": "user", "content": [{"type": "text", "text": "Fix "}, {"type": "text", "text": "it."}]},
                {"role": "assistant", "content": None, "tool_calls": []},
                {"role": "tool", "tool_call_id": "c1", "content": "def f():\n    return 1\n"}]
    assert message_texts(messages) == ["Fix it.", "def f():\n    return 1\n"]
    model = SSR("fake", engine=ScriptedEngine(["ok"]))
    config = GenerationConfig(thinking_budget=0, max_answer_tokens=8)
    view = model.engine.tokenize("def f():\\n    return 1\\n")
    assert model.start(messages, config, tools=ToolUse((TOOL,))).views == [view]
    assert model.start(messages, config, tools=ToolUse((TOOL,), "none")).views == []
    assert model.start(messages, config).views == []
    assert model.start(messages, GenerationConfig(mode="ar", thinking_budget=0), tools=ToolUse((TOOL,))).views == []
