"""Per-request metrics and the token-level trace."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from .config import DRAFT_MODES

STAGES = ("prefill", "cot", "draft", "verify", "continuation")
RENAMED = {"suffix_proposed_tokens": "answer_proposed_tokens",  # rows written before the rename (bench rows,
           "suffix_accepted_tokens": "answer_accepted_tokens"}  # docs/peers/*.jsonl) name them so


def current_names(metrics: dict) -> dict:
    """A row's metrics under today's names (rows written before a rename are read too)."""
    return {RENAMED.get(name, name): value for name, value in metrics.items()}


@dataclass
class Metrics:
    mode: str
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of them, held by an earlier request's kept KV (engines/prefix.py): not prefilled
    cot_tokens: int = 0  # reasoning tokens the model wrote (forced end not counted)
    cot_end: str = ""  # "natural" (end marker), "budget" (b_v reached), "eos", "length" (the output's limit) or "repetition"
    answer_tokens: int = 0  # answer tokens committed (forced answer prefix and EOS not counted)
    forced_tokens: int = 0  # tokens forced between CoT and answer (end marker, answer prefix)
    stop: str = ""  # "eos" or "max_tokens"
    draft_tokens: int = 0  # tokens the draft child wrote
    accepted_prefix_tokens: int = 0  # draft tokens accepted in the prefix verify pass
    answer_proposed_tokens: int = 0  # answer tokens proposed in span passes, every source's (was suffix_proposed_tokens)
    answer_accepted_tokens: int = 0  # of those, accepted (was suffix_accepted_tokens)
    verify_passes: int = 0  # score passes over a draft or an answer span
    cot_proposed_tokens: int = 0  # CoT tokens proposed by the proposer (CoT speculation)
    cot_accepted_tokens: int = 0  # of those, accepted
    cot_passes: int = 0  # score passes over CoT spans
    decode_steps: int = 0  # single-token steps (batched with a draft child or not)
    cot_steps: int = 0  # of those, steps of the CoT (the rest: the answer's)
    batched_steps: int = 0  # of those, steps that carried a draft child too
    shared_passes: int = 0  # CoT span passes that carried a draft child's step too (one forward pass)
    spans_beside_child: bool = False  # the engine shares passes: CoT spans go on while a child lives
    branch_passes: int = 0  # span passes that verified several candidate spans, each on its own sequence
    branch_wins: int = 0  # of those, passes won by a candidate other than the span policy's first choice
    # wall seconds per stage; "draft" is the child's lifetime, concurrent with "cot"
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    # per draft child: forked_at, tokens, bootstrapped, written, accepted (by the next stage or
    # the parent), seconds, bootstrap_s, seconds_without_bootstrap (estimated)
    stages: list[dict] = field(default_factory=list)
    engine: dict = field(default_factory=dict)  # engine-specific counters (vLLM: requests, prefix-cache hits)
    policy: dict = field(default_factory=dict)  # the drafting plan and why (policy.Plan.as_dict)
    first_answer_token_s: float = 0.0  # from request start to the first answer token
    total_s: float = 0.0
    # the loop's own host time: the request's wall seconds less those inside the engine (its
    # calls; vLLM: waiting on outputs) and those the reader took between chunks
    host_s: float = 0.0
    engine_passes: int = 0  # forward passes (vLLM: the requests' outputs, one engine step each)

    @property
    def host_ms_per_pass(self) -> float:
        return 1e3 * self.host_s / max(1, self.engine_passes)

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        s = self.seconds
        parts = [
            f"{self.mode}: {self.total_s:.2f}s",
            f"cot {self.cot_tokens} tok ({self.cot_end}) {s['cot']:.2f}s",
            f"answer {self.answer_tokens} tok, first after {self.first_answer_token_s:.2f}s",
        ]
        explain = self.policy.get("explain", {})
        if explain.get("policy") == "auto" and not self.stages and self.mode in DRAFT_MODES:
            parts.append(f"policy: {explain.get('reason', '')}")
        if len(self.stages) > 1:
            parts.append(f"{len(self.stages)} stages, bootstrapped "
                         f"{'/'.join(str(stage['bootstrapped']) for stage in self.stages[1:])}")
        if self.draft_tokens:
            parts.append(
                f"draft {self.draft_tokens} tok {s['draft']:.2f}s, "
                f"accepted prefix {self.accepted_prefix_tokens}, verify {s['verify']:.2f}s"
            )
        if self.answer_proposed_tokens:
            parts.append(
                f"spans accepted {self.answer_accepted_tokens}/{self.answer_proposed_tokens} "
                f"in {self.verify_passes} passes"
            )
        parts.append(f"continuation {s['continuation']:.2f}s")
        return " | ".join(parts)


    def plain(self) -> str:
        """One line for a person: time, tokens, what SSR did and why (summary() has the details)."""
        s = self.seconds
        ended = {"budget": " (thinking budget reached)", "repetition": " (ended: it was repeating itself)",
                 "length": " (cut at --max-tokens or the context's end: no answer)",
                 "eos": " (the model ended its output while thinking)" if not self.answer_tokens else ""}
        stopped = {"max_tokens": " (cut at --max-tokens, --max-answer-tokens or the context's end)",
                   "repetition": " (ended: it was repeating itself)"}
        answer_s = s["verify"] + s["continuation"]
        parts = [f"{self.total_s:.1f} s: thought {self.cot_tokens} tokens in {s['cot']:.1f} s"
                 f"{ended.get(self.cot_end, '')}, answered {self.answer_tokens} tokens in {answer_s:.1f} s"
                 f"{stopped.get(self.stop, '')}"]
        if self.mode == "ar":
            parts.append("plain decoding (--mode ar)")
        if self.draft_tokens:
            parts.append(f"a draft answer written while thinking: {self.accepted_prefix_tokens} of its "
                         f"{self.draft_tokens} tokens kept")
        elif self.mode in DRAFT_MODES:
            parts.append(_no_draft_reason(self.policy.get("explain", {})))
        if self.answer_accepted_tokens:
            parts.append(f"{self.answer_accepted_tokens} answer tokens copied from earlier text (prompt, reasoning, "
                         f"draft) and checked in {self.verify_passes} passes instead of decoded one by one")
        elif self.mode != "ar":
            parts.append("nothing to copy from the prompt or reasoning")
        if self.cot_accepted_tokens:
            parts.append(f"{self.cot_accepted_tokens} reasoning token{'s' * (self.cot_accepted_tokens != 1)} copied "
                         f"in {self.cot_passes} passes")
        return "; ".join(parts) + " (same tokens as plain decoding; --json for details)"


def _no_draft_reason(explain: dict) -> str:
    predicted = explain.get("predicted_s", {})
    if explain.get("policy") == "auto" and predicted:
        cost = predicted["per_draft_token_batched"]
        saved = predicted["per_answer_token_without_draft"] - predicted["per_draft_token_verified"]
        return (f"no draft answer: it would cost {-predicted['net_gain_per_draft']:.1f} s more than it saves on "
                f"this machine (a draft token {cost * 1e3:.0f} ms, a used one saves {max(0.0, saved) * 1e3:.0f} ms)")
    return "no draft answer (" + explain.get("reason", "not planned") + ")"


class StageClock:
    """Adds wall time to Metrics.seconds[stage]."""

    def __init__(self, metrics: Metrics, clock=time.perf_counter) -> None:
        self.metrics = metrics
        self.clock = clock  # seconds, monotonic (a replay engine's modelled clock in `ssr simulate`)
        self.start = clock()

    def restart(self) -> None:
        """Count from now (a walk built before it runs)."""
        self.start = self.clock()

    def now(self) -> float:
        return self.clock() - self.start

    def add(self, stage: str, since: float) -> float:
        now = self.now()
        self.metrics.seconds[stage] += now - since
        return now
