"""Run modes side by side on the same items, interleaved, and summarise ratios to `ar`."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from ..api import SSR
from ..config import GenerationConfig
from ..lossless import first_divergence
from .suites import Item

TEMPLATES = {"humaneval": "code", "classeval": "code"}  # LongProc prompts ask for other formats


def template_for(suite: str) -> str:
    return TEMPLATES.get(suite, "plain")


def run_item(model: SSR, item: Item, modes: list[str], config: GenerationConfig, repeat: int,
             template: str | None = None) -> list[dict]:
    """Every mode once on one item; the order alternates with the repeat to cancel drift."""
    template = template or template_for(item.suite)
    order = modes if repeat % 2 == 0 else modes[::-1]
    generations = {mode: model.start(item.prompt, replace(config, mode=mode), template) for mode in order}
    results = {mode: generation.run() for mode, generation in generations.items()}
    prompt_ids = generations[modes[0]].prompt_ids
    rows = []
    for mode in modes:
        result = results[mode]
        divergence = None
        if mode != "ar" and "ar" in results:
            divergence = first_divergence(model.engine, prompt_ids, results["ar"], result)
        rows.append({
            "suite": item.suite, "item": item.item_id, "repeat": repeat, "mode": mode,
            "metrics": result.metrics.as_dict(), "answer": result.answer,
            "identical": divergence is None, "logit_gap": divergence.logit_gap if divergence else None,
            "divergence": divergence.describe() if divergence else None,
            "cot_ids": result.cot_ids, "draft_ids": result.draft_ids, "forced_ids": result.forced_ids,
            "answer_ids": result.answer_ids, "trace": result.trace,
        })
    return rows


def run_bench(model: SSR, items: list[Item], modes: list[str], config: GenerationConfig, repeats: int,
              out_path: Path, progress: bool = True) -> list[dict]:
    """Runs and writes JSONL rows to out_path as each item finishes (Ctrl-C keeps them)."""
    from tqdm import tqdm

    out_path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    bar = tqdm(total=repeats * len(items), unit="item", disable=not progress, dynamic_ncols=True)
    with out_path.open("w", encoding="utf-8") as out:
        for repeat in range(repeats):
            for item in items:
                bar.set_description(f"{item.suite} {item.item_id}")
                item_rows = run_item(model, item, modes, config, repeat)
                for row in item_rows:
                    out.write(json.dumps(row) + "\n")
                out.flush()
                rows.extend(item_rows)
                bar.update(1)
    bar.close()
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per (suite, mode): median latency, median per-run ratio to ar, acceptance, identity."""
    ar_total = {(r["suite"], r["item"], r["repeat"]): r["metrics"]["total_s"] for r in rows if r["mode"] == "ar"}
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["suite"], row["mode"])].append(row)
    table = []
    for (suite, mode), group in groups.items():
        metrics = [r["metrics"] for r in group]
        ratios = [m["total_s"] / ar_total[(r["suite"], r["item"], r["repeat"])]
                  for r, m in zip(group, metrics) if (r["suite"], r["item"], r["repeat"]) in ar_total]
        table.append({
            "suite": suite, "mode": mode, "runs": len(group),
            "median_s": statistics.median(m["total_s"] for m in metrics),
            "median_first_answer_s": statistics.median(m["first_answer_token_s"] for m in metrics),
            "ratio_to_ar": statistics.median(ratios) if ratios else None,
            "mean_accepted_prefix": statistics.mean(m["accepted_prefix_tokens"] for m in metrics),
            "mean_suffix_accepted": statistics.mean(m["suffix_accepted_tokens"] for m in metrics),
            "mean_answer_tokens": statistics.mean(m["answer_tokens"] for m in metrics),
            "identical": sum(r["identical"] for r in group),
        })
    return sorted(table, key=lambda t: (t["suite"], t["mode"] != "ar", t["mode"]))


def format_table(table: list[dict]) -> str:
    header = (f"{'suite':22s} {'mode':11s} {'runs':>4s} {'median s':>9s} {'1st ans s':>9s} {'ratio':>6s} "
              f"{'prefix acc':>10s} {'suffix acc':>10s} {'answer tok':>10s} {'identical':>9s}")
    lines = [header, "-" * len(header)]
    for t in table:
        ratio = f"{t['ratio_to_ar']:.3f}" if t["ratio_to_ar"] is not None else "-"
        lines.append(
            f"{t['suite']:22s} {t['mode']:11s} {t['runs']:4d} {t['median_s']:9.2f} {t['median_first_answer_s']:9.2f} "
            f"{ratio:>6s} {t['mean_accepted_prefix']:10.1f} {t['mean_suffix_accepted']:10.1f} "
            f"{t['mean_answer_tokens']:10.1f} {t['identical']:>4d}/{t['runs']:<4d}"
        )
    return "\n".join(lines)
