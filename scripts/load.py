"""Throughput under load, side by side in one run: `ssr serve --engine vllm` against stock vLLM's
OpenAI server on the same model, machine and clients, 1 client and then N at once.

    .venv-vllm/bin/python scripts/load.py --clients 1,8 --requests 24 --max-tokens 96

Each server is started in turn (vLLM's as `python -m vllm.entrypoints.openai.api_server`, the
same server as the `vllm serve` command), warmed with one request, then loaded: R chat
requests, greedy, streamed with usage, by C clients at once. Printed per (server, clients):
completion tokens per second over the load's wall time, median time to first token and to the
first answer token (`content`; reasoning streams as `reasoning_content`), the most requests
the server's engine held at once (ssr: its live vLLM requests gauge; vLLM: vllm:num_requests_running),
5xx responses, the requests left in the engine after the clients stop, and for stock vLLM with a
speculative method the draft tokens it accepted during the load and per verify step, read from
its own /metrics (vllm:spec_decode_num_accepted_tokens, vllm:spec_decode_num_drafts). Ratios: tokens per
second against stock vLLM at the same clients, and against the same server with 1 client.
Only the standard library on the client side.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

from soak import wait_ready  # scripts/ is on the path: python scripts/load.py

PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "Write a Python function is_palindrome(text) that ignores case.",
           "Write a Python class Stack with push, pop and peek.",
           "Write a Python function that merges two sorted lists.",
           "Write a Python function that counts the vowels in a string.",
           "Write a Python function that flattens a nested list.",
           "Write a Python function that returns the prime factors of n.",
           "Write a Python function that reverses the words of a sentence.")
GAUGES = {"ssr": "ssr:live_sequences", "vllm": "vllm:num_requests_running"}


def servers(args) -> dict[str, list[str]]:
    py = sys.executable
    common = ["--model", args.model]
    ssr = [py, "-m", "ssr.cli", "serve", "--engine", "vllm", "--eager", "--port", str(args.port),
           "--max-queue", "64", "--context-size", "2048", *common]
    model_dir = subprocess.run([py, "-c", f"from ssr.engines.vllm import vllm_model_source as s; print(s({args.model!r}))"],
                               capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    vllm = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--served-model-name", args.model,
            "--port", str(args.port), "--max-model-len", "2048", "--enforce-eager", "-O0", "--dtype", "float32",
            "--gpu-memory-utilization", "0.3"]  # as ssr on CPUs: the default 0.92 of RAM does not fit here
    table = {"ssr ar": ssr + ["--mode", "ar", "--thinking-budget", str(args.thinking_budget)],
             "ssr ssr": ssr + ["--mode", "ssr", "--thinking-budget", str(args.thinking_budget)],
             "vllm": vllm,
             "vllm suffix": vllm + ["--speculative-config", json.dumps({"method": "suffix"})],
             "vllm method ssr": vllm + ["--speculative-config", json.dumps({"method": "ssr",
                                                                              "num_speculative_tokens": 16})]}
    return {name: table[name] for name in args.servers.split(",")}


def request(port: int, model: str, prompt: str, max_tokens: int) -> dict:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    start = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    out = {"status": response.status, "first": None, "first_answer": None, "tokens": 0}
    if response.status != 200:
        response.read()
        return out
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            out["tokens"] = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            now = time.monotonic() - start
            if (delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")) and out["first"] is None:
                out["first"] = now
            if delta.get("content") and out["first_answer"] is None:
                out["first_answer"] = now
    connection.close()
    return out


def gauge(port: int, name: str) -> float:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    except OSError:
        return -1
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)]
    return sum(values) if values else -1


def load(port: int, model: str, clients: int, total: int, max_tokens: int, gauge_name: str) -> dict:
    results, peak, done = [], [0.0], threading.Event()
    queue = list(range(total))
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                if not queue:
                    return
                index = queue.pop(0)
            result = request(port, model, PROMPTS[index % len(PROMPTS)], max_tokens)
            with lock:
                results.append(result)

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], gauge(port, gauge_name))
            done.wait(0.2)

    drafted_before = spec_counters(port)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - start
    done.set()
    watcher.join()
    time.sleep(1.0)
    counted = min(drafted_before) >= 0  # the server exports vLLM's spec-decode counters
    accepted, steps = (after - before for after, before in zip(spec_counters(port), drafted_before))
    ok = [r for r in results if r["status"] == 200]
    median = lambda key: statistics.median([r[key] for r in ok if r[key] is not None] or [float("nan")])  # noqa: E731
    return {"clients": clients, "tokens_per_s": sum(r["tokens"] for r in ok) / wall, "wall_s": wall,
            "ttft_s": median("first"), "ttfa_s": median("first_answer"),
            "5xx": sum(r["status"] >= 500 for r in results), "peak_running": peak[0],
            "left_running": gauge(port, gauge_name),
            # vLLM's own speculative-decoding counters over the load (stock vLLM's /metrics; none: -)
            "accepted_draft_tokens": accepted if counted else None, "verify_steps": steps if counted else None}


def spec_counters(port: int) -> tuple[float, float]:
    """(accepted draft tokens, verify steps with a draft) so far, from vLLM's /metrics; -1 each
    where the server has no speculative decoding (or no such metrics)."""
    return (gauge(port, "vllm:spec_decode_num_accepted_tokens_total"),
            gauge(port, "vllm:spec_decode_num_drafts_total"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--servers", default="ssr ar,vllm", help="comma-separated: ssr ar, ssr ssr, vllm, vllm suffix, "
                                                                 "vllm method ssr")
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per load (default: 3 per client of the largest --clients, so that the batch "
                             "stays full while answers of uneven length finish: the load measures the server, "
                             "not its last request alone)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--thinking-budget", type=int, default=128,
                        help="ssr serve's CoT budget (above its --draft-at, 64)")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.requests is None:
        args.requests = 3 * max(int(c) for c in args.clients.split(","))
    rows = []
    for name, command in servers(args).items():
        kind = "ssr" if name.startswith("ssr") else "vllm"
        print(f"# {name}: {' '.join(command)}", file=sys.stderr, flush=True)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=open(f"/tmp/load-{name.replace(' ', '_')}.log", "w"),
                                   env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}, start_new_session=True)
        try:
            wait_ready(args.port, process, name)
            request(args.port, args.model, PROMPTS[0], 8)  # warm-up
            for clients in [int(c) for c in args.clients.split(",")]:
                row = {"server": name, **load(args.port, args.model, clients, args.requests, args.max_tokens,
                                              GAUGES[kind])}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:  # it had exited (a server that failed to start)
                pass
    base = {r["clients"]: r["tokens_per_s"] for r in rows if r["server"] == "vllm"}
    alone = {r["server"]: r["tokens_per_s"] for r in rows if r["clients"] == 1}
    print("| server | clients | tokens/s | × vllm | × own 1 client | TTFT s | TTFA s | peak running | 5xx | left "
          "| accepted drafts (vLLM /metrics) | per verify step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        vs = f"{r['tokens_per_s'] / base[r['clients']]:.2f}" if r["clients"] in base else "-"
        own = f"{r['tokens_per_s'] / alone[r['server']]:.2f}" if r["server"] in alone else "-"
        steps = r["verify_steps"]
        accepted = "-" if steps is None else f"{r['accepted_draft_tokens']:g}"
        per_step = "-" if not steps else f"{r['accepted_draft_tokens'] / steps:.2f}"
        print(f"| {r['server']} | {r['clients']} | {r['tokens_per_s']:.1f} | {vs} | {own} | {r['ttft_s']:.2f} | "
              f"{r['ttfa_s']:.2f} | {r['peak_running']:g} | {r['5xx']} | {r['left_running']:g} | {accepted} | "
              f"{per_step} |")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
