"""Server protocol in-process on the fake engine: malformed input, 429, time-out, stop
strings, cancellation. (tests/test_server.py runs a real server process.)"""
from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.config import GenerationConfig  # noqa: E402
from ssr.engines.fake import FakeEngine  # noqa: E402
from ssr.server.app import create_app  # noqa: E402
from test_server_hardening import wait_until  # noqa: E402
from ssr.server.scheduler import _StopFilter  # noqa: E402

DEFAULTS = GenerationConfig(thinking_budget=24, draft_at=8, draft_tokens=16, max_answer_tokens=32)
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Write a stack."}]}


class SlowFake(FakeEngine):
    def step(self, batch):
        time.sleep(0.02)
        return super().step(batch)


def client(engine=None, **options) -> TestClient:
    model = SSR("fake", engine=engine or FakeEngine(max_sequences=4))
    return TestClient(create_app(model, "fake", defaults=DEFAULTS, **options))


def test_chat_and_completion_shapes():
    with client() as http:
        reply = http.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        message = body["choices"][0]["message"]
        assert message["content"].startswith("```python") and message["reasoning_content"]
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == body["ssr"]["cot_tokens"]
        reply = http.post("/v1/completions", json={"model": "fake", "prompt": "Write a stack."})
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"], reply.text


def test_stream_events_and_usage():
    with client() as http:
        with http.stream("POST", "/v1/chat/completions",
                         json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}) as reply:
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert any("reasoning_content" in d for d in deltas) and any(d.get("content") for d in deltas)
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all("reasoning_content" not in d for d in deltas[first_answer:])  # reasoning comes first
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length") and "ssr" in chunks[-2]


def test_same_answer_as_library_greedy():
    with client() as http:
        content = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
    model = SSR("fake", engine=FakeEngine())
    result = model.generate([{"role": "user", "content": "Write a stack."}], DEFAULTS)
    assert content == result.answer


@pytest.mark.parametrize("text, stops, expected", [
    (["ab", "cSTO", "Pde"], ("STOP",), "abc"),
    (["abc"], ("x",), "abc"),
    (["a", "b"], (), "ab"),
    (["hello wor", "ld"], ("world", "lo w"), "hel"),
])
def test_stop_filter(text, stops, expected):
    cut = _StopFilter(stops)
    out, hit = "", False
    for piece in text:
        emitted, hit = cut.push(piece)
        out += emitted
        if hit:
            break
    if not hit:
        out += cut.flush()
    assert out == expected


def test_stop_string_ends_the_answer():
    with client() as http:
        full = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
        stop = full[12:14]
        cut = http.post("/v1/chat/completions", json={**CHAT, "stop": stop}).json()["choices"][0]
        assert cut["message"]["content"] == full[: full.index(stop)].strip() and cut["finish_reason"] == "stop"


def test_a_stop_string_never_met_holds_nothing_back():
    """The stop filter holds back a tail that could start a stop string; at the end it is sent."""
    with client() as http:
        full = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
        held = http.post("/v1/chat/completions", json={**CHAT, "stop": ["\u2603\u2603\u2603\u2603"]}).json()["choices"][0]
    assert held["message"]["content"] == full["message"]["content"]
    assert held["finish_reason"] == full["finish_reason"]


def test_queue_full_gives_429_and_timeout_gives_504():
    with client(SlowFake(), max_queue=1, timeout_s=0.5) as http:
        statuses = []

        def call():
            statuses.append(http.post("/v1/chat/completions", json=CHAT).status_code)

        threads = [threading.Thread(target=call) for _ in range(4)]
        threads[0].start()
        wait_until(lambda: http.get("/health").json()["running"] == 1)  # it runs (and will run out of time) ...
        threads[1].start()
        wait_until(lambda: http.get("/health").json()["waiting"] == 1)  # ... this one waits: the queue is full
        for thread in threads[2:]:
            thread.start()
        for thread in threads:
            thread.join()
        assert 429 in statuses and 504 in statuses, statuses  # one runs out of time, one waits, rest refused
        assert http.get("/health").json()["status"] == "ok"
        metrics = http.get("/metrics").text
        assert 'ssr:requests_total{outcome="rejected"}' in metrics and "ssr:live_sequences 0" in metrics


MALFORMED = [
    ("post", "/v1/chat/completions", b"{bad", 422),
    ("post", "/v1/chat/completions", b"[]", 422),
    ("post", "/v1/chat/completions", b"", 422),
    ("post", "/v1/chat/completions", {"messages": CHAT["messages"]}, 422),  # no model
    ("post", "/v1/chat/completions", {"model": "fake"}, 422),  # no messages
    ("post", "/v1/chat/completions", {"model": "gpt-9", "messages": CHAT["messages"]}, 404),
    ("post", "/v1/chat/completions", {**CHAT, "messages": []}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "messages": "hi"}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user"}]}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "  "}]}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "temperature": -1}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "temperature": "hot"}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "top_p": 0}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "max_tokens": -3}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "max_tokens": 2.5}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "max_completion_tokens": "many"}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "seed": -1}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "seed": "x"}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "n": 2}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "stream": "yes"}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "stream_options": []}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": 1}}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "stop": 5}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "stop": [""]}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": "fast"}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"mode": "turbo"}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"mode": 3}}, 422),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"warp": 1}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"draft_at": 30, "thinking_budget": 20}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"draft_tokens": 0}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"thinking_budget": -1}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"verify": "maybe"}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "ssr": {"template": "poem"}}, 400),
    ("post", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x " * 70000}]}, 400),
    ("post", "/v1/completions", {"model": "fake"}, 422),
    ("post", "/v1/completions", {"model": "fake", "prompt": ""}, 400),
    ("post", "/v1/completions", {"model": "fake", "prompt": ["a", "b"]}, 422),
    ("post", "/v1/completions", {"model": "nope", "prompt": "hi"}, 404),
    ("post", "/v1/completions", {"model": "fake", "prompt": "hi", "top_k": -2}, 400),
    ("get", "/v1/chat/completions", None, 405),
    ("get", "/v1/completions", None, 405),
    ("post", "/v1/models", None, 405),
    ("post", "/health", None, 405),
    ("delete", "/metrics", None, 405),
    ("get", "/v1/chat", None, 404),
    ("get", "/", None, 404),
    ("post", "/v2/chat/completions", CHAT, 404),
    ("get", "/v1/models/extra", None, 404),
]


def test_malformed_requests_get_openai_errors():
    assert len(MALFORMED) >= 50
    with client() as http:
        for method, path, body, status in MALFORMED:
            if isinstance(body, bytes):
                reply = http.request(method, path, content=body, headers={"content-type": "application/json"})
            else:
                reply = http.request(method, path, json=body)
            assert reply.status_code == status, (method, path, body if not isinstance(body, dict) else
                                                 {k: v for k, v in body.items() if k != "messages"}, reply.text)
            error = reply.json()["error"]
            assert error["message"] and error["type"] and "Traceback" not in reply.text
        assert http.get("/health").status_code == 200
