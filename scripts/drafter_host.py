"""Host time of ssr's vLLM drafter a request-step, in each of its layouts (speculation.HostCosts):
one chain among every source's candidates (batch 1) and one span a pass from the suffix tree
alone (batch 32, GPU preset: speculation.per_step_layout picks it there). Each trace's
drafting is replayed as greedy vLLM verifies it (vllm_drafter.replay_chains: the drafter's own
code, no vLLM needed) and timed; the median over traces of milliseconds a step, with the
interquartile range. Real traces (../shared/traces), the first N of each (set, model) group.
Then a request's setup: its drafter made and its first chain drafted (every source indexing the
prompt, inside vLLM's step, so the batch waits for it), in microseconds a prompt token.

    python scripts/drafter_host.py ../shared/traces/*.dev.jsonl.gz --limit 5
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from ssr.bench.traces import tokenized_traces
from ssr.config import ConfigError
from ssr.engines.vllm_drafter import ChainDrafter, replay_chains
from ssr.engines.vllm_plugin import DEFAULT_TOKENS
from ssr.loop.speculation import per_step_layout
from ssr.pricing.costs import CostModel, gpu_preset


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--limit", type=int, default=5, help="traces per (set, model) group")
    args = parser.parse_args()
    try:
        traces = tokenized_traces(args.files, limit=args.limit)
    except ConfigError as error:
        print(f"drafter_host: {error}", file=sys.stderr)
        return 2
    max_span = DEFAULT_TOKENS  # the drafter's chains at most (num_speculative_tokens unset)
    for batch in (1, 32):
        costs = CostModel(table=gpu_preset().at_batch(batch))
        per_step, steps = [], 0
        for each in traces:
            start = time.perf_counter()
            done = replay_chains(each.prompt_ids, each.cot_ids + each.answer_ids, CostModel(table=gpu_preset()),
                                 each.cot_ids[-1:], True, max_span, costs, batch=batch)
            per_step.append(1e3 * (time.perf_counter() - start) / max(1, len(done)))
            steps += len(done)
        quartiles = statistics.quantiles(per_step, n=4) if len(per_step) > 1 else per_step * 3
        print(f"batch {batch:2d} ({per_step_layout(costs, batch).value}): {statistics.median(per_step):.3f} ms a step "
              f"(quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}), {len(traces)} traces, {steps} steps")
    costs = CostModel(table=gpu_preset())
    setup = []  # (prompt tokens, microseconds a prompt token)
    for each in traces:
        start = time.perf_counter()
        ChainDrafter(list(each.prompt_ids), None, costs, each.cot_ids[-1:], True, max_span).step(
            (each.cot_ids + each.answer_ids)[:1], max_span)
        setup.append((len(each.prompt_ids), 1e6 * (time.perf_counter() - start) / max(1, len(each.prompt_ids))))
    longest = max(setup)
    print(f"setup: {statistics.median(us for _, us in setup):.1f} us a prompt token (median over {len(setup)} "
          f"prompts of {min(setup)[0]}-{longest[0]} tokens; the longest {longest[1]:.1f}, "
          f"{longest[0] * longest[1] / 1e3:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
