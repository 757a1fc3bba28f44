"""`ssr serve` observability: /metrics scraped with prometheus_client's own parser after real
requests (whole, streamed, cancelled, refused), histograms checked against what the clients saw;
the request log (--log-requests) replays in every mode; the Grafana dashboard queries only
metrics the server exports."""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.bench.trace_replay import TRACE_MODES, CostSetting, replay_all  # noqa: E402
from ssr.bench.traces import load_traces, tokenize_trace  # noqa: E402
from ssr.config import GenerationConfig  # noqa: E402
from ssr.pricing.costs import gpu_preset  # noqa: E402
from ssr.engines.fake import FakeEngine  # noqa: E402
from ssr.server.app import create_app  # noqa: E402

DEFAULTS = GenerationConfig(thinking_budget=24, draft_at=8, draft_tokens=16, max_answer_tokens=32)
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Write a stack."}]}
DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "serve" / "grafana-ssr.json"


class SlowFake(FakeEngine):
    def step(self, batch):
        time.sleep(0.02)
        return super().step(batch)


def make_app(engine=None, **options):
    return create_app(SSR("fake", engine=engine or FakeEngine(max_sequences=4)), "fake", defaults=DEFAULTS, **options)


def scrape(http) -> dict:
    """{sample name + sorted labels: value} from /metrics, parsed by prometheus_client."""
    reply = http.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= set(got))


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the state was not reached in time"
        time.sleep(0.01)


def test_histograms_count_and_sum_what_the_clients_saw():
    app = make_app(SlowFake(max_sequences=4))
    with TestClient(app) as http:
        seen = []  # (client seconds, reply body) of each request that finished
        for stream in (False, True, False):
            start = time.monotonic()
            if stream:
                with http.stream("POST", "/v1/chat/completions",
                                 json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}) as reply:
                    events = [json.loads(line[6:]) for line in reply.iter_lines()
                              if line.startswith("data: ") and line != "data: [DONE]"]
                body = {"usage": events[-1]["usage"], "choices": [{"finish_reason": next(
                    e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"])}],
                        "ssr": None}
            else:
                body = http.post("/v1/chat/completions", json=CHAT).json()
            seen.append((time.monotonic() - start, body))
        assert http.post("/v1/chat/completions", json={"model": "fake"}).status_code == 422  # refused: not counted
        samples = scrape(http)
    finished = len(seen)
    labels = {"model_name": "fake", "mode": DEFAULTS.mode}
    for name in ("ssr:e2e_request_latency_seconds", "ssr:time_to_first_token_seconds",
                 "ssr:request_queue_time_seconds", "ssr:request_time_per_output_token_seconds"):
        assert value(samples, name + "_count", **labels) == finished, name
    client_s = sum(seconds for seconds, _ in seen)
    e2e_s = value(samples, "ssr:e2e_request_latency_seconds_sum", **labels)
    assert 0 < value(samples, "ssr:time_to_first_token_seconds_sum", **labels) < e2e_s <= client_s
    assert value(samples, "ssr:e2e_request_latency_seconds_bucket", le="+Inf", **labels) == finished
    usage = [body["usage"] for _, body in seen]
    assert value(samples, "ssr:prompt_tokens_total", **labels) == sum(u["prompt_tokens"] for u in usage)
    assert value(samples, "ssr:generation_tokens_total", **labels) == sum(u["completion_tokens"] for u in usage)
    assert value(samples, "ssr:request_generation_tokens_sum", **labels) == sum(u["completion_tokens"] for u in usage)
    reasons = [body["choices"][0]["finish_reason"] for _, body in seen]
    for reason in set(reasons):
        assert value(samples, "ssr:request_success_total", finished_reason=reason, **labels) == reasons.count(reason)
    whole = [body["ssr"] for _, body in seen if body["ssr"]]
    assert value(samples, "ssr:cot_tokens_per_pass_count", **labels) >= sum(m["cot_passes"] for m in whole)
    assert value(samples, "ssr:policy_decisions_total", **labels) == finished
    assert value(samples, 'ssr:requests_total', outcome="ok") == finished  # the older counters stay


def streamed_text(line: str) -> bool:
    """An SSE line carrying reasoning or answer text (not empty)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[len("data: "):]).get("choices") or [{}]
    delta = choices[0].get("delta", {})
    return bool(delta.get("reasoning_content") or delta.get("content"))


def test_a_cancelled_request_counts_its_first_token_but_no_latency():
    app = make_app(SlowFake(max_sequences=4))
    scheduler = app.state.scheduler
    with TestClient(app) as http:
        lines, first_text = [], threading.Event()

        def stream():
            with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
                for line in reply.iter_lines():
                    lines.append(line)
                    if streamed_text(line):  # not the first chunk's role and empty content
                        first_text.set()

        worker = threading.Thread(target=stream)
        worker.start()
        assert first_text.wait(120)  # text has streamed: the request is mid-way
        scheduler.drain(grace_s=0.0)
        worker.join()
        samples = scrape(http)
    assert value(samples, "ssr:requests_total", outcome="cancelled") == 1
    assert value(samples, "ssr:e2e_request_latency_seconds_count") == 0
    assert value(samples, "ssr:request_success_total") == 0
    assert value(samples, "ssr:time_to_first_token_seconds_count") == 1 and "shutting_down" in "".join(lines)


def test_request_log_replays_in_every_mode(tmp_path):
    path = tmp_path / "requests.jsonl"
    with TestClient(make_app(log_requests=str(path))) as http:
        replies = [http.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": f"Task {i}."}]})
                   .json() for i in range(3)]
        health = http.get("/health").json()
    assert health["request_log"] == {"path": str(path), "written": 3, "failed": 0, "error": None}
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["answer"] for line in lines] == [r["choices"][0]["message"]["content"] for r in replies]
    assert [line["reasoning"] for line in lines] == [r["choices"][0]["message"]["reasoning_content"] for r in replies]
    assert lines[0]["messages"] == [{"role": "user", "content": "Task 0."}] and lines[0]["seconds"]["e2e"] > 0

    class Words:
        vocab_size, name = 1 << 20, "words"
        ids: dict = {}

        def tokenize(self, text, special=False):
            return self.token_starts(text)[0]

        def token_starts(self, text):
            words = list(re.finditer(r"\w+|[^\w\s]|\s+", text))
            return [self.ids.setdefault(w.group(), len(self.ids)) for w in words], [w.start() for w in words]

    traces = load_traces([path])
    assert [t.cot for t in traces] == [line["reasoning"] for line in lines]
    cut = tmp_path / "with-a-cancelled-one.jsonl"
    cut.write_text(path.read_text() + json.dumps({**lines[0], "finish": "cancelled"}) + "\n")
    assert len(load_traces([cut])) == 3  # a request that did not finish is not a trace
    rows = replay_all([tokenize_trace(t, Words()) for t in traces], TRACE_MODES, [CostSetting("gpu", gpu_preset())])
    assert len(rows) == 3 * len(TRACE_MODES) * 2 and all(row["identical"] for row in rows)


@pytest.mark.parametrize("target", ["/dev/full", "missing-folder/requests.jsonl"])
def test_an_unwritable_request_log_never_fails_a_request(tmp_path, target):
    path = target if target.startswith("/dev") else str(tmp_path / target)
    if target.startswith("/dev") and not Path(target).exists():
        pytest.skip("no /dev/full here")
    logged = []
    with TestClient(make_app(log_requests=path, log=logged.append)) as http:
        assert all(http.post("/v1/chat/completions", json=CHAT).status_code == 200 for _ in range(2))
        health = http.get("/health")
    report = health.json()["request_log"]
    assert health.status_code == 200 and report["failed"] == 2 and report["written"] == 0 and report["error"]
    assert len(logged) == 1 and path in logged[0]  # said once in the log


def exported_names(http) -> set[str]:
    """Every series name /metrics declares: samples, and the series of declared families that
    have none yet (a labelled counter before its first increment)."""
    names = set()
    for family in text_string_to_metric_families(http.get("/metrics").text):
        names.update(sample.name for sample in family.samples)
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def test_every_dashboard_query_names_an_exported_metric():
    with TestClient(make_app()) as http:
        http.post("/v1/chat/completions", json=CHAT)
        exported = exported_names(http)
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    queries += [variable["definition"] for variable in dashboard["templating"]["list"] if "definition" in variable]
    assert len(queries) >= 8
    for query in queries:
        names = re.findall(r"ssr:[a-z0-9_]+", query)
        assert names, query
        for name in names:
            assert name in exported, f"{name} (in {query!r}) is not exported"
    assert "ssr:not_a_metric_total" not in exported


def test_the_request_log_records_the_draft_children_and_replays_with_them(tmp_path):
    """A request whose children drafted logs each one (the CoT tokens it saw, as many characters
    of the logged reasoning, its answer's text): `ssr traces` reads them back as drafts and forks
    them where they forked."""
    path = tmp_path / "requests.jsonl"
    body = {**CHAT, "ssr": {"policy": "fixed", "draft_at": 8, "draft_interval": 6}}
    with TestClient(make_app(log_requests=str(path))) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    (line,) = [json.loads(text) for text in path.read_text().splitlines()]
    drafts = line["drafts"]
    assert [d["budget_tokens"] for d in drafts] == [8, 14, 20][:len(drafts)] and len(drafts) >= 2
    assert all(0 < d["cot_chars"] < len(line["reasoning"]) and d["answer"] for d in drafts)
    (trace,) = load_traces([path])
    assert [(d.budget_tokens, d.cot_chars) for d in trace.drafts] == [(d["budget_tokens"], d["cot_chars"]) for d in drafts]
