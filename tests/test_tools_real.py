"""The official openai client's tool loop (call -> result -> final answer) against a real
`ssr serve` on the default model, whose chat template renders tools; the same turns in plain
decoding give the same calls and text (greedy)."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
from test_server import serve  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.model]
MODEL = "qwen2.5-coder-0.5b"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def client():
    for base in serve(["--model", MODEL, "--max-tokens", "96"], start_s=300):
        yield openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)


def _loop(client, mode: str) -> list:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    seen = []
    for _ in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                               extra_body={"ssr": {"mode": mode}})
        choice = reply.choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        seen.append((choice.finish_reason, choice.message.content, calls))
        if not calls:
            return seen
        messages.append(choice.message.model_dump(exclude_none=True))
        for call in choice.message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": json.dumps({"city": "Paris", "sky": "sunny", "celsius": 22})})
    return seen


def test_the_openai_tool_loop_on_the_default_model(client):
    turns = _loop(client, "ssr")
    assert turns[0] == ("tool_calls", None, [("get_weather", {"city": "Paris"})])
    finish, content, calls = turns[-1]
    assert len(turns) == 2 and finish == "stop" and content and not calls
    assert _loop(client, "ar") == turns  # plain decoding: the same calls, the same answer


def test_the_openai_clients_stream_joins_the_streamed_call(client):
    """Streamed, the call's arguments come in pieces (not one delta) and the official client's
    own accumulator joins them into the call the whole reply holds."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    pieces = []
    with client.chat.completions.stream(model=MODEL, messages=messages, tools=TOOLS) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                pieces.append(event.arguments_delta)
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and len(pieces) > 1
    (call,) = final.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
