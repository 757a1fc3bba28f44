"""What SSR's draft child is worth on a real reasoning model: traces that record the answers the
model wrote from its own partial CoT (`drafts`), replayed in every draft mode with each choice of
drafts (bench/trace_drafts.py) beside the modes that fork none.

    python -m ssr.bench.draft_report FILE... [--drafts none,512,1024,2048,all,plan]
        [--modes ar,ssr,ssr-prefix,paper,suffix,sglang-ngram] [--orders cold,deployment]
        [--cost-model gpu] [--step2 STEPS] [--draft-tokens M] [--limit N]

Per (order, mode, drafts): the median whole-request ratio to `ar`, the median ratio of the time to
the first answer token (what a user waiting for the answer sees), the draft tokens accepted as the
answer's prefix and the answer tokens later spans took from the draft only (bench/sources.py), a
request's mean; and the draft's share of the time saved: (mode without drafts - mode) / (ar - mode),
summed over requests. Then, for `ssr`, each request's best choice in hindsight (among no draft and
each recorded budget) against the plan's: the summed seconds of each.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import replace

from ..config import MODE_TABLE, ConfigError
from ..pricing.costs import load_costs
from .report import render_table
from .sources import accepted_sources
from .trace_drafts import DraftChoice
from .trace_replay import CostSetting, replay_all
from .traces import tokenized_traces


def replay_choices(files: list[str], modes: list[str], choices: list[DraftChoice], orders: list[str],
                   setting: CostSetting, draft_tokens: int | None, limit: int | None) -> list[dict]:
    """Every trace in every (mode, choice): modes that fork no child once, with `none`."""
    traces = tokenized_traces(files, limit)
    if not any(t.drafts for t in traces):
        raise ConfigError("no trace in these files records draft children (`drafts`)")
    rows = []
    for choice in choices:
        drafting = [m for m in modes if MODE_TABLE[m].drafts] if choice.how != "none" else modes
        if drafting:
            rows += replay_all(traces, drafting, [setting], orders, progress=sys.stderr.isatty(), drafts=choice,
                               draft_tokens=draft_tokens)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """One line per (order, mode, drafts): the module docstring's columns."""
    def key(row: dict) -> tuple:
        return row["order"], row["item"]

    ar = {key(r): r["metrics"] for r in rows if r["mode"] == "ar"}
    undrafted = {(key(r), r["mode"]): r["metrics"]["total_s"] for r in rows if r["drafts"] == "none"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["order"], row["mode"], row["drafts"])].append(row)
    lines = []
    for (order, mode, drafts), group in sorted(groups.items()):
        paired = [r for r in group if key(r) in ar]
        sources = [accepted_sources(r) for r in paired]
        saved = sum(ar[key(r)]["total_s"] - r["metrics"]["total_s"] for r in paired)
        by_draft = sum(undrafted.get((key(r), mode), r["metrics"]["total_s"]) - r["metrics"]["total_s"] for r in paired)
        lines.append({
            "order": order, "mode": mode, "drafts": drafts, "runs": len(paired),
            "ratio": statistics.median(r["metrics"]["total_s"] / ar[key(r)]["total_s"] for r in paired),
            "first_answer": statistics.median(r["metrics"]["first_answer_token_s"] / ar[key(r)]["first_answer_token_s"]
                                              for r in paired),
            "prefix": statistics.mean(s["draft prefix"] for s in sources),
            "from_draft": statistics.mean(s["draft"] for s in sources),
            "draft_share": by_draft / saved if saved > 0 else 0.0,
            "forked": sum(1 for r in paired if r["metrics"]["stages"]),
            "identical": sum(bool(r["identical"]) for r in paired),
        })
    return lines


def hindsight(rows: list[dict], mode: str = "ssr") -> list[dict]:
    """Per order: the summed seconds of the plan's choices and of each request's best choice among
    no draft and one recorded budget, and how many requests the plan chose as well as hindsight."""
    seconds: dict[tuple, dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row["mode"] == mode and (row["drafts"] in ("none", "plan") or row["drafts"].startswith("b=")):
            seconds[(row["order"], row["item"])][row["drafts"]] = row["metrics"]["total_s"]
    out = []
    for order in sorted({order for order, _ in seconds}):
        items = [v for (o, _), v in seconds.items() if o == order and "plan" in v]
        best = [min(s for choice, s in v.items() if choice != "plan") for v in items]
        out.append({"order": order, "requests": len(items), "plan_s": sum(v["plan"] for v in items),
                    "best_s": sum(best), "none_s": sum(v.get("none", v["plan"]) for v in items),
                    "as_best": sum(1 for v, b in zip(items, best) if v["plan"] <= b * (1 + 1e-9))})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssr.bench.draft_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="traces with `drafts` (JSONL, gzip or not)")
    parser.add_argument("--drafts", default="none,512,1024,2048,all,plan", help="choices, comma-separated")
    parser.add_argument("--modes", default="ar,ssr,ssr-prefix,paper,suffix,sglang-ngram", help="modes, comma-separated")
    parser.add_argument("--orders", default="cold,deployment", help="cold and/or deployment")
    parser.add_argument("--cost-model", default="gpu", help="gpu, gpu:MS, specdecode-h100 or a calibrate JSON")
    parser.add_argument("--step2", type=float, default=None, metavar="STEPS",
                        help="a step of two sequences (a child beside the parent) costs STEPS steps (default the "
                             "cost model's; the paper's A6000: 1.19, from its CoT throughput -5.4%% while a draft "
                             "was active 29.5%% of the time)")
    parser.add_argument("--draft-tokens", type=int, default=None, help="m: tokens a child writes at most "
                                                                        "(default the mode's, 256)")
    parser.add_argument("--limit", type=int, default=None, help="traces per (set, model) group")
    args = parser.parse_args(argv)
    try:
        choices = [DraftChoice.parse(c) for c in args.drafts.split(",") if c.strip()]
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if "ar" not in modes:
            modes.insert(0, "ar")
        setting = CostSetting(args.cost_model, load_costs(args.cost_model))
        if args.step2 is not None:
            if not args.step2 >= 1:
                raise ConfigError(f"--step2 must be >= 1 (a step of one sequence), got {args.step2}")
            table = setting.costs
            setting = CostSetting(f"{args.cost_model}, step2 {args.step2:g}", replace(
                table, step_s={**table.step_s, 2: args.step2 * table.step_s[1],
                               4: max(table.step_s.get(4, 0.0), args.step2 * table.step_s[1])}))
        rows = replay_choices(args.files, modes, choices, [o.strip() for o in args.orders.split(",")], setting,
                              args.draft_tokens, args.limit)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    table = summary(rows)
    print(render_table(["order", "mode", "drafts", "runs", "ratio to ar", "1st answer token", "prefix tok",
                        "from draft tok", "draft's share of saved", "forked", "identical"],
                       [[t["order"], t["mode"], t["drafts"], str(t["runs"]), f"{t['ratio']:.3f}",
                         f"{t['first_answer']:.3f}", f"{t['prefix']:.1f}", f"{t['from_draft']:.1f}",
                         f"{t['draft_share']:.1%}", str(t["forked"]), f"{t['identical']}/{t['runs']}"] for t in table],
                       False))
    for line in hindsight(rows):
        print(f"\n{line['order']}: ssr's plan {line['plan_s']:.1f} s, best choice in hindsight {line['best_s']:.1f} s "
              f"(plan / best {line['plan_s'] / line['best_s']:.4f}), no draft {line['none_s']:.1f} s; the plan chose "
              f"as hindsight on {line['as_best']}/{line['requests']} requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
