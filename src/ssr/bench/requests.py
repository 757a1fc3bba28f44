"""What a client request on `--engine vllm` costs after its CoT, in vLLM requests and engine passes
(loop/vllm_walk.py), from bench rows; the passes priced on a cost table (the GPU preset by default).

After the CoT the walk either verifies the latest draft in a request of its own and continues in a
new answer request (ssr, ssr-prefix; ar where a budget or an answer prefix is forced), or lets the
parent's request go on into the answer (ar and ssr-suffix where nothing comes between: the draft
then reaches the answer through vLLM's speculative method, a chain of at most
num_speculative_tokens a step). A pass on the request's critical path after the CoT is one of:

  - the verify request's prefill: its tokens past the prefix cache (the CoT's last partial block
    and the draft), one pass;
  - the answer request's prefill: its tokens past the prefix cache, one pass that writes its first
    token;
  - a decode step: 1 token, or 1 + the chain drafted where vLLM verified one (the chains of a
    part are read as its mean: vLLM reports per step only for steps that had a draft).

Each new request after the CoT is also a round trip through vLLM's front end: submitted only once
the previous one has returned.
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ..engines.vllm_plugin import DEFAULT_TOKENS
from ..pricing.costs import CostTable, gpu_preset

PARTIAL_BLOCK = 8  # a new request's tokens past the prefix cache before its own: half a 16-token block


def after_cot(metrics: dict) -> dict | None:
    """The passes after the CoT of one vLLM row's walk (None: not a vLLM row, or no answer)."""
    engine = metrics.get("engine") or {}
    if "requests" not in engine or not metrics.get("answer_tokens"):
        return None
    passes: list[int] = []  # tokens fed per pass
    verified = bool(metrics.get("verify_passes"))
    if verified:
        passes.append(max(1, engine["verify_prompt_tokens"] - engine.get("verify_cached_tokens", 0)))
    decoded = metrics["answer_tokens"] - (metrics["accepted_prefix_tokens"] + 1 if verified else 0)
    steps = max(0, decoded - metrics.get("answer_accepted_tokens", 0))  # a step: 1 + what it accepted
    new_request = "answer_prompt_tokens" in engine
    if new_request and steps:
        passes.append(max(1, engine["answer_prompt_tokens"] - engine.get("answer_cached_tokens", 0)))
        steps -= 1
    speculation = (engine.get("speculation") or {}).get("answer") or {}
    chains = min(steps, speculation.get("verify_steps") or 0)
    if chains:
        passes += [1 + round((speculation.get("drafted") or 0) / chains)] * chains
    passes += [1] * (steps - chains)
    return {"requests": engine["requests"], "round_trips": int(verified) + int(new_request), "passes": passes}


def priced_steps(passes: list[int], table: CostTable) -> float:
    """The passes' seconds on `table`, in decode steps of one token."""
    return sum(table.step(1) if tokens <= 1 else table.score(tokens) for tokens in passes) / table.step(1)


def requests_table(rows: list[dict], group_name, table: CostTable | None = None) -> list[dict]:
    """Per (suite, mode) of vLLM rows: means per client request of vLLM requests, round trips,
    passes and tokens fed after the CoT, those passes priced on `table` (steps), and the
    measured seconds from the CoT's end to the answer's end."""
    table = table or gpu_preset()
    groups: dict[tuple[str, str], list[tuple[dict, dict]]] = defaultdict(list)
    for row in rows:
        found = after_cot(row["metrics"])
        if found is not None:
            groups[(group_name(row), row["mode"])].append((row["metrics"], found))
    lines = []
    for (suite, mode), group in sorted(groups.items()):
        mean = lambda values: statistics.mean(list(values))  # noqa: E731
        lines.append({
            "suite": suite, "mode": mode, "runs": len(group),
            "requests": mean(found["requests"] for _, found in group),
            "round_trips": mean(found["round_trips"] for _, found in group),
            "passes": mean(len(found["passes"]) for _, found in group),
            "tokens": mean(sum(found["passes"]) for _, found in group),
            "priced_steps": mean(priced_steps(found["passes"], table) for _, found in group),
            "answer_tokens": mean(metrics["answer_tokens"] for metrics, _ in group),
            "after_cot_s": mean(metrics["seconds"]["verify"] + metrics["seconds"]["continuation"]
                                for metrics, _ in group),
            "costs": table.source,
        })
    return lines


def format_requests(lines: list[dict], render, markdown: bool = False) -> str:
    columns = ["suite", "mode", "runs", "vLLM requests", "round trips", "passes", "tokens fed", "answer tok",
               "priced (steps)", "measured s"]
    cells = [[line["suite"], line["mode"], str(line["runs"]), f"{line['requests']:.1f}", f"{line['round_trips']:.1f}",
              f"{line['passes']:.1f}", f"{line['tokens']:.0f}", f"{line['answer_tokens']:.0f}",
              f"{line['priced_steps']:.1f}", f"{line['after_cot_s']:.2f}"] for line in lines]
    return render(columns, cells, markdown)


@dataclass(frozen=True)
class Designs:
    """Two ways to take a draft into the answer, priced in decode steps of one token (what differs
    between them: the answer after the accepted prefix is decoded alike). The other requests of
    the batch decode one token a pass each, so a pass costs score(batch - 1 + its own tokens)."""

    verify_request: float  # the draft verified in one pass, then an answer request's prefill pass
    parent_goes_on: float  # the parent's steps, each verifying a chain of the draft's next tokens


def price_designs(accepted: int, draft_tokens: int, table: CostTable, batch: int = 1,
                  chain: int = DEFAULT_TOKENS, partial: int = PARTIAL_BLOCK) -> Designs:
    """accepted: draft tokens equal to the answer's first ones; draft_tokens: the draft verified;
    chain: draft tokens a step verifies (vLLM's num_speculative_tokens); partial: tokens of a new
    request past the prefix cache before its own (a partly filled KV block)."""
    others = batch - 1
    pass_s = lambda tokens: table.step(1) if others + tokens <= 1 else table.score(others + tokens)  # noqa: E731
    verify = pass_s(partial + draft_tokens) + pass_s(partial)
    steps = -(-(accepted + 1) // (chain + 1))  # the prefix and the token after it, chain + 1 a step at best
    return Designs(verify / pass_s(1), steps * pass_s(chain + 1) / pass_s(1))


def draft_designs(path: Path, batches: tuple[int, ...] = (1, 16, 64), chains: tuple[int, ...] = (DEFAULT_TOKENS, 128),
                  draft_cap: int = 256) -> list[dict]:
    """Per batch and chain length, the designs priced on the GPU preset over a file of traces with
    drafts (the latest draft forked before the CoT ended, cut at draft_cap tokens as the walk cuts
    it), tokens counted with the default model's vocabulary."""
    from ..engines.vocab import load_vocab
    from ..models import DEFAULT_MODEL
    from ..verifying.verify import common_prefix
    from .traces import jsonl_records

    vocab, table, pairs = load_vocab(DEFAULT_MODEL), gpu_preset(), []
    for record in jsonl_records(path):
        forked = [d for d in record.get("drafts") or () if d["cot_chars"] < len(record["cot"])]
        if not forked:
            continue
        draft = vocab.tokenize(max(forked, key=lambda d: d["cot_chars"])["answer"])[:draft_cap]
        pairs.append((common_prefix(draft, vocab.tokenize(record["answer"])), len(draft)))
    if not pairs:
        raise SystemExit(f"{path}: no trace with a draft forked before its CoT ended")
    out = []
    for batch in batches:
        for chain in chains:
            priced = [price_designs(accepted, tokens, table, batch, chain) for accepted, tokens in pairs]
            out.append({"batch": batch, "chain": chain, "runs": len(pairs),
                        "accepted": statistics.median(a for a, _ in pairs),
                        "draft": statistics.median(d for _, d in pairs),
                        "verify_request": statistics.median(p.verify_request for p in priced),
                        "parent_goes_on": statistics.median(p.parent_goes_on for p in priced),
                        "verify_cheaper": sum(p.verify_request < p.parent_goes_on for p in priced)})
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m ssr.bench.requests TRACES: the two designs priced over a file of traces with drafts."""
    import argparse

    from .report import render_table

    parser = argparse.ArgumentParser(prog="python -m ssr.bench.requests", description=main.__doc__)
    parser.add_argument("traces", help="JSONL (gzip or not) of traces with `drafts` (docs/traces.md)")
    args = parser.parse_args(argv)
    path = Path(args.traces)
    if not path.is_file():
        raise SystemExit(f"no such file: {path}")
    lines = draft_designs(path)
    print(render_table(["batch", "chain", "runs", "accepted (median)", "draft tok", "verify request (steps)",
                        "parent goes on (steps)", "verify request cheaper"],
                       [[str(x["batch"]), str(x["chain"]), str(x["runs"]), f"{x['accepted']:.0f}", f"{x['draft']:.0f}",
                         f"{x['verify_request']:.2f}", f"{x['parent_goes_on']:.2f}",
                         f"{x['verify_cheaper']}/{x['runs']}"] for x in lines]))
    print(f"costs: {gpu_preset().source}; 2 more round trips through vLLM's front end for the verify request, "
          "not priced", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
