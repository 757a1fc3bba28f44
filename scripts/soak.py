"""Soak `ssr serve`: N clients for T minutes over loopback, a mix of streaming, non-streaming,
invalid and cancelled-mid-stream requests; the queue is kept small so some requests find it
full (429). Reports requests by outcome, p50/p99 latency and time to first token, the
server's resident memory after warm-up and at the end, and its live sequences afterwards.

    python scripts/soak.py --clients 8 --minutes 10                     # starts `ssr serve` (default model)
    python scripts/soak.py --minutes 2 -- --model smollm2-135m          # arguments after -- go to ssr serve
    python scripts/soak.py --url http://127.0.0.1:8000 --pid 1234       # a server already running

Exit status 1 if any response was a 5xx, malformed, lost or hung, or sequences stayed live.
Only the standard library is used on the client side.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "Write a Python function is_palindrome(text) that ignores case.",
           "Write a Python class Stack with push, pop and peek.",
           "Write a Python function that merges two sorted lists.",
           "Write a Python function that counts the vowels in a string.",
           "Write a Python function that flattens a nested list.")
INVALID = (b"{bad json", b"[]", b'{"model": "m", "messages": []}', b'{"model": "m", "temperature": Infinity}',
           b"[" * 3000 + b"]" * 3000, b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}')
KINDS = (("stream", 0.35), ("whole", 0.35), ("invalid", 0.15), ("cancel", 0.15))


@dataclass
class Outcome:
    kind: str  # stream, whole, invalid, cancel
    status: int  # HTTP status (0: no response)
    result: str  # ok, rejected (429), refused (expected 4xx), cancelled, server_error, malformed, lost, hung
    seconds: float
    first_token_s: float | None = None  # streams: to the first reasoning or answer text


@dataclass
class Soak:
    base: str
    model: str
    api_key: str | None
    timeout_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def connection(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.base)
        return http.client.HTTPConnection(parts.hostname, parts.port, timeout=self.timeout_s)

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    modes: tuple[str, ...] = ("ssr", "ssr", "ar", "suffix")  # drawn per request

    def body(self, rng: random.Random, stream: bool) -> bytes:
        return json.dumps({
            "model": self.model, "stream": stream, "max_tokens": rng.randint(16, 160),
            "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "ssr": {"thinking_budget": rng.randint(32, 160), "mode": rng.choice(self.modes)},
        }).encode()

    def one(self, rng: random.Random) -> Outcome:
        kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        payload = rng.choice(INVALID).replace(b'"m"', json.dumps(self.model).encode()) if kind == "invalid" \
            else self.body(rng, stream=kind in ("stream", "cancel"))
        started = time.monotonic()
        connection = self.connection()
        try:
            connection.request("POST", "/v1/chat/completions", payload, self.headers())
            reply = connection.getresponse()
            if reply.getheader("content-type", "").startswith("text/event-stream"):
                return self._stream(reply, kind, started, connection)
            raw = reply.read()
            return Outcome(kind, reply.status, _judge(kind, reply.status, raw), time.monotonic() - started)
        except (socket.timeout, TimeoutError):
            return Outcome(kind, 0, "hung", time.monotonic() - started)
        except (OSError, http.client.HTTPException):
            return Outcome(kind, 0, "lost", time.monotonic() - started)
        finally:
            connection.close()

    def _stream(self, reply, kind: str, started: float, connection) -> Outcome:
        first, events = None, []
        for line in reply:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if first is None and ('"reasoning_content"' in line or '"content": "' in line) and '"role"' not in line:
                first = time.monotonic() - started
                if kind == "cancel":  # hang up mid-stream
                    connection.sock.close()
                    return Outcome(kind, reply.status, "cancelled", time.monotonic() - started, first)
            if line == "data: [DONE]":
                break
        try:
            chunks = [json.loads(event) for event in events[:-1]]
            done = events[-1] == "[DONE]"
        except (ValueError, IndexError):
            return Outcome(kind, reply.status, "malformed", time.monotonic() - started, first)
        if not done:
            return Outcome(kind, reply.status, "lost", time.monotonic() - started, first)
        errors = [c["error"] for c in chunks if "error" in c]
        result = "ok" if not errors else ("server_error" if errors[0].get("type") == "internal_error" else "refused")
        return Outcome(kind, reply.status, result, time.monotonic() - started, first)

    def client(self, seed: int, until: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < until:
            outcome = self.one(rng)
            with self.lock:
                self.outcomes.append(outcome)
            if outcome.result == "rejected":
                time.sleep(rng.uniform(1.0, 3.0))  # as a client backs off after 429


def _judge(kind: str, status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return "malformed"
    if status >= 500:
        return "server_error"
    if status == 429:
        return "rejected"
    if status == 200:
        return "ok" if "choices" in body and kind != "invalid" else "malformed"
    return "refused" if isinstance(body.get("error"), dict) and body["error"].get("message") else "malformed"


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def metric(base: str, name: str, api_key: str | None) -> float:
    parts = urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    text = connection.getresponse().read().decode()
    connection.close()
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.MULTILINE).group(1))


def start_server(serve_args: list[str], port: int, max_queue: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "ssr.cli", "serve", "--port", str(port), "--max-queue", str(max_queue),
               *serve_args]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_ready(port, proc)
    return proc


def wait_ready(port: int, proc: subprocess.Popen, what: str = "ssr serve", timeout_s: float = 600) -> None:
    """Poll the server's /health (ssr's and vLLM's) until it answers 200; SystemExit, with its
    error output where it is piped, if the process exits or the server never answers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            detail = f": {proc.stderr.read()}" if proc.stderr is not None else ""
            raise SystemExit(f"{what} exited with {proc.returncode}{detail}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"{what} did not start within {timeout_s:g} s")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(soak: Soak, rss: dict[str, float], live: float, seconds: float) -> dict:
    by_result: dict[str, int] = {}
    for outcome in soak.outcomes:
        by_result[outcome.result] = by_result.get(outcome.result, 0) + 1
    answered = [o for o in soak.outcomes if o.result == "ok"]
    firsts = [o.first_token_s for o in soak.outcomes if o.first_token_s is not None]
    return {
        "seconds": round(seconds), "requests": len(soak.outcomes), "by_outcome": by_result,
        "by_kind": {kind: sum(o.kind == kind for o in soak.outcomes) for kind, _ in KINDS},
        "latency_ok_s": {"p50": percentile([o.seconds for o in answered], 0.5),
                         "p99": percentile([o.seconds for o in answered], 0.99)},
        "first_token_s": {"p50": percentile(firsts, 0.5), "p99": percentile(firsts, 0.99)},
        "rss_mib": rss, "rss_growth": (rss["end"] - rss["warm"]) / rss["warm"] if rss.get("warm") else None,
        "live_sequences_after": live,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=1.0, help="resident memory is compared from here")
    parser.add_argument("--max-queue", type=int, default=4, help="the started server's queue (small: some 429s)")
    parser.add_argument("--url", default=None, help="a running server instead of starting one")
    parser.add_argument("--pid", type=int, default=None, help="its process id (for resident memory)")
    parser.add_argument("--model", default=None, help="the model id to request (default: the server's)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a request counts as hung")
    parser.add_argument("--modes", default="ssr,ssr,ar,suffix",
                        help="ssr modes drawn per request (--engine vllm runs ar, ssr, ssr-prefix: use ssr,ar)")
    parser.add_argument("--out", default=None, help="write the report as JSON here")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    proc = None
    if args.url is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        print(f"starting ssr serve {' '.join(serve_args)} on port {port} …", file=sys.stderr)
        proc = start_server(serve_args + (["--api-key", args.api_key] if args.api_key else []), port, args.max_queue)
        args.url, args.pid = f"http://127.0.0.1:{port}", proc.pid
    parts = urlsplit(args.url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    connection.request("GET", "/v1/models", headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
    model = args.model or json.loads(connection.getresponse().read())["data"][0]["id"]
    soak = Soak(args.url, model, args.api_key, args.timeout)
    soak.modes = tuple(args.modes.split(","))
    started = time.monotonic()
    until = started + args.minutes * 60
    threads = [threading.Thread(target=soak.client, args=(seed, until), daemon=True) for seed in range(args.clients)]
    rss: dict[str, float] = {"start": rss_mib(args.pid)} if args.pid else {}
    for thread in threads:
        thread.start()
    warm_at = started + args.warmup_minutes * 60
    while any(thread.is_alive() for thread in threads):
        time.sleep(5)
        if args.pid and "warm" not in rss and time.monotonic() >= warm_at:
            rss["warm"] = rss_mib(args.pid)
        if int(time.monotonic() - started) % 60 < 5:
            with soak.lock:
                done = len(soak.outcomes)
            print(f"  {time.monotonic() - started:5.0f} s: {done} requests", file=sys.stderr, flush=True)
    for thread in threads:
        thread.join()
    time.sleep(2)
    if args.pid:
        rss["end"] = rss_mib(args.pid)
    live = metric(args.url, "ssr:live_sequences", args.api_key)
    summary = report(soak, rss, live, time.monotonic() - started)
    if proc is not None:
        proc.terminate()
        summary["server_exit"] = proc.wait(timeout=120)
        summary["server_log_tail"] = proc.stderr.read().strip().splitlines()[-2:]
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    bad = sum(summary["by_outcome"].get(result, 0) for result in ("server_error", "malformed", "lost", "hung"))
    return 1 if bad or live not in (0, -1) or summary.get("server_exit", 0) != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
