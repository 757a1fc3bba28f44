"""Time to first answer token through a running `ssr serve`, `ar` vs `ssr`, on ClassEval.

    ssr serve --model qwen2.5-coder-0.5b --port 8000 &
    python scripts/server_ttfa.py --base http://127.0.0.1:8000 --model qwen2.5-coder-0.5b --limit 5

Each item is asked once per mode, the order alternating per item; prints per-item
seconds and the medians (time to first `delta.content`, total) and their ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from openai import OpenAI

from ssr.bench.suites import load_suite


def ask(client: OpenAI, model: str, prompt: str, mode: str) -> tuple[float, float, str]:
    start = time.perf_counter()
    first, parts = None, []
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                            stream=True, extra_body={"ssr": {"mode": mode}})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - start
            parts.append(chunk.choices[0].delta.content)
    return first or float("nan"), time.perf_counter() - start, "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--modes", default="ar,ssr")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base + "/v1", api_key="unused", max_retries=0, timeout=1800)
    modes = args.modes.split(",")
    seconds: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for index, item in enumerate(load_suite("classeval", limit=args.limit)):
        answers = {}
        for mode in modes if index % 2 == 0 else modes[::-1]:
            first, total, answers[mode] = ask(client, args.model, item.prompt, mode)
            seconds[mode].append((first, total))
            print(f"{item.item_id:14s} {mode:10s} first answer {first:7.2f}s  total {total:7.2f}s", file=sys.stderr)
        if len(set(answers.values())) > 1:
            print(f"{item.item_id}: answers differ between modes", file=sys.stderr)
    base = modes[0]
    for mode in modes:
        first = statistics.median(s[0] for s in seconds[mode])
        total = statistics.median(s[1] for s in seconds[mode])
        ratio_first = statistics.median(a[0] / b[0] for a, b in zip(seconds[mode], seconds[base]))
        ratio_total = statistics.median(a[1] / b[1] for a, b in zip(seconds[mode], seconds[base]))
        print(f"{mode:10s} median first answer {first:7.2f}s  total {total:7.2f}s  "
              f"ratio to {base}: first {ratio_first:.3f}  total {ratio_total:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
