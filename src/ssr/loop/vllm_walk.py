"""One request on vLLM: SSR made of ordinary vLLM requests (engines/vllm.py); it shares the
sequence walk's transcript, result and iteration (loop/walk.py).

  1. think    - the parent streams its CoT (stops at the end marker or b_v; code fences masked
                out with allowed_token_ids: vLLM's speculative methods refuse logit_bias). At
                each stage budget b a draft child is submitted: prompt + CoT[:b] + end marker +
                answer prefix, a prefix-cache hit on the parent's blocks; it writes up to m
                tokens in vLLM's batch while the parent streams on. A later stage is
                *bootstrapped*: the previous draft rides in the new child's prompt, scored there
                (`prompt_logprobs`) under the longer CoT; if a token is rejected the child
                restarts from the accepted prefix and the token that replaces it.
  2. close    - the CoT has ended: live children are aborted; the latest non-empty draft is
                verified in one request over prompt + CoT + forced + draft with `prompt_logprobs`
                (greedy: accepted while the draft token is the argmax; the first mismatch's
                argmax, or the token after a fully accepted draft, is the bonus; sampled: exact
                rejection sampling on top-k rows, verify.verify_sampled_rows)
  3. continue - one request from the accepted prefix; or, where nothing comes between CoT and
                answer (`goes_on`: ar and ssr-suffix, nothing to ban or force but what vLLM's own
                thinking budget forces, engines/vllm_budget.py), the parent's request goes on as
                stock vLLM serves it, the children's drafts copied by vLLM's speculative method
                (ssr, suffix). What vLLM accepted: metrics.engine["speculation"], the trace
  4. finish   - every request still open is aborted, metrics closed (`ar`: the walk, no children)

Sampled requests: exact rejection sampling on vLLM's raw top-k logprob rows, which hold every
token the sampler may pick when top_k = k <= max_logprobs (-1: whole vocabularies); the child
returns its rows (`logprobs=k`), the verify request the target's (`prompt_logprobs=k`).
Otherwise a sampled request decodes plainly and says why (docs/losslessness.md, "Sampling on vLLM").
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from ..config import ConfigError, GenerationConfig
from ..pricing.costs import CostModel
from ..engines.base import EngineError
from ..engines.vllm import Request, VllmEngine
from ..metrics import StageClock
from ..pricing.drafting import PolicyStats, fixed_plan, plan_request
from ..formats.thinking import ThinkingFormat
from ..verifying.verify import exact_row_size, verify_greedy_rows, verify_sampled_rows
from ..engines.vllm_budget import vllm_budget
from ..engines.vllm_speculation import record_speculation
from .children import Draft, RequestChild, latest_usable, through_eos
from .transcript import Chunk
from .walk import Walk

VLLM_MODES = ("ar", "ssr", "ssr-prefix", "ssr-suffix")  # continuation proposers live inside vLLM (--speculative-method)
COPIES_RESPONSES = ("ssr", "suffix")  # vLLM methods that copy from earlier requests' responses (a child's draft)


class VllmGeneration(Walk):
    """Iterate for chunks as they are decoded; `result` is set when iteration ends."""

    def __init__(self, engine: VllmEngine, fmt: ThinkingFormat, config: GenerationConfig,
                 prompt_ids: Sequence[int], banned_ids: Sequence[int] = (),
                 costs: CostModel | None = None, stats: PolicyStats | None = None) -> None:
        if config.mode not in VLLM_MODES:
            raise ConfigError(f"--engine vllm runs modes {', '.join(VLLM_MODES)}; for suffix or prompt-lookup "
                              "continuation start it with --speculative-method suffix|ngram")
        if config.mode == "ssr-suffix" and getattr(engine, "speculative_method", None) not in COPIES_RESPONSES:
            raise ConfigError("--mode ssr-suffix on vLLM needs a speculative method that copies earlier responses "
                              f"(--speculative-method {' or '.join(COPIES_RESPONSES)}): the draft reaches the answer "
                              "only through it")
        super().__init__(engine, fmt, config, prompt_ids, stats)
        self.banned_ids = sorted(banned_ids)
        # a budget the CoT may reach, in the model's own format (the engine's markers are its): vLLM
        # counts it and forces the end marker itself (vllm_budget.py), the same one in every mode and child
        markers = getattr(engine, "budget_markers", None)
        self.vllm_budget = vllm_budget(self.prompt_ids, markers[0], self.cot_cap) \
            if markers and fmt.native and self.cot_cap < self.limit else None
        if self.vllm_budget is not None:
            self.forced_end_ids = list(markers[1])
        # one request writes the CoT and the answer, as stock vLLM serves it, where nothing comes
        # between them: no draft verified in a request of its own (ar, ssr-suffix: vLLM's method
        # copies the draft), no token banned while thinking, no answer prefix, no budget but vLLM's
        self.goes_on = not config.verifies_draft_prefix and not self.banned_ids and not self.answer_prefix_ids \
            and (self.cot_cap >= self.limit or self.vllm_budget is not None)
        # a child is priced at the batch it would run in: the requests vLLM holds now and this one
        batch = engine.live_requests() + 1
        self.plan = plan_request(config, (costs or CostModel()).at_batch(batch), stats or PolicyStats(),
                                 cot_cap=self.cot_cap)
        self.plan.explain["batch"] = batch
        max_logprobs = getattr(engine, "max_logprobs", 20)
        self.row_size = exact_row_size(config.sampling, max_logprobs)
        if not config.sampling.greedy and self.plan.draft and self.row_size is None and config.verifies_draft_prefix:
            self.plan = fixed_plan(GenerationConfig(mode="ar", sampling=config.sampling))
            self.plan.explain["reason"] = (
                f"sampling on vLLM decodes plainly here: exact verification needs top_k between 1 and the "
                f"engine's max_logprobs ({max_logprobs}), or full rows (--max-logprobs -1)")
        self.rng = np.random.default_rng(config.sampling.seed)  # rejection sampling's coins
        self.metrics.policy = self.plan.as_dict()
        self.check_context()  # each child's request is shorter than the parent's answer request

    # -- stages -------------------------------------------------------------------------

    def _run(self) -> Iterator[Chunk]:
        clock = StageClock(self.metrics)
        self._open: list[Request] = []  # every request this generation submitted
        self._parent, self._parent_seen = None, 0  # the CoT's request, its output tokens read
        drafts: list[RequestChild] = []
        cot_ids = self.text.cot_ids  # the transcript's: it grows as the CoT is read
        try:
            # 1. think (children fork at the plan's budgets)
            cot_end = yield from self._think(cot_ids, drafts, clock)
            since = clock.add("cot", 0.0)
            if not self.length_end(cot_end):  # (the output ends with its CoT: no answer)
                # 2. close the CoT, verify the latest draft
                yield from self._close(cot_ids, cot_end, latest_usable(drafts))
                self.metrics.first_answer_token_s = since = clock.add("verify", since)
                # 3. continue
                yield from self._continue(cot_ids)
                clock.add("continuation", since)
        finally:
            for request in self._open:  # 4. nothing of this request stays in vLLM
                request.abort()
        tail = self.text.close_answer()
        if tail:
            yield tail
        self.metrics.total_s = clock.now()
        used = latest_usable(drafts)
        self._close_metrics(drafts, used)
        self.finish(used.token_ids if used else [], drafts=drafts)

    def _think(self, cot_ids: list[int], drafts: list[RequestChild], clock: StageClock):
        """Stage 1: fills cot_ids and drafts; returns how the CoT ended."""
        opening = self.text.opening()
        if opening:
            yield opening
        if not self.cot_cap:  # a budget of 0: no CoT to decode and no child, as the sequence walk
            self.metrics.cot_tokens, self.metrics.cot_end = 0, self.cap_end
            return self.cap_end
        stages = list(self.plan.stages) if self.plan.draft else []
        banned = set(self.banned_ids)
        allowed = [token for token in range(self.engine.vocab_size) if token not in banned] if banned else None
        # a one-token end marker (</think>) stops the request in vLLM's scheduler, which then reports
        # its spec-decode metrics; a text marker stops it in the frontend (no metrics: the stream's)
        end_ids = self.engine.tokenize(self.fmt.end)
        stops = {"stop_ids": end_ids} if len(end_ids) == 1 else {"stop": [self.fmt.end]}
        if self.goes_on:  # the parent's request goes on into the answer, as stock vLLM serves it
            budget = {} if self.vllm_budget is None else {"thinking_token_budget": self.vllm_budget}
            parent = self._submit("parent", self.prompt_ids, self._params(self.limit, detokenize=True, **budget))
        else:
            parent = self._submit("parent", self.prompt_ids, self._params(
                self.cot_cap, allowed_token_ids=allowed, detokenize=True, **stops))
        cot_end, seen = "", 0
        self._fork_due(cot_ids, stages, drafts, clock)  # b = 0: a child from the prompt alone
        for output in parent.stream():
            for token in output.outputs[0].token_ids[seen:]:
                seen += 1
                chunk, cot_end = self.text.cot_token(token)
                if chunk:
                    yield chunk
                if not cot_end and self.goes_on and len(cot_ids) == self.cot_cap < self.limit:
                    cot_end = self.cap_end  # vLLM forces the end marker next (vllm_budget)
                if cot_end:
                    break
                self._fork_due(cot_ids, stages, drafts, clock)
            if cot_end:
                break
        self._parent, self._parent_seen = parent, seen
        if not self._parent_goes_on(cot_end):
            parent.abort()
            self._speculation("cot", parent, 0, len(cot_ids))
        if not cot_end:  # the stream ended without an end marker or EOS seen here
            reason = parent.latest.outputs[0].finish_reason if parent.latest is not None else "length"
            cot_end = self.cap_end if reason == "length" else "natural"
        tail = self.text.close_reasoning()
        if tail:
            yield tail
        for draft in drafts:  # outstanding children end with the parent's CoT
            self._finish_draft(draft, clock)
        self.metrics.cot_tokens, self.metrics.cot_end = len(cot_ids), cot_end
        return cot_end

    def _close(self, cot_ids: list[int], cot_end: str, draft: Draft | None) -> Iterator[Chunk]:
        """Stage 2: force end marker + answer prefix; verify the draft in one request."""
        shown = self.text.force([] if cot_end == "natural" else self.forced_end_ids, self.answer_prefix_ids)
        forced = self.text.forced_ids
        self.metrics.forced_tokens = len(forced)
        if shown:
            yield shown
        if not self.text.answer_room():  # the forced tokens filled the output
            self.metrics.stop = "max_tokens"
            return
        if draft is None or not self.config.verifies_draft_prefix:
            return
        draft_ids = draft.token_ids[: self.text.answer_room()]
        accepted, bonus, cached = self._verify(self.prompt_ids + cot_ids + forced, draft_ids, draft.rows)
        self.metrics.verify_passes += 1
        self.metrics.accepted_prefix_tokens = accepted
        self.metrics.engine["verify_cached_tokens"] = cached
        self.metrics.engine["verify_prompt_tokens"] = len(self.prompt_ids) + len(cot_ids) + len(forced) + len(draft_ids)
        self.trace.append({"kind": "draft", "forked_at": draft.forked_at, "proposed": len(draft_ids),
                            "accepted": accepted})
        yield from self.commit(draft_ids[:accepted] + [bonus])

    def _verify(self, context_ids: list[int], draft_ids: list[int],
                draft_rows: list[dict[int, float]]) -> tuple[int, int, int]:
        """(num_accepted, next token, prefix-cache hits) of a draft under context_ids: greedy, the
        argmax check; sampled, rejection sampling on top-k rows (next: recovered or bonus).
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
        target_rows = [rows[len(context_ids) + position] for position in range(len(draft_ids))]
        if not all(target_rows):
            raise EngineError("vLLM returned no prompt logprobs for a draft position")
        bonus = output.outputs[0].token_ids[0]  # the target's own token after the whole draft
        if self.config.sampling.greedy:
            accepted, next_token = verify_greedy_rows(draft_ids, target_rows, bonus)
            return accepted, next_token, cached
        verdict = verify_sampled_rows(draft_ids, draft_rows[: len(draft_ids)],
                                      [self._top(row) for row in target_rows], bonus, self.config.sampling,
                                      self.rng, approx=self.config.verify == "approx")
        return verdict.num_accepted, verdict.next_token, cached

    def _verify_request(self, prompt_ids: list[int], reads_cache: bool):
        request = self._submit("verify", prompt_ids, self._params(
            1, prompt_logprobs=self._row_request(), skip_reading_prefix_cache=not reads_cache))
        return request.result()

    def _continue(self, cot_ids: list[int]) -> Iterator[Chunk]:
        """Stage 3: the parent's own request goes on (`goes_on`, the CoT ended itself), or one
        request from the accepted prefix; to EOS or max_tokens."""
        if self.metrics.stop:
            return
        request, start, forced = self._parent, len(self.text.answer_ids), self.text.forced_ids
        if request is not None and self._parent_goes_on(self.metrics.cot_end):  # after the CoT and what vLLM forced
            first, outputs = self._parent_seen + len(forced), [request.latest]
        else:
            context = self.prompt_ids + cot_ids + forced + self.text.answer_ids
            request, first, outputs = self._submit("answer", context, self._params(self.text.answer_room())), 0, []
            self.metrics.engine["answer_prompt_tokens"] = len(context)
        seen = first
        for output in itertools.chain(outputs, request.stream()):
            tokens = output.outputs[0].token_ids
            if first and len(tokens) >= first and list(tokens[self._parent_seen:first]) != forced:
                raise EngineError(f"vLLM's thinking budget forced {list(tokens[self._parent_seen:first])}, "
                                  f"not the end marker {forced}")
            new = list(tokens[seen:])
            seen += len(new)
            yield from self.commit(new)
            if self.metrics.stop:
                break
        request.abort()
        if not first and request.latest is not None:
            self.metrics.engine["answer_cached_tokens"] = request.latest.num_cached_tokens or 0
        used = len(self.text.answer_ids) - start
        if first:  # one request wrote both: its speculation read in two parts
            self._speculation("cot", request, 0, len(cot_ids), part=(0, first))
        self._speculation("answer", request, start, used, part=(first, seen) if first else None)
        if not self.metrics.stop:
            self.metrics.stop = "eos" if self.text.answer_room() else "max_tokens"
        self.metrics.decode_steps = len(cot_ids) + seen - first  # tokens vLLM decoded for the parent

    def _parent_goes_on(self, cot_end: str) -> bool:
        """The parent's request goes on into the answer after a CoT that ended so."""
        return self.goes_on and (cot_end == "natural" or (cot_end == "budget" and self.vllm_budget is not None))

    # -- children -------------------------------------------------------------------------

    def _fork_due(self, cot_ids: list[int], stages: list[int], drafts: list[RequestChild], clock: StageClock) -> None:
        """Fork when the CoT has reached the next stage budget (and look at a bootstrapped child)."""
        self._check(drafts[-1] if drafts else None)
        if stages and len(cot_ids) == stages[0]:
            stages.pop(0)
            self._fork(cot_ids, drafts, clock)

    def _fork(self, cot_ids: list[int], drafts: list[RequestChild], clock: StageClock) -> None:
        """A draft child from CoT[:b]. A previous child is stopped and its draft rides in the new
        child's prompt (bootstrapping; `_check` scores it under the longer CoT)."""
        previous = drafts[-1] if drafts else None
        if previous is not None:
            self._finish_draft(previous, clock)
        context = self.prompt_ids + cot_ids + self.forced_end_ids + self.answer_prefix_ids
        draft = RequestChild(seq=None, forked_at=len(cot_ids), started_s=clock.now(), context_ids=context)
        if previous is not None and previous.token_ids and self.config.verifies_draft_prefix:
            carried = through_eos(previous.token_ids, self.engine.eos_ids)[: self.plan.draft_tokens]
            draft.carried_ids, draft.carried_rows, draft.checked = carried, previous.rows[: len(carried)], False
        self._submit_child(draft, score_carried=not draft.checked)
        drafts.append(draft)

    def _submit_child(self, draft: RequestChild, score_carried: bool) -> None:
        extra = {"prompt_logprobs": self._row_request()} if score_carried else {}
        if not self.config.sampling.greedy:
            extra["logprobs"] = self.row_size  # its rows, for the verification
        room = len(self.prompt_ids) + self.limit - len(draft.context_ids)  # what the parent's output may still hold
        left = max(1, min(self.plan.draft_tokens, room) - len(draft.carried_ids))
        draft.request = self._submit("draft", draft.context_ids + draft.carried_ids,
                                     self._params(left, child=True, **extra))

    def _check(self, draft: RequestChild | None, restart: bool = True) -> bool:
        """Once a bootstrapped child's first output is in: its carried tokens scored under its own
        CoT. All accepted: it goes on. Else its carried tokens become the accepted prefix and the
        token that replaces the first rejected one, and (restart) it starts again from them (a
        prefix-cache hit; nothing to score again). Returns whether the tokens its request wrote
        still follow its carried ones."""
        if draft is None or draft.checked or draft.request is None or draft.request.latest is None:
            return True
        output, start, carried = draft.request.latest, len(draft.context_ids), draft.carried_ids
        draft.checked = True
        scored = output.prompt_logprobs[start: start + len(carried)] if output.prompt_logprobs else []
        bonus = output.outputs[0].token_ids[0] if output.outputs[0].token_ids else None
        greedy = self.config.sampling.greedy
        own_rows: list[dict[int, float]] = []  # sampled: [carried] q under this child's CoT
        if (output.num_cached_tokens or 0) > start - 1 or len(scored) < len(carried) or not all(scored) \
                or (bonus is None and not greedy):
            accepted, next_token = 0, None  # rows missing (the cache reached into the carried tokens): start afresh
        elif greedy:
            accepted, next_token = verify_greedy_rows(carried, scored, bonus)
        else:
            own_rows = [self._top(row) for row in scored]
            verdict = verify_sampled_rows(carried, draft.carried_rows, own_rows, bonus, self.config.sampling, self.rng)
            accepted, next_token = verdict.num_accepted, verdict.next_token
        draft.bootstrapped = accepted
        if accepted == len(carried):
            draft.carried_rows = own_rows
            return True
        draft.request.abort()
        draft.carried_ids = carried[:accepted] + ([] if next_token is None else [next_token])
        draft.carried_rows = own_rows[: len(draft.carried_ids)]
        if restart:
            self.metrics.engine["child_restarts"] = self.metrics.engine.get("child_restarts", 0) + 1
            self._submit_child(draft, score_carried=False)
        return False

    def _finish_draft(self, draft: RequestChild, clock: StageClock) -> None:
        request = draft.request
        if request is None:
            return
        request.abort()
        follows = self._check(draft, restart=False)  # its first output may have come in since the last look
        written = request.token_ids if follows else []  # after a rejected carried token they are void
        if draft.checked:  # else its carried tokens were never scored: the previous draft stays the usable one
            draft.token_ids = through_eos(draft.carried_ids + written, self.engine.eos_ids)[: self.plan.draft_tokens]
            if not self.config.sampling.greedy:
                generated = request.latest.outputs[0].logprobs if request.latest is not None else []
                draft.rows = (draft.carried_rows + [self._top(row) for row in generated or []])[: len(draft.token_ids)]
        draft.written = len(written)
        draft.seconds = clock.now() - draft.started_s
        draft.cached_tokens = (request.latest.num_cached_tokens or 0) if request.latest is not None else 0
        draft.request = None
        self.metrics.seconds["draft"] += draft.seconds

    # -- helpers ------------------------------------------------------------------------

    def _engine_time(self) -> tuple[float, int]:
        """Blocked on vLLM's outputs; passes: the outputs vLLM produced (an engine step each)."""
        return sum(r.waited_s for r in self._open), sum(len(r.steps) for r in self._open)

    def _speculation(self, phase: str, request: Request, start: int, used: int,
                     part: tuple[int, int] | None = None) -> None:
        """What vLLM's own speculative method accepted in the CoT or answer (request, or its part)."""
        method = getattr(self.engine, "speculative_method", None)
        if method:
            record_speculation(self.metrics, self.trace, phase, request, f"vllm-{method}", start, used, part)

    def _submit(self, role: str, prompt_ids: list[int], params) -> Request:
        request = self.engine.open(self.engine.new_id(role), prompt_ids, params)
        self._open.append(request)
        return request

    def _params(self, max_tokens: int, child: bool = False, detokenize: bool = False, stop_ids=(), **extra):
        sampling = self.config.sampling
        seed = sampling.seed + 7919 * (1 + len(self._open)) if child else sampling.seed  # a child's own coins
        randomness = {"temperature": 0.0} if sampling.greedy else {
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k, "seed": seed}
        return self.engine.sampling_params(
            max_tokens=max(1, max_tokens), stop_token_ids=sorted({*self.engine.eos_ids, *stop_ids}),
            detokenize=detokenize, include_stop_str_in_output=True, skip_special_tokens=False, **randomness, **extra)

    def _row_request(self) -> int:
        """Logprobs per row to ask vLLM for: greedy needs the argmax, sampling the top k (or all: -1)."""
        return 1 if self.config.sampling.greedy else self.row_size

    def _top(self, row: dict) -> dict[int, float]:
        """A vLLM logprob row {token: Logprob} -> {token: raw logprob} of its top-k tokens only (vLLM
        adds the sampled or prompt token when it ranks lower: the sampler could not pick it)."""
        limit = self.row_size if self.row_size and self.row_size > 0 else len(row)
        return {token: logprob.logprob for token, logprob in row.items() if logprob.rank <= limit}

    def _close_metrics(self, drafts: list[RequestChild], used: RequestChild | None) -> None:
        metrics = self.metrics
        # a child's draft counts as accepted by what took it on: the next stage's bootstrapped
        # prefix, or (the one verified) the parent's accepted prefix
        handed = [nxt.bootstrapped for nxt in drafts[1:]] + [0]
        metrics.stages = [dict(draft.stage(metrics.accepted_prefix_tokens if draft is used else handed[index]),
                               cached_tokens=draft.cached_tokens, used=draft is used)
                          for index, draft in enumerate(drafts)]
        metrics.draft_tokens = len(used.token_ids) if used else 0
        metrics.engine["requests"] = len(self._open)
