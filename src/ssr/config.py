"""Frozen configuration, validated once at construction.

Every knob a request can set lives here. Invalid values raise `ConfigError` with a
message meant for a person (the CLI prints it as one line and exits 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

VERIFY_MODES = ("exact", "approx")
DEFAULT_CONTEXT = 8192  # KV tokens an engine holds for a sequence unless told (--context-size)
POLICIES = ("auto", "fixed")


@dataclass(frozen=True)
class Mode:
    """What a mode of the decoding loop does; every reader of a mode's meaning reads it here."""

    name: str
    drafts: bool  # forks draft children from the partial CoT (ssr's method)
    verifies_draft: bool  # verifies the latest draft as a prefix of the answer in one pass
    proposer: str | None  # what speculates the output: "suffix" (ssr's sources where it drafts, else the
    #                       `suffix` peer), "pld", "ngram" (the peers as their users run them), None (plain)
    summary: str  # one line for help and docs
    replays_as: str | None = None  # replay-only (ssr traces): the engine mode whose loop runs it; None: engines run it
    cot_spans: bool = True  # the CoT is speculated too (False: the paper's regime, the CoT decoded plainly)
    own_proposer: bool = False  # replay-only: it brings its own proposer (bench/peers, bench/oracle.py)

    @property
    def chooses(self) -> bool:
        """ssr's own speculation: the span policy chooses among the sources and cuts each span."""
        return self.drafts and self.proposer is not None


MODE_TABLE = {mode.name: mode for mode in (
    Mode("ar", False, False, None, "plain decoding"),
    Mode("ssr", True, True, "suffix", "draft children, the draft verified, every output token speculated"),
    Mode("ssr-prefix", True, True, None, "draft children, the draft verified, the rest decoded plainly"),
    Mode("ssr-suffix", True, False, "suffix", "draft children seed the speculation; no draft verify pass"),
    Mode("suffix", False, False, "suffix", "peer: vLLM's suffix decoding (arctic-inference's tree)"),
    Mode("pld", False, False, "pld", "peer: transformers' prompt lookup decoding"),
    Mode("ngram", False, False, "ngram", "peer: vLLM's ngram method (its docs' example)"),
)}
REPLAY_ONLY = (  # what `ssr traces` also replays: the paper's method, the peers no engine of ssr runs, the limit
    Mode("paper", True, True, "suffix", "ssr with the CoT decoded plainly (the paper's method)", replays_as="ssr",
         cot_spans=False),
    Mode("ngram-v1", False, False, "ngram", "peer: vLLM's ngram on its V1 runner (earliest match)", replays_as="ngram"),
    *(Mode(name, False, False, "own", summary, replays_as="suffix", own_proposer=True) for name, summary in (
        ("vllm-ngram", "peer: vLLM's ngram on its default runner (rightmost match, K tokens always)"),
        ("arctic-tree", "peer: arctic-inference's tree speculation"),
        ("sglang-ngram", "peer: SGLang's NGRAM, a BFS token tree of 12 over one trie of decode windows"),
        ("sglang-ngram-prob", "peer: SGLang's NGRAM, its PROB tree"),
        ("llamacpp-ngram-simple", "peer: llama-server's ngram-simple"),
        ("llamacpp-ngram-mod", "peer: llama-server's ngram-mod"),
        ("oracle", "the limit: with hindsight, the longest copy of what comes next a pass"),
        ("oracle-anchored", "the limit of copying after the context's last token: the oracle, its copies "
                            "following an occurrence of that token"))),
)
# replay-only references on traces that carry a GPU run's recorded acceptance (bench/recorded.py);
# not in the default modes: a trace without the record cannot replay them
RECORDED_MODES = tuple(
    Mode(name, False, False, "own", summary, replays_as="suffix", own_proposer=True) for name, summary in (
        ("recorded-ngram", "reference: vLLM's n-gram acceptance as a GPU run recorded it (acc_ngram)"),
        ("recorded-eagle", "reference: vLLM's EAGLE acceptance as a GPU run recorded it (acc_eagle)")))
MODES = tuple(MODE_TABLE)  # what the engines run (generate, bench, serve)
MODE_TABLE.update((mode.name, mode) for mode in (*REPLAY_ONLY, *RECORDED_MODES))
# what `ssr traces` replays, in its tables' order (`ngram` is there as ngram-v1 and vllm-ngram, by its rules)
TRACE_MODES = ("ar", "ssr", "paper", "suffix", "ngram-v1", "pld", *(mode.name for mode in REPLAY_ONLY[2:]))
DRAFT_MODES = tuple(name for name in MODES if MODE_TABLE[name].drafts)  # modes that fork draft children


class ConfigError(ValueError):
    """A configuration value a person must fix."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax, lowest id on ties)
    top_p: float = 1.0  # nucleus mass kept, (0, 1]
    top_k: int = 0  # 0 keeps the whole vocabulary
    seed: int = 0  # seeds the request's numpy Generator

    def __post_init__(self) -> None:
        _check(self.temperature >= 0 and math.isfinite(self.temperature),
               f"--temperature must be a finite number >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"--top-p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, f"--top-k must be >= 0, got {self.top_k}")
        _check(self.seed >= 0, f"--seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class SuffixParams:
    """Suffix-decoding proposer (ArcticInference-style suffix tree). The ssr modes' defaults are
    vLLM's but for a deeper tree (64: longer matches, longer spans); the span policy then prices
    each span on the engine's cost curve. The `suffix` peer uses vLLM's defaults exactly
    (proposers.PEER_SUFFIX)."""

    max_depth: int = 64  # longest pattern + continuation stored in the tree
    max_span: int = 64  # longest span proposed in one verify pass
    span_factor: float = 1.0  # span length allowed per matched token
    min_prob: float = 0.1  # stop a span when its cumulative estimated probability drops below

    def __post_init__(self) -> None:
        _check(self.max_depth >= 2, f"suffix max_depth must be >= 2, got {self.max_depth}")
        _check(self.max_span >= 1, f"suffix max_span must be >= 1, got {self.max_span}")
        _check(self.span_factor > 0, f"suffix span_factor must be > 0, got {self.span_factor}")
        _check(0 <= self.min_prob <= 1, f"suffix min_prob must be in [0, 1], got {self.min_prob}")


@dataclass(frozen=True)
class GenerationConfig:
    mode: str = "ssr"  # one of MODES; "ar" is plain decoding
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # b_v: CoT tokens before the end of thinking is forced. None: no budget of the request's own, so
    # a reasoning model thinks until it ends its thinking itself; a thinking template (a model that
    # does not reason by itself) brings its own (ThinkingFormat.budget)
    thinking_budget: int | None = None
    # output tokens at most, reasoning included (OpenAI's max_completion_tokens, vLLM's max_tokens);
    # None: until the context is full
    max_tokens: int | None = None
    max_answer_tokens: int | None = None  # answer tokens at most (forced answer prefix not counted); None: no cap
    draft_at: int = 64  # b_d: CoT tokens before the draft child forks (auto: until CoT lengths are known)
    draft_tokens: int = 256  # m: answer tokens the draft child may write (auto: at most this)
    draft_interval: int = 0  # i: CoT tokens between stages (forks at b_d, b_d + i, ...); 0 = one stage
    policy: str = "auto"  # "auto": drafting decided from measured costs (pricing/drafting.py); "fixed": as given
    verify: str = "exact"  # sampling only: "exact" rejection sampling or "approx" resampling
    suffix: SuffixParams = field(default_factory=SuffixParams)
    adaptive_spans: bool = True  # cut spans to what the measured engine costs make worth it
    cot_spans: bool = True  # speculate the CoT too (False: the paper's regime, the CoT decoded plainly)
    verify_chunk: int = 16  # draft tokens in the first verify pass; doubles while all accepted
    repetition_stop: int = 0  # CoT or answer ends when its last N lines repeat a block (text.LoopGuard); 0 = off

    def __post_init__(self) -> None:
        _check(self.mode in MODES, f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _check(self.verify in VERIFY_MODES, f"--verify must be one of {', '.join(VERIFY_MODES)}")
        _check(self.thinking_budget is None or self.thinking_budget >= 0,
               f"--thinking-budget must be >= 0, got {self.thinking_budget}")
        _check(self.max_tokens is None or self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}")
        _check(self.max_answer_tokens is None or self.max_answer_tokens >= 1,
               f"--max-answer-tokens must be >= 1, got {self.max_answer_tokens}")
        _check(self.draft_tokens >= 1, f"--draft-tokens must be >= 1, got {self.draft_tokens}")
        _check(self.draft_at >= 0, f"--draft-at must be >= 0, got {self.draft_at}")
        _check(self.policy in POLICIES, f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        _check(self.draft_interval >= 0, f"--draft-interval must be >= 0, got {self.draft_interval}")
        _check(self.verify_chunk >= 1, f"--verify-chunk must be >= 1, got {self.verify_chunk}")
        _check(self.repetition_stop == 0 or self.repetition_stop >= 2,
               f"--repetition-stop must be 0 (off) or >= 2 lines, got {self.repetition_stop}")
        if self.uses_draft and self.thinking_budget:  # no chain of thought: nothing to fork, no draft
            _check(
                self.draft_at < self.thinking_budget,
                f"--draft-at ({self.draft_at}) must be smaller than --thinking-budget "
                f"({self.thinking_budget}): the draft forks from a partial chain of thought",
            )

    def cot_cap(self, output_limit: int) -> int:
        """CoT tokens at most in a request that may write `output_limit` tokens: the thinking
        budget where there is one, else all of them."""
        return output_limit if self.thinking_budget is None else min(self.thinking_budget, output_limit)

    @property
    def uses_draft(self) -> bool:
        """Modes that fork a draft child from the partial CoT."""
        return MODE_TABLE[self.mode].drafts

    @property
    def chooses_spans(self) -> bool:
        """The span policy chooses among the sources and cuts each span (the ssr modes, unless
        --all-spans); the peers verify what their one proposer proposes."""
        return self.adaptive_spans and self.uses_draft

    @property
    def verifies_draft_prefix(self) -> bool:
        """Modes that verify the draft as a prefix of the answer in one pass."""
        return MODE_TABLE[self.mode].verifies_draft

    @property
    def proposer(self) -> str | None:
        """Continuation proposer: 'suffix', 'pld', 'ngram' or None (plain decoding)."""
        return MODE_TABLE[self.mode].proposer
