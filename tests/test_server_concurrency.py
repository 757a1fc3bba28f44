"""`ssr serve` with several requests at once where the engine batches them (vLLM: its slots),
in-process on the fake requests engine (vLLM's request interface, no vLLM): every client's walk
runs concurrently, the answers are those of a request alone, and one request at a time stays
the rule on the sequence engines (llama.cpp, transformers)."""
from __future__ import annotations

import threading

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.config import GenerationConfig  # noqa: E402
from ssr.engines.fake import FakeEngine, FakeRequestsEngine  # noqa: E402
from ssr.server.app import create_app  # noqa: E402

from test_server_hardening import wait_until  # noqa: E402

DEFAULTS = GenerationConfig(mode="ssr", thinking_budget=24, draft_at=8, draft_tokens=16, max_answer_tokens=32, policy="fixed")
PROMPTS = ("Write a stack.", "Write a queue.", "Sort a list.", "Reverse a string.")


class GatedRequests(FakeRequestsEngine):
    """Each walk's first request waits at a gate until the test opens it: the walks that run at
    once are the ones inside."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.inside = self.peak = 0
        self._count = threading.Lock()

    def open(self, request_id, prompt_ids, params):
        with self._count:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        try:
            assert self.gate.wait(60)
            return super().open(request_id, prompt_ids, params)
        finally:
            with self._count:
                self.inside -= 1


def chat(http, prompt: str) -> dict:
    reply = http.post("/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": prompt}]})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]


def test_walks_on_a_batching_engine_run_at_once_and_answer_as_alone():
    alone = {}
    with TestClient(create_app(SSR("fake", engine=FakeRequestsEngine()), "fake", defaults=DEFAULTS)) as http:
        for prompt in PROMPTS:
            alone[prompt] = chat(http, prompt)
    engine = GatedRequests()
    app = create_app(SSR("fake", engine=engine), "fake", defaults=DEFAULTS)
    assert app.state.scheduler.slots == engine.slots == 4
    replies: dict[str, dict] = {}
    with TestClient(app) as http:
        clients = [threading.Thread(target=lambda p=prompt: replies.update({p: chat(http, p)})) for prompt in PROMPTS]
        for client in clients:
            client.start()
        wait_until(lambda: engine.inside == len(PROMPTS))  # every walk is in the engine at once
        assert app.state.scheduler.running == len(PROMPTS)
        assert http.get("/health").json()["running"] == len(PROMPTS)
        engine.gate.set()
        for client in clients:
            client.join()
        assert replies == alone  # the same reasoning and answer as each request alone
        assert app.state.scheduler.running == 0 and engine.peak == len(PROMPTS)


def test_more_clients_than_slots_wait_in_the_queue_and_all_finish():
    engine = GatedRequests()
    app = create_app(SSR("fake", engine=engine), "fake", defaults=DEFAULTS, slots=2)
    replies = []
    with TestClient(app) as http:
        clients = [threading.Thread(target=lambda p=prompt: replies.append(chat(http, p))) for prompt in PROMPTS]
        for client in clients:
            client.start()
        wait_until(lambda: engine.inside == 2 and app.state.scheduler.waiting == 2)
        engine.gate.set()
        for client in clients:
            client.join()
    assert len(replies) == len(PROMPTS) and engine.peak == 2


def test_sequence_engines_keep_one_request_at_a_time():
    app = create_app(SSR("fake", engine=FakeEngine(max_sequences=4)), "fake", defaults=DEFAULTS)
    assert app.state.scheduler.slots == 1
    with TestClient(app) as http:
        assert http.get("/health").json()["slots"] == 1
