"""One request on vLLM: SSR made of ordinary vLLM requests (engines/vllm.py).

  1. think    - the parent streams its CoT (stops at the end marker or b_v; code fences
                biased out). At each stage budget b a draft child is submitted: prompt +
                CoT[:b] + end marker + answer prefix, so its prompt is a prefix-cache hit on
                the parent's blocks; it writes up to m tokens in vLLM's batch while the
                parent streams on. A new stage aborts the previous child (its draft is kept).
  2. close    - the parent has ended: live children are aborted; the latest non-empty draft
                is verified in one request over prompt + CoT + forced + draft with
                `prompt_logprobs` (greedy: accepted while the draft token is the argmax; the
                first mismatch's argmax, or the token after a fully accepted draft, is the bonus)
  3. continue - one request continues from the accepted prefix (vLLM's own speculative
                method, when the engine was started with one, speeds it up inside vLLM)
  4. finish   - every request still open is aborted, metrics closed
`ar` is the same walk without children: the CoT request, then the answer request.
Sampled requests decode plainly: exact rejection sampling needs the draft's and the
target's full distributions, which vLLM's outputs do not carry (top-k logprobs only).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .config import ConfigError, GenerationConfig
from .draft import Draft
from .engines.base import EngineError
from .engines.vllm import Request, VllmEngine
from .metrics import Metrics, StageClock
from .policy import CostModel, PolicyStats, fixed_plan, plan_request
from .text import TextStream
from .thinking import ThinkingFormat
from .walk import Chunk, Walk

VLLM_MODES = ("ar", "ssr", "ssr-prefix")  # continuation proposers live inside vLLM (--speculative-method)
BANNED_BIAS = -1e9  # logit bias that removes a token (vLLM adds it to the logits)


@dataclass
class Child(Draft):
    """A draft child that is a vLLM request."""

    request: Request | None = None  # while it runs
    cached_tokens: int = 0  # of its prompt, read from vLLM's prefix cache


class VllmGeneration(Walk):
    """Iterate for chunks as they are decoded; `result` is set when iteration ends."""

    def __init__(self, engine: VllmEngine, fmt: ThinkingFormat, config: GenerationConfig,
                 prompt_ids: Sequence[int], banned_ids: Sequence[int] = (),
                 costs: CostModel | None = None, stats: PolicyStats | None = None) -> None:
        if config.mode not in VLLM_MODES:
            raise ConfigError(f"--engine vllm runs modes {', '.join(VLLM_MODES)}; for suffix or prompt-lookup "
                              "continuation start it with --speculative-method suffix|ngram")
        super().__init__(engine, fmt, config, prompt_ids, stats)
        self.banned_ids = sorted(banned_ids)
        self.plan = plan_request(config, costs or CostModel(), stats or PolicyStats())
        if not config.sampling.greedy and self.plan.draft:
            self.plan = fixed_plan(GenerationConfig(mode="ar", sampling=config.sampling))
            self.plan.explain["reason"] = ("sampling on vLLM decodes plainly: exact verification needs full "
                                           "distributions, vLLM returns top-k logprobs")
        self.metrics = Metrics(mode=config.mode, prompt_tokens=len(prompt_ids), policy=self.plan.as_dict())
        self._check_context()  # each child's request is shorter than the parent's answer request

    # -- stages -------------------------------------------------------------------------

    def _run(self) -> Iterator[Chunk]:
        clock = StageClock(self.metrics)
        self._open: list[Request] = []  # every request this generation submitted
        self._trace: list[dict] = []  # the verify event, as decode.py records it
        self.answer_ids: list[int] = []
        self._forced_ids: list[int] = []
        self._answer_text = TextStream(shown=self.fmt.answer_prefix.lstrip())
        drafts: list[Child] = []
        cot_ids: list[int] = []
        try:
            # 1. think (children fork at the plan's budgets)
            cot_end = yield from self._think(cot_ids, drafts, clock)
            since = clock.add("cot", 0.0)
            # 2. close the CoT, verify the latest draft
            yield from self._close(cot_ids, cot_end, _latest_usable(drafts))
            self.metrics.first_answer_token_s = since = clock.add("verify", since)
            # 3. continue
            yield from self._continue(cot_ids)
            clock.add("continuation", since)
        finally:
            for request in self._open:  # 4. nothing of this request stays in vLLM
                request.abort()
        tail = self._answer_text.flush()
        if tail:
            yield Chunk("answer", tail, ())
        self.metrics.total_s = clock.now()
        used = _latest_usable(drafts)
        self._close_metrics(drafts, used)
        self._finish(cot_ids, used.token_ids if used else [])

    def _think(self, cot_ids: list[int], drafts: list[Child], clock: StageClock):
        """Stage 1: fills cot_ids and drafts; returns how the CoT ended."""
        stream = self._reasoning_text = TextStream(self.fmt.end, shown=self.fmt.steer)
        if self.fmt.steer:
            yield Chunk("reasoning", self.fmt.steer, ())
        stages = list(self.plan.stages) if self.plan.draft else []
        bias = {token: BANNED_BIAS for token in self.banned_ids} or None
        parent = self._submit("parent", self.prompt_ids, self._params(
            self.config.thinking_budget, stop=[self.fmt.end], logit_bias=bias, detokenize=True))
        cot_end, seen = "", 0
        self._fork_due(cot_ids, stages, drafts, clock)  # b = 0: a child from the prompt alone
        for output in parent.stream():
            new = output.outputs[0].token_ids[seen:]
            seen += len(new)
            for token in new:
                chunk, cot_end = self._cot_token(token, cot_ids, stream)
                if chunk:
                    yield chunk
                if cot_end:
                    break
                self._fork_due(cot_ids, stages, drafts, clock)
            if cot_end:
                break
        parent.abort()
        if not cot_end:  # the stream ended without an end marker or EOS seen here
            reason = parent.latest.outputs[0].finish_reason if parent.latest is not None else "length"
            cot_end = "budget" if reason == "length" else "natural"
        tail = stream.flush()
        if tail:
            yield Chunk("reasoning", tail, ())
        for draft in drafts:  # outstanding children end with the parent's CoT
            self._finish_draft(draft, clock)
        self.metrics.cot_tokens, self.metrics.cot_end = len(cot_ids), cot_end
        return cot_end

    def _close(self, cot_ids: list[int], cot_end: str, draft: Draft | None) -> Iterator[Chunk]:
        """Stage 2: force end marker + answer prefix; verify the draft in one request."""
        forced = ([] if cot_end == "natural" else self.forced_end_ids) + self.answer_prefix_ids
        self._forced_ids = forced
        self.metrics.forced_tokens = len(forced)
        prefix = self.fmt.answer_prefix.lstrip()
        if prefix:
            yield Chunk("answer", prefix, tuple(self.answer_prefix_ids))
        if draft is None or not self.config.verifies_draft_prefix:
            return
        draft_ids = draft.token_ids[: self.config.max_tokens]
        accepted, bonus, cached = self._verify(self.prompt_ids + cot_ids + forced, draft_ids)
        self.metrics.verify_passes += 1
        self.metrics.accepted_prefix_tokens = accepted
        self.metrics.engine["verify_cached_tokens"] = cached
        self.metrics.engine["verify_prompt_tokens"] = len(self.prompt_ids) + len(cot_ids) + len(forced) + len(draft_ids)
        self._trace.append({"kind": "draft", "forked_at": draft.forked_at, "proposed": len(draft_ids),
                            "accepted": accepted})
        yield from self._commit(draft_ids[:accepted] + [bonus])

    def _verify(self, context_ids: list[int], draft_ids: list[int]) -> tuple[int, int, int]:
        """(num_accepted, bonus token, prefix-cache hits) of a greedy draft under context_ids.
        vLLM computes prompt logprobs only past the tokens it read from the prefix cache
        (rows before hold no data): reading the cache is kept only while the hit ends before
        the draft (it can reach into it when an earlier request wrote the same answer)."""
        reads_cache = self.engine.verify_reads_cache and self.engine.enable_prefix_caching
        output = self._verify_request(context_ids + draft_ids, reads_cache)
        cached = output.num_cached_tokens or 0
        if cached > len(context_ids) - 1:
            self.metrics.engine["verify_cache_reaches_draft"] = cached
            output = self._verify_request(context_ids + draft_ids, False)
        rows = output.prompt_logprobs  # [prompt tokens]: row i predicts token i from tokens < i
        for position, draft_token in enumerate(draft_ids):
            row = rows[len(context_ids) + position]
            if not row:
                raise EngineError(f"vLLM returned no prompt logprobs for draft position {position}")
            best = _argmax(row)
            if best != draft_token:
                return position, best, cached
        return len(draft_ids), output.outputs[0].token_ids[0], cached

    def _verify_request(self, prompt_ids: list[int], reads_cache: bool):
        request = self._submit("verify", prompt_ids, self._params(
            1, prompt_logprobs=1, skip_reading_prefix_cache=not reads_cache))
        return request.result()

    def _continue(self, cot_ids: list[int]) -> Iterator[Chunk]:
        """Stage 3: one request from the accepted prefix to EOS or max_tokens."""
        if self.metrics.stop:
            return
        context = self.prompt_ids + cot_ids + self._forced_ids + self.answer_ids
        request = self._submit("answer", context, self._params(self.config.max_tokens - len(self.answer_ids)))
        seen = 0
        for output in request.stream():
            new = list(output.outputs[0].token_ids[seen:])
            seen += len(new)
            yield from self._commit(new)
            if self.metrics.stop:
                break
        if not self.metrics.stop:
            self.metrics.stop = "max_tokens" if len(self.answer_ids) >= self.config.max_tokens else "eos"
        self.metrics.decode_steps = len(cot_ids) + seen  # tokens vLLM decoded for the parent

    # -- children -------------------------------------------------------------------------

    def _fork_due(self, cot_ids: list[int], stages: list[int], drafts: list[Child], clock: StageClock) -> None:
        """Fork when the CoT has reached the next stage budget."""
        if stages and len(cot_ids) == stages[0]:
            stages.pop(0)
            self._fork(cot_ids, drafts, clock)

    def _fork(self, cot_ids: list[int], drafts: list[Child], clock: StageClock) -> None:
        """A draft child from CoT[:b]: the previous one (if running) is aborted, its draft kept."""
        if drafts:
            self._finish_draft(drafts[-1], clock)
        context = self.prompt_ids + cot_ids + self.forced_end_ids + self.answer_prefix_ids
        draft = Child(seq=None, forked_at=len(cot_ids), started_s=clock.now())
        draft.request = self._submit("draft", context, self._params(self.plan.draft_tokens, greedy=True))
        drafts.append(draft)

    def _finish_draft(self, draft: Child, clock: StageClock) -> None:
        request = draft.request
        if request is None:
            return
        request.abort()
        draft.token_ids = request.token_ids
        draft.written = len(draft.token_ids)
        draft.seconds = clock.now() - draft.started_s
        draft.cached_tokens = (request.latest.num_cached_tokens or 0) if request.latest is not None else 0
        draft.request = None
        self.metrics.seconds["draft"] += draft.seconds

    # -- helpers ------------------------------------------------------------------------

    def _submit(self, role: str, prompt_ids: list[int], params) -> Request:
        request = self.engine.open(self.engine.new_id(role), prompt_ids, params)
        self._open.append(request)
        return request

    def _params(self, max_tokens: int, greedy: bool = False, detokenize: bool = False, **extra):
        sampling = self.config.sampling
        randomness = {"temperature": 0.0} if greedy or sampling.greedy else {
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
            "seed": sampling.seed}
        return self.engine.sampling_params(
            max_tokens=max(1, max_tokens), stop_token_ids=sorted(self.engine.eos_ids), detokenize=detokenize,
            include_stop_str_in_output=True, skip_special_tokens=False, **randomness, **extra)

    def _close_metrics(self, drafts: list[Child], used: Child | None) -> None:
        metrics = self.metrics
        # a superseded child hands nothing on (no bootstrapping here): 0 accepted by the next stage
        metrics.stages = [dict(draft.stage(metrics.accepted_prefix_tokens if draft is used else 0),
                               cached_tokens=draft.cached_tokens, used=draft is used) for draft in drafts]
        metrics.draft_tokens = len(used.token_ids) if used else 0
        metrics.engine["requests"] = len(self._open)


def _latest_usable(drafts: list[Child]) -> Child | None:
    """The latest draft that wrote anything (a child forked just before the end may not have)."""
    return next((draft for draft in reversed(drafts) if draft.token_ids), None)


def _argmax(row: dict) -> int:
    """The greedy token of a prompt-logprobs row {token: Logprob}: rank 1, lowest id on ties."""
    return min(token for token, logprob in row.items() if logprob.rank == 1)
