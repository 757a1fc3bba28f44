"""Time to the first token of turn 2 of a tool conversation on llama.cpp: the kept prefix of
turn 1 (engines/prefix.py) against a cold prefill of the same prompt. Prints both medians and
their ratio. Usage: python scripts/turn_prefill.py [--model M] [--repeats N]"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ssr.api import SSR
from ssr.config import GenerationConfig
from ssr.formats.tools import ToolUse

TOOLS = ToolUse(({"type": "function", "function": {"name": "read_file", "description": "Read a file",
                  "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},))


def conversation(chars: int) -> list[dict]:
    source = (Path(__file__).resolve().parents[1] / "src" / "ssr" / "formats" / "tools.py").read_text()[:chars]
    return [{"role": "user", "content": "Read tools.py and tell me what CallStream does."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "read_file", "arguments": '{"path": "tools.py"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": source}]


def first_token_s(model: SSR, messages: list[dict]) -> tuple[float, int, int]:
    generation = model.start(messages, GenerationConfig(max_tokens=1), tools=TOOLS)
    start = time.perf_counter()
    chunks = iter(generation)
    next(chunks)
    elapsed = time.perf_counter() - start
    for _ in chunks:
        pass
    return elapsed, generation.metrics.prompt_tokens, generation.metrics.cached_prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "transformers"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--chars", type=int, default=6000, help="characters of the tool result")
    args = parser.parse_args()
    turn1 = conversation(args.chars)
    medians = {}
    for kept in (True, False):
        model = SSR(args.model, args.engine)
        if not kept:
            model.engine.prefix = None  # every prefill cold
        times = []
        for n in range(args.repeats):
            first_token_s(model, turn1)  # turn 1: its KV is kept for turn 2
            turn2 = turn1 + [{"role": "assistant", "content": f"CallStream reads calls ({n})."},
                             {"role": "user", "content": "And read_calls?"}]
            seconds, prompt, cached = first_token_s(model, turn2)
            times.append(seconds)
            print(f"{'kept' if kept else 'cold'}: turn 2 prompt {prompt} tokens, {cached} from the kept KV, "
                  f"first token {seconds:.2f} s", flush=True)
        medians[kept] = statistics.median(times)
    print(f"turn 2 first token: kept {medians[True]:.2f} s, cold {medians[False]:.2f} s, "
          f"ratio {medians[True] / medians[False]:.3f}")


if __name__ == "__main__":
    main()
