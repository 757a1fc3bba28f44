"""The cost-aware policy: what self-speculation is worth on this engine, from measured costs.

A draft token is never free: batched with the parent it adds step(2) - step(1), and
verifying it adds a scored token. On a GPU both are ~0; on a CPU a second sequence
costs 0.4-1.3 steps. The policy predicts, per request, from

  - the engine's cost table (costs.engine_costs: measured once, cached, rescaled to the
    machine's speed now; a drift factor learnt from every call of every request), and
  - statistics of earlier requests (CoT and answer lengths, how many draft tokens ended up
    used: accepted as the answer's prefix, or found again in the answer by suffix decoding),

whether a draft child pays at all, when it forks (b_d) and how long it writes (m), how the
draft is verified (first chunk, doubling while all match) and how long each suffix span is
(expected tokens gained per second, from the per-length score cost). `Plan.explain` holds
the choice and the predicted seconds behind it (`--json` prints it).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

from .config import GenerationConfig
from .costs import Costs

SEED_NGRAM = 4  # answer tokens count as found in the draft when this n-gram ending at them is there


@dataclass
class CostModel:
    """Seconds per engine call. With a measured `table`: the table times drift factors learnt
    from observed calls, one for steps and one for score passes (a pass over k tokens slows
    with the cached length more than a step does, so their ratio, which prices every span,
    is learnt too); without: a line learnt online, step_s + token_s * (n - 1)."""

    step_s: float = 0.05  # no table: one token for one sequence
    token_s: float = 0.02  # no table: each further token in the same pass
    smoothing: float = 0.2  # weight of a new observation
    table: Costs | None = None  # measured step / score costs per size
    drift: float = 1.0  # observed / table for steps, smoothed
    score_drift: float = 1.0  # observed / table for score passes, smoothed

    def observe_step(self, seconds: float) -> None:
        if self.table is not None:
            self.drift = self._smoothed(self.drift, seconds / max(self.table.step(1), 1e-9))
        else:
            self.step_s += self.smoothing * (seconds - self.step_s)

    def observe_score(self, num_tokens: int, seconds: float) -> None:
        if self.table is not None:
            self.score_drift = self._smoothed(self.score_drift, seconds / max(self.table.score(num_tokens), 1e-9))
        elif num_tokens >= 2:
            per_token = max(0.0, (seconds - self.step_s) / (num_tokens - 1))
            self.token_s += self.smoothing * (per_token - self.token_s)

    def _smoothed(self, current: float, ratio: float) -> float:
        ratio = min(max(ratio, 0.2), 5.0)  # one stall must not swing the model
        return current + self.smoothing * (ratio - current)

    def cost(self, num_tokens: int) -> float:
        """num_tokens fed to one sequence in one pass."""
        if self.table is not None:
            return self.drift * self.table.step(1) if num_tokens <= 1 else \
                self.score_drift * self.table.score(num_tokens)
        return self.step_s + self.token_s * max(0, num_tokens - 1)

    def step(self, num_sequences: int) -> float:
        """One token for each of num_sequences in one pass (no table: no batching gain)."""
        if self.table is not None:
            return self.drift * self.table.step(num_sequences)
        return self.step_s * num_sequences


def best_span_length(accept_probs: Sequence[float], costs: CostModel) -> int:
    """Length of the span prefix to verify; 0 means decode one token plainly.

    accept_probs[i]: estimated probability that the first i + 1 proposed tokens
    are all accepted (non-increasing). Maximises expected tokens per second,
    (1 + expected accepted(k)) / cost(k + 1).
    """
    return best_span(accept_probs, costs)[0]


def best_span(accept_probs: Sequence[float], costs: CostModel) -> tuple[int, float]:
    """(best length, its expected tokens per second); length 0 is a plain step."""
    best_len, best_rate = 0, 1.0 / costs.cost(1)
    expected = 0.0
    for length, prob in enumerate(accept_probs, start=1):
        expected += prob
        rate = (1.0 + expected) / costs.cost(length + 1)  # pending token + span in one pass
        if rate > best_rate:
            best_len, best_rate = length, rate
    return best_len, best_rate


CHEAP_SPAN_STEPS = 1.5  # a verify pass over the longest span costing at most this many steps is "cheap"


def span_extension(costs: CostModel, max_span: int) -> float | None:
    """Where verifying max_span tokens costs about one step (GPUs: a pass is memory-bound up to
    hundreds of tokens), suffix spans go on past their match length along the tree's most
    frequent continuation (the probability floor it returns, 0.0; SuffixTree.propose_from), and
    best_span cuts each to what its source's measured acceptance is worth. Elsewhere (a CPU,
    where a scored token costs up to half a step) None: spans stop at the match length."""
    return 0.0 if costs.cost(max_span + 1) <= CHEAP_SPAN_STEPS * costs.cost(1) else None


@dataclass
class AcceptanceStats:
    """Measured acceptance of one source's spans as a survival curve S(i): the chance that the
    first i tokens of a span are all accepted. Measured, not the proposer's own estimate: a
    suffix tree's frequencies over one prompt are poorly calibrated (a continuation seen once is
    "certain"). A curve, not one per-token rate: copied text is accepted whole or fails at once.

    Kaplan-Meier over tried tokens: position j is at risk in a span proposed longer than j whose
    first j tokens were accepted, and fails there when token j is rejected; shorter spans are
    censored. The first token keeps its own hazard (is the source right here at all?); later
    positions are shrunk towards the pooled hazard of all later positions, which also prices
    positions no span has reached yet, so spans can grow past what the cut has tried so far.
    The prior (one pseudo-span with hazard 1 - prior_rate everywhere) is optimistic, so every
    source is tried and learnt within a few passes (the guard bounds the cost). Older spans
    weigh less (`decay` per span): text moves between copied and new regions, and a source that
    just failed at once is likely to fail at the next position too."""

    prior_weight: float = 1.0  # pseudo-spans behind the prior
    prior_rate: float = 0.9  # the prior's chance to accept each token given the ones before
    decay: float = 0.9  # weight of the spans seen so far when a new one is observed
    at_risk: list[float] = field(default_factory=list)  # [j]: spans that tried token j
    failed: list[float] = field(default_factory=list)  # [j]: of those, rejected token j

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        tried = min(num_proposed, num_accepted + 1)
        self.at_risk = [count * self.decay for count in self.at_risk]
        self.failed = [count * self.decay for count in self.failed]
        grow = tried - len(self.at_risk)
        if grow > 0:
            self.at_risk += [0.0] * grow
            self.failed += [0.0] * grow
        for position in range(tried):
            self.at_risk[position] += 1
        if num_accepted < num_proposed:
            self.failed[num_accepted] += 1

    def carried(self, weight: float) -> AcceptanceStats:
        """A copy whose spans weigh `weight` as much: what the next request starts from (the prior
        regains ground, so a source that failed in earlier requests is tried again later)."""
        return replace(self, at_risk=[count * weight for count in self.at_risk],
                       failed=[count * weight for count in self.failed])

    def probs(self, length: int) -> list[float]:
        """S(1) .. S(length)."""
        prior_hazard = 1.0 - self.prior_rate
        pooled = (sum(self.failed[1:]) + self.prior_weight * prior_hazard) / (sum(self.at_risk[1:]) + self.prior_weight)
        out, survival = [], 1.0
        for position in range(length):
            at_risk = self.at_risk[position] if position < len(self.at_risk) else 0.0
            failed = self.failed[position] if position < len(self.failed) else 0.0
            shrink = prior_hazard if position == 0 else pooled
            survival *= 1.0 - (failed + self.prior_weight * shrink) / (at_risk + self.prior_weight)
            out.append(survival)
        return out


class SpanPolicy:
    """Chooses, among the proposers' candidate spans, the one (cut to the best length) with the
    most expected tokens per second on this engine's cost curve (best_span), from each source's
    measured acceptance curve (AcceptanceStats; a suffix span's source names its match-length bucket);
    learns from every verdict, per source. Used by the decoding loop and (through the replay
    engine) by the simulator alike.

    Guard (never slower than plain decoding): the loop also reports each pass's seconds;
    the realised gain, sum over passes of (tokens committed x a plain step's cost - the pass's
    seconds), is kept. Once `min_passes` passes have lost time overall, spans stop and one
    in `explore_every` proposals is still verified, so the gain can recover."""

    min_passes = 8  # passes before the guard judges
    explore_every = 8  # while off: verify one proposal in this many

    carry = 0.75  # weight of earlier requests' spans in a new request's acceptance curves

    def __init__(self, costs: CostModel, learnt: dict[str, AcceptanceStats] | None = None) -> None:
        self.costs = costs
        # per source; starts from what earlier requests learnt (PolicyStats.spans), carried at 3/4 weight
        self.stats: dict[str, AcceptanceStats] = defaultdict(
            AcceptanceStats, {source: stats.carried(self.carry) for source, stats in (learnt or {}).items()})
        self.gain_s = 0.0  # realised seconds saved by span passes against plain steps
        self.timed_passes = 0  # passes whose seconds were reported
        self.skipped = 0  # proposals dropped by the guard since the last one verified

    def choose(self, candidates: Sequence[tuple[str, list[int]]]) -> tuple[str, list[int]]:
        """(source, span cut to its best length) of the candidate worth most; ("", []) for a plain step."""
        best_source, best_span_ids, best_rate = "", [], 1.0 / self.costs.cost(1)
        for source, span in candidates:
            length, rate = best_span(self.stats[source].probs(len(span)), self.costs)
            if length and rate > best_rate:
                best_source, best_span_ids, best_rate = source, span[:length], rate
        if best_span_ids and self.losing:
            self.skipped += 1
            if self.skipped % self.explore_every:
                return "", []
        return best_source, best_span_ids

    def cut(self, span: list[int], source: str = "") -> list[int]:
        """One source's span cut to its best length ([] for a plain step)."""
        return self.choose([(source, span)])[1]

    @property
    def losing(self) -> bool:
        return self.timed_passes >= self.min_passes and self.gain_s < 0

    def observe(self, num_proposed: int, num_accepted: int, seconds: float | None = None, source: str = "") -> None:
        """A verified span: its length, the verdict, the pass's seconds when measured, and its source."""
        self.stats[source].observe(num_proposed, num_accepted)
        if seconds is not None:
            self.timed_passes += 1
            self.gain_s += (num_accepted + 1) * self.costs.cost(1) - seconds


@dataclass
class PolicyStats:
    """What earlier requests showed; the priors stand for one typical request (qwen2.5-coder
    on ClassEval, docs/results-issue3.md) and weigh as much as one observed request."""

    cot_tokens: list[int] = field(default_factory=list)  # CoT length of each request
    answer_tokens: list[int] = field(default_factory=list)  # answer length of each request
    draft_tokens: float = 60.0  # draft tokens written (prior: one draft ...)
    used_tokens: float = 30.0  # ... of which used: accepted prefix + found again by suffix decoding
    accepted_prefix: float = 30.0  # accepted prefix tokens, summed (prior: one draft)
    drafts: float = 1.0  # drafts verified
    answer_s: float = 0.0  # continuation seconds, summed (requests continued by suffix decoding)
    answer_count: int = 0  # continuation answer tokens, summed (same requests)
    window: int = 32  # requests kept for the length medians
    cot_open_tokens: float = 0.0  # ssr's CoT tokens decoded while no draft child lived (CoT spans on), summed
    cot_span_accepted: float = 0.0  # of those, accepted from CoT spans, summed
    # span acceptance per phase ("cot", "answer") and source, as the latest request left it: the
    # next request's span policy starts from it (SpanPolicy.carry), not from the prior alone
    spans: dict[str, dict[str, AcceptanceStats]] = field(default_factory=dict)

    def observe(self, metrics, draft_ids: Sequence[int], answer_ids: Sequence[int],
                known_ids: Sequence[int]) -> None:
        """After a request: its metrics, final draft, answer, and prompt + CoT (known_ids)."""
        self.cot_tokens = (self.cot_tokens + [metrics.cot_tokens])[-self.window :]
        self.answer_tokens = (self.answer_tokens + [metrics.answer_tokens])[-self.window :]
        continued = metrics.answer_tokens - metrics.accepted_prefix_tokens
        if continued > 0 and metrics.mode in ("ssr", "ssr-suffix", "suffix"):
            self.answer_s += metrics.seconds["continuation"]
            self.answer_count += continued
        if metrics.mode in ("ssr", "ssr-suffix"):  # the CoT speculation a child's life turns off
            beside_child = sum(stage["written"] for stage in metrics.stages)
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


def fixed_plan(config: GenerationConfig) -> Plan:
    """The flags as given (--policy fixed), and the plan of modes that never draft."""
    if not config.uses_draft:
        return Plan(draft=False, stages=(), draft_tokens=config.draft_tokens, verify_chunk=config.verify_chunk,
                    explain={"policy": config.policy, "reason": f"mode {config.mode} forks no draft child"})
    stages = stage_budgets(config.draft_at, config.draft_interval, config.thinking_budget)
    return Plan(draft=bool(stages), stages=stages, draft_tokens=config.draft_tokens,
                verify_chunk=config.verify_chunk,
                explain={"policy": "fixed", "reason": "--policy fixed: the budgets as given"})


def plan_request(config: GenerationConfig, costs: CostModel, stats: PolicyStats) -> Plan:
    """`--policy auto`: the request's drafting plan from predicted seconds."""
    if config.policy == "fixed" or not config.uses_draft:
        return fixed_plan(config)
    # 1. how long the draft would be: the typical answer, at most --draft-tokens
    expected_answer = stats.expected_answer()
    draft_tokens = min(config.draft_tokens, config.max_tokens, max(16, expected_answer or config.draft_tokens))
    # 2. what a draft token costs and what a used one saves (seconds)
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
    expected_cot = stats.expected_cot(config.thinking_budget)
    first = config.draft_at if expected_cot is None else max(expected_cot // 4, expected_cot - draft_tokens)
    first = min(first, config.thinking_budget - 1)
    # 4. while the child lives the parent's CoT is decoded without spans: what they would have saved
    beside_child = min(draft_tokens, max(0, (expected_cot or config.thinking_budget) - first))
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
    }
    if gain_s <= 0:
        explain["reason"] = (
            f"no draft: a draft token costs {batched_s * 1e3:.1f} ms batched, a used one saves "
            f"{saved_s * 1e3:.1f} ms and {used:.0%} are used, CoT spans lost beside the child "
            f"{cot_spans_s:.2f} s -> {gain_s:+.2f} s per draft; suffix decoding from prompt + CoT only")
        return Plan(draft=False, stages=(), draft_tokens=draft_tokens, verify_chunk=chunk, explain=explain)
    stages = stage_budgets(first, config.draft_interval, config.thinking_budget)
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
