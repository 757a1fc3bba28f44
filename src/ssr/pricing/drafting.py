"""The cost-aware drafting policy: what a draft child is worth on this engine, from measured costs.

A draft token is never free: batched with the parent it adds step(2) - step(1), and
verifying it adds a scored token. On a GPU both are ~0; on a CPU a second sequence
costs 0.4-1.3 steps. The policy predicts, per request, from

  - the engine's cost table (probe.engine_costs: measured once, cached, rescaled to the
    machine's speed now; each request learns drift factors from its own calls, and the plan
    prices a draft at the median drifts of earlier requests: their context, their load), and
  - statistics of earlier requests (CoT and answer lengths, how many draft tokens ended up
    used: accepted as the answer's prefix, or found again in the answer by suffix decoding),

whether a draft child pays at all, when it forks (b_d) and how long it writes (m) and how the
draft is verified (first chunk, doubling while all match). `Plan.explain` holds the choice and
the predicted seconds behind it (`--json` prints it). How long each speculated span is: span_policy.py.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from ..config import DEFAULT_CONTEXT, MODE_TABLE, GenerationConfig
from .costs import CostModel
from .acceptance import AcceptanceStats

SEED_NGRAM = 4  # answer tokens count as found in the draft when this n-gram ending at them is there


@dataclass
class PolicyStats:
    """What earlier requests showed; the priors stand for one typical request (qwen2.5-coder
    on ClassEval, docs/paper-evaluation.md) and weigh as much as one observed request."""

    cot_tokens: list[int] = field(default_factory=list)  # CoT length of each request
    answer_tokens: list[int] = field(default_factory=list)  # answer length of each request
    draft_tokens: float = 60.0  # draft tokens written (prior: one draft ...)
    used_tokens: float = 30.0  # ... of which used: accepted prefix + found again by suffix decoding
    accepted_prefix: float = 30.0  # accepted prefix tokens, summed (prior: one draft)
    drafts: float = 1.0  # drafts verified
    answer_s: float = 0.0  # continuation seconds, summed (requests continued by suffix decoding)
    answer_count: int = 0  # continuation answer tokens, summed (same requests)
    window: int = 32  # requests kept for the length medians
    cot_open_tokens: float = 0.0  # ssr's CoT tokens decoded with spans on (no child lived, or passes shared), summed
    cot_span_accepted: float = 0.0  # of those, accepted from CoT spans, summed
    # the engine's speed on earlier requests against its cost table (CostModel.drift, score_drift
    # at each request's end): a table probed at a short context prices a long prompt's steps low,
    # while answer_s above is measured at the requests' own context; the plan prices both alike
    step_drifts: list[float] = field(default_factory=list)
    score_drifts: list[float] = field(default_factory=list)
    # span acceptance per phase ("cot", "answer") and source, as the latest request left it: the
    # next request's span policy starts from it (SpanPolicy.carry), not from the prior alone
    spans: dict[str, dict[str, AcceptanceStats]] = field(default_factory=dict)

    def observe(self, metrics, draft_ids: Sequence[int], answer_ids: Sequence[int],
                known_ids: Sequence[int], costs: CostModel | None = None) -> None:
        """After a request: its metrics, final draft, answer, prompt + CoT (known_ids) and the
        cost model it learnt from its own calls."""
        if costs is not None and costs.table is not None:
            self.step_drifts = (self.step_drifts + [costs.drift])[-self.window :]
            self.score_drifts = (self.score_drifts + [costs.score_drift])[-self.window :]
        self.cot_tokens = (self.cot_tokens + [metrics.cot_tokens])[-self.window :]
        self.answer_tokens = (self.answer_tokens + [metrics.answer_tokens])[-self.window :]
        continued = metrics.answer_tokens - metrics.accepted_prefix_tokens
        if continued > 0 and MODE_TABLE[metrics.mode].proposer == "suffix":
            self.answer_s += metrics.seconds["continuation"]
            self.answer_count += continued
        if MODE_TABLE[metrics.mode].chooses:  # the CoT speculation a child's life turns off
            beside_child = 0 if metrics.spans_beside_child else sum(stage["written"] for stage in metrics.stages)
            self.cot_open_tokens += max(0, metrics.cot_tokens - beside_child)
            self.cot_span_accepted += metrics.cot_accepted_tokens
        if draft_ids:
            accepted = metrics.accepted_prefix_tokens
            self.drafts += 1
            self.draft_tokens += len(draft_ids)
            self.accepted_prefix += accepted
            self.used_tokens += accepted + found_in_draft(answer_ids[accepted:], draft_ids[accepted:], known_ids)

    def expected_cot(self, budget: int) -> int | None:
        return min(budget, int(statistics.median(self.cot_tokens))) if self.cot_tokens else None

    def expected_answer(self) -> int | None:
        return int(statistics.median(self.answer_tokens)) if self.answer_tokens else None

    def priced(self, costs: CostModel) -> CostModel:
        """costs at the speed earlier requests saw (median drifts), where they measured one."""
        if costs.table is None or not self.step_drifts:
            return costs
        return replace(costs, drift=statistics.median(self.step_drifts),
                       score_drift=statistics.median(self.score_drifts))

    @property
    def cot_span_rate(self) -> float:
        """Share of CoT tokens accepted from spans while no child lived (0 until measured)."""
        return self.cot_span_accepted / self.cot_open_tokens if self.cot_open_tokens else 0.0

    @property
    def used_fraction(self) -> float:
        return self.used_tokens / max(self.draft_tokens, 1.0)

    @property
    def accept_rate(self) -> float:
        """Per-token probability that a draft token matches, given all before it did
        (geometric: mean accepted prefix = rate / (1 - rate))."""
        mean = self.accepted_prefix / max(self.drafts, 1.0)
        return mean / (mean + 1.0)


def found_in_draft(answer_ids: Sequence[int], draft_ids: Sequence[int], known_ids: Sequence[int]) -> int:
    """Answer tokens whose SEED_NGRAM-gram (ending at them) occurs in the draft but not in
    the prompt + CoT: what the draft adds to the suffix tree."""
    def grams(ids: Sequence[int]) -> set[tuple[int, ...]]:
        return {tuple(ids[i : i + SEED_NGRAM]) for i in range(len(ids) - SEED_NGRAM + 1)}

    in_draft, known = grams(draft_ids), grams(known_ids)
    found = 0
    for end in range(SEED_NGRAM, len(answer_ids) + 1):
        gram = tuple(answer_ids[end - SEED_NGRAM : end])
        found += gram in in_draft and gram not in known
    return found


@dataclass(frozen=True)
class Plan:
    """What a request does about drafting, and why."""

    draft: bool  # fork draft children at all
    stages: tuple[int, ...]  # CoT tokens at which children fork (b1 < b2 < ...)
    draft_tokens: int  # m: answer tokens each child writes at most
    verify_chunk: int  # draft tokens in the first verify pass (doubling while all match)
    explain: dict = field(default_factory=dict, compare=False)  # the choice and its predicted seconds

    def as_dict(self) -> dict:
        return asdict(self)


def stage_budgets(first: int, interval: int, budget: int) -> tuple[int, ...]:
    """b1, b1 + i, b1 + 2i, ... below the thinking budget (one stage when interval is 0)."""
    if first >= budget:
        return ()
    if interval <= 0:
        return (first,)
    return tuple(range(first, budget, interval))


def horizon(config: GenerationConfig, cot_cap: int | None) -> int:
    """CoT tokens at most a plan reckons with: the request's (the walk knows its output limit),
    else the thinking budget, else max tokens, else a context of DEFAULT_CONTEXT tokens."""
    if cot_cap is not None:
        return cot_cap
    return config.cot_cap(config.max_tokens or DEFAULT_CONTEXT)


def fixed_plan(config: GenerationConfig, cot_cap: int | None = None) -> Plan:
    """The flags as given (--policy fixed), and the plan of modes that never draft."""
    if not config.uses_draft:
        return Plan(draft=False, stages=(), draft_tokens=config.draft_tokens, verify_chunk=config.verify_chunk,
                    explain={"policy": config.policy, "reason": f"mode {config.mode} forks no draft child"})
    stages = stage_budgets(config.draft_at, config.draft_interval, horizon(config, cot_cap))
    return Plan(draft=bool(stages), stages=stages, draft_tokens=config.draft_tokens,
                verify_chunk=config.verify_chunk,
                explain={"policy": "fixed", "reason": "--policy fixed: the budgets as given"})


def plan_request(config: GenerationConfig, costs: CostModel, stats: PolicyStats,
                 spans_beside_child: bool = False, cot_cap: int | None = None) -> Plan:
    """`--policy auto`: the request's drafting plan from predicted seconds. spans_beside_child:
    the engine verifies the parent's CoT spans and steps a child in one pass (score_batch);
    cot_cap: the request's CoT tokens at most (horizon)."""
    if config.policy == "fixed" or not config.uses_draft:
        return fixed_plan(config, cot_cap)
    cap = horizon(config, cot_cap)
    # 1. how long the draft would be: the typical answer, at most --draft-tokens
    expected_answer = stats.expected_answer()
    draft_tokens = min(config.draft_tokens, config.max_answer_tokens or config.draft_tokens,
                       max(16, expected_answer or config.draft_tokens))
    # 2. what a draft token costs and what a used one saves (seconds), both at earlier requests' speed
    costs = stats.priced(costs)
    batched_s = max(0.0, costs.step(2) - costs.step(1))  # the child riding in the parent's step
    scored_s = max(0.0, (costs.cost(draft_tokens + 1) - costs.cost(1)) / draft_tokens)  # verifying it
    answer_s = stats.answer_s / stats.answer_count if stats.answer_count else costs.step(1)
    saved_s = max(0.0, answer_s - scored_s)  # a used token: scored instead of decoded
    used = stats.used_fraction
    chunk = best_verify_chunk(draft_tokens, stats.accept_rate, costs)
    waste_s = expected_verify_s(draft_tokens, chunk, stats.accept_rate, costs) - \
        min(stats.accept_rate / (1 - stats.accept_rate), draft_tokens) * scored_s  # passes over rejected tokens
    fork_s = costs.cost(4)  # forcing the end marker on the child
    # 3. when: late enough to see most of the CoT, early enough to finish m tokens before it ends
    # (the child writes a token per parent pass; CoT spans beside it make the passes fewer)
    expected_cot = stats.expected_cot(cap)
    per_pass = 1.0 / max(0.2, 1.0 - stats.cot_span_rate) if spans_beside_child else 1.0  # CoT tokens per pass
    first = config.draft_at if expected_cot is None else \
        max(expected_cot // 4, expected_cot - round(draft_tokens * per_pass))
    first = min(first, cap - 1)
    # 4. unless one pass carries both, the parent's CoT is decoded without spans while the child
    # lives: what they would have saved
    beside_child = 0 if spans_beside_child else \
        min(draft_tokens, max(0, (expected_cot or cap) - first))
    cot_spans_s = beside_child * stats.cot_span_rate * max(0.0, costs.step(1) - scored_s)
    gain_s = draft_tokens * (used * saved_s - batched_s) - max(0.0, waste_s) - fork_s - cot_spans_s
    explain = {
        "policy": "auto",
        "run": "batched" if gain_s > 0 else "none",
        "predicted_s": {"step_1": costs.step(1), "step_2": costs.step(2), "per_draft_token_batched": batched_s,
                        "per_draft_token_verified": scored_s, "per_answer_token_without_draft": answer_s,
                        "verify_waste": max(0.0, waste_s), "fork": fork_s, "cot_spans_lost": cot_spans_s,
                        "net_gain_per_draft": gain_s},
        "used_fraction": used, "accept_rate": stats.accept_rate, "cot_span_rate": stats.cot_span_rate,
        "cot_tokens_per_pass": per_pass,
    }
    if gain_s <= 0:
        explain["reason"] = (
            f"no draft: a draft token costs {batched_s * 1e3:.1f} ms batched, a used one saves "
            f"{saved_s * 1e3:.1f} ms and {used:.0%} are used, CoT spans lost beside the child "
            f"{cot_spans_s:.2f} s -> {gain_s:+.2f} s per draft; suffix decoding from prompt + CoT only")
        return Plan(draft=False, stages=(), draft_tokens=draft_tokens, verify_chunk=chunk, explain=explain)
    stages = stage_budgets(first, config.draft_interval, cap)
    explain["expected_cot_tokens"] = expected_cot
    explain["reason"] = (
        f"draft: {gain_s:+.2f} s per draft predicted ({used:.0%} of {draft_tokens} tokens used, "
        f"{batched_s * 1e3:.1f} ms each batched); forks at {list(stages)}")
    return Plan(draft=True, stages=stages, draft_tokens=draft_tokens, verify_chunk=chunk, explain=explain)


def expected_verify_s(num_tokens: int, first_chunk: int, accept_rate: float, costs: CostModel) -> float:
    """Expected seconds to verify a draft of num_tokens in chunks (first_chunk, doubling
    while every token matches), each token matching with accept_rate given its prefix did."""
    seconds, scored, chunk, reach = 0.0, 0, first_chunk, 1.0
    while scored < num_tokens and reach > 1e-6:
        size = min(chunk, num_tokens - scored)
        seconds += reach * (costs.cost(size + 1) - (costs.cost(1) if scored == 0 else 0.0))
        scored += size
        reach = accept_rate ** scored  # probability the next chunk is needed
        chunk *= 2
    return seconds


def best_verify_chunk(num_tokens: int, accept_rate: float, costs: CostModel) -> int:
    """First chunk (a power of two, or the whole draft) with the least expected verify time;
    on a GPU one pass over everything, on a CPU small chunks that stop at the first mismatch."""
    candidates = sorted({min(1 << k, num_tokens) for k in range(3, 10)} | {num_tokens})
    return min(candidates, key=lambda chunk: (expected_verify_s(num_tokens, chunk, accept_rate, costs), -chunk))
