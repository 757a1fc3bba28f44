"""What `ssr serve` tells operators: Prometheus metrics (prometheus_client, one registry per app)
and the request log (`--log-requests`), one JSON line per finished request, which `ssr traces`
replays in every mode.

Latency histograms take vLLM's names and buckets under the `ssr:` prefix (vllm/v1/metrics/
loggers.py): time to first token, time per output token (per request), end-to-end latency and
queue time, prompt and generation tokens per request, requests by finish reason; ssr adds what
only it knows: time to first *answer* token, CoT and answer tokens per verify pass, accepted
tokens by source, drafts forked and accepted, the drafting policy's decisions. They are labelled
by model_name and mode. The older unlabelled counters and gauges stay as they were.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # vLLM's time_to_first_token_seconds
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)  # vLLM's request_time_per_output_token_seconds
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)  # vLLM's e2e_request_latency_seconds, request_queue_time_seconds
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)  # 1-2-5
PASS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)  # tokens one verify pass committed


@dataclass
class Finished:
    """One request as the engine worker saw it end (seconds from its arrival)."""

    request_id: str
    model: str
    prompt: str | list[dict[str, str]]  # the completion text or the chat messages
    finish: str  # stop, length, tool_calls, cancelled, timeout, error
    queued_s: float  # waiting before the worker took it
    first_token_s: float | None  # the first reasoning or answer text (None: none came)
    first_answer_s: float | None  # the first answer text
    e2e_s: float
    metrics: dict  # decode.Metrics.as_dict()
    trace: list[dict] = field(default_factory=list)  # verify events (kind, source, proposed, accepted)
    reasoning: str = ""
    answer: str = ""
    tool_calls: tuple = ()  # tools.ToolCall read from the answer
    tool_call_problems: tuple[str, ...] = ()  # why call-looking text stayed content
    tools: object = None  # the request's tools.ToolUse, if it offered tools
    # its draft children, as `ssr traces` reads them: {"budget_tokens", "cot_chars", "answer"}
    drafts: tuple[dict, ...] = ()


def draft_records(drafts, cot_ids, reasoning: str, token_bytes, eos_ids) -> tuple[dict, ...]:
    """A request's draft children as a trace records them: the CoT tokens each saw, as many of the
    logged reasoning's characters (the reasoning is logged stripped), and its answer's text. A
    child that saw none of the reasoning, or all of it, is left out: no replay forks there."""
    def text(ids) -> str:
        return b"".join(token_bytes(token) for token in ids if token not in eos_ids).decode("utf-8", "replace")

    records = []
    for forked_at, draft_ids in drafts:
        chars = len(text(cot_ids[:forked_at]).lstrip())
        if 0 < chars < len(reasoning):
            records.append({"budget_tokens": forked_at, "cot_chars": chars, "answer": text(draft_ids).strip()})
    return tuple(records)


class ServerMetrics:
    """The app's metrics in a registry of its own; `observe` each finished request, `render` for
    /metrics. Legacy counters and gauges come from the scheduler's Stats at scrape time."""

    def __init__(self, stats, scheduler, engine) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = registry = CollectorRegistry()
        labels = ("model_name", "mode")

        def histogram(name: str, text: str, buckets) -> Histogram:
            return Histogram(name, text, labels, buckets=buckets, registry=registry)

        def counter(name: str, text: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, text, labels + extra, registry=registry)

        self.ttft = histogram("ssr:time_to_first_token_seconds", "Time to the first token (reasoning or answer).",
                              TTFT_BUCKETS)
        self.ttfa = histogram("ssr:time_to_first_answer_token_seconds", "Time to the first answer token.",
                              TTFT_BUCKETS)
        self.tpot = histogram("ssr:request_time_per_output_token_seconds",
                              "Per request: seconds per output token after the first.", TPOT_BUCKETS)
        self.e2e = histogram("ssr:e2e_request_latency_seconds", "End-to-end latency of finished requests.",
                             LATENCY_BUCKETS)
        self.queue = histogram("ssr:request_queue_time_seconds", "Seconds a request waited for the engine.",
                               LATENCY_BUCKETS)
        self.prompt_tokens = histogram("ssr:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.generation_tokens = histogram("ssr:request_generation_tokens",
                                           "Generated tokens (reasoning and answer) per request.", TOKEN_BUCKETS)
        self.cot_per_pass = histogram("ssr:cot_tokens_per_pass", "CoT tokens committed by one verify pass.",
                                      PASS_BUCKETS)
        self.answer_per_pass = histogram("ssr:answer_tokens_per_pass", "Answer tokens committed by one verify pass.",
                                         PASS_BUCKETS)
        self.prompt_total = counter("ssr:prompt_tokens", "Prompt tokens processed.")
        self.generation_total = counter("ssr:generation_tokens", "Tokens generated (reasoning and answer).")
        self.success = counter("ssr:request_success", "Finished requests by finish reason.", ("finished_reason",))
        self.accepted = counter("ssr:accepted_tokens", "Speculated tokens accepted, by part and proposer source.",
                                ("part", "source"))
        self.drafts = counter("ssr:drafts_forked", "Draft children forked.")
        self.draft_accepted = counter("ssr:draft_tokens_accepted", "Draft tokens accepted as the answer's prefix.")
        self.decisions = counter("ssr:policy_decisions", "The drafting policy's decisions.", ("decision",))
        registry.register(_Legacy(stats, scheduler, engine))
        self.engine = engine
        self._lock = threading.Lock()

    def observe(self, done: Finished) -> None:
        m = done.metrics
        key = (done.model, m["mode"])
        with self._lock:
            self.queue.labels(*key).observe(done.queued_s)
            if done.first_token_s is not None:
                self.ttft.labels(*key).observe(done.first_token_s)
            if done.first_answer_s is not None:
                self.ttfa.labels(*key).observe(done.first_answer_s)
            generated = m["cot_tokens"] + m["forced_tokens"] + m["answer_tokens"]  # usage.completion_tokens
            self.prompt_total.labels(*key).inc(m["prompt_tokens"])
            self.generation_total.labels(*key).inc(generated)
            if done.finish in ("stop", "length", "tool_calls"):
                self.success.labels(*key, done.finish).inc()
                self.e2e.labels(*key).observe(done.e2e_s)
                self.prompt_tokens.labels(*key).observe(m["prompt_tokens"])
                self.generation_tokens.labels(*key).observe(generated)
                if generated > 1 and done.first_token_s is not None:
                    self.tpot.labels(*key).observe((done.e2e_s - done.first_token_s) / (generated - 1))
            for event in done.trace:
                part = "cot" if event.get("kind") == "cot_span" else "answer"
                (self.cot_per_pass if part == "cot" else self.answer_per_pass).labels(*key).observe(
                    event["accepted"] + 1)
                source = "draft" if event.get("kind") == "draft" else str(event.get("source", "")).split("/")[0]
                if event["accepted"]:
                    self.accepted.labels(*key, part, source or "unknown").inc(event["accepted"])
            self.drafts.labels(*key).inc(len(m.get("stages") or []))
            self.draft_accepted.labels(*key).inc(m["accepted_prefix_tokens"])
            if m.get("policy"):
                self.decisions.labels(*key, "draft" if m["policy"].get("draft") else "no_draft").inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        own = generate_latest(self.registry)
        engine = self.engine
        if engine.capabilities.serves_metrics:  # the engine's own (vLLM's vllm:*), beside ssr's
            own += engine.metrics_text()
        return own, CONTENT_TYPE_LATEST


class _Legacy:
    """The counters and gauges /metrics had before the histograms, with the same names."""

    COUNTERS = (  # (name, help, Stats key)
        ("ssr:spec_decode_num_drafts", "Verify passes (draft prefix and suffix spans).", "verify_passes"),
        ("ssr:spec_decode_num_draft_tokens", "Tokens proposed for verification.", "proposed_tokens"),
        ("ssr:spec_decode_num_accepted_tokens", "Proposed tokens accepted.", "accepted_tokens"),
        ("ssr:draft_children", "Draft children forked from a partial chain of thought.", "drafts"),
        ("ssr:draft_child_tokens", "Answer tokens written by draft children.", "draft_tokens"),
        ("ssr:accepted_prefix_tokens", "Draft tokens accepted as the answer's prefix.", "accepted_prefix_tokens"),
        ("ssr:answer_proposed_tokens", "Answer tokens proposed in span passes (every source).", "answer_proposed_tokens"),
        ("ssr:answer_accepted_tokens", "Of those, accepted.", "answer_accepted_tokens"),
        ("ssr:reasoning_tokens", "Chain-of-thought tokens.", "reasoning_tokens"),
    )
    OUTCOMES = ("ok", "cancelled", "timed_out", "rejected", "invalid", "failed")

    def __init__(self, stats, scheduler, engine) -> None:
        self.stats, self.scheduler, self.engine = stats, scheduler, engine

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self.stats.lock:
            c = dict(self.stats.counters)
            stages = dict(self.stats.stage_seconds)
        c["proposed_tokens"] = c.get("verified_draft_tokens", 0) + c.get("answer_proposed_tokens", 0)
        c["accepted_tokens"] = c.get("accepted_prefix_tokens", 0) + c.get("answer_accepted_tokens", 0)
        for name, text, key in self.COUNTERS:
            yield CounterMetricFamily(name, text, value=c.get(key, 0))
        seconds = CounterMetricFamily("ssr:stage_seconds", "Wall seconds per request stage (draft overlaps cot).",
                                      labels=["stage"])
        for stage, value in sorted(stages.items()):
            seconds.add_metric([stage], value)
        yield seconds
        outcomes = CounterMetricFamily("ssr:requests", "Finished requests by outcome.", labels=["outcome"])
        for outcome in self.OUTCOMES:
            outcomes.add_metric([outcome], c.get(outcome, 0))
        yield outcomes
        for name, text, value in (("ssr:num_requests_running", "Requests decoding now.",
                                   self.scheduler.running),
                                  ("ssr:num_requests_waiting", "Requests in the queue.", self.scheduler.waiting),
                                  ("ssr:live_sequences", "Engine sequences holding KV cache.", self.engine.live_sequences())):
            yield GaugeMetricFamily(name, text, value=value)


class RequestLog:
    """`--log-requests FILE`: one JSON line per finished request (the shape `ssr traces` reads:
    messages, reasoning, answer, model, plus mode, finish, timing and speculation figures),
    appended and flushed per request. A write that fails (full disk, no permission) is counted
    and reported on /health and once in the log; it never fails the request."""

    def __init__(self, path: str | Path, log=print) -> None:
        self.path = Path(path)
        self.log = log
        self.written = 0  # requests logged
        self.failed = 0  # requests not logged (the file could not be opened or written)
        self.error: str | None = None  # the last failure
        self._lock = threading.Lock()
        try:  # opened once, appended to; an unwritable file is reported, not fatal
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as error:
            self._file = None
            self._fail(error, lost=0)

    def write(self, done: Finished) -> None:
        messages = done.prompt if isinstance(done.prompt, list) else [{"role": "user", "content": done.prompt}]
        m = done.metrics
        record = {"id": done.request_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "model": done.model,
                  "mode": m["mode"], "messages": messages, "reasoning": done.reasoning, "answer": done.answer,
                  **_tool_fields(done),
                  "finish": done.finish, "seconds": {"queued": done.queued_s, "first_token": done.first_token_s,
                                                     "first_answer_token": done.first_answer_s, "e2e": done.e2e_s},
                  "tokens": {"prompt": m["prompt_tokens"], "reasoning": m["cot_tokens"], "answer": m["answer_tokens"]},
                  "speculation": {key: m[key] for key in ("cot_passes", "cot_accepted_tokens", "verify_passes",
                                                          "answer_accepted_tokens", "accepted_prefix_tokens",
                                                          "decode_steps", "draft_tokens")},
                  **({"drafts": list(done.drafts)} if done.drafts else {})}
        with self._lock:
            if self._file is None:
                self.failed += 1
                return
            try:
                self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
                self._file.flush()
                self.written += 1
            except (OSError, ValueError) as error:
                self._fail(error)

    def health(self) -> dict:
        return {"path": str(self.path), "written": self.written, "failed": self.failed, "error": self.error}

    def _fail(self, error: Exception, lost: int = 1) -> None:
        self.failed += lost
        if self.error is None:
            self.log(f"ssr: request log {self.path}: {error}; requests go on unlogged")
        self.error = str(error)


def _tool_fields(done: Finished) -> dict:
    """A tool-calling request's tools and calls, as the chat API spells them (`ssr traces` reads
    them back and renders them as the model's template does)."""
    if done.tools is None:
        return {}
    out = {"tools": list(done.tools.tools), "tool_choice": done.tools.choice,
           "tool_calls": [call.as_openai() for call in done.tool_calls]}
    if done.tool_call_problems:
        out["tool_call_problems"] = list(done.tool_call_problems)
    return out
