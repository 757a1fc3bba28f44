"""A trace's recorded draft children in the replay (`ssr traces --drafts`).

A trace may carry what draft children wrote: each forked from the trace's own partial CoT
(`cot[:cot_chars]`, `budget_tokens` in the model's own count), the end of thinking forced, its whole
answer recorded (bench/traces.py, TraceDraft). The replay forks a child where the plan says, from
the recorded fork points only: the replayed engine's child writes the recorded draft a token per
parent step (priced as a step of two sequences), up to m tokens, and only as far as it got before
the CoT ended; the loop then verifies it in chunks and seeds the continuation with it, as on a
real engine. A child forked where nothing was recorded writes EOS at once.

Several recorded drafts are independent (each its own child from the prompt), like the paper's
independent multi-drafts; the loop bootstraps a later child from the earlier draft (verifies it on
the new child), which under greedy keeps what the later child would have written anyway, so the
replay prices bootstrapping (one pass for the common prefix instead of a step a token) and
changes no token.

Choices (DraftChoice):
- `none`: no child (the replay before drafts: every source but a draft);
- `all`: a child at every recorded fork point (multi-stage);
- a budget (`512`): one child at the recorded fork point of that budget; a trace whose CoT ended
  before it has none, and forks nothing;
- `plan`: the drafting plan decides from what a deployment knows before the CoT ends (the
  costs, CoT and answer lengths and draft use of earlier requests: pricing/drafting.plan_request)
  whether to fork, and forks at the budget its fork point falls on among the budgets the set
  records (the largest not past it, else the smallest).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import MODE_TABLE, ConfigError, GenerationConfig
from ..pricing.costs import CostModel
from ..pricing.drafting import Plan, PolicyStats, best_verify_chunk, plan_request
from .traces import TokenTrace

CHOICES = ("plan", "all", "none")  # and a budget in tokens


@dataclass(frozen=True)
class DraftChoice:
    """Which recorded children a replay forks: `how` is plan, all, none or budget (then `budget`)."""

    how: str = "plan"
    budget: int = 0

    @classmethod
    def parse(cls, text: str) -> DraftChoice:
        text = text.strip()
        if text in CHOICES:
            return cls(text)
        if text.isdigit() and int(text) > 0:
            return cls("budget", int(text))
        raise ConfigError(f"--drafts: give plan, all, none or a recorded budget in tokens (e.g. 512), got {text!r}")

    @property
    def label(self) -> str:
        return f"b={self.budget}" if self.how == "budget" else self.how


NO_DRAFT = Plan(draft=False, stages=(), draft_tokens=1, verify_chunk=16,
                explain={"reason": "trace replay: no draft child forks"})


def draft_plan(tokens: TokenTrace, mode: str, config: GenerationConfig, choice: DraftChoice, costs: CostModel,
               stats: PolicyStats, budgets: tuple[int, ...], shares_passes: bool) -> tuple[Plan, dict]:
    """(the plan, the RowModel's draft fields) for one trace in one mode. budgets: the budgets the
    trace's set records (what a deployment configured, known before any CoT ends)."""
    if not MODE_TABLE[mode].drafts or not tokens.drafts or choice.how == "none":
        return NO_DRAFT, {}
    recorded = {draft.budget_tokens: fork for draft, fork in zip(tokens.trace.drafts, tokens.drafts)}
    if choice.how == "plan":
        plan = plan_request(config, costs, stats, spans_beside_child=shares_passes)
        if not plan.draft:
            return replace(plan, stages=()), {}
        budget = _snapped(plan.stages[0], budgets)
        chosen = [recorded[budget]] if budget in recorded else []
        plan = replace(plan, explain={**plan.explain, "budget": budget})
    else:
        chosen = list(recorded.values()) if choice.how == "all" else \
            [recorded[choice.budget]] if choice.budget in recorded else []
        m = config.draft_tokens
        plan = Plan(draft=bool(chosen), stages=(), draft_tokens=m,
                    verify_chunk=best_verify_chunk(m, stats.accept_rate, costs),
                    explain={"policy": "replay", "reason": f"--drafts {choice.label}"})
    if not chosen:  # the CoT ended before the budget: no child forks
        return replace(plan, draft=False, stages=()), {}
    forks = sorted(chosen)
    (last_at, last_draft), earlier = forks[-1], forks[:-1]
    fields = {"draft_ids": list(last_draft), "draft_forked_at": last_at,
              "earlier_drafts": tuple((at, tuple(draft)) for at, draft in earlier)}
    return replace(plan, draft=True, stages=tuple(at for at, _ in forks)), fields


def _snapped(fork_at: int, budgets: tuple[int, ...]) -> int:
    """The recorded budget a planned fork point falls on: the largest not past it, else the smallest."""
    if not budgets:
        raise ConfigError("--drafts plan: the set records no draft budgets")
    below = [b for b in budgets if b <= fork_at]
    return max(below) if below else min(budgets)
