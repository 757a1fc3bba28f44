"""`ssr serve`: an OpenAI-compatible HTTP server (FastAPI) over one SSR model.

Reasoning streams as `delta.reasoning_content`, the answer as `delta.content` (the
convention of vLLM and DeepSeek). Every error is OpenAI-style JSON; no route gives a
traceback.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..config import GenerationConfig
from .protocol import (ApiError, ParsedRequest, chat_chunk, completion_chunk, final_response, parse_body,
                       parse_request, usage)
from .scheduler import Job, Scheduler, Stats, shutting_down

DISCONNECT_POLL_S = 0.5  # how often a waiting non-streaming handler checks its client
MAX_BODY_BYTES = 8 << 20  # a request body larger than this gets 413
BODY_TIMEOUT_S = 30.0  # a body that has not fully arrived by then gets 408 (slow or stalled uploads)
OPEN_PATHS = ("/health",)  # answered without an API key


def create_app(model, served_name: str, max_queue: int = 16, timeout_s: float = 600.0,
               defaults: GenerationConfig | None = None, aliases: tuple[str, ...] = (),
               api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               body_timeout_s: float = BODY_TIMEOUT_S, log_requests: str | None = None, slots: int | None = None,
               log=print):
    from .observe import RequestLog, ServerMetrics

    defaults = defaults or GenerationConfig()
    served = {served_name, *aliases}
    stats = Stats()
    scheduler = Scheduler(model, max_queue, timeout_s, stats, served_name, slots=slots, log=log)
    metrics_out = ServerMetrics(stats, scheduler, model.engine)
    scheduler.on_finished.append(metrics_out.observe)
    request_log = RequestLog(log_requests, log) if log_requests else None
    if request_log is not None:
        scheduler.on_finished.append(request_log.write)
    @contextlib.asynccontextmanager
    async def lifespan(_):
        yield
        scheduler.stop()
        # here, not after uvicorn.run: on SIGTERM uvicorn re-raises the signal once shut down,
        # and vLLM's engine processes would outlive the server
        close = getattr(model.engine, "close", None)
        if close is not None:
            close()

    app = FastAPI(title="ssr", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.engine = model.engine
    app.state.metrics = metrics_out
    app.state.request_log = request_log
    app.add_middleware(Gate, scheduler=scheduler, api_key=api_key)

    _install_error_handlers(app)

    _add_status_routes(app, served_name, scheduler, request_log, metrics_out)

    async def handle(request: Request, kind: str):
        raw = await read_body(request, max_body_bytes, body_timeout_s)
        parsed = parse_request(parse_body(raw), kind, served, defaults)
        job = scheduler.submit(parsed)
        first = await _next_event(job, request)
        if first is None:
            return JSONResponse({}, status_code=499)  # the client left while queued
        if first[0] == "error":
            raise first[1]
        prompt_tokens = first[1]["prompt_tokens"]
        if parsed.stream:
            return StreamingResponse(_sse(job, parsed, served_name, prompt_tokens), media_type="text/event-stream")
        return await _whole_reply(job, request, parsed, served_name, prompt_tokens)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await handle(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, "completion")

    return app


def _add_status_routes(app: FastAPI, served_name: str, scheduler: Scheduler, request_log, metrics_out) -> None:
    """GET /health (503 while draining), /v1/models and /metrics."""

    @app.get("/health")
    async def health():
        state = {"model": served_name, "running": scheduler.running, "waiting": scheduler.waiting,
                 "slots": scheduler.slots}
        if request_log is not None:  # a request log that cannot be written is reported here
            state["request_log"] = request_log.health()
        if scheduler.draining:  # a load balancer stops sending here
            return JSONResponse({"status": "draining", **state}, status_code=503)
        return {"status": "ok", **state}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "ssr"}]}

    @app.get("/metrics")
    async def metrics():
        body, content_type = metrics_out.render()
        return Response(body, media_type=content_type)


async def _whole_reply(job, request: Request, parsed, served_name: str, prompt_tokens: int):
    """A request without `stream`: its events read to the end, one response (499 where the
    client left; an error event raised as the API error it is)."""
    reasoning, answer, calls = [], [], []
    while True:
        event = await _next_event(job, request)
        if event is None:
            return JSONResponse({}, status_code=499)
        name, payload = event
        if name == "error":
            raise payload
        if name == "done":
            body = final_response(parsed, served_name, "".join(reasoning).strip(), "".join(answer).strip(),
                                  payload["finish_reason"], usage(prompt_tokens, payload["metrics"]),
                                  payload["metrics"], calls)
            return JSONResponse(body)
        if name != "tool_call_delta":  # a whole reply takes each call read whole
            {"reasoning": reasoning, "answer": answer, "tool_call": calls}[name].append(payload)


class Gate:
    """ASGI middleware in front of every route: the API key (401 without it, but on /health)
    and shutdown (503 for new requests while the server drains)."""

    def __init__(self, app, scheduler: Scheduler, api_key: str | None) -> None:
        self.app, self.scheduler = app, scheduler
        self.expected = f"Bearer {api_key}".encode() if api_key else None  # the whole header value

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if self.expected is not None:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(401, "a valid API key is required: send the header Authorization: Bearer <key>",
                                 kind="authentication_error", code="invalid_api_key")
                return await _send_json(send, 401, error.body(), [(b"www-authenticate", b"Bearer")])
        if self.scheduler.draining and scope["path"] != "/metrics":
            error = shutting_down()
            return await _send_json(send, 503, error.body(), [(b"retry-after", b"5")])
        return await self.app(scope, receive, send)


async def _send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": payload})


DRAIN_BYTES = 64 << 20  # an over-size body is read (and dropped) up to this, so its client can read the 413


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, or ApiError: 413 past `limit` bytes, 408 if it has not arrived within
    `timeout_s`, 400 if the client hung up half-way. An over-size body is drained (up to
    DRAIN_BYTES, within the time-out) before the 413: a client that sends its whole body before
    reading (no `Expect: 100-continue`, as urllib) then reads the 413 instead of a reset."""
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0

    async def collect() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit and not too_large:
                chunks.clear()  # the rest is drained, not kept
            if size > DRAIN_BYTES:
                break
            if size <= limit:
                chunks.append(chunk)

    try:
        await asyncio.wait_for(collect(), timeout_s)
    except asyncio.TimeoutError as error:
        if too_large or size > limit:
            raise _too_large(declared, size, limit) from error
        raise ApiError(408, f"the body did not arrive within {timeout_s:g} s", kind="timeout_error") from error
    except ClientDisconnect as error:
        if too_large or size > limit:
            raise _too_large(declared, size, limit) from error
        raise ApiError(400, "the client closed the connection before the whole body arrived") from error
    if too_large or size > limit:
        raise _too_large(declared, size, limit)
    return b"".join(chunks)


def _too_large(declared: str, size: int, limit: int) -> ApiError:
    if declared.isdigit() and int(declared) > limit:
        return ApiError(413, f"the body is {int(declared)} bytes; the limit is {limit}", code="body_too_large")
    return ApiError(413, f"the body is over the limit of {limit} bytes", code="body_too_large")


def _install_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI-style JSON: ours, routing (404/405), validation, anything else."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError):
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException):
        kind = {404: "not_found_error", 405: "method_not_allowed"}.get(error.status_code, "invalid_request_error")
        message = {404: "no such route", 405: "method not allowed on this route"}.get(error.status_code,
                                                                                     str(error.detail))
        return JSONResponse(ApiError(error.status_code, message, kind=kind).body(), status_code=error.status_code,
                            headers=getattr(error, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError):
        return JSONResponse(ApiError(422, f"malformed request: {error.errors()[:1]}").body(), status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception):
        body = ApiError(500, f"internal error: {type(error).__name__}", kind="internal_error").body()
        return JSONResponse(body, status_code=500)


async def _next_event(job: Job, request) -> tuple[str, object] | None:
    """The job's next event; None (and the job cancelled) if the client disconnected."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancelled.set()
                return None
        except asyncio.CancelledError:
            job.cancelled.set()
            raise


async def _sse(job: Job, request: ParsedRequest, model: str, prompt_tokens: int):
    """Server-sent events; a client that goes away cancels the job (finally)."""
    def data(payload: dict) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    chat = request.kind == "chat"
    try:
        if chat:
            yield data(chat_chunk(request, model, {"role": "assistant", "content": ""}))
        while True:
            name, payload = await job.events.get()
            if name == "error":
                yield data(payload.body())
                break
            if name == "tool_call_delta":  # a piece of a call (clients join deltas by index)
                yield data(chat_chunk(request, model, {"tool_calls": [payload.as_openai()]}))
                continue
            if name == "tool_call":  # the call read whole: its deltas are sent
                continue
            if name in ("reasoning", "answer"):
                if chat:
                    yield data(chat_chunk(request, model, {"reasoning_content" if name == "reasoning" else "content":
                                                           payload}))
                else:
                    yield data(completion_chunk(request, model, "" if name == "reasoning" else payload,
                                                payload if name == "reasoning" else None))
                continue
            # done: the finish chunk carries usage and the ssr metrics
            used = usage(prompt_tokens, payload["metrics"])
            last = (chat_chunk(request, model, {}, payload["finish_reason"]) if chat
                    else completion_chunk(request, model, "", None, payload["finish_reason"]))
            last["usage"], last["ssr"] = used, payload["metrics"]
            yield data(last)
            if request.include_usage:
                tail = chat_chunk(request, model, {}) if chat else completion_chunk(request, model, "")
                tail["choices"], tail["usage"] = [], used
                yield data(tail)
            break
        yield "data: [DONE]\n\n"
    finally:
        job.cancelled.set()  # harmless when finished; frees the sequences when the client left


def serve(app, host: str, port: int, grace_s: float, log=print) -> None:
    """Run the app under uvicorn with a graceful shutdown: on SIGTERM or SIGINT new requests
    get 503 while running and queued ones finish within `grace_s` s (then they are cancelled
    with a 503 error), every sequence is released, and the process exits normally (status 0).
    A second signal stops at once."""
    import signal
    import threading

    import uvicorn

    scheduler: Scheduler = app.state.scheduler

    class DrainingServer(uvicorn.Server):
        def capture_signals(self):  # ours instead of uvicorn's, which re-raises the signal on exit
            return _handled(self.on_signal, (signal.SIGINT, signal.SIGTERM))

        def on_signal(self, sig, frame) -> None:
            if scheduler.draining:  # a second signal: stop now
                self.should_exit = self.force_exit = True
                return
            log(f"ssr: {signal.Signals(sig).name}: draining ({scheduler.running} running, "
                f"{scheduler.waiting} waiting; up to {grace_s:g} s), new requests get 503")
            threading.Thread(target=self.drain, name="ssr-drain", daemon=True).start()

        def drain(self) -> None:
            outcome = scheduler.drain(grace_s)
            log(f"ssr: drained: {outcome['finished']} finished, {outcome['cancelled']} cancelled, "
                f"live sequences {app.state.engine.live_sequences()}; exiting")
            self.should_exit = True

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=10)
    DrainingServer(config).run()


@contextlib.contextmanager
def _handled(handler, signals):
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
