"""One engine, many clients: worker threads, one per slot, run queued requests.

Design (docs/serve.md): HTTP handlers put `Job`s in a bounded FIFO (full -> 429) and read the
job's events from an asyncio queue. A worker takes the oldest job when it is free. Between two
decoded chunks (one token step or one verify pass) the worker checks the job's cancel flag
(client gone) and deadline (time-out); closing the generation releases its sequences or aborts
its engine requests at once.

How many jobs run at once is the engine's `slots` (declared, engines/base.py):
- llama.cpp and transformers: 1. The engine and its KV cache belong to one worker; on a CPU a
  second sequence costs nearly a full step, and SSR's own draft child already uses the batch.
- vLLM: its running-request limit (max_num_seqs) over the requests one walk holds at once
  (parent and draft child): every client's walk is in vLLM's batch, and vLLM schedules them all
  together (its own KV limit queues what does not fit).
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field

from ..config import MODE_TABLE, ConfigError
from ..engines.base import EngineError
from .protocol import ApiError, ParsedRequest, field_message


@dataclass
class Job:
    request: ParsedRequest
    loop: asyncio.AbstractEventLoop  # the event loop that reads `events`
    deadline: float  # time.monotonic() after which the job is stopped
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # (kind, payload) tuples
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client left, or shutdown
    shutdown: bool = False  # cancelled by a shutdown whose grace ran out: the client still waits for an answer
    arrived: float = field(default_factory=time.monotonic)  # when it was submitted

    def emit(self, kind: str, payload) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


class Stats:
    """Counters for /metrics (read by the handler thread, written by the worker)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counters: collections.Counter[str] = collections.Counter()
        self.stage_seconds: collections.Counter[str] = collections.Counter()

    def add(self, **counts: float) -> None:
        with self.lock:
            self.counters.update(counts)

    def add_metrics(self, metrics: dict) -> None:
        with self.lock:
            c = self.counters
            c["drafts"] += metrics["draft_tokens"] > 0
            if MODE_TABLE[metrics["mode"]].verifies_draft:  # the draft is verified as a prefix
                c["verified_draft_tokens"] += metrics["draft_tokens"]
            c["draft_tokens"] += metrics["draft_tokens"]
            c["accepted_prefix_tokens"] += metrics["accepted_prefix_tokens"]
            c["answer_proposed_tokens"] += metrics["answer_proposed_tokens"]
            c["answer_accepted_tokens"] += metrics["answer_accepted_tokens"]
            c["verify_passes"] += metrics["verify_passes"]
            c["reasoning_tokens"] += metrics["cot_tokens"]
            c["answer_tokens"] += metrics["answer_tokens"]
            c["prompt_tokens"] += metrics["prompt_tokens"]
            self.stage_seconds.update(metrics["seconds"])


class Scheduler:
    def __init__(self, model, max_queue: int, timeout_s: float, stats: Stats, served_name: str = "",
                 slots: int | None = None, log=print) -> None:
        self.model, self.max_queue, self.timeout_s, self.stats = model, max_queue, timeout_s, stats
        self.log = log  # the server's log (a tool call that stayed content says why here)
        self.served_name = served_name  # the model's name in metrics and the request log
        self.on_finished: list = []  # callables given each started request's observe.Finished
        # jobs run at once: given, or the engine's declared slots (1 for engines that own one KV cache)
        self.slots = max(1, slots if slots is not None else model.engine.slots)
        self._waiting: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._running: dict[int, Job] = {}  # the jobs workers run now, by id()
        self.draining = False  # shutting down: new requests are refused (503)
        self._stopping = False
        self._threads = [threading.Thread(target=self._loop, name=f"ssr-engine-{number}", daemon=True)
                         for number in range(self.slots)]
        for thread in self._threads:
            thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Jobs the workers run now (0 .. slots)."""
        return len(self._running)

    def _busy(self) -> bool:
        return bool(self._waiting or self._running)

    def submit(self, request: ParsedRequest) -> Job:
        job = Job(request, asyncio.get_running_loop(), time.monotonic() + self.timeout_s)
        with self._wake:
            if self.draining:
                raise shutting_down()
            if len(self._waiting) >= self.max_queue:
                self.stats.add(rejected=1)
                raise ApiError(429, f"the server is busy: {self.max_queue} requests already wait; retry later",
                               kind="rate_limit_error", code="queue_full")
            self._waiting.append(job)
            self._wake.notify()
        return job

    def drain(self, grace_s: float, poll_s: float = 0.05) -> dict[str, int]:
        """Refuse new requests; let the running and waiting ones finish within `grace_s`, then
        cancel the rest (their clients get a 503 error; sequences are released as on any
        cancel). Returns how many finished and how many were cancelled."""
        with self._wake:
            self.draining = True
            pending = len(self._waiting) + len(self._running)
        deadline = time.monotonic() + grace_s
        while self._busy() and time.monotonic() < deadline:
            time.sleep(poll_s)
        with self._wake:
            left = list(self._waiting) + list(self._running.values())
            for job in left:
                job.shutdown = True
                job.cancelled.set()
        while self._busy() and time.monotonic() < deadline + 30:
            time.sleep(poll_s)  # each worker stops its running job at its next chunk
        return {"finished": pending - len(left), "cancelled": len(left)}

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self._running[id(job)] = job
            try:
                self._run(job)
            except Exception as error:  # noqa: BLE001 - a request must never take the worker down
                self.stats.add(failed=1)
                job.emit("error", ApiError(500, f"internal error: {type(error).__name__}: {error}",
                                           kind="internal_error"))
            finally:
                with self._wake:
                    self._running.pop(id(job), None)

    def _run(self, job: Job) -> None:
        """One job: started (or refused), its chunks streamed to the client, its end told."""
        generation = self._start(job)
        if generation is None:
            return
        calls = _calls(job.request, self.model)
        seen = _Seen(job.arrived, time.monotonic())
        finish = self._stream(job, generation, seen, calls)
        self._settle(job, generation, seen, calls, finish)

    def _start(self, job: Job):
        """The job's generation, or None where it ends before one starts (cancelled, past its
        deadline in the queue, a request the model refuses), its client told why."""
        if job.cancelled.is_set():
            self.stats.add(cancelled=1)
            if job.shutdown:
                job.emit("error", shutting_down(CANCELLED_BY_SHUTDOWN))
            return None
        if time.monotonic() > job.deadline:
            self.stats.add(timed_out=1)
            job.emit("error", ApiError(504, "timed out while waiting in the queue", kind="timeout_error"))
            return None
        request = job.request
        try:
            generation = self.model.start(request.prompt, request.config, request.template, tools=request.tools)
        except ConfigError as error:  # e.g. prompt + budgets longer than the context
            self.stats.add(invalid=1)
            job.emit("error", ApiError(400, field_message(error)))
            return None
        job.emit("started", {"prompt_tokens": len(generation.prompt_ids)})
        return generation

    def _stream(self, job: Job, generation, seen: _Seen, calls) -> str | None:
        """The generation's chunks to the client, checking between two for a client gone or the
        deadline; how it ended ("cancelled", "timeout", "error", "stop": a stop string or the one
        call allowed), None where the generation ran out (its tail of held-back text sent)."""
        stops = _StopFilter(job.request.stop)
        chunks = iter(generation)
        try:
            for chunk in chunks:
                if job.cancelled.is_set():
                    return "cancelled"
                if time.monotonic() > job.deadline:
                    return "timeout"
                if chunk.channel == "reasoning":
                    seen.text(chunk.text, answer=False)
                    job.emit("reasoning", chunk.text)
                    continue
                text, hit = stops.push(chunk.text)
                if text:
                    self._answer(job, seen, calls, text)
                if hit or calls is not None and calls.full:  # a stop string, or the one call allowed
                    return "stop"
        except EngineError as error:
            job.emit("error", ApiError(500, f"engine error: {error}", kind="internal_error"))
            return "error"
        finally:
            chunks.close()  # releases the parent and any draft child at once
        tail = stops.flush()
        if tail:
            self._answer(job, seen, calls, tail)
        return None

    def _settle(self, job: Job, generation, seen: _Seen, calls, finish: str | None) -> None:
        """The job's finish reason, its calls closed, its metrics counted and logged, and its end
        told to the client (done, or the error a time-out or a shutdown gives)."""
        if finish in (None, "stop"):
            if finish is None:
                finish = "length" if generation.metrics.stop == "max_tokens" else "stop"
            if calls is not None:
                self._answer(job, seen, calls, None)
                if calls.calls and finish == "stop":
                    finish = "tool_calls"
        metrics = generation.metrics.as_dict()
        self.stats.add_metrics(metrics)
        self._finished(job, seen, finish, metrics, generation.result)
        self.stats.add(**{{"cancelled": "cancelled", "timeout": "timed_out", "error": "failed"}.get(finish, "ok"): 1})
        if finish == "timeout":
            job.emit("error", ApiError(504, f"the request ran past the {self.timeout_s:g} s time-out",
                                       kind="timeout_error"))
        elif finish == "cancelled" and job.shutdown:
            job.emit("error", shutting_down(CANCELLED_BY_SHUTDOWN))
        elif finish not in ("cancelled", "error"):
            if seen.problems:
                metrics = {**metrics, "tool_call_problems": list(seen.problems)}
            job.emit("done", {"finish_reason": finish, "metrics": metrics})

    def _answer(self, job: Job, seen: _Seen, calls, text: str | None) -> None:
        """Answer text to the client: as it is, or read for tool calls (None: the answer ended)."""
        if calls is None:
            seen.text(text, answer=True)
            job.emit("answer", text)
            return
        for kind, value in calls.push(text) if text is not None else calls.flush():
            if kind == "content":
                seen.text(value, answer=True)
                job.emit("answer", value)
            elif kind == "delta":  # what a streaming client is sent of a call
                seen.text("", answer=True)
                job.emit("tool_call_delta", value)
            elif kind == "call":  # the call read whole: the reply's message, the request log
                seen.call(value)
                job.emit("tool_call", value)
            else:  # a call-looking text that is no call: it stays content, the reason is counted and logged
                self.stats.add(tool_call_problems=1)
                seen.problems.append(value)
                self.log(f"ssr: {job.request.request_id}: a tool call stays content: {value}")

    def _finished(self, job: Job, seen: _Seen, finish: str, metrics: dict, result) -> None:
        """Tell the observers (metrics, the request log); one that fails does not fail the request."""
        from .observe import Finished, draft_records

        reasoning = "".join(seen.reasoning).strip()  # as a whole response has it
        engine = self.model.engine
        drafts = draft_records(result.drafts, result.cot_ids, reasoning, engine.token_bytes, engine.eos_ids) \
            if result is not None else ()
        done = Finished(job.request.request_id, self.served_name, job.request.prompt, finish, seen.started - seen.arrived,
                        seen.first, seen.first_answer, time.monotonic() - seen.arrived, metrics,
                        result.trace if result is not None else [], reasoning, "".join(seen.answer).strip(),
                        tuple(seen.calls), tuple(seen.problems), job.request.tools, drafts)
        for observe in self.on_finished:
            try:
                observe(done)
            except Exception:  # noqa: BLE001 - observing must never take the worker down
                self.stats.add(observer_errors=1)


class _Seen:
    """What a request's client has been sent, and when (monotonic seconds)."""

    def __init__(self, arrived: float, started: float) -> None:
        self.arrived, self.started = arrived, started
        self.first: float | None = None  # the first text, reasoning or answer, after arrival
        self.first_answer: float | None = None
        self.reasoning: list[str] = []
        self.answer: list[str] = []
        self.calls: list = []  # tools.ToolCall read from the answer
        self.problems: list[str] = []  # why call-looking text stayed content

    def call(self, call) -> None:
        self.text("", answer=True)
        self.calls.append(call)

    def text(self, piece: str, answer: bool) -> None:
        now = time.monotonic() - self.arrived
        if self.first is None:
            self.first = now
        if answer and self.first_answer is None:
            self.first_answer = now
        if piece:
            (self.answer if answer else self.reasoning).append(piece)


def _calls(request: ParsedRequest, model):
    """The reader of the answer's tool calls, when the request offers tools (else None)."""
    if request.tools is None or not request.tools.active:
        return None
    from ..formats.tool_stream import CallStream
    from ..formats.tools import detect_tool_format

    fmt = detect_tool_format(model.engine.chat_template)
    return CallStream(fmt, request.tools.offered, None if request.tools.parallel else 1)


CANCELLED_BY_SHUTDOWN = "the server shut down before this request finished; retry"


def shutting_down(message: str = "the server is shutting down; retry on another replica or later") -> ApiError:
    """503 while the server drains: for a new request, or one its grace period cancelled."""
    return ApiError(503, message, kind="service_unavailable", code="shutting_down")


class _StopFilter:
    """Cuts the answer at the first stop string; holds back a possible partial match."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.text = ""  # answer so far
        self.sent = 0  # characters of it already emitted

    def push(self, piece: str) -> tuple[str, bool]:
        self.text += piece
        if not self.stops:
            return self._emit(len(self.text)), False
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if hits:
            return self._emit(min(hits)), True
        hold = max(len(s) for s in self.stops) - 1
        return self._emit(max(self.sent, len(self.text) - hold)), False

    def flush(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        out, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        return out
