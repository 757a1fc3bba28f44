"""Model-free replay of bench traces under a cost model (`ssr simulate`).

Under greedy decoding every mode writes the same tokens, so one bench row holds all
the model ever decided: the CoT, the draft the child wrote, the answer. Replaying a
row walks the same loop as `decode.Generation`, with the real proposers and span
policy, but instead of calling an engine it adds up what each call would cost:

    prefill     prefill(P - 1)
    think       steps with 1 sequence, or 2 while the draft child lives; fork = one score
    close       score(fed + first chunk), doubling chunks while the draft matches
    continue    propose -> score(1 + span) or a plain step -> accept the longest match

Accepted counts come from matching proposals against the row's own answer, so they
are exact; only the seconds are modelled.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace

from ..config import GenerationConfig, SamplingParams, SuffixParams
from ..policy import CostModel, SpanPolicy
from ..proposers import PromptLookupProposer, SuffixProposer
from ..costs import Costs
from .report import group_name, render_table

EOS = -1  # stands for whichever end-of-sequence token the model wrote


@dataclass
class Replay:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # stage -> modelled s
    accepted_prefix_tokens: int = 0
    suffix_accepted_tokens: int = 0
    answer_tokens: int = 0

    @property
    def total_s(self) -> float:
        return sum(v for k, v in self.seconds.items() if k != "draft")


def _common_prefix(proposed: list[int], target: list[int]) -> int:
    count = 0
    for a, b in zip(proposed, target):
        if a != b:
            break
        count += 1
    return count


def replay(row: dict, costs: Costs, config: GenerationConfig, answer_prefix_ids: list[int],
           spans: str = "policy") -> Replay:
    """Modelled seconds of one bench row under `costs` (its own mode, greedy).

    spans="policy" re-decides every span with the proposer and the span policy under
    `costs` (a projection); spans="recorded" replays the spans the run verified (its
    trace), so only the cost model is under test.
    """
    config = replace(config, mode=row["mode"])
    out = Replay()
    cot_ids, answer_ids = row["cot_ids"], row["answer_ids"]
    stopped_by_eos = row["metrics"]["stop"] == "eos"
    target = answer_ids + ([EOS] if stopped_by_eos else [])  # what the model commits
    forced = row["forced_ids"]
    forced_end_len = len(forced) - len(answer_prefix_ids)
    cot_end = row["metrics"]["cot_end"]
    prompt_len = len(row["prompt_ids"])
    out.seconds["prefill"] = costs.prefill(prompt_len - 1)

    # 1. think: one step per CoT token (and one more for an EOS); 2 sequences while the child lives
    #    (costs are linear in the cached length, so the mean context prices a whole stage)
    cot_steps = len(cot_ids) + (cot_end == "eos")
    config, draft_ids = _think(out, row, costs, config, cot_steps, forced_end_len + len(answer_prefix_ids))

    # 2. close: forced tokens, then the draft in chunks that double while all match
    fed = (0 if cot_end == "eos" else 1) + len(forced)
    checked = draft_ids[: config.max_tokens] if config.verifies_draft_prefix else []
    if stopped_by_eos and len(checked) == len(answer_ids) + 1 and checked[:-1] == answer_ids:
        checked = answer_ids + [EOS]  # the child ended where the model ends: with EOS
    num_accepted = _common_prefix(checked, target)
    chunk, scored = config.verify_chunk, min(config.verify_chunk, len(checked))
    closed = prompt_len + cot_steps  # tokens cached when the CoT closes
    verify_s = costs.score(fed + scored, closed)
    while scored < len(checked) and num_accepted >= scored:
        chunk *= 2
        size = min(chunk, len(checked) - scored)
        verify_s += costs.score(size, closed + fed + scored)
        scored += size
    out.seconds["verify"] = verify_s
    out.accepted_prefix_tokens = num_accepted if checked else 0

    # 3. continue
    if spans == "recorded":
        out.seconds["continuation"] = _recorded_continuation(row, costs, cot_steps, closed + len(forced))
        out.suffix_accepted_tokens = row["metrics"]["suffix_accepted_tokens"]
        out.answer_tokens = row["metrics"]["answer_tokens"]
        return out
    proposer = _proposer(config, row, cot_ids, answer_prefix_ids, draft_ids)
    out.seconds["continuation"], out.suffix_accepted_tokens, out.answer_tokens = _policy_continuation(
        proposer, costs, config, target, answer_prefix_ids, num_accepted, closed + len(forced))
    return out


def _think(out: Replay, row: dict, costs: Costs, config: GenerationConfig, cot_steps: int,
           forced_len: int) -> tuple[GenerationConfig, list[int]]:
    """Stage 1's seconds into `out`: (config with the row's verify chunk, the draft verified)."""
    prompt_len = len(row["prompt_ids"])
    stages = row["metrics"].get("stages")  # every fork, in rows written since the policy (else None)
    if "policy" in row["metrics"]:
        config = replace(config, verify_chunk=row["metrics"]["policy"]["verify_chunk"])
    if stages is None:  # older rows: one stage at the configured b_d
        drafted = config.uses_draft and config.draft_at < cot_steps
        stages = [{"forked_at": config.draft_at, "written": max(0, len(row["draft_ids"]) - 1)}] if drafted else []
    draft_ids = row["draft_ids"] if stages else []
    batched = sum(stage["written"] for stage in stages)
    thinking = prompt_len + cot_steps // 2
    out.seconds["cot"] = (cot_steps - batched) * costs.step(1, thinking) + batched * costs.step(2, thinking)
    for index, stage in enumerate(stages):  # each fork: forced end, and the previous draft re-verified
        fork_at = prompt_len + stage["forked_at"]
        rechecked = 0 if index == 0 else min(stages[index - 1]["tokens"], stage["bootstrapped"] + config.verify_chunk)
        out.seconds["cot"] += costs.score(1 + forced_len + rechecked, fork_at)
        out.seconds["draft"] += stage["written"] * costs.step(2, fork_at + stage["written"] // 2)
    return config, draft_ids


def _policy_continuation(proposer, costs: Costs, config: GenerationConfig, target: list[int],
                         answer_prefix_ids: list[int], num_accepted: int, answer_start: int) -> tuple[float, int, int]:
    """Stage 3 as `Generation._continue` runs it, spans cut by the policy under `costs`:
    (seconds, suffix-accepted tokens, answer tokens); answer_start: tokens cached before the answer."""
    if proposer is not None:
        proposer.observe(answer_prefix_ids)
    spans = SpanPolicy(CostModel(step_s=costs.step(1), token_s=(costs.score(32) - costs.step(1)) / 31))
    committed = _Commit(target, config.max_tokens, proposer)
    committed.add(target[: num_accepted + 1])  # the draft's accepted prefix and the next token
    seconds, suffix_accepted = 0.0, 0
    while not committed.stopped:
        position = committed.length
        span, probs = proposer.propose(config.max_tokens - position) if proposer else ([], None)
        if span and config.adaptive_spans:
            span = spans.cut(span, probs)
        if not span:
            seconds += costs.step(1, answer_start + position)
            committed.add(target[position : position + 1])
            continue
        pass_s = costs.score(1 + len(span), answer_start + position)
        seconds += pass_s
        accepted = _common_prefix(span, target[position:])
        spans.observe(len(span), probs, accepted, pass_s)
        suffix_accepted += accepted
        committed.add(target[position : position + accepted + 1])
    return seconds, suffix_accepted, committed.length


def _recorded_continuation(row: dict, costs: Costs, cot_steps: int, answer_start: int) -> float:
    """The run's own spans (one score pass each) plus its plain decode steps, at the answer's
    mean context."""
    context = answer_start + row["metrics"]["answer_tokens"] // 2
    scored = sum(costs.score(1 + event["proposed"], context) for event in row["trace"] if event["kind"] == "span")
    plain_steps = row["metrics"]["decode_steps"] - cot_steps
    return scored + plain_steps * costs.step(1, context)


class _Commit:
    """The answer as `Generation._commit` builds it: stops at EOS or max_tokens."""

    def __init__(self, target: list[int], max_tokens: int, proposer) -> None:
        self.target, self.max_tokens, self.proposer = target, max_tokens, proposer
        self.length, self.stopped = 0, False

    def add(self, token_ids: list[int]) -> None:
        if not token_ids:  # past the end of a max_tokens answer
            self.stopped = True
            return
        kept = []
        for token in token_ids:
            if token == EOS:
                self.stopped = True
                break
            kept.append(token)
            self.length += 1
            if self.length >= self.max_tokens:
                self.stopped = True
                break
        if self.proposer is not None and not self.stopped:
            self.proposer.observe(kept)


def _proposer(config: GenerationConfig, row: dict, cot_ids, answer_prefix_ids, draft_ids):
    if config.proposer == "suffix":
        seeds = [row["prompt_ids"], cot_ids] + ([answer_prefix_ids + draft_ids] if draft_ids else [])
        return SuffixProposer(config.suffix, seeds)
    if config.proposer == "pld":
        return PromptLookupProposer(row["prompt_ids"] + cot_ids)
    return None


def config_from_dict(data: dict) -> GenerationConfig:
    """Inverse of dataclasses.asdict for GenerationConfig (as bench rows store it)."""
    fields = dict(data, sampling=SamplingParams(**data["sampling"]), suffix=SuffixParams(**data["suffix"]))
    return GenerationConfig(**fields)


def answer_prefix_of(rows: list[dict]) -> list[int]:
    """The forced answer prefix: rows whose CoT ended naturally forced only it."""
    for row in rows:
        if row.get("answer_prefix_ids") is not None:
            return row["answer_prefix_ids"]
    natural = [r["forced_ids"] for r in rows if r["metrics"]["cot_end"] == "natural"]
    if natural:
        return natural[0]
    return rows[0]["forced_ids"][1:] if rows else []  # fallback: a one-token end marker


def simulate(rows: list[dict], costs: Costs, config: GenerationConfig, spans: str = "policy") -> list[dict]:
    """Per row: measured and modelled seconds; rows must come from greedy runs."""
    by_suite: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_suite[group_name(row)].append(row)
    out = []
    for suite_rows in by_suite.values():
        prefix = answer_prefix_of(suite_rows)
        for row in suite_rows:
            row_config = config_from_dict(row["config"]) if isinstance(row.get("config"), dict) else config
            result = replay(row, costs, row_config, prefix, spans)
            out.append({"suite": group_name(row), "item": row["item"], "repeat": row["repeat"], "mode": row["mode"],
                        "measured_s": row["metrics"]["total_s"], "modelled_s": result.total_s,
                        "modelled_stages": dict(result.seconds),
                        "accepted_prefix": (result.accepted_prefix_tokens, row["metrics"]["accepted_prefix_tokens"]),
                        "suffix_accepted": (result.suffix_accepted_tokens, row["metrics"]["suffix_accepted_tokens"])})
    return out


def anchor_to_ar(projected: list[dict]) -> list[dict]:
    """Scale each item's modelled seconds so its `ar` run matches what was measured.

    The machine's speed drifts between a calibration and a bench run (here by ~20% over
    hours); anchoring removes that common factor and leaves what the simulator models:
    the differences between modes. `ar` rows then match by construction."""
    factors = {(p["suite"], p["item"], p["repeat"]): p["measured_s"] / p["modelled_s"]
               for p in projected if p["mode"] == "ar" and p["modelled_s"] > 0}
    out = []
    for p in projected:
        factor = factors.get((p["suite"], p["item"], p["repeat"]), 1.0)
        out.append({**p, "modelled_s": p["modelled_s"] * factor,
                    "modelled_stages": {k: v * factor for k, v in p["modelled_stages"].items()}})
    return out


def summarise_projection(projected: list[dict]) -> list[dict]:
    """Per (suite, mode): median modelled s, median |error| vs measured, modelled ratio to ar."""
    ar = {(p["suite"], p["item"], p["repeat"]): p for p in projected if p["mode"] == "ar"}
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in projected:
        groups[(p["suite"], p["mode"])].append(p)
    table = []
    for (suite, mode), group in sorted(groups.items()):
        pairs = [(p, ar.get((p["suite"], p["item"], p["repeat"]))) for p in group]
        modelled_ratio = [p["modelled_s"] / base["modelled_s"] for p, base in pairs if base]
        measured_ratio = [p["measured_s"] / base["measured_s"] for p, base in pairs if base]
        table.append({
            "suite": suite, "mode": mode, "runs": len(group),
            "measured_s": statistics.median(p["measured_s"] for p in group),
            "modelled_s": statistics.median(p["modelled_s"] for p in group),
            "abs_error": statistics.median(abs(p["modelled_s"] / p["measured_s"] - 1) for p in group),
            "measured_ratio": statistics.median(measured_ratio) if measured_ratio else None,
            "modelled_ratio": statistics.median(modelled_ratio) if modelled_ratio else None,
        })
    return table


def format_projection(table: list[dict], markdown: bool = False) -> str:
    columns = ["suite", "mode", "runs", "measured s", "modelled s", "median abs error", "measured ratio",
               "modelled ratio"]
    lines = [[t["suite"], t["mode"], str(t["runs"]), f"{t['measured_s']:.2f}", f"{t['modelled_s']:.2f}",
              f"{100 * t['abs_error']:.1f}%",
              "-" if t["measured_ratio"] is None else f"{t['measured_ratio']:.3f}",
              "-" if t["modelled_ratio"] is None else f"{t['modelled_ratio']:.3f}"] for t in table]
    return render_table(columns, lines, markdown)
