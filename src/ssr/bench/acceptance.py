"""Recorded per-position acceptance held against ssr's replay of the same proposer.

A benchmark that ran vLLM's n-gram proposer on a GPU records, for every generated position i,
`acc_ngram.acc_len[i]`: 1 + the draft tokens vLLM would have accepted had a verify step started
there (the bonus counted). ssr's prompt lookup (proposing/lookup.py, vLLM V1's rule: the longest
n-gram in [min, max] ending the context that occurred before, its earliest occurrence, the tokens
after it) is replayed over the same prompt and output and must reach the same count at each
position. Position 0 is the prefill's token (no step starts before it).

Per step: the steps vLLM takes with k draft tokens, walked over the output, each step's accepted
tokens against the record's min(acc_len - 1, k) where it starts.

    python -m ssr.bench.acceptance FILE... [--min 3 --max 7 --tokens 20 --k 3,5]
"""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..proposing.lookup import PromptLookupProposer
from ..verifying.verify import common_prefix
from .traces import jsonl_records


@dataclass
class Fidelity:
    """Positions where the replayed proposer reaches the recorded acceptance, and where not."""

    agree: int = 0
    total: int = 0
    # (request id, position, replayed acc_len, recorded acc_len, tokens left in the output) of each miss
    misses: list[tuple[str, int, int, int, int]] = field(default_factory=list)


def replayed_acc_len(prompt: Sequence[int], output: Sequence[int], min_ngram: int, max_ngram: int,
                     tokens: int) -> list[int]:
    """acc_len per output position from 1 on: 1 + the proposal's tokens equal to the output's next."""
    proposer = PromptLookupProposer(list(prompt), max_ngram=max_ngram, num_tokens=tokens, min_ngram=min_ngram)
    proposer.observe(list(output[:1]))
    found = []
    for position in range(1, len(output)):
        proposal, _ = proposer.propose(tokens)
        found.append(1 + common_prefix(proposal, output[position:]))
        proposer.observe(list(output[position:position + 1]))
    return found


def fidelity(records: Iterable[dict], min_ngram: int = 3, max_ngram: int = 7, tokens: int = 20) -> Fidelity:
    result = Fidelity()
    for record in records:
        output, recorded = record["generated_token_ids"], record["acc_ngram"]["acc_len"]
        found = replayed_acc_len(record["prompt_token_ids"], output, min_ngram, max_ngram, tokens)
        for position, (mine, theirs) in enumerate(zip(found, recorded[1:]), start=1):
            result.total += 1
            if mine == theirs:
                result.agree += 1
            else:
                result.misses.append((str(record.get("id", "")), position, mine, theirs, len(output) - position))
    return result


def step_fidelity(records: Iterable[dict], k: int, min_ngram: int = 3, max_ngram: int = 7) -> Fidelity:
    """The steps vLLM takes with k draft tokens, walked over each output as greedy verification
    takes them (a step at position i accepts what matches, up to k, then the bonus), the replayed
    proposer's accepted tokens held against the record's min(acc_len[i] - 1, k) at each step."""
    result = Fidelity()
    for record in records:
        output, recorded = record["generated_token_ids"], record["acc_ngram"]["acc_len"]
        found = replayed_acc_len(record["prompt_token_ids"], output, min_ngram, max_ngram, k)
        position = 1  # the prefill wrote position 0
        while position < len(output):
            mine, theirs = min(found[position - 1] - 1, k), min(recorded[position] - 1, k)
            result.total += 1
            if mine == theirs:
                result.agree += 1
            else:
                result.misses.append((str(record.get("id", "")), position, mine + 1, theirs + 1, len(output) - position))
            position += mine + 1
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssr.bench.acceptance",
                                     description="ssr's prompt lookup against recorded n-gram acceptance")
    parser.add_argument("files", nargs="+", help="JSONL (gzip or not) with prompt_token_ids, generated_token_ids, acc_ngram")
    parser.add_argument("--min", type=int, default=3, dest="min_ngram", help="prompt_lookup_min (default 3)")
    parser.add_argument("--max", type=int, default=7, dest="max_ngram", help="prompt_lookup_max (default 7)")
    parser.add_argument("--tokens", type=int, default=20, help="tokens proposed (default 20)")
    parser.add_argument("--k", default="3,5", help="draft tokens a step, comma-separated, for the steps' count (3,5)")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.k.split(",") if k.strip()]
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            raise SystemExit(f"no such file: {path}")
        results = [("positions", args.tokens, fidelity(jsonl_records(path), args.min_ngram, args.max_ngram, args.tokens))]
        results += [(f"steps at k = {k}", k, step_fidelity(jsonl_records(path), k, args.min_ngram, args.max_ngram))
                    for k in ks]
        for what, reach, result in results:
            near_end = sum(1 for miss in result.misses if miss[4] <= reach)
            print(f"{path.name}: {what}: {result.agree}/{result.total} agree ({result.agree / max(1, result.total):.4%}); "
                  f"{len(result.misses)} do not, {near_end} of them within {reach} tokens of the output's end"
                  + (f"; first: {result.misses[:2]}" if result.misses else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
