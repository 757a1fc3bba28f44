"""Run modes side by side on the same items, interleaved, and summarise ratios to `ar`."""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from ..api import SSR
from ..config import GenerationConfig
from ..formats.thinking import detect_format
from ..verifying.lossless import first_divergence
from ..proposing.history import ResponseHistory
from .suites import Item

# code tasks get a prose-plan template with the answer opened as a code block; the
# other LongProc tasks ask for free-form procedures
TEMPLATES = {"functions": "code", "humaneval": "code", "classeval": "code", "longproc:pseudo_to_code": "cpp",
             "longproc:tom_tracking": "trace"}


def template_for(suite: str) -> str:
    return TEMPLATES.get(suite, "plain")


def bench_template(model: SSR, suite: str) -> str:
    """The thinking format an item runs in: --template where given; else the model's own where it
    has one (a reasoning model is measured as it is served); else the suite's template."""
    if model.template != "auto":
        return model.template
    return "auto" if detect_format(model.engine.chat_template).native else template_for(suite)


def run_item(model: SSR, item: Item, modes: list[str], config: GenerationConfig, repeat: int,
             template: str | None = None, flip: bool = False, engine: str = "llama.cpp",
             histories: dict[str, ResponseHistory] | None = None) -> list[dict]:
    """Every mode once on one item; the order is reversed when `flip` (alternate it per
    item and repeat to cancel drift). histories: per mode, the earlier items' responses of this
    pass (never this item's: not another mode's, not another repeat's)."""
    template = template or bench_template(model, item.suite)
    order = modes[::-1] if flip else modes
    histories = histories if histories is not None else {mode: ResponseHistory(0) for mode in modes}
    earlier = {mode: len(histories[mode].responses) for mode in modes}  # responses each mode could copy from
    generations = {mode: model.start(item.prompt, replace(config, mode=mode), template, histories[mode])
                   for mode in order}
    first_request = getattr(model.engine, "last_number", 0) + 1  # vLLM: this item's first request
    results = {}
    for index, (mode, generation) in enumerate(generations.items()):
        if index:  # vLLM's suffix cache: no run copies this item's answer from another mode's run
            _forget_responses(model, since=first_request)
        results[mode] = generation.run()
    prompt_ids = generations[modes[0]].prompt_ids
    rows = []
    for mode in modes:
        result = results[mode]
        divergence = None
        if mode != "ar" and "ar" in results:
            divergence = first_divergence(model.engine, prompt_ids, results["ar"], result)
        rows.append({
            "suite": item.suite, "item": item.item_id, "repeat": repeat, "mode": mode, "engine": engine,
            "position": order.index(mode), "config": asdict(generations[mode].config),
            "prompt_ids": prompt_ids, "answer_prefix_ids": generations[mode].answer_prefix_ids,
            "forced_end_ids": generations[mode].forced_end_ids, "history_responses": earlier[mode],
            "metrics": result.metrics.as_dict(), "answer": result.answer,
            "identical": divergence is None, "logit_gap": divergence.logit_gap if divergence else None,
            "divergence": divergence.describe() if divergence else None,
            "cot_ids": result.cot_ids, "draft_ids": result.draft_ids, "forced_ids": result.forced_ids,
            "answer_ids": result.answer_ids, "trace": result.trace,
        })
    return rows


def run_bench(models: dict[str, SSR], items: list[Item], modes: list[str], config: GenerationConfig,
              repeats: int, out_path: Path, progress: bool = True) -> list[dict]:
    """Every mode on every engine's model ({engine name: model}) per item; writes JSONL rows to
    out_path as each item finishes (Ctrl-C keeps them)."""
    from tqdm import tqdm

    out_path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    bar = tqdm(total=repeats * len(items), unit="item", disable=not progress, dynamic_ncols=True)
    with out_path.open("w", encoding="utf-8") as out:
        for repeat in range(repeats):
            # each (engine, mode) copies from the earlier items of this pass only
            histories = {engine: {mode: ResponseHistory() for mode in modes} for engine in models}
            for model in models.values():  # vLLM's own cache of responses: nothing from another pass
                _forget_responses(model, since=1)
            for index, item in enumerate(items):
                bar.set_description(f"{item.suite} {item.item_id}")
                flip = (repeat + index) % 2 == 1
                engines = list(models)[::-1] if flip else list(models)
                item_rows = [row for engine in engines for row in run_item(
                    models[engine], item, modes, config, repeat, flip=flip, engine=engine,
                    histories=histories[engine])]
                for row in item_rows:
                    out.write(json.dumps(row) + "\n")
                out.flush()
                rows.extend(item_rows)
                bar.update(1)
    bar.close()
    return rows


def _forget_responses(model: SSR, since: int) -> None:
    """Engines that keep earlier responses inside (vLLM's suffix method) drop those of the
    requests numbered `since` or later; the others keep theirs in `histories`."""
    forget = getattr(model.engine, "forget_responses", None)
    if forget is not None:
        forget(since)
