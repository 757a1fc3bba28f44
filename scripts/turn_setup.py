"""A turn's setup in a deployment, with n-gram lookup's index kept from the turn before and made
afresh, side by side: ssr's proposer for a token tree (every source made, the prompt indexed,
the first candidates asked), its output then observed and the request ended, over real agent
conversations in file order. Each turn runs twice, against two response histories fed alike;
the afresh one drops the index its last request gave back. Tool views are left out
(docs/agents.md, "The prompt's n-gram index kept too").

    python scripts/turn_setup.py ../shared/traces/agentic-nemo-gym.dev.jsonl.gz --group policy_model --tasks 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from ssr.bench.parsers import DEFAULT_MODEL
from ssr.bench.traces import load_traces, tokenize_trace
from ssr.config import GenerationConfig
from ssr.engines.vocab import load_vocab
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
    args = parser.parse_args()
    missing = [f for f in args.files if not Path(f).is_file()]
    if missing:
        print(f"no such trace file: {', '.join(missing)}", file=sys.stderr)
        return 2
    vocab = load_vocab(DEFAULT_MODEL)
    turns = [tokenize_trace(t, vocab) for t in load_traces([Path(f) for f in args.files], None, args.groups,
                                                             args.tasks)]
    config, kept, afresh = GenerationConfig(mode="ssr"), ResponseHistory(), ResponseHistory()
    rows = []  # (prompt tokens, ms kept, ms afresh)
    for turn in turns:
        output = list(turn.cot_ids) + list(turn.answer_ids)
        rows.append((len(turn.prompt_ids), setup_ms(config, turn.prompt_ids, output, kept, True),
                     setup_ms(config, turn.prompt_ids, output, afresh, False)))
    for low, high in zip(BANDS, BANDS[1:] + (None,)):
        band = [row for row in rows if row[0] >= low and (high is None or row[0] < high)]
        if band:
            print(f"prompts of {low:,}{f'-{high:,}' if high else '+'} tokens: {len(band)} turns, setup median "
                  f"{statistics.median(r[1] for r in band):.0f} ms kept, {statistics.median(r[2] for r in band):.0f}"
                  f" ms afresh (ratio {statistics.median(r[1] / r[2] for r in band):.2f})")
    print(f"all {len(rows)} turns: {sum(r[1] for r in rows) / 1e3:.1f} s kept, {sum(r[2] for r in rows) / 1e3:.1f} s afresh")
    return 0


if __name__ == "__main__":
    sys.exit(main())
