"""Model-free replay of bench traces under a cost model (`ssr simulate`).

Under greedy decoding every mode writes the same tokens, so one bench row holds all the
model ever decided: the CoT, the draft the child wrote, the answer. Replaying a row runs the
real decoding loop (`loop.Generation`) on a replay engine (bench/replay.py) whose logits
put the row's token first at every position and whose clock is the cost model: prefill,
steps with 1 or 2 sequences, score passes of k tokens, each at its cached length. Nothing is
mirrored by hand, so the replay cannot drift from the loop.

The row's drafting plan (whether, where children forked, m, the verify chunk) is replayed
as it was. Spans: "policy" re-decides every span with the mode's proposer and span policy
under the cost model (a projection); "recorded" replays the run's own spans (from the
trace), so only the cost model is under test.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..config import GenerationConfig, SamplingParams, SuffixParams
from ..loop import Generation
from ..engines.base import shares_passes
from ..pricing.costs import CostModel, CostTable
from ..pricing.drafting import Plan, PolicyStats, fixed_plan, plan_request
from ..proposing.history import ResponseHistory
from .drafts import DraftBook
from ..proposing.proposers import CHAIN
from ..proposing.source import Source
from .replay import REPLAY_FORMAT, ReplayEngine, RowModel
from .report import group_name, render_table


@dataclass
class Replay:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # stage -> modelled s
    accepted_prefix_tokens: int = 0
    answer_accepted_tokens: int = 0
    cot_accepted_tokens: int = 0
    answer_tokens: int = 0
    draft_forked: int = 0  # draft children forked

    @property
    def total_s(self) -> float:
        return sum(v for k, v in self.seconds.items() if k != "draft")


def replay(row: dict, costs: CostTable, config: GenerationConfig, answer_prefix_ids: list[int],
           spans: str = "policy", forced_end_ids: list[int] | None = None,
           history: ResponseHistory | None = None, stats: PolicyStats | None = None,
           drafts: DraftBook | None = None, host: str | float | None = None) -> Replay:
    """Modelled seconds of one bench row under `costs` (its own mode, greedy); `history`: the
    earlier rows' responses, as the bench gave them to this row's mode; `stats`: what the
    engine's earlier rows taught the policy (span acceptance), as the bench's model kept it.
    drafts: drafting re-planned under `costs`, its drafts from this book (else: the run's plan).
    host: the loop's host time on the clock (ReplayEngine: "measured", or seconds per pass)."""
    config = replace(config, mode=row["mode"], sampling=SamplingParams())
    metrics = row["metrics"]
    stats = stats if stats is not None else PolicyStats()
    plan = _row_plan(row, config) if drafts is None else \
        plan_request(config, CostModel(table=costs), stats, spans_beside_child=shares_passes(ReplayEngine))
    model = RowModel(
        prompt_ids=row["prompt_ids"], cot_ids=row["cot_ids"], answer_ids=row["answer_ids"],
        forced_end_ids=forced_end_ids if forced_end_ids is not None else _forced_end(row, answer_prefix_ids),
        answer_prefix_ids=answer_prefix_ids, draft_ids=row["draft_ids"] if plan.draft else [],
        draft_forked_at=(metrics.get("stages") or [{}])[-1].get("forked_at", plan.stages[-1] if plan.stages else None),
        cot_end=metrics["cot_end"], stop=metrics["stop"], repetition_stop=config.repetition_stop)
    if drafts is not None:
        model = _with_planned_draft(row, model, plan, drafts)
    engine = ReplayEngine(model, costs, host=host)
    proposer = None
    if spans == "recorded":
        config = replace(config, adaptive_spans=False)
        proposer = RecordedSpans(row.get("trace", []), engine) if config.proposer else None
    generation = Generation(engine, REPLAY_FORMAT, config, row["prompt_ids"], costs=CostModel(table=costs),
                            stats=stats, proposer=proposer, plan=plan, history=history)
    result = generation.run()
    done = result.metrics
    return Replay(seconds=defaultdict(float, done.seconds), accepted_prefix_tokens=done.accepted_prefix_tokens,
                  answer_accepted_tokens=done.answer_accepted_tokens, cot_accepted_tokens=done.cot_accepted_tokens,
                  answer_tokens=done.answer_tokens, draft_forked=len(done.stages))


def _with_planned_draft(row: dict, model: RowModel, plan: Plan, drafts: DraftBook) -> RowModel:
    """The row's model with the draft of the plan's last stage (none where the plan forks no
    child or the CoT ends before the fork)."""
    if not plan.draft or not plan.stages or plan.stages[-1] >= len(model.cot_ids):
        return replace(model, draft_ids=[], draft_forked_at=None)
    forked_at = plan.stages[-1]
    context = model.prompt_ids + model.cot_ids[:forked_at] + model.forced_end_ids + model.answer_prefix_ids
    return replace(model, draft_ids=drafts.draft(row, context, forked_at, plan.draft_tokens), draft_forked_at=forked_at)


def _row_plan(row: dict, config: GenerationConfig) -> Plan:
    """The drafting plan the run followed (rows since the policy record it), else the flags'."""
    recorded = row["metrics"].get("policy")
    if recorded:
        return Plan(draft=recorded["draft"], stages=tuple(recorded["stages"]), draft_tokens=recorded["draft_tokens"],
                    verify_chunk=recorded["verify_chunk"], explain=recorded.get("explain", {}))
    return fixed_plan(replace(config, policy="fixed"))


def _forced_end(row: dict, answer_prefix_ids: list[int]) -> list[int]:
    """The end marker the run forced (rows whose CoT ended by itself did not force one)."""
    if row.get("forced_end_ids") is not None:
        return row["forced_end_ids"]
    forced = row["forced_ids"]
    if row["metrics"]["cot_end"] != "natural" and len(forced) > len(answer_prefix_ids):
        return forced[: len(forced) - len(answer_prefix_ids)]
    return [-2, -3]  # unknown: a two-token marker (its ids matter to no prediction)


def config_from_dict(data: dict) -> GenerationConfig:
    """Inverse of dataclasses.asdict for GenerationConfig (as bench rows store it). Rows written
    before `max_answer_tokens` existed meant it by `max_tokens` (the answer's tokens only)."""
    fields = dict(data, sampling=SamplingParams(**data["sampling"]), suffix=SuffixParams(**data["suffix"]))
    if "max_answer_tokens" not in data:
        fields.update(max_answer_tokens=data.get("max_tokens"), max_tokens=None)
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


def forced_end_of(rows: list[dict], answer_prefix_ids: list[int]) -> list[int] | None:
    """The forced end marker of a suite's rows (recorded, or read off a row that forced it)."""
    for row in rows:
        if row.get("forced_end_ids") is not None or row["metrics"]["cot_end"] != "natural":
            return _forced_end(row, answer_prefix_ids)
    return None


def project_modes(rows: list[dict], modes: Sequence[str]) -> list[dict]:
    """The rows, each `ar` row followed by copies of it as `modes` (where the item has no row of
    that mode): for items a bench ran in `ar` only, because every mode on them would take hours
    here (LongProc html_to_tsv's ~15k-token prompts on a CPU). Under greedy decoding every mode
    writes the ar row's tokens, so the replay runs each mode's real loop on them. A projected
    row has no measured seconds, and no draft (none was recorded): it projects spans only."""
    have = {(row.get("engine"), row["suite"], row["item"], row["repeat"], row["mode"]) for row in rows}
    out = []
    for row in rows:
        out.append(row)
        if row["mode"] != "ar":
            continue
        row.setdefault("planned_drafts", {})  # shared with the projected rows: drafts written for them stay here
        for mode in modes:
            if mode == "ar" or (row.get("engine"), row["suite"], row["item"], row["repeat"], mode) in have:
                continue
            config = dict(row["config"], mode=mode)
            no_draft = {"draft": False, "stages": [], "draft_tokens": config["draft_tokens"],
                        "verify_chunk": config["verify_chunk"],
                        "explain": {"reason": "projected from the ar row: no draft was recorded"}}
            metrics = dict(row["metrics"], mode=mode, total_s=None, policy=no_draft, stages=[])
            out.append(dict(row, mode=mode, config=config, metrics=metrics, draft_ids=[], trace=[], projected=True))
    return out


def simulate(rows: list[dict], costs: CostTable, config: GenerationConfig, spans: str = "policy",
             drafts: DraftBook | None = None, progress: bool = False, host: str | float | None = None) -> list[dict]:
    """Per row: measured and modelled seconds; rows must come from greedy runs. drafts: drafting
    re-planned under `costs`, drafts from the book (it writes missing ones into the rows)."""
    from tqdm import tqdm

    by_suite: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_suite[group_name(row)].append(row)
    prefixes = {suite: answer_prefix_of(suite_rows) for suite, suite_rows in by_suite.items()}
    forced_ends = {suite: forced_end_of(suite_rows, prefixes[suite]) for suite, suite_rows in by_suite.items()}
    histories: dict[tuple, ResponseHistory] = defaultdict(ResponseHistory)  # as the bench kept them
    learnt: dict[str, PolicyStats] = defaultdict(PolicyStats)  # per engine: one model's stats, all its rows
    out = []
    for row in tqdm(rows, unit="row", disable=not progress, dynamic_ncols=True):  # in the bench's order:
        # each row's history holds the rows before it
        suite = group_name(row)
        row_config = config_from_dict(row["config"]) if isinstance(row.get("config"), dict) else config
        # rows since the response history record how many responses they could copy from
        history = histories[(row.get("engine"), row["mode"], row["repeat"])] if "history_responses" in row else None
        result = replay(row, costs, row_config, prefixes[suite], spans, forced_ends[suite], history,
                        learnt[row.get("engine")], drafts, host)
        out.append({"suite": suite, "item": row["item"], "repeat": row["repeat"], "mode": row["mode"],
                    "measured_s": row["metrics"]["total_s"], "modelled_s": result.total_s,
                    "modelled_stages": dict(result.seconds),
                    "draft_forked": bool(result.draft_forked),
                    "accepted_prefix": (result.accepted_prefix_tokens, row["metrics"]["accepted_prefix_tokens"]),
                    "answer_accepted": (result.answer_accepted_tokens, row["metrics"]["answer_accepted_tokens"])})
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
        measured_ratio = [p["measured_s"] / base["measured_s"] for p, base in pairs
                          if base and p["measured_s"] is not None]
        measured = [p for p in group if p["measured_s"] is not None]  # projected rows have none
        table.append({
            "suite": suite, "mode": mode, "runs": len(group),
            "measured_s": statistics.median(p["measured_s"] for p in measured) if measured else None,
            "modelled_s": statistics.median(p["modelled_s"] for p in group),
            "abs_error": statistics.median(abs(p["modelled_s"] / p["measured_s"] - 1) for p in measured)
            if measured else None,
            "measured_ratio": statistics.median(measured_ratio) if measured_ratio else None,
            "modelled_ratio": statistics.median(modelled_ratio) if modelled_ratio else None,
            "drafts": sum(p.get("draft_forked", False) for p in group),  # rows whose replay forked a child
            "accepted_prefix": statistics.mean(p["accepted_prefix"][0] for p in group),  # modelled, per row
        })
    return table


def format_projection(table: list[dict], markdown: bool = False) -> str:
    columns = ["suite", "mode", "runs", "measured s", "modelled s", "median abs error", "measured ratio",
               "modelled ratio", "drafts", "prefix accepted"]
    lines = [[t["suite"], t["mode"], str(t["runs"]), "-" if t["measured_s"] is None else f"{t['measured_s']:.2f}",
              f"{t['modelled_s']:.2f}", "-" if t["abs_error"] is None else f"{100 * t['abs_error']:.1f}%",
              "-" if t["measured_ratio"] is None else f"{t['measured_ratio']:.3f}",
              "-" if t["modelled_ratio"] is None else f"{t['modelled_ratio']:.3f}",
              str(t["drafts"]), f"{t['accepted_prefix']:.1f}"] for t in table]
    return render_table(columns, lines, markdown)


class RecordedSpans:
    """A proposer that replays a run's own spans (`ssr simulate --spans recorded`): at the output
    position where the run verified a span, the same number of tokens, of which the same number
    are right (the model's tokens, then tokens it never writes)."""

    shape = CHAIN
    implementation = None

    def __init__(self, trace: list[dict], engine: ReplayEngine) -> None:
        self.engine, self.never_id = engine, engine.never_id
        self.events = {(event["kind"], event["at"]): event for event in trace if "at" in event}
        self.cot_len, self.answer_len, self.in_answer = 0, 0, False  # output observed so far

    def add_source(self, token_ids: Sequence[int]) -> None:
        """The run's spans are replayed as they were."""

    def prepare(self) -> None:
        """Nothing deferred."""

    def observe(self, token_ids: Sequence[int]) -> None:
        if self.in_answer:
            self.answer_len += len(token_ids)
        elif self.cot_len < len(self.engine.cot):
            self.cot_len += len(token_ids)
        else:  # the CoT is complete: these are the forced tokens, the answer follows
            self.in_answer = True

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        kind, at, target = ("span", self.answer_len, self.engine.answer) if self.in_answer else \
            ("cot_span", self.cot_len, self.engine.cot)
        event = self.events.get((kind, at))
        if event is None:
            return [], None
        right = target[at: at + event["accepted"]]
        return (right + [self.never_id] * (event["proposed"] - len(right)))[:max_tokens], None

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        span, _ = self.propose(max_tokens)
        return [(RECORDED, span)] if span else []


RECORDED = Source("recorded")  # a run's own span, replayed
