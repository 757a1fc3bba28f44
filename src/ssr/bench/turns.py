"""Agent conversations in `ssr traces`: each mode's ratio to `ar` split by turn (a
conversation's first assistant turn against the later ones, whose prompts hold earlier calls and
tool results), and tokens committed per forward pass split by part of the output (reasoning;
the answer's content; a tool call's frame; its arguments).

Per part, a pass's committed tokens are shared among the parts they belong to: a pass that
commits 4 argument tokens and 1 frame token counts 0.8 of a pass to the arguments.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

PARTS = ("content", "call", "arguments")


def part_runs(labels) -> list[list]:
    """Per-token part labels, run-length coded for a row: [[part, count], ...]."""
    runs: list[list] = []
    for label in labels:
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    return runs


def answer_passes(row: dict) -> dict[str, tuple[float, float]]:
    """Part -> (tokens, passes) of a row's answer. The first answer token comes with the pass that
    closes the CoT; a span pass commits its accepted tokens and one more; the rest are steps."""
    labels = [part for part, count in row.get("parts") or [["content", len(row["answer_ids"])]]
              for _ in range(count)]
    share = [1.0] * len(labels)  # the share of a pass each position's token costs
    for event in row["trace"]:
        if event.get("kind") != "span":
            continue
        committed = event["accepted"] + 1
        for position in range(event["at"], min(event["at"] + committed, len(labels))):
            share[position] = 1.0 / committed
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for label, cost in zip(labels, share):
        out[label][0] += 1
        out[label][1] += cost
    return {label: (tokens, passes) for label, (tokens, passes) in out.items()}


def turn_table(rows: list[dict]) -> list[dict]:
    """Per (suite, engine, mode) of conversation rows: median ratio to ar on turn 1 and on later
    turns, and tokens per pass for the reasoning and each answer part."""
    conversation = [r for r in rows if r.get("turn")]
    ar = {(r["suite"], r["engine"], r["item"]): r["metrics"]["total_s"] for r in conversation if r["mode"] == "ar"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in conversation:
        groups[(row["suite"], row["engine"], row["mode"])].append(row)
    table = []
    for (suite, engine, mode), group in sorted(groups.items()):
        ratios: dict[str, list[float]] = {"first": [], "later": []}
        tokens: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for row in group:
            base = ar.get((suite, engine, row["item"]))
            if base:
                ratios["first" if row["turn"] == 1 else "later"].append(row["metrics"]["total_s"] / base)
            m = row["metrics"]
            tokens["reasoning"][0] += m["cot_tokens"]
            tokens["reasoning"][1] += m["cot_steps"] + m["cot_passes"]
            for part, (count, passes) in answer_passes(row).items():
                tokens[part][0] += count
                tokens[part][1] += passes
        table.append({"suite": suite, "engine": engine, "mode": mode,
                      "turns": {k: len(v) for k, v in ratios.items()},
                      "ratio": {k: statistics.median(v) if v else None for k, v in ratios.items()},
                      "per_pass": {part: (t / p if p else None) for part, (t, p) in tokens.items()},
                      "tokens": {part: t for part, (t, _) in tokens.items()}})
    return table


def format_turn_table(table: list[dict], markdown: bool = False) -> str:
    from .report import render_table

    def cell(value, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    columns = ["suite", "mode", "engine", "turns 1 / later", "ratio turn 1", "ratio later",
               "reasoning tok/pass", "content tok/pass", "call tok/pass", "arguments tok/pass", "argument tokens"]
    lines = [[t["suite"], t["mode"], t["engine"], f"{t['turns']['first']} / {t['turns']['later']}",
              cell(t["ratio"]["first"]), cell(t["ratio"]["later"])]
             + [cell(t["per_pass"].get(part), 2) for part in ("reasoning", *PARTS)]
             + [str(int(t["tokens"].get("arguments", 0)))] for t in table]
    return render_table(columns, lines, markdown)
