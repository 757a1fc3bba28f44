"""`ssr serve` against hostile and unusual clients, in-process on the fake engine: no 500
ever (a property-based fuzz over request bodies), fields real clients send, body limits,
the API key, and draining on shutdown."""
from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.config import GenerationConfig  # noqa: E402
from ssr.engines.fake import FakeEngine  # noqa: E402
from ssr.server.app import create_app  # noqa: E402

DEFAULTS = GenerationConfig(thinking_budget=24, draft_at=8, draft_tokens=16, max_answer_tokens=32)
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Write a stack."}]}
RAW = {"content-type": "application/json"}


class SlowFake(FakeEngine):
    def step(self, batch):
        time.sleep(0.02)
        return super().step(batch)


def wait_until(condition, timeout_s: float = 120.0) -> None:
    """Poll until condition() holds (a test waits on states, never on fixed sleeps)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the state was not reached in time"
        time.sleep(0.01)


def make_app(engine=None, **options):
    model = SSR("fake", engine=engine or FakeEngine(max_sequences=4))
    return create_app(model, "fake", defaults=DEFAULTS, **options)


def body_with(**fields) -> bytes:
    return json.dumps({**CHAT, **fields}).encode()


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
TOOL_CASES = [  # tools, tool_choice, parallel_tool_calls and earlier calls: (raw body, expected status)
    (body_with(tools=[TOOL], tool_choice="required"), 200),
    (body_with(tools=[TOOL], tool_choice="none"), 200),
    (body_with(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}), 200),
    (body_with(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "other"}}), 400),
    (body_with(tools=[TOOL], tool_choice="always"), 400),
    (body_with(tool_choice="required"), 400),  # no tools to call
    (body_with(tools=[TOOL], parallel_tool_calls=False), 200),
    (body_with(tools=[TOOL], parallel_tool_calls="no"), 422),
    (body_with(tools=TOOL), 422),  # not a list
    (body_with(tools=[TOOL, TOOL]), 400),  # a name offered twice
    (body_with(tools=[{"type": "retrieval"}]), 400),
    (body_with(tools=[{"type": "function", "function": {"name": "has space"}}]), 400),
    (body_with(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]), 400),
    (body_with(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]), 400),
    (body_with(tools=[{"type": "function", "function": {"name": "f", "description": 3}}]), 422),
    (body_with(tools=[{"type": "function"}]), 422),
    (body_with(tools=[TOOL], messages=[*CHAT["messages"], {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                       {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]), 200),
    (body_with(tools=[TOOL], messages=[*CHAT["messages"], {"role": "assistant", "tool_calls": [CALL]}]), 200),
    (body_with(messages=[*CHAT["messages"], {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{not json"}}]}]), 400),
    (body_with(messages=[*CHAT["messages"], {"role": "assistant", "tool_calls": {"a": 1}}]), 422),
    (body_with(messages=[*CHAT["messages"], {"role": "assistant", "tool_calls": [{"function": "f"}]}]), 422),
    (body_with(messages=[*CHAT["messages"], {"role": "tool", "content": "x", "tool_call_id": 5}]), 422),
    (body_with(messages=[*CHAT["messages"], {"role": "function", "content": "x", "name": "f"}]), 400),
    (body_with(functions=[{"name": "f"}]), 400),  # the deprecated form
]
HOSTILE = [  # (raw body, expected status)
    (b"[" * 5000 + b"]" * 5000, 422),  # nesting deeper than the JSON parser recurses
    (b'{"model": "fake", "messages": ' + b"[" * 100000 + b"]" * 100000 + b"}", 422),
    (b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', 422),
    (b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "top_p": NaN}', 422),
    (b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', 400),
    (b'{"model": "fake", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 422),  # invalid UTF-8
    (b'{"model": "fake", "messages": [{"role": "user", "content": "\\ud800"}]}', 400),  # lone surrogate escape: not text (was a 500 on real models)
    (body_with(max_tokens=10**12), 400),
    (body_with(max_tokens=2**70), 400),
    (body_with(seed=2**70), 200),
    (body_with(top_k=10**30), 200),
    (body_with(temperature=1e308), 200),
    (body_with(temperature=1e-320), 200),
    (body_with(temperature=1e-320, top_p=1e-300), 200),
    (body_with(ssr={"thinking_budget": 32}), 200),  # the default fork point (8) is kept
    (body_with(ssr={"thinking_budget": 4}), 200),  # below the default fork point: it follows the budget
    (body_with(ssr={"thinking_budget": 0}), 200),  # no chain of thought, no draft
    (body_with(ssr={"thinking_budget": 4, "draft_at": 8}), 400),  # both set by the client: contradict
    (body_with(messages=[{"role": "developer", "content": "Be brief."}, CHAT["messages"][0]]), 200),
    (body_with(messages=[*CHAT["messages"], {"role": "tool", "content": "42", "tool_call_id": "x"}]), 200),
    (body_with(tools=[{"type": "function", "function": {"name": "f"}}]), 200),
    (body_with(tools=[], tool_choice="auto"), 200),
    (body_with(tool_choice={"type": "function"}), 422),
    *TOOL_CASES,
    (body_with(logit_bias={"50256": -100}), 400),
    (body_with(logit_bias={}), 200),
    (body_with(logprobs=True), 400),
    (body_with(frequency_penalty=0.5), 400),
    (body_with(thinking_token_budget=64), 400),  # vLLM's field, another count than ssr.thinking_budget
    (body_with(thinking_token_budget=-1), 200),
    (body_with(response_format={"type": "json_object"}), 400),
    (body_with(response_format={"type": "text"}), 200),
    (body_with(reasoning_effort="low"), 200),
    (body_with(reasoning_effort="extreme"), 400),
    (body_with(reasoning_effort=3), 422),
    (body_with(max_completion_tokens=8, stream_options={"include_usage": True}), 200),
    (body_with(user="u-1", metadata={"team": "a"}, store=False, service_tier="auto"), 200),
    (body_with(metadata={"team": 1}), 422),
    (body_with(user=5), 422),
]


@pytest.mark.parametrize("raw, status", HOSTILE)
def test_hostile_and_unusual_bodies_get_their_status_never_500(raw, status):
    with TestClient(make_app()) as http:
        reply = http.post("/v1/chat/completions", content=raw, headers=RAW)
    assert reply.status_code == status, reply.text[:300]
    body = reply.json()
    assert ("choices" in body) if status == 200 else (body["error"]["message"] and body["error"]["type"])


def test_reasoning_effort_sets_the_thinking_budget():
    with TestClient(make_app()) as http:
        low = http.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "low"}).json()["ssr"]
        none = http.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "none"}).json()["ssr"]
    assert low["cot_tokens"] <= DEFAULTS.thinking_budget // 4 and none["cot_tokens"] == 0


def test_body_limits_413_and_408_and_truncated_upload():
    with TestClient(make_app(max_body_bytes=1000, body_timeout_s=0.3)) as http:
        big = body_with(messages=[{"role": "user", "content": "x" * 2000}])
        assert http.post("/v1/chat/completions", content=big, headers=RAW).status_code == 413

        def chunked():  # no content-length: the limit is enforced while reading
            for _ in range(20):
                yield b" " * 100

        assert http.post("/v1/chat/completions", content=chunked(), headers=RAW).status_code == 413


def test_lone_surrogate_escapes_get_400_not_500():
    with TestClient(make_app()) as http:
        for body in (b'{"model": "fake", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
                     b'{"model": "fake", "prompt": "\\udfff", "max_tokens": 4}',
                     b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "user": "\\ud83d"}'):
            path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
            reply = http.post(path, content=body, headers=RAW)
            assert reply.status_code == 400 and "surrogate" in reply.json()["error"]["message"]
        paired = b'{"model": "fake", "messages": [{"role": "user", "content": "hi \\ud83d\\ude00"}], "max_tokens": 4}'
        assert http.post("/v1/chat/completions", content=paired, headers=RAW).status_code == 200  # a real pair: text


def test_a_client_that_sends_a_whole_oversize_body_reads_the_413():
    """Over a real socket (uvicorn): urllib sends all 20 MB before it reads (no Expect:
    100-continue); the server drains the body, so the client reads the 413, not a reset."""
    import socket
    import urllib.error
    import urllib.request

    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, timeout_s=30)
        body = body_with(messages=[{"role": "user", "content": "x" * (20 << 20)}])
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers=RAW)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 413 and json.loads(refused.value.read())["error"]["code"] == "body_too_large"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.mark.parametrize("second, status", [("stall", 408), ("disconnect", 400)])
def test_slow_or_truncated_upload(second, status):
    """At the ASGI level (a test client sends whole bodies): half a body, then nothing for
    longer than the body time-out, or the client hangs up."""
    import asyncio

    app = make_app(body_timeout_s=0.3)
    sent = []

    async def run():
        messages = [{"type": "http.request", "body": b'{"model": "fake",', "more_body": True}]

        async def receive():
            if messages:
                return messages.pop(0)
            if second == "stall":
                await asyncio.sleep(5)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                 "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        await asyncio.wait_for(app(scope, receive, send), 3)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == status
    body = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert body["error"]["message"]


def test_api_key_guards_every_route_but_health():
    with TestClient(make_app(api_key="s3cret")) as http:
        assert http.get("/health").status_code == 200
        for method, path in (("get", "/v1/models"), ("get", "/metrics"), ("post", "/v1/chat/completions"),
                             ("post", "/v1/completions"), ("get", "/nowhere")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                reply = http.request(method, path, json=CHAT, headers=headers)
                assert reply.status_code == 401, (path, headers)
                assert reply.json()["error"]["type"] == "authentication_error"
        good = {"Authorization": "Bearer s3cret"}
        assert http.get("/v1/models", headers=good).status_code == 200
        assert http.post("/v1/chat/completions", json=CHAT, headers=good).status_code == 200


def test_drain_lets_running_requests_finish_and_refuses_new_ones():
    app = make_app(SlowFake(max_sequences=4))
    with TestClient(app) as http:
        replies = []
        worker = threading.Thread(target=lambda: replies.append(http.post("/v1/chat/completions", json=CHAT)))
        worker.start()
        wait_until(lambda: app.state.scheduler.running > 0)  # it is running now
        outcome = {}
        drain = threading.Thread(target=lambda: outcome.update(app.state.scheduler.drain(grace_s=30)))
        drain.start()
        wait_until(lambda: app.state.scheduler.draining)
        refused = http.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert http.get("/health").status_code == 503
        worker.join()
        drain.join()
        assert replies[0].status_code == 200 and replies[0].json()["choices"][0]["message"]["content"]
        assert outcome == {"finished": 1, "cancelled": 0}
        assert app.state.engine.live_sequences() == 0


def test_drain_past_its_grace_cancels_with_503_and_frees_sequences():
    app = make_app(SlowFake(max_sequences=4))
    with TestClient(app) as http:
        replies = []
        streams = []

        def stream():
            with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
                streams.append([line for line in reply.iter_lines() if line.startswith("data: ")])

        scheduler = app.state.scheduler
        workers = [threading.Thread(target=stream),  # running, mid-stream at the drain
                   threading.Thread(target=lambda: replies.append(http.post("/v1/chat/completions", json=CHAT)))]
        workers[0].start()
        wait_until(lambda: scheduler.running > 0)  # states, not sleeps: a first request may
        workers[1].start()  # spend seconds on a one-time cost probe
        wait_until(lambda: scheduler.waiting == 1)
        outcome = scheduler.drain(grace_s=0.0)
        for worker in workers:
            worker.join()
        assert outcome["cancelled"] == 2
        assert replies[0].status_code == 503 and replies[0].json()["error"]["code"] == "shutting_down"  # queued
        assert streams[0][-1] == "data: [DONE]" and "shutting_down" in streams[0][-2]
        assert app.state.engine.live_sequences() == 0


# -- fuzz -------------------------------------------------------------------------------------

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True,
                      allow_infinity=True), st.text(max_size=20))  # NaN, Infinity: json.dumps writes them
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3) |
                          st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool", "x"]),
                                 "content": st.one_of(st.text(max_size=40), json_value)},
                                optional={"tool_calls": st.one_of(st.just([CALL]), json_value),
                                          "tool_call_id": st.one_of(st.text(max_size=8), json_value)})
tools = st.one_of(st.just([TOOL]), st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "x"]), "function": st.fixed_dictionaries(
        {"name": st.one_of(st.sampled_from(["get_weather", "f"]), st.text(max_size=8))},
        optional={"parameters": json_value, "description": json_value})}), max_size=2), json_value)
FIELDS = {
    "model": st.one_of(st.just("fake"), json_value),
    "messages": st.one_of(st.lists(message, max_size=3), json_value),
    "prompt": st.one_of(st.text(max_size=40), json_value),
    "max_tokens": st.one_of(st.integers(-5, 64), json_value),
    "max_completion_tokens": st.one_of(st.integers(-5, 64), json_value),
    "temperature": st.one_of(st.floats(0, 3), json_value),
    "top_p": st.one_of(st.floats(0, 1.5), json_value),
    "top_k": st.one_of(st.integers(-3, 100), json_value),
    "seed": st.one_of(st.integers(-3, 2**40), json_value),
    "n": st.one_of(st.integers(0, 3), json_value),
    "stream": st.one_of(st.booleans(), json_value),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), json_value),
    "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=4), max_size=5), json_value),
    "reasoning_effort": st.one_of(st.sampled_from(["none", "minimal", "low", "medium", "high"]), json_value),
    "logit_bias": json_value, "tools": tools, "user": json_value, "metadata": json_value,
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", {"type": "function", "function":
                                              {"name": "get_weather"}}]), json_value),
    "parallel_tool_calls": st.one_of(st.booleans(), json_value),
    "ssr": st.one_of(st.dictionaries(st.sampled_from(["mode", "thinking_budget", "draft_at", "draft_tokens",
                                                      "verify", "policy", "template", "draft_interval"]),
                                     st.one_of(st.integers(-2, 40), st.sampled_from(["ssr", "ar", "suffix",
                                                                                      "fixed", "code"]))),
                     json_value),
}
request_body = st.fixed_dictionaries({}, optional=FIELDS)


def _check_reply(reply) -> None:
    assert reply.status_code != 500 and reply.status_code in (200, 400, 404, 413, 422, 429), reply.text[:300]
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for event in events[:-1]:
            json.loads(event)
        return
    body = reply.json()
    assert "choices" in body if reply.status_code == 200 else body["error"]["message"]


@pytest.fixture(scope="module")
def fuzz_client():
    with TestClient(make_app(max_queue=64)) as http:
        yield http


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(body=request_body, route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_fuzz_structured_bodies_never_500(fuzz_client, body, route):
    _check_reply(fuzz_client.post(route, content=json.dumps(body).encode(), headers=RAW))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)),
       cut=st.integers(0, 400))
def test_fuzz_raw_and_truncated_bodies_never_500(fuzz_client, raw, cut):
    valid = body_with(max_tokens=4)
    for data in (raw, valid[:cut], valid[:cut] + raw):
        _check_reply(fuzz_client.post("/v1/chat/completions", content=data, headers=RAW))
