"""Agent conversations in `ssr traces`: every assistant turn a request (its prompt the
conversation before it, rendered as the Qwen family's template renders tool calls and results),
refusals with the reason, the parts of an answer, the table by turn and part, and a served
tool-calling request's log line replayed token for token."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_traces import GPU, WordVocab

from ssr.bench.conversations import render_messages
from ssr.bench.trace_replay import replay_all, replay_trace
from ssr.bench.traces import load_traces, parse_record, part_labels, read_traces, tokenize_trace
from ssr.bench.turns import answer_passes, turn_table
from ssr.config import ConfigError
from ssr.verifying.verify import common_prefix

pytestmark = pytest.mark.shared_data  # runs from a clone too: nothing here reads ../shared

CALL = {"name": "read_file", "arguments": '{"path": "app.py"}', "id": "c1"}
CONVERSATION = {"model": "Org/Agent-9B (thinking)", "task_id": "fix-1", "messages": [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "Fix app.py."},
    {"role": "assistant", "content": "", "reasoning": "I should read it.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "def add(a, b):\n    return a - b\n"},
    {"role": "assistant", "content": "Found it.", "reasoning": "It subtracts.", "tool_calls": [
        {"name": "write_file", "arguments": '{"path": "app.py", "text": "def add(a, b):\\n    return a + b\\n"}',
         "id": "c2"},
        {"name": "run", "arguments": '{"cmd": "pytest"}', "id": "c3"}]},
    {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    {"role": "tool", "tool_call_id": "c3", "content": "1 passed"},
    {"role": "assistant", "content": "Fixed: add now adds.", "reasoning": "Done."},
]}
READ = '<tool_call>\n{"name": "read_file", "arguments": {"path": "app.py"}}\n</tool_call>'


def test_every_assistant_turn_is_a_request_on_the_conversation_before_it():
    turns = parse_record(CONVERSATION, "agentic")
    assert [(t.turn, t.item, t.task) for t in turns] == [(1, "fix-1/turn1", "fix-1"), (2, "fix-1/turn2", "fix-1"),
                                                         (3, "fix-1/turn3", "fix-1")]
    assert turns[0].messages == (("system", "You fix bugs."), ("user", "Fix app.py."))
    assert turns[0].cot == "I should read it." and turns[0].answer == READ  # the arguments as the model wrote them
    assert turns[2].messages[2:] == (
        ("assistant", "<think>\nI should read it.\n</think>\n\n" + READ),  # kept: after the last query
        ("user", "<tool_response>\ndef add(a, b):\n    return a - b\n\n</tool_response>"),
        ("assistant", "<think>\nIt subtracts.\n</think>\n\nFound it."
                      '\n<tool_call>\n{"name": "write_file", "arguments": {"path": "app.py", "text": '
                      '"def add(a, b):\\n    return a + b\\n"}}\n</tool_call>'
                      '\n<tool_call>\n{"name": "run", "arguments": {"cmd": "pytest"}}\n</tool_call>'),
        ("user", "<tool_response>\nok\n</tool_response>\n<tool_response>\n1 passed\n</tool_response>"))
    assert [part for part, _ in turns[1].parts] == ["content", "call", "arguments", "call", "call", "arguments",
                                                    "call"]
    assert turns[2].parts == (("content", "Fixed: add now adds."),)


def test_earlier_reasoning_before_the_last_user_query_is_dropped():
    messages = CONVERSATION["messages"][:4] + [{"role": "user", "content": "Also rename it."}]
    rendered = render_messages(messages)
    assert rendered[2] == ("assistant", READ)  # no <think>: a user query came after it


def test_openai_shaped_calls_and_a_served_log_line_with_tools():
    served = {"messages": [{"role": "user", "content": "Weather?"}], "reasoning": "Ask the tool.", "answer": "",
              "finish": "tool_calls", "model": "m", "id": "r1",
              "tool_calls": [{"id": "call_1", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    (trace,) = parse_record(served, "log")
    assert trace.answer == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert dict(trace.parts)["arguments"] == '{"city": "Oslo"}'


def test_tool_calling_requests_copy_from_their_messages_escaped():
    """A call's arguments are JSON: turn 2 writes the file the tool showed it raw with its newlines
    escaped. Tools offered, its messages' escaped views are ssr's sources too, and ssr copies the
    file into the arguments in fewer passes, the output the trace's token for token."""
    turns = parse_record(CONVERSATION, "agentic")
    assert all(turn.tools for turn in turns)
    vocab = WordVocab()
    second = tokenize_trace(turns[1], vocab)
    tool_result = "<tool_response>\ndef add(a, b):\n    return a - b\n\n</tool_response>"
    assert vocab.tokenize(json.dumps(tool_result)[1:-1]) in second.views
    plain = replace(second, views=())
    passes = {}
    for name, tokens in (("with views", second), ("without", plain)):
        row = replay_trace(tokens, "ssr", GPU, "cold")
        assert row["identical"]
        passes[name] = answer_passes(row)["arguments"][1]
    assert passes["with views"] < passes["without"]
    served = {"messages": [{"role": "user", "content": "Weather?"}], "reasoning": "", "answer": "Sunny.",
              "model": "m", "id": "r2"}
    assert not parse_record(served, "log")[0].tools  # no tools offered: no views
    assert not tokenize_trace(parse_record(served, "log")[0], vocab).views
    assert parse_record({**served, "tools": [{"type": "function", "function": {"name": "f"}}]}, "log")[0].tools
    assert not parse_record({**served, "tools": [{"type": "function", "function": {"name": "f"}}],
                             "tool_choice": "none"}, "log")[0].tools


@pytest.mark.parametrize("record, says", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "without an assistant turn"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}, "role must be one of"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x",
                                                       "tool_calls": [{"arguments": "{}"}]}]}, "has no name"),
    ({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}, "content must be text"),
    ({"messages": []}, "non-empty list"),
])
def test_a_record_that_cannot_be_read_whole_is_refused_with_the_reason(tmp_path, record, says):
    path = tmp_path / "agentic.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ConfigError, match=rf"agentic.jsonl:1: not a trace \(.*{says}"):
        list(read_traces(path))


def test_answer_tokens_keep_their_part():
    vocab = WordVocab()
    (first, second, _) = [tokenize_trace(t, vocab) for t in parse_record(CONVERSATION, "agentic")]
    assert len(second.answer_parts) == len(second.answer_ids)
    arguments = [token for token, part in zip(second.answer_ids, second.answer_parts) if part == "arguments"]
    assert arguments == vocab.tokenize('{"path": "app.py", "text": "def add(a, b):\\n    return a + b\\n"}') + \
        vocab.tokenize('{"cmd": "pytest"}')


def test_the_answer_is_tokenized_whole_as_the_model_writes_it_and_later_prompts_hold_it():
    """A token may cross parts (here the run of newlines between a content's last line and its
    call): the answer is the text's own tokens, each labelled with the part its first character
    is in, so a later turn's prompt holds the same tokens (a copy of an earlier call is found)."""
    vocab = WordVocab()
    record = json.loads(json.dumps(CONVERSATION))
    record["messages"][2]["content"] = "Reading it first.\n"  # the call opens a line after it: "\n\n"
    turns = parse_record(record, "agentic")
    first, later = tokenize_trace(turns[0], vocab), tokenize_trace(turns[1], vocab)
    assert first.answer_ids == vocab.tokenize(turns[0].answer)
    newlines = vocab.tokenize("\n\n")[0]
    assert first.answer_parts[first.answer_ids.index(newlines)] == "content"  # its first character's part
    text = [vocab.tokenize(turns[0].answer), first.answer_ids]
    assert text[0] == text[1] and any(later.prompt_ids[i:i + len(text[0])] == text[0]
                                      for i in range(len(later.prompt_ids)))


@pytest.mark.parametrize("parts, starts, labels", [
    ((("content", "ab"), ("call", "cd")), [0, 1, 2, 3], ("content", "content", "call", "call")),
    ((("content", "ab"), ("call", "cd")), [0, 1, 3], ("content", "content", "call")),  # "bc" is content's
    ((("call", "x"), ("arguments", "{}"), ("call", "}")), [0, 1, 3], ("call", "arguments", "call")),
    ((("content", "a"),), [0], ("content",)),
])
def test_part_labels(parts, starts, labels):
    assert part_labels(parts, starts) == labels


PASSES = [  # (parts, span events (at, accepted), expected part -> (tokens, passes))
    ([["content", 4]], [], {"content": (4, 4)}),
    ([["content", 4]], [(1, 2)], {"content": (4, 2)}),  # token 0, then 3 tokens in one pass
    ([["content", 2], ["arguments", 3]], [(1, 3)], {"content": (2, 1.25), "arguments": (3, 0.75)}),
    ([["call", 2], ["arguments", 2]], [(0, 1), (2, 5)], {"call": (2, 1), "arguments": (2, 2 / 6)}),
]


@pytest.mark.parametrize("parts, spans, expected", PASSES)
def test_passes_are_shared_among_the_parts_they_commit(parts, spans, expected):
    row = {"parts": parts, "answer_ids": [0] * sum(c for _, c in parts),
           "trace": [{"kind": "span", "at": at, "accepted": accepted} for at, accepted in spans]}
    got = answer_passes(row)
    assert set(got) == set(expected)
    for part, (tokens, passes) in expected.items():
        assert got[part][0] == tokens and got[part][1] == pytest.approx(passes)


def test_conversations_replay_token_for_token_in_conversation_order(tmp_path):
    path = tmp_path / "agentic.jsonl"
    path.write_text(json.dumps(CONVERSATION) + "\n" + json.dumps({**CONVERSATION, "task_id": "fix-2"}) + "\n")
    traces = load_traces([path])
    assert [t.item for t in traces] == [f"fix-{n}/turn{t}" for n in (1, 2) for t in (1, 2, 3)]
    rows = replay_all([tokenize_trace(t, WordVocab()) for t in traces], ["ar", "ssr", "sglang-ngram"], [GPU])
    assert all(row["identical"] for row in rows) and {row["turn"] for row in rows} == {1, 2, 3}
    table = {(t["suite"], t["mode"]): t for t in turn_table(rows)}
    ssr = table[("agentic / Org/Agent-9B (deployment)", "ssr")]
    assert ssr["turns"] == {"first": 2, "later": 4} and ssr["ratio"]["later"] < 1.0
    assert ssr["per_pass"]["arguments"] > 1.0  # the second conversation copies the first one's calls
    assert table[("agentic / Org/Agent-9B (cold)", "ar")]["per_pass"]["arguments"] == 1.0


def test_deployment_order_prefills_only_what_the_last_request_did_not_leave_in_kv(tmp_path):
    """A server keeps its last request's KV (prefix caching): in deployment order turn N prefills
    the prompt past what turn N - 1's prompt and output hold, every mode alike; cold order, and a
    turn that shares too little (another conversation), prefill it all."""
    path = tmp_path / "agentic.jsonl"
    path.write_text(json.dumps(CONVERSATION) + "\n")
    tokens = [tokenize_trace(t, WordVocab()) for t in load_traces([path])]
    rows = replay_all(tokens, ["ar", "ssr"], [GPU])
    by = {(r["order"], r["mode"], r["turn"]): r["metrics"] for r in rows}
    for mode in ("ar", "ssr"):
        for turn, each in enumerate(tokens, 1):
            cold, deployed = by[("cold", mode, turn)], by[("deployment", mode, turn)]
            assert cold["cached_prompt_tokens"] == 0
            assert cold["seconds"]["prefill"] == pytest.approx(GPU.costs.prefill(len(each.prompt_ids) - 1))
            if turn == 1:
                assert deployed["cached_prompt_tokens"] == 0
                continue
            before = tokens[turn - 2]
            held = common_prefix(before.prompt_ids + before.cot_ids + before.answer_ids, each.prompt_ids[:-1])
            assert deployed["cached_prompt_tokens"] == held >= len(before.prompt_ids) - 1
            fed = len(each.prompt_ids) - 1 - held
            assert deployed["seconds"]["prefill"] == pytest.approx(GPU.costs.prefill(fed, held))
            assert deployed["seconds"]["prefill"] < cold["seconds"]["prefill"]
    assert all(row["identical"] for row in rows)


def test_a_served_tool_calling_request_replays_from_its_log_line(tmp_path):
    """`ssr serve --log-requests` on a tool-calling request writes a line `ssr traces` replays."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient
    from test_tools import TOOL, WEATHER, ScriptedEngine

    from ssr.api import SSR
    from ssr.config import GenerationConfig
    from ssr.server.app import create_app

    log = tmp_path / "requests.jsonl"
    app = create_app(SSR("fake", engine=ScriptedEngine([WEATHER])), "fake", log_requests=str(log),
                     defaults=GenerationConfig(thinking_budget=24, draft_at=8, max_answer_tokens=256))
    with TestClient(app) as http:
        reply = http.post("/v1/chat/completions", json={"model": "fake", "tools": [TOOL], "messages": [
            {"role": "user", "content": "Weather in Paris?"}]})
    assert reply.json()["choices"][0]["finish_reason"] == "tool_calls"
    line = json.loads(log.read_text())
    assert line["tools"] == [TOOL] and line["tool_calls"][0]["function"]["name"] == "get_weather"
    (trace,) = load_traces([log])
    assert dict(trace.parts)["arguments"] == '{"city": "Paris"}'
    rows = replay_all([tokenize_trace(trace, WordVocab())], ["ar", "ssr"], [GPU], orders=["cold"])
    assert all(row["identical"] for row in rows)


def test_a_real_vocabulary_says_where_each_token_starts():
    """GgufVocab.token_starts: a byte-level token is its bytes, so the starts cut the text into
    the tokens' own texts, multi-byte characters and tokens across parts included."""
    from ssr.bench.parsers import DEFAULT_MODEL
    from ssr.engines.vocab import load_vocab

    vocab = load_vocab(DEFAULT_MODEL)
    text = 'Lisez « café ».\n<tool_call>\n{"name": "f", "arguments": {"q": "naïve 東京"}}\n</tool_call>'
    ids, starts = vocab.token_starts(text)
    assert ids == vocab.tokenize(text) and starts[0] == 0 and starts == sorted(starts)
    assert len(set(starts)) >= len(starts) - 2  # a character split over two tokens starts both
    cut = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    assert "".join(cut) == text and '"}}\n' in cut  # the arguments' end and the call's close: one token


def test_a_token_longer_than_the_first_buffer_is_read_whole():
    """llamacpp.token_piece: llama.cpp answers a buffer too small with minus the size it needs."""
    from ssr.engines.llamacpp import token_piece

    class Lib:  # llama_token_to_piece as llama.cpp's C function behaves
        @staticmethod
        def llama_token_to_piece(vocab, token, buffer, length, lstrip, special):
            piece = bytes([65 + token % 26]) * token
            if length < len(piece):
                return -len(piece)
            buffer[: len(piece)] = piece
            return len(piece)

    assert token_piece(Lib(), None, 3) == b"DDD"
    assert token_piece(Lib(), None, 300) == bytes([65 + 300 % 26]) * 300
