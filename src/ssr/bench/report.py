"""From bench rows (JSONL) to tables, report.md and plots; rebuildable at any time.

A row is one (suite, item, repeat, mode) run, as `runner.run_item` writes it.
Ratios to `ar` are paired: per item, mode seconds / ar seconds (mean over repeats);
a suite's ratio is the median over items, with a percentile bootstrap 95% interval
that resamples items.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..config import DRAFT_MODES
from ..metrics import STAGES, current_names
from .requests import format_requests, requests_table
from .sources import ANSWER_SOURCES, COT_SOURCES, sources_table

MODE_ORDER = ("ar", "ssr", "ssr-prefix", "ssr-suffix", "paper", "suffix", "pld", "ngram", "ngram-v1", "vllm-ngram",
              "arctic-tree", "sglang-ngram", "sglang-ngram-prob", "llamacpp-ngram-simple", "llamacpp-ngram-mod",
              "oracle", "oracle-anchored")


def load_rows(paths: Iterable[Path]) -> list[dict]:
    """Rows from JSONL files, or from `runs.jsonl` in folders; torn last lines skipped."""
    rows = []
    for path in paths:
        path = path / "runs.jsonl" if path.is_dir() else path
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by Ctrl-C
            if isinstance(row.get("metrics"), dict):
                row["metrics"] = current_names(row["metrics"])
            rows.append(row)
    return rows


def attach_quality(rows: list[dict], scorer: Callable[[str, str, str], dict], cache_path: Path | None) -> None:
    """Sets row["quality"] = scorer(suite, item, answer); results cached by answer hash."""
    cache = json.loads(cache_path.read_text()) if cache_path and cache_path.exists() else {}
    for row in rows:
        if "quality" in row:
            continue
        key = f"{row['suite']}|{row['item']}|{hashlib.sha1(row['answer'].encode()).hexdigest()}"
        if key not in cache:
            cache[key] = scorer(row["suite"], row["item"], row["answer"])
        row["quality"] = cache[key]
    if cache_path:
        cache_path.write_text(json.dumps(cache, indent=0))


def bootstrap_median(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of the median, resampling the values with replacement."""
    data = np.asarray(values, dtype=np.float64)
    if len(data) < 2:
        return (float(data[0]), float(data[0])) if len(data) else (float("nan"), float("nan"))
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    medians = np.median(data[picks], axis=1)  # [resamples]
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def group_name(row: dict) -> str:
    """The table a row belongs to: its suite, with the engine named when not llama.cpp."""
    engine = row.get("engine", "llama.cpp")
    return row["suite"] if engine == "llama.cpp" else f"{row['suite']} [{engine}]"


STAGE_KEYS = {"cot": ("cot",), "answer": ("verify", "continuation")}  # CoT and answer stages apart


def _seconds(metrics: dict, key: str) -> float:
    """metrics[key], or for a STAGE_KEYS name the seconds of its stages."""
    if key in STAGE_KEYS:
        return sum(metrics["seconds"][stage] for stage in STAGE_KEYS[key])
    return metrics[key]


def item_ratios(rows: list[dict], key: str = "total_s") -> dict[tuple[str, str], dict[str, float]]:
    """(suite, mode) -> {item: mean over repeats of metrics[key] / ar's metrics[key]}; key may
    also be "cot" or "answer" (stage seconds)."""
    ar = {(group_name(r), r["item"], r["repeat"]): _seconds(r["metrics"], key) for r in rows if r["mode"] == "ar"}
    collected: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        base = ar.get((group_name(row), row["item"], row["repeat"]))
        if base:
            collected[(group_name(row), row["mode"])][row["item"]].append(_seconds(row["metrics"], key) / base)
    return {group: {item: statistics.mean(v) for item, v in items.items()} for group, items in collected.items()}


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (suite, mode): medians, paired ratio to ar with its interval, acceptance,
    quality and identity."""
    ratios = item_ratios(rows)
    stage_ratios = {name: item_ratios(rows, name) for name in STAGE_KEYS}
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(group_name(row), row["mode"])].append(row)
    table = []
    for (suite, mode), group in groups.items():
        metrics = [r["metrics"] for r in group]
        item_ratio = list(ratios.get((suite, mode), {}).values())
        scored = [r["quality"]["value"] for r in group if r.get("quality")]
        table.append({
            "suite": suite, "mode": mode, "runs": len(group), "items": len({r["item"] for r in group}),
            "median_s": statistics.median(m["total_s"] for m in metrics),
            "median_first_answer_s": statistics.median(m["first_answer_token_s"] for m in metrics),
            "stage_s": {s: statistics.median(m["seconds"][s] for m in metrics) for s in STAGES},
            "ratio_to_ar": statistics.median(item_ratio) if item_ratio else None,
            "ratio_ci": bootstrap_median(item_ratio) if item_ratio else None,
            "stage_ratio": {name: _median(list(by_group.get((suite, mode), {}).values()))
                            for name, by_group in stage_ratios.items()},
            "mean_cot_accepted": statistics.mean(m.get("cot_accepted_tokens", 0) for m in metrics),
            "mean_accepted_prefix": statistics.mean(m["accepted_prefix_tokens"] for m in metrics),
            "mean_answer_accepted": statistics.mean(m["answer_accepted_tokens"] for m in metrics),
            "mean_answer_tokens": statistics.mean(m["answer_tokens"] for m in metrics),
            "quality": statistics.mean(scored) if scored else None,
            "identical": sum(bool(r["identical"]) for r in group),
            "host_ms_per_pass": _host_ms_per_pass(metrics),
        })
    return sorted(table, key=lambda t: (t["suite"], _mode_rank(t["mode"])))


def _host_ms_per_pass(metrics: list[dict]) -> float | None:
    """The loop's own host milliseconds per forward pass over the group (metrics.host_s; rows
    written before it was measured have none)."""
    timed = [m for m in metrics if m.get("engine_passes")]
    if not timed:
        return None
    return 1e3 * sum(m["host_s"] for m in timed) / sum(m["engine_passes"] for m in timed)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mode_rank(mode: str) -> int:
    return MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(table: list[dict], markdown: bool = False) -> str:
    """Plain text for the terminal, or a markdown table."""
    columns = ["suite", "mode", "runs", "median s", "1st answer s", "ratio to ar (95% CI)", "cot ratio",
               "answer ratio", "cot acc", "prefix acc", "span acc", "answer tok", "host ms/pass", "quality",
               "identical"]
    lines = []
    for t in table:
        ci = t["ratio_ci"]
        ratio = "-" if t["ratio_to_ar"] is None else (
            f"{t['ratio_to_ar']:.3f} ({ci[0]:.3f}-{ci[1]:.3f})" if ci else f"{t['ratio_to_ar']:.3f}")
        lines.append([t["suite"], t["mode"], str(t["runs"]), _fmt(t["median_s"]), _fmt(t["median_first_answer_s"]),
                      ratio, _fmt(t["stage_ratio"]["cot"], 3), _fmt(t["stage_ratio"]["answer"], 3),
                      _fmt(t["mean_cot_accepted"], 1), _fmt(t["mean_accepted_prefix"], 1), _fmt(t["mean_answer_accepted"], 1),
                      _fmt(t["mean_answer_tokens"], 1), _fmt(t["host_ms_per_pass"], 3), _fmt(t["quality"]),
                      f"{t['identical']}/{t['runs']}"])
    return render_table(columns, lines, markdown)


def render_table(columns: list[str], lines: list[list[str]], markdown: bool = False) -> str:
    """Markdown, or aligned plain text (first two columns left, the rest right)."""
    if markdown:
        out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(c), *(len(line[i]) for line in lines)) if lines else len(c) for i, c in enumerate(columns)]

    def render(cells: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths)))

    return "\n".join([render(columns), "-" * (sum(widths) + 2 * len(widths))] + [render(line) for line in lines])


def drafting_table(rows: list[dict]) -> list[dict]:
    """Per (suite, mode) that drafts: how often the policy drafted, the stages, what
    bootstrapping took over and the draft-child seconds it saved (estimated per stage as
    its bootstrapped tokens at the child's own seconds per written token)."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        if "policy" in row["metrics"] and row["mode"] in DRAFT_MODES:
            groups[(group_name(row), row["mode"])].append(row["metrics"])
    table = []
    for (suite, mode), metrics in sorted(groups.items()):
        stages = [stage for m in metrics for stage in m["stages"]]
        later = [stage for m in metrics for stage in m["stages"][1:]]
        child_s = sum(stage["seconds"] for stage in stages)
        without_s = sum(stage["seconds_without_bootstrap"] for stage in stages)
        reasons = Counter(m["policy"]["explain"].get("reason", "").split(":")[0] for m in metrics)
        table.append({
            "suite": suite, "mode": mode, "runs": len(metrics),
            "drafted": sum(bool(m["stages"]) for m in metrics),
            "stages": statistics.mean(len(m["stages"]) for m in metrics),
            "draft_tokens": statistics.mean(m["draft_tokens"] for m in metrics),
            "bootstrapped": statistics.mean(stage["bootstrapped"] for stage in later) if later else None,
            "stage_accepted": [statistics.mean(m["stages"][i]["accepted"] for m in metrics if len(m["stages"]) > i)
                               for i in range(max((len(m["stages"]) for m in metrics), default=0))],
            "child_s": child_s, "saved_fraction": 1 - child_s / without_s if without_s > 0 else None,
            "reasons": dict(reasons),
        })
    return table


def format_drafting(table: list[dict], markdown: bool = False) -> str:
    columns = ["suite", "mode", "runs", "drafted", "stages", "draft tok", "bootstrapped",
               "accepted per stage", "child s", "child s saved", "policy"]
    lines = [[t["suite"], t["mode"], str(t["runs"]), str(t["drafted"]), _fmt(t["stages"], 1),
              _fmt(t["draft_tokens"], 1), _fmt(t["bootstrapped"], 1),
              " / ".join(f"{a:.0f}" for a in t["stage_accepted"][:6]) or "-", _fmt(t["child_s"], 1),
              "-" if t["saved_fraction"] is None else f"{t['saved_fraction']:.1%}",
              ", ".join(f"{k} x{v}" for k, v in t["reasons"].items())] for t in table]
    return render_table(columns, lines, markdown)


def write_report(rows: list[dict], out_dir: Path, config_note: str = "", extra: str = "") -> Path:
    """report.md (one table per suite, then `extra`), stages.png and ratios.png."""
    table = summarise(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = ["# ssr bench report", ""]
    if config_note:
        parts += [config_note, ""]
    parts += ["Latency ratio = mode seconds / `ar` seconds on the same item (median over items, "
              "bootstrap 95% interval over items). Quality: the suite's metric (HumanEval and "
              "ClassEval pass@1, LongProc accuracy or row F1). Identical: output token-identical to `ar`.", ""]
    for suite in sorted({t["suite"] for t in table}):
        parts += [f"## {suite}", "", format_table([t for t in table if t["suite"] == suite], markdown=True), ""]
        notes = sorted({f"{r['item']}: {r['quality']['note']}" for r in rows
                        if group_name(r) == suite and r.get("quality") and r["quality"].get("note")})
        if notes:
            parts += ["Environment-dependent items (scored, marked): " + "; ".join(notes), ""]
    drafting = drafting_table(rows)
    if drafting:
        parts += _section("Drafting (policy, stages, bootstrapping)",
                          "drafted: requests that forked a child; accepted per stage: tokens of stage k's draft kept "
                          "by stage k+1's bootstrap (the last: by the parent's verify); child s saved: draft-child "
                          "seconds bootstrapping saved vs decoding the taken-over tokens.",
                          format_drafting(drafting, markdown=True))
    sources = sources_table(rows, group_name)
    if sources:
        parts += _section("Accepted tokens by source (mean per run)",
                          "Each accepted token goes to the first text holding the 4-gram that ends at it: the draft's "
                          "accepted prefix; answer span tokens: prompt, CoT, draft (only there), the answer's own "
                          "earlier text, other; CoT span tokens: prompt, the CoT's own earlier text, other "
                          "(bench/sources.py).", format_sources(sources, markdown=True))
    requests = requests_table(rows, group_name)
    if requests:
        parts += _section("After the CoT on vLLM (requests and passes per client request)",
                          "vLLM requests: all a client request made (parent, children, verify, answer); round trips: "
                          "requests after the CoT, each submitted once the one before returned; passes and tokens fed "
                          "after the CoT on the request's critical path, priced on the GPU preset in decode steps; "
                          "measured s: the CoT's end to the answer's end on this machine (bench/requests.py).",
                          format_requests(requests, render_table, markdown=True))
    plots = _plots(table, out_dir)
    parts += [f"![{name}]({name})" for name in plots] + ([""] if plots else [])
    if extra:
        parts += [extra, ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _section(title: str, explanation: str, table: str) -> list[str]:
    return [f"## {title}", "", explanation, "", table, ""]


def format_sources(table: list[dict], markdown: bool = False) -> str:
    names = ANSWER_SOURCES + COT_SOURCES
    lines = [[t["suite"], t["mode"], str(t["runs"])] + [f"{t[name]:.1f}" for name in names] for t in table]
    return render_table(["suite", "mode", "runs"] + list(names), lines, markdown)


def _plots(table: list[dict], out_dir: Path) -> list[str]:
    """Stacked stage seconds per mode (one panel per suite) and ratio to ar per suite."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    suites = sorted({t["suite"] for t in table})
    fig, axes = plt.subplots(1, len(suites), figsize=(4.5 * len(suites), 4), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        lines = [t for t in table if t["suite"] == suite]
        bottom = np.zeros(len(lines))
        for stage in ("prefill", "cot", "verify", "continuation"):  # "draft" overlaps "cot"
            heights = np.array([t["stage_s"][stage] for t in lines])
            ax.bar([t["mode"] for t in lines], heights, bottom=bottom, label=stage)
            bottom += heights
        ax.set_title(suite)
        ax.set_ylabel("median seconds")
        ax.tick_params(axis="x", rotation=45)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "stages.png", dpi=100)
    plt.close(fig)
    modes = [m for m in MODE_ORDER if m != "ar" and any(t["mode"] == m for t in table)]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(suites) * len(modes) / 2), 4))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        lines = [next((t for t in table if t["suite"] == s and t["mode"] == mode and t["ratio_to_ar"]), None)
                 for s in suites]
        xs = [j + i * width for j, line in enumerate(lines) if line]
        ratios = [line["ratio_to_ar"] for line in lines if line]
        errors = np.array([[line["ratio_to_ar"] - line["ratio_ci"][0], line["ratio_ci"][1] - line["ratio_to_ar"]]
                           for line in lines if line]).T.reshape(2, -1)
        ax.bar(xs, ratios, width, yerr=errors, capsize=2, label=mode)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(suites))], suites, rotation=20)
    ax.set_ylabel("latency / ar (lower is faster)")
    if ax.get_legend_handles_labels()[1]:  # no bars when ar ran alone
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "ratios.png", dpi=100)
    plt.close(fig)
    return ["stages.png", "ratios.png"]
