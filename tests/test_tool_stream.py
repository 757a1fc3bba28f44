"""Tool calls streamed as they are written: how a call's opening is read (a table), the
arguments' deltas joined by index against the answer read whole (random splits), and what a
client is sent of a call that breaks after its first delta."""
from __future__ import annotations

import json
import random

import pytest

from ssr.formats.tool_stream import CallDelta, CallStream, call_head, read_calls
from ssr.formats.tools import FORMATS

from test_tools import OFFERED, READS

HERMES = FORMATS["hermes"]

HEADS = [  # (the call's text after its opening marker, call_head's verdict)
    ("", None),
    ("\n{", None),
    ('\n{"na', None),
    ('\n{"name": "sea', None),
    ('\n{"name": "search"', None),
    ('\n{"name": "search", "arg', None),
    ('\n{"name": "search", "arguments": ', None),
    ('\n{"name": "search", "arguments": {', ("search", 33)),  # where the arguments' "{" is
    ('{"name":"search","parameters":{"q"', ("search", 30)),
    ('\n{"name": "a\\"b", "arguments": {', ('a"b', 31)),
    ('\n{"arguments": {"q": 1}, "name": "search"}', False),  # keys in the other order: read whole
    ('\n{"name": "search", "arguments": "{', False),  # arguments as a JSON string: read whole
    ('\n{"name": 3', False),
    ("\nplain text", False),
]


@pytest.mark.parametrize("text, verdict", HEADS)
def test_call_head_table(text, verdict):
    assert call_head(text, HERMES) == verdict


def _feed(answer: str, rng: random.Random) -> list[tuple[str, object]]:
    stream, events, at = CallStream(HERMES, OFFERED), [], 0
    while at < len(answer):
        size = rng.randint(1, 7)
        events += stream.push(answer[at : at + size])
        at += size
    return events + stream.flush()


def _joined(events) -> dict[int, list]:
    """index -> [id, name, arguments]: the deltas joined as a client joins them."""
    calls: dict[int, list] = {}
    for kind, delta in events:
        if kind == "delta":
            if delta.id is not None:
                assert delta.index not in calls and delta.index == len(calls)  # indices in order, from 0
                calls[delta.index] = [delta.id, delta.name, ""]
            calls[delta.index][2] += delta.arguments
    return calls


@pytest.mark.parametrize("answer", [row[0] for row in READS])
def test_deltas_joined_by_index_are_the_calls_read_whole(answer):
    """Oracle: the answer read whole. Fed in random pieces, every valid call reaches the client
    as deltas whose joined arguments hold the call's arguments, under the call's id."""
    whole = read_calls(answer, HERMES, OFFERED)
    for seed in range(20):
        events = _feed(answer, random.Random(seed))
        calls = [value for kind, value in events if kind == "call"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == \
            [(c.name, json.loads(c.arguments)) for c in whole.calls]
        joined = {call_id: (name, arguments) for call_id, name, arguments in _joined(events).values()}
        for call in calls:
            assert joined[call.id][0] == call.name and json.loads(joined[call.id][1]) == json.loads(call.arguments)
        if not [kind for kind, _ in events if kind == "problem"]:
            assert len(joined) == len(calls)  # no delta of anything but a call


def test_arguments_reach_the_client_while_they_are_written():
    """A long call fed a character at a time: the name goes out once written, then the arguments
    in pieces before the call closes, none holding text of the closing marker."""
    content = "x" * 200
    answer = '<tool_call>\n{"name": "search", "arguments": {"q": "' + content + '", "n": [1, {"a": "}"}]}}\n</tool_call>'
    stream, sent_before_close, calls = CallStream(HERMES, OFFERED), [], []
    for at, char in enumerate(answer):
        for kind, value in stream.push(char):
            if kind == "delta":
                sent_before_close.append((at, value))
            elif kind == "call":
                calls.append((at, value))
    assert stream.flush() == []
    first_at, first = sent_before_close[0]
    assert first.name == "search" and first.arguments == "" and first_at == answer.index("{", answer.index("arguments"))
    pieces = [delta.arguments for _, delta in sent_before_close[1:]]
    assert len(pieces) > 100 and "".join(pieces) == answer[answer.index('{"q"'):answer.rindex("}")]
    ((at, call),) = calls  # the call, read whole when its closing marker arrived
    assert at == len(answer) - 1 and all(when < at for when, _ in sent_before_close)
    assert call.id == first.id and json.loads(call.arguments)["n"] == [1, {"a": "}"}]


@pytest.mark.parametrize("fence", ["", "```json\n", "```\n"])
def test_a_bare_call_streams_once_it_opens_as_one(fence):
    """An answer that is, whole, one call's JSON (bare, or alone in a fence): its name and
    arguments go out while it is written; read whole at its end, it is the same call."""
    answer = fence + '{"name": "get_weather", "arguments": {"city": "Paris, France"}}' + ("\n```" if fence else "")
    stream, events = CallStream(HERMES, OFFERED), []
    for char in answer:
        events += stream.push(char)
    sent = [value for kind, value in events if kind == "delta"]
    assert sent[0].name == "get_weather" and len(sent) > 10 and not [k for k, _ in events if k == "call"]
    (call,) = [value for kind, value in stream.flush() if kind == "call"]
    assert call.id == sent[0].id and "".join(d.arguments for d in sent) == '{"city": "Paris, France"}'


def test_a_bare_answer_that_streamed_as_a_call_and_is_not_one_is_a_problem():
    answer = '{"name": "search", "arguments": {"q": 1}} and then some words'
    stream = CallStream(HERMES, OFFERED)
    events = stream.push(answer) + stream.flush()
    assert [kind for kind, _ in events] == ["delta", "delta", "problem", "content"] and events[-1][1] == answer


def test_a_call_that_breaks_after_its_first_delta_is_a_problem_and_content():
    """It cannot be taken back: its deltas were sent; the reason is a problem, its text content,
    and it is no call (the next call takes the next index)."""
    broken = '<tool_call>\n{"name": "search", "arguments": {"q": 1,, }}\n</tool_call>'
    good = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    stream = CallStream(HERMES, OFFERED)
    events = stream.push(broken + "\n" + good) + stream.flush()
    assert [kind for kind, _ in events].count("problem") == 1
    assert broken in "".join(value for kind, value in events if kind == "content")
    (call,) = [value for kind, value in events if kind == "call"]
    joined = _joined(events)
    assert joined[0][1] == "search" and joined[1][:2] == [call.id, "get_weather"] and stream.calls == 1


def test_a_call_read_whole_is_one_delta():
    answer = '<tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>'
    events = CallStream(HERMES, OFFERED).push(answer)
    deltas = [value for kind, value in events if kind == "delta"]
    assert deltas == [CallDelta(0, deltas[0].id, "search", '{"q": 1}')]
    assert deltas[0].as_openai() == {"index": 0, "id": deltas[0].id, "type": "function",
                                     "function": {"name": "search", "arguments": '{"q": 1}'}}
    assert CallDelta(2, None, None, "1}").as_openai() == {"index": 2, "function": {"arguments": "1}"}}
