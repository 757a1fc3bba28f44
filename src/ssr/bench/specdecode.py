"""The replay's GPU projections held against a GPU's measurement: SpecDecode-Bench's outputs
(Llama-3.1-8B-Instruct on one H100, vLLM 0.10.1.1, greedy), priced with their fitted H100 costs
(`specdecode-h100`, pricing/costs.py), set beside the speedups their Figure 1 measured.

    python -m ssr.bench.specdecode FILE... [--batch 1,16] [--k 3,5] [--ssr tree,forks,chain] [--limit N]

Per workload (a file) and batch (their batch: one prompt repeated, every copy in one step):
- predicted: vLLM's n-gram (the `ngram-v1` peer at prompt_lookup_min 3, prompt_lookup_max 7, k
  drafted tokens) and EAGLE (`recorded-eagle`: the acceptance their EAGLE run recorded, played
  back at k), each with its drafting cost from their fit, against `ar` on the same costs;
- measured: their Figure 1, read off the plot (FIGURE below), and predicted / measured;
- ssr on the same outputs and costs, as a token tree, as forks and as one chain (what vLLM
  verifies), with its loop's host time measured here added to every step (a step waits for every
  request's), beside vLLM's n-gram.

A speedup is theirs: the throughput ratio (generated tokens over a request's latency, averaged
over requests; simulator.py, simulate_like_experiment); the ratio of summed latencies is printed
beside it. Differences from their simulator kept on purpose: the n-gram replay searches for real
where their simulator draws whether a draft was proposed at random (p = 0.2 on GSM8K, 0.8 on
InstructCoder), their simulator reads a step's acceptance one position early (acc_len at
cur_gen_len - 1; the record's own meaning, checked by bench/acceptance.py, is at the step's
start), and every request of a file is replayed (their figure: a random 300).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from ..pricing.costs import specdecode_h100
from ..proposing.lookup import NgramSettings
from .trace_replay import CostSetting, replay_trace
from .traces import load_traces, tokenize_trace

# Their Figure 1 (Llama3.1-8B row), read off the plot at batch 1 and 16 (about +-0.02); a workload
# is named by the file's name. acc_eagle is what their simulator replays as EAGLE-3.
FIGURE = {
    "gsm8k": {"n-gram k=3": (1.17, 1.15), "EAGLE": (1.73, 1.68), "EAGLE-3": (1.76, 1.70)},
    "instructcoder": {"n-gram k=3": (1.89, 1.74), "n-gram k=5": (2.10, 1.89), "EAGLE": (1.97, 1.84),
                      "EAGLE-3": (2.02, 1.89)},
    "cnn": {"n-gram k=3": (1.34, 1.29), "EAGLE": (1.45, 1.40), "EAGLE-3": (1.68, 1.57)},
    "sharegpt": {"n-gram k=3": (1.28, 1.25), "EAGLE": (1.66, 1.66), "EAGLE-3": (1.71, 1.68)},
}
FIGURE_BATCHES = (1, 16)
NGRAM = (3, 7)  # their prompt_lookup_min, prompt_lookup_max


def workload(path: Path) -> str | None:
    """The figure's workload a file holds, by its name."""
    name = path.name.lower()
    return next((key for key in FIGURE if key in name.replace("-", "").replace("_", "")), None)


def speedups(rows: list[dict], base: list[dict], batch: int, host: bool = False) -> tuple[float, float]:
    """(their throughput ratio, the ratio of summed latencies) of rows against base, item by item;
    host: each row's loop host time added, once per request in the step."""
    def seconds(row: dict) -> float:
        return row["metrics"]["total_s"] + (row["host"]["s"] * batch if host else 0.0)

    ar = {row["item"]: row for row in base}
    pairs = [(row, ar[row["item"]]) for row in rows if row["item"] in ar]
    tokens = [r["metrics"]["cot_tokens"] + r["metrics"]["answer_tokens"] for r, _ in pairs]
    fast = statistics.mean(n / seconds(r) for n, (r, _) in zip(tokens, pairs))
    slow = statistics.mean(n / seconds(a) for n, (_, a) in zip(tokens, pairs))
    return fast / slow, sum(seconds(a) for _, a in pairs) / sum(seconds(r) for r, _ in pairs)


def replay_file(path: Path, batches: list[int], ks: list[int], ssr_shapes: list[str], limit: int | None,
                progress: bool) -> dict[tuple[int, str], list[dict]]:
    """(batch, row name) -> rows: ar, vLLM's n-gram and EAGLE at each k, ssr in each shape."""
    from tqdm import tqdm

    traces = [tokenize_trace(trace, None) for trace in load_traces([path], limit)]
    jobs = [("ar", "ar", {}), *((f"n-gram k={k}", "ngram-v1", {"ngram": NgramSettings(*NGRAM, k)}) for k in ks),
            *((f"EAGLE k={k}", "recorded-eagle", {"recorded_k": k}) for k in ks),
            *((f"ssr {shape}", "ssr", {"candidates": shape}) for shape in ssr_shapes)]
    out: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for _, mode, options in jobs:  # a first replay in each mode, not kept: imports and first calls off the host time
        replay_trace(traces[0], mode, CostSetting("warm-up", specdecode_h100()), "cold", **{"candidates": "chain", **options})
    steps = [(batch, job, tokens) for batch in batches for job in jobs for tokens in traces]
    settings = {batch: CostSetting(f"specdecode-h100@{batch}", specdecode_h100().at_batch(batch), batch)
                for batch in batches}  # one table a batch (a CostModel keeps its pass prices by table)
    for batch, (name, mode, options), tokens in tqdm(steps, unit="replay", desc=path.name, disable=not progress):
        setting = settings[batch]
        options = {"candidates": "chain", **options}
        out[(batch, name)].append(replay_trace(tokens, mode, setting, "cold", **options))
    return out


def report(path: Path, rows: dict[tuple[int, str], list[dict]], batches: list[int]) -> list[str]:
    """The file's lines: predicted against measured, then ssr beside vLLM's n-gram."""
    measured = FIGURE.get(workload(path) or "", {})
    lines = [f"{path.name}: {len(rows[(batches[0], 'ar')])} requests; speedup = throughput ratio (their metric), "
             "[ratio of summed latencies]"]
    names = sorted({name for _, name in rows if name != "ar" and not name.startswith("ssr")})
    for batch in batches:
        base = rows[(batch, "ar")]
        for name in names:
            tput, summed = speedups(rows[(batch, name)], base, batch)
            figure = _figure(measured, name, batch)
            against = "; ".join(f"{label} measured {value:.2f}, predicted / measured {tput / value:.3f}"
                                for label, value in figure)
            lines.append(f"  batch {batch:>3}  {name:<12} predicted {tput:.3f} [{summed:.3f}]"
                         + (f"  ({against})" if against else ""))
        ngram = rows.get((batch, "n-gram k=3"))
        ngram_ratio = 1 / speedups(ngram, base, batch)[1] if ngram else None
        for name in sorted(name for b, name in rows if b == batch and name.startswith("ssr")):
            bare, with_host = (1 / speedups(rows[(batch, name)], base, batch, host)[1] for host in (False, True))
            tput = speedups(rows[(batch, name)], base, batch, host=True)[0]
            host_ms = 1e3 * sum(r["host"]["s"] for r in rows[(batch, name)]) / max(1, sum(
                r["host"]["passes"] for r in rows[(batch, name)]))
            lines.append(f"  batch {batch:>3}  {name:<12} ratio to ar {bare:.3f}, with host time {with_host:.3f} "
                         f"({host_ms:.2f} ms a pass here; speedup {tput:.3f})"
                         + (f"; / n-gram k=3's {ngram_ratio:.3f} = {with_host / ngram_ratio:.3f}" if ngram_ratio else ""))
    return lines


def _figure(measured: dict, name: str, batch: int) -> list[tuple[str, float]]:
    """The figure's values for a predicted row (EAGLE k: the figure's EAGLE and EAGLE-3 lines)."""
    if batch not in FIGURE_BATCHES:
        return []
    at = FIGURE_BATCHES.index(batch)
    labels = ["EAGLE-3", "EAGLE"] if name.startswith("EAGLE") else [name]
    return [(label, measured[label][at]) for label in labels if label in measured]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssr.bench.specdecode", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="SpecDecode-Bench JSONL (gzip or not): prompt_token_ids, "
                                                 "generated_token_ids, acc_eagle")
    parser.add_argument("--batch", default="1,16", help="batch sizes, comma-separated (default 1,16)")
    parser.add_argument("--k", default="3,5", help="draft tokens a step, comma-separated (default 3,5)")
    parser.add_argument("--ssr", default="tree,forks,chain", help="ssr's shapes: tree, forks, chain ('' for none)")
    parser.add_argument("--limit", type=int, default=None, help="the first N requests of each file")
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch.split(",") if b.strip()]
        ks = [int(k) for k in args.k.split(",") if k.strip()]
    except ValueError:
        parser.error("--batch and --k take integers, comma-separated")
    shapes = [s.strip() for s in args.ssr.split(",") if s.strip()]
    if not batches or min(batches) < 1 or not ks or min(ks) < 1 or not set(shapes) <= {"tree", "forks", "chain"}:
        parser.error("--batch and --k take integers >= 1; --ssr takes tree, forks and/or chain")
    for name in args.files:
        path = Path(name)
        if not path.is_file():
            parser.error(f"no such file: {path}")
        rows = replay_file(path, batches, ks, shapes, args.limit, sys.stderr.isatty())
        print("\n".join(report(path, rows, batches)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
