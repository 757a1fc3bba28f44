"""A real `ssr serve` process with the fast test model, driven by the official openai client."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytestmark = pytest.mark.model  # loads real model weights or starts ssr processes (deselect: -m 'not model')

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

MODEL = "smollm2-135m"
MESSAGES = [{"role": "user", "content": "Write a Python function is_even(n)."}]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def _health_status(base: str, timeout_s: float = 30) -> int:
    """/health's status code once it is no longer 200 (the server has seen a signal), or 200 if it
    still is at the deadline: a test waits on the state, not for a fixed time."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            _get(base + "/health")
        except urllib.error.HTTPError as error:
            return error.code
        time.sleep(0.05)
    return 200


def start(arguments: list[str], start_s: float = 180) -> tuple[subprocess.Popen, str]:
    """A real `ssr serve` process on a free port, answering /health: (process, base URL)."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ssr.cli", "serve", "--port", str(port), *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + start_s
    while time.time() < deadline:
        try:
            if '"ok"' in _get(base + "/health"):
                break
        except OSError:
            time.sleep(0.5)
        if proc.poll() is not None:
            pytest.fail(f"server exited: {proc.stdout.read()}")
    return proc, base


def serve(arguments: list[str], start_s: float = 180):
    """A real `ssr serve` process: yields its base URL, then stops it."""
    proc, base = start(arguments, start_s)
    yield base
    proc.terminate()
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server():
    yield from serve(["--model", MODEL, "--thinking-budget", "24", "--draft-at", "8", "--draft-tokens", "16",
                      "--max-answer-tokens", "32", "--max-queue", "8"])


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


def _metric(base: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", _get(base + "/metrics"), flags=re.MULTILINE)
    return float(match.group(1))


def test_models_and_chat(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    message = reply.choices[0].message
    assert message.content.startswith("```python")
    assert message.model_extra["reasoning_content"].startswith("Plan")
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > reply.usage.completion_tokens_details.reasoning_tokens
    assert reply.model_extra["ssr"]["mode"] == "ssr"


def test_stream_separates_reasoning_and_answer(client):
    reasoning, content, usage = [], [], None
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices:
            delta = chunk.choices[0].delta
            if (delta.model_extra or {}).get("reasoning_content"):
                assert not content, "reasoning after the answer started"
                reasoning.append(delta.model_extra["reasoning_content"])
            if delta.content:
                content.append(delta.content)
    assert "".join(reasoning).startswith("Plan") and "".join(content).startswith("```python")
    assert usage is not None and usage.total_tokens > 0


def test_stream_equals_non_stream_greedy(client):
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"ssr": {"mode": "ar"}})
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True) if c.choices)
    assert streamed.strip() == whole.choices[0].message.content


def test_completions(client):
    reply = client.completions.create(model=MODEL, prompt="Write is_odd(n) in Python.", max_tokens=48)
    assert reply.choices[0].text and reply.choices[0].finish_reason in ("stop", "length")
    usage = reply.usage  # max_tokens counts the reasoning too (the server's budget is 24)
    assert usage.completion_tokens <= 48 and usage.completion_tokens_details.reasoning_tokens <= 24


def test_four_concurrent_clients(client):
    answers: dict[int, str] = {}

    def ask(index: int) -> None:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Write a function that adds {index} to x."}],
            max_tokens=48)
        answers[index] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert sorted(answers) == [0, 1, 2, 3] and all(answers.values())


def test_cancelled_stream_frees_its_sequences(client, server):
    before = _metric(server, 'ssr:requests_total{outcome="cancelled"}')
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True,
                                            extra_body={"ssr": {"thinking_budget": 200, "draft_at": 4}},
                                            max_tokens=200)
    for count, _ in enumerate(stream):
        if count == 3:
            break
    stream.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        if _metric(server, 'ssr:requests_total{outcome="cancelled"}') > before:
            break
        time.sleep(0.2)
    assert _metric(server, 'ssr:requests_total{outcome="cancelled"}') == before + 1
    assert _metric(server, "ssr:live_sequences") == 0 and _metric(server, "ssr:num_requests_running") == 0


def test_errors_through_the_client(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=-1)
    assert "temperature must be a finite number >= 0" in str(error.value)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 9000}])
    assert "more than the context holds" in str(error.value)


def test_api_key_and_graceful_shutdown_on_sigterm():
    """A real process: 401 without the key (not on /health); on SIGTERM the running stream
    finishes, new requests get 503, every sequence is freed and the process exits 0."""
    import signal
    import urllib.error

    proc, base = start(["--model", MODEL, "--api-key", "k3y", "--shutdown-grace", "120", "--thinking-budget", "48",
                        "--draft-at", "8", "--max-answer-tokens", "48"])
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(base + "/v1/models")
        assert refused.value.code == 401
        keyed = openai.OpenAI(base_url=base + "/v1", api_key="k3y", max_retries=0, timeout=300)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
        chunks, finish = [], []
        stream = keyed.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 2:
                proc.send_signal(signal.SIGTERM)
                assert _health_status(base) == 503  # draining: /health says so at once

                with pytest.raises(openai.APIStatusError) as late:
                    keyed.models.list()
                assert late.value.status_code == 503
            if chunk.choices and chunk.choices[0].finish_reason:
                finish.append(chunk.choices[0].finish_reason)
        assert finish and finish[0] in ("stop", "length")
        assert proc.wait(timeout=120) == 0
        log = proc.stdout.read()
        assert "SIGTERM: draining" in log and "drained: 1 finished, 0 cancelled, live sequences 0" in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
