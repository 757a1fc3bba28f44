"""A turn's setup in a deployment, with n-gram lookup's index kept from the turn before and made
afresh, side by side: ssr's proposer for a token tree (every source made, the prompt indexed,
the first candidates asked), its output then observed and the request ended, over real agent
conversations in file order. Each turn runs twice, against two response histories fed alike;
the afresh one drops the index its last request gave back. Tool views are left out
(docs/agents.md, "The prompt's n-gram index kept too"). With --cold, each turn once on a server
started afresh (nothing kept: every source indexes the whole prompt, as `ssr traces --orders
cold` replays it; docs/agents.md, "A long prompt's setup").

    python scripts/turn_setup.py ../shared/traces/agentic-nemo-gym.dev.jsonl.gz --group policy_model --tasks 1
    python scripts/turn_setup.py ../shared/traces/agentic-nemo-gym.dev.jsonl.gz --group policy_model --tasks 1 --cold
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from ssr.bench.traces import tokenized_traces
from ssr.config import ConfigError, GenerationConfig
from ssr.proposing.history import ResponseHistory
from ssr.proposing.proposers import LOOKUP_INDEX, request_proposer

BANDS = (0, 10_000, 50_000)  # prompt tokens where a band of the table starts


def setup_ms(config, prompt, output, history, keep: bool) -> float:
    """One request's setup in milliseconds; its output observed and the request ended after."""
    if not keep:
        history.borrow(LOOKUP_INDEX)  # what the last request gave back, dropped
    start = time.perf_counter()
    proposer = request_proposer(config, 0.1, prompt, history, several=True, wide=True, trie=True)
    proposer.candidates(16)
    took = 1e3 * (time.perf_counter() - start)
    for at in range(0, len(output), 4):
        proposer.observe(output[at:at + 4])
    proposer.candidates(16)
    history.add(output)
    proposer.end()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--group", action="append", dest="groups", help="only groups holding this text")
    parser.add_argument("--tasks", type=int, default=1, help="per group, every turn of the first N tasks")
    parser.add_argument("--cold", action="store_true", help="each turn once, nothing kept from the turn before")
    args = parser.parse_args()
    try:
        turns = tokenized_traces(args.files, groups=args.groups, tasks=args.tasks)
    except ConfigError as error:
        print(f"turn_setup: {error}", file=sys.stderr)
        return 2
    config, kept, afresh = GenerationConfig(mode="ssr"), ResponseHistory(), ResponseHistory()
    if args.cold:
        return cold(config, turns)
    rows = []  # (prompt tokens, ms kept, ms afresh)
    for number, turn in enumerate(turns):
        output = list(turn.cot_ids) + list(turn.answer_ids)
        sides = [(kept, True), (afresh, False)][:: 1 if number % 2 else -1]  # each side first every other turn
        took = {keep: setup_ms(config, turn.prompt_ids, output, history, keep) for history, keep in sides}
        rows.append((len(turn.prompt_ids), took[True], took[False]))
    for head, band in bands(rows):
        print(f"{head}, setup median {statistics.median(r[1] for r in band):.0f} ms kept, "
              f"{statistics.median(r[2] for r in band):.0f} ms afresh (ratio {statistics.median(r[1] / r[2] for r in band):.2f})")
    print(f"all {len(rows)} turns: {sum(r[1] for r in rows) / 1e3:.1f} s kept, {sum(r[2] for r in rows) / 1e3:.1f} s afresh")
    return 0


def bands(rows: list[tuple]):
    """("prompts of LOW-HIGH tokens: N turns", its rows) for each band of prompt lengths holding any."""
    for low, high in zip(BANDS, BANDS[1:] + (None,)):
        band = [row for row in rows if row[0] >= low and (high is None or row[0] < high)]
        if band:
            yield f"prompts of {low:,}{f'-{high:,}' if high else '+'} tokens: {len(band)} turns", band


def cold(config, turns) -> int:
    """Each turn's setup on a history of its own: the median per band of prompt lengths."""
    rows = [(len(turn.prompt_ids), setup_ms(config, turn.prompt_ids, list(turn.cot_ids) + list(turn.answer_ids),
                                            ResponseHistory(), True)) for turn in turns]
    for head, band in bands(rows):
        print(f"{head}, setup median {statistics.median(r[1] for r in band):.0f} ms cold, "
              f"{statistics.median(1e3 * r[1] / r[0] for r in band):.1f} us a prompt token")
    print(f"all {len(rows)} turns: {sum(r[1] for r in rows) / 1e3:.1f} s cold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
