"""One request on a sequence engine, decoded plainly (`ar`) or with self-speculation (`ssr` and
the peers). Its parts, each passed what it needs:
  Sequences      the engine as the request sees it: the parent, forks, children; timed passes
  Verifier       greedy or exact sampled verdicts; a draft verified in doubling chunks
  DraftChildren  the draft children: fork, bootstrap, grow, finish
  CandidatePass  one speculative pass (CoT or answer): propose, score, verify, keep the winner
  Transcript     the output as tokens and streamed text; when the CoT and the answer end
  Speculation    how the request's candidates are verified (tree, forks, chain or one), decided once
  Plan           whether, when and how long children draft (pricing/drafting.py), decided once
The request walks four stages:
  1. think    - the parent writes its CoT; at each stage budget of the plan a draft child forks,
                is forced to end thinking and writes up to m answer tokens, its steps batched
                with the parent's (a later child is bootstrapped from the previous draft); the
                proposer's spans over prompt + CoT so far are verified in one pass each while no
                child lives, or beside it where the engine feeds several sequences a pass
  2. close    - the CoT ends (its end marker, EOS or b_v); the end marker and answer prefix are
                forced and the latest draft verified (chunks, early exit)
  3. continue - the proposer (suffix tree over prompt, drafts and output; n-gram lookup) guesses
                spans, each verified in one pass, the longest match kept
  4. finish   - outstanding sequences released, metrics closed
It changes speed only, never tokens: every token is the model's own (verifying/verify.py).
Every sequence keeps one *pending* token: committed, not yet fed to the engine.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from ..config import ConfigError, GenerationConfig
from ..pricing.costs import CostModel
from ..engines.base import tree_passes
from ..proposing.history import ResponseHistory
from ..metrics import StageClock
from ..pricing.drafting import Plan, PolicyStats, plan_request
from ..proposing.proposers import CompetingProposers, Proposer, request_proposer
from ..pricing.span_policy import SpanPolicy
from ..formats.thinking import ThinkingFormat
from .candidates import CandidatePass, Outcome
from .children import Draft, DraftChildren, stage_metrics
from .sequences import Sequences
from .speculation import Layout, decide, host_seconds
from .transcript import Chunk
from .verifier import Verifier
from .walk import Walk


class Generation(Walk):
    """Iterate for chunks as they are decoded; `result` is set when iteration ends."""

    def __init__(self, engine, fmt: ThinkingFormat, config: GenerationConfig,
                 prompt_ids: Sequence[int], banned_ids: Sequence[int] = (),
                 costs: CostModel | None = None, stats: PolicyStats | None = None,
                 proposer: Proposer | None = None, plan: Plan | None = None,
                 history: ResponseHistory | None = None, views: Sequence[Sequence[int]] = ()) -> None:
        super().__init__(engine, fmt, config, prompt_ids, stats)
        self.history = history  # earlier responses: suffix trees copy from them; this one joins at the end
        self.views = views  # tools offered: the messages' escaped views, for ssr's proposer to copy from
        self._carried: list[int] = []  # answer tokens the CoT's last pass verified past the end marker (per_step)
        self._proposer = proposer  # spans from this proposer instead of the mode's (`ssr simulate --spans recorded`)
        # engine costs: the model's (measured, rescaled at start-up), learnt further from this
        # request's own calls only, so one request's load (another mode, a busy machine) does not
        # price the next one's spans
        self.costs = replace(costs) if costs is not None else CostModel()
        self.speculation = spec = decide(engine, config, self.costs)
        self.costs.learns = not spec.per_step  # vLLM's drafter prices with its table as given
        # drafting: whether, when, how (`plan` given: a replay of a run's own plan)
        self.plan = plan or plan_request(config, self.costs, stats or PolicyStats(),
                                         spans_beside_child=spec.beside_child, cot_cap=self.cot_cap)
        learnt = stats.spans if stats is not None else {}  # span acceptance earlier requests measured
        one_chain = spec.layout is Layout.CHAIN  # one candidate verified a pass: the others judged, shared tokens pooled
        self.spans = SpanPolicy(self.costs, learnt.get("answer"), one_chain)  # answer span lengths worth a verify pass
        self.cot_spans = SpanPolicy(self.costs, learnt.get("cot"), one_chain)  # the same for CoT spans (accepted less)
        if spec.per_step:  # a drafted pass adds every request's host time to the step (vLLM's drafter)
            self.spans.host_s = self.cot_spans.host_s = host_seconds(spec.layout, engine.batch)
        self.metrics.policy, self.metrics.spans_beside_child = self.plan.as_dict(), spec.beside_child
        ids = config.sampling.greedy and engine.capabilities.returns_ids  # argmax where the logits live
        self.seqs = Sequences(engine, self.costs, self.metrics, banned_ids, ids)
        self.clock = StageClock(self.metrics, self.seqs.now)  # restarted when the request runs
        self.verifier = Verifier(config)
        self.children = DraftChildren(self.seqs, self.verifier, config, self.plan,
                                      self.forced_end_ids + self.answer_prefix_ids, engine.eos_ids, self.clock,
                                      self.limit)
        self.candidates = CandidatePass(self.seqs, self.verifier, spec, config.chooses_spans, self.children,
                                        self.metrics)
        self.check_context()

    # -- stages -------------------------------------------------------------------------

    def _run(self) -> Iterator[Chunk]:
        clock, drafts = self.clock, self.children.drafts
        clock.restart()
        try:
            # the prompt's sources are indexed while an accelerator prefills it (after, on a CPU)
            proposer = self._request_proposer(self.seqs.prefill_beside(self.prompt_ids[:-1], self._build_proposer))
            kept = self.engine.prefix if self.engine.capabilities.keeps_prefix else None  # the last request's KV
            self.metrics.cached_prompt_tokens = kept.reused if kept is not None else 0
            since = clock.add("prefill", 0.0)
            # 1. think (a draft child forks at each stage budget; CoT spans, beside it where passes are shared)
            pending, cot_end = yield from self._think(self.prompt_ids[-1], proposer)
            since = clock.add("cot", since)
            if not self.length_end(cot_end):  # (the output ends with its CoT: no answer)
                # 2. close the CoT, verify the latest draft
                if proposer is not None:
                    for each in drafts:  # spans may copy from every stage's draft
                        proposer.add_source(self.answer_prefix_ids + each.token_ids)
                yield from self._close(pending, cot_end, drafts[-1] if drafts else None, proposer)
                self.metrics.first_answer_token_s = since = clock.add("verify", since)
                # 3. continue
                yield from self._continue(proposer)
                clock.add("continuation", since)
        finally:
            self.seqs.drop_all()
        # 4. finish
        tail = self.text.close_answer()
        if tail:
            yield tail
        self.metrics.total_s = clock.now()
        stage_metrics(self.metrics, drafts)
        if self.stats is not None and self.config.chooses_spans:
            self.stats.spans.update(answer=dict(self.spans.stats), cot=dict(self.cot_spans.stats))
        self.finish(drafts[-1].token_ids if drafts else [], self.costs, drafts)
        if self.history is not None:
            self.history.add(self.result.output_ids)
        if isinstance(proposer, CompetingProposers):  # ssr's: what it borrowed goes back
            proposer.end()

    def _build_proposer(self) -> Proposer | None:
        """The mode's proposer (or the one given), the prompt indexed: it reads the request's
        settings and the response history only (it may run beside the prefill)."""
        spec, proposer = self.speculation, self._proposer
        if proposer is None:
            proposer = request_proposer(self.config, spec.extend, self.prompt_ids, self.history, several=spec.several,
                                        wide=spec.wide, trie=spec.trie, views=self.views, lookup=spec.lookup)
            if proposer is not None:
                proposer.prepare()  # what it would index at its first pass, indexed here
        return proposer

    def _request_proposer(self, proposer: Proposer | None) -> Proposer | None:
        """The proposer built, its shape told to the candidate pass."""
        spec = self.speculation
        if proposer is not None:
            self.candidates.shape = proposer.shape
            if proposer.shape.tree and not tree_passes(self.engine):
                raise ConfigError("a proposer that verifies its own token tree needs an engine with tree attention")
        if self.config.uses_draft and self.config.proposer == "suffix":
            self.metrics.engine["suffix_spans"] = "past the match" if spec.extend is not None else "match length"
        if proposer is not None and proposer.implementation:  # the suffix tree's: arctic-inference or ssr's own
            self.metrics.engine["suffix_tree"] = proposer.implementation
        return proposer

    def _think(self, pending: int, proposer: Proposer | None):
        """Stage 1: returns (the pending token or None, how the CoT ended). A child forks at each
        stage budget of the plan; only the latest child is alive (it rides in the parent's
        passes). Spans are verified (never across a stage budget) while no child is alive, or
        beside it where the engine feeds both in one pass."""
        config, metrics, text, children = self.config, self.metrics, self.text, self.children
        opening = text.opening()
        if opening:
            yield opening
        stages = list(self.plan.stages) if self.plan.draft else []
        cot_end = self.cap_end
        while len(text.cot_ids) < self.cot_cap:
            if stages and len(text.cot_ids) == stages[0]:
                stages.pop(0)
                children.fork(pending, len(text.cot_ids))
            child = children.alive
            if proposer is not None and config.cot_spans and (child is None or metrics.spans_beside_child) \
                    and (text.cot_ids or not self.speculation.per_step):  # vLLM: the prefill's token comes first
                room = min([self.cot_cap] + stages[:1]) - len(text.cot_ids) - 1  # tokens after the bonus
                candidates = self.candidates.propose(proposer, room, self.cot_spans)  # 1. propose
                if candidates:
                    pending, end = yield from self._cot_span(pending, candidates, proposer)
                    if end:
                        cot_end = end
                        break
                    continue
            batch = [(self.seqs.parent, pending)] + ([(child.seq, child.token_ids[-1])] if child else [])
            scores = self.seqs.step(batch, thinking=True)  # [len(batch), vocab], or [len(batch)] token ids
            metrics.cot_steps += 1
            if child is not None:
                children.stepped(child, scores[1])
            token = self.verifier.verdict([], self.seqs.mask(scores[0].copy())[None]).next_token
            chunk, end = text.cot_token(token)
            if chunk:
                yield chunk
            pending = None if end == "eos" else token
            if proposer is not None and pending is not None:
                proposer.observe([token])
            if end:
                cot_end = end
                break
        tail = text.close_reasoning()
        if tail:
            yield tail
        children.finish_all()  # outstanding children end with the parent's CoT
        metrics.cot_tokens, metrics.cot_end = len(text.cot_ids), cot_end
        return pending, cot_end

    def _cot_span(self, pending: int, candidates, proposer: Proposer):
        """One speculative CoT pass under the CoT's rules (banned tokens, end marker, EOS, loops), a
        living child's step in the same pass: returns (pending token or None, how the CoT ended or "")."""
        at = len(self.text.cot_ids)
        child = self.children.alive
        outcome = self.candidates.verify(pending, candidates, thinking=True)  # 2. score 3. verify
        committed = outcome.committed
        end, fed = "", 0  # fed: tokens processed; the last of them becomes pending
        for token in committed:
            fed += 1
            chunk, end = self.text.cot_token(token)
            if chunk:
                yield chunk
            if end:
                break
        # vLLM's chain runs on past the end marker: the tokens it verified there are the answer's first
        carries = end == "natural" and self.speculation.per_step and not self.answer_prefix_ids  # nothing forced after it
        self._carried = committed[fed:] if carries else []
        kept = fed + len(self._carried)
        self.seqs.truncate(self.seqs.parent, outcome.base + kept)  # 4. commit: pending + the tokens before the new pending
        proposer.observe(committed[: fed - 1 if end == "eos" else fed])  # 5. observe (EOS is not part of the CoT)
        child_s = self.costs.step(2) - self.costs.step(1) if child is not None else 0.0  # a plain step carries it too
        self._observe(outcome, self.cot_spans, "cot_span", at, self.seqs.now() - outcome.start_s - child_s)
        self.metrics.cot_passes += 1
        self.metrics.cot_proposed_tokens += len(outcome.span)
        self.metrics.cot_accepted_tokens += min(outcome.verdict.num_accepted, fed)
        return (None if end == "eos" else committed[fed - 1]), end

    def _close(self, pending: int | None, cot_end: str, draft: Draft | None,
               proposer: Proposer | None) -> Iterator[Chunk]:
        """Stage 2: force end marker + answer prefix and verify the latest draft."""
        end_ids = [] if cot_end == "natural" else self.forced_end_ids
        shown = self.text.force(end_ids, self.answer_prefix_ids)
        forced = self.text.forced_ids
        self.metrics.forced_tokens = len(forced)
        fed = ([] if pending is None else [pending]) + forced
        if not self.text.answer_room():  # the forced tokens filled the output
            self.metrics.stop = "max_tokens"
            if shown:
                yield shown
            return
        draft_ids = draft.token_ids[: self.text.answer_room()] \
            if draft is not None and self.config.verifies_draft_prefix else []
        if not forced and not draft_ids and pending is not None and self.text.cot_ids and self.speculation.per_step:
            # vLLM's drafter drafts after the end marker as after any token: the answer starts with
            # what the CoT's last chain verified past it, else with a pass of its own (the parity
            # test: tests/test_chain_parity.py)
            if shown:
                yield shown
            if self._carried:
                yield from self.commit(self._carried, proposer)
            else:
                yield from self._answer_pass(pending, proposer)
            return
        num_accepted, verdict, _ = self.verifier.chunked(self.seqs, self.seqs.parent, fed, draft_ids,
                                                         draft.probs if draft else [], self.plan.verify_chunk)
        if draft_ids:
            self.metrics.verify_passes += 1
            self.metrics.accepted_prefix_tokens = num_accepted
            self.trace.append({"kind": "draft", "forked_at": draft.forked_at, "proposed": len(draft_ids),
                               "accepted": num_accepted})
        if proposer is not None:
            proposer.observe(forced)
        if shown:
            yield shown
        yield from self.commit(draft_ids[:num_accepted] + [verdict.next_token], proposer)

    def _continue(self, proposer: Proposer | None) -> Iterator[Chunk]:
        """Stage 3: the answer, a pass at a time."""
        answer = self.text.answer_ids
        while not self.metrics.stop:
            yield from self._answer_pass(answer[-1], proposer)

    def _answer_pass(self, pending: int, proposer: Proposer | None) -> Iterator[Chunk]:
        """One pass of the answer after `pending`: a span verified, or a plain step."""
        answer = self.text.answer_ids
        candidates = self.candidates.propose(proposer, self.text.answer_room(), self.spans)  # 1.
        if not candidates:
            scores = self.seqs.step([(self.seqs.parent, pending)])  # [1, vocab]
            yield from self.commit([self.verifier.verdict([], scores).next_token], proposer)
            return
        outcome = self.candidates.verify(pending, candidates)  # 2. score 3. verify
        self.seqs.truncate(self.seqs.parent, outcome.base + 1 + outcome.verdict.num_accepted)  # 4. commit
        self.metrics.verify_passes += 1
        self.metrics.answer_proposed_tokens += len(outcome.span)
        self.metrics.answer_accepted_tokens += outcome.verdict.num_accepted
        self._observe(outcome, self.spans, "span", len(answer), self.seqs.now() - outcome.start_s)  # 5. observe
        yield from self.commit(outcome.committed, proposer)

    def _observe(self, outcome: Outcome, policy: SpanPolicy, kind: str, at: int, seconds: float) -> None:
        """What the pass taught the span policy, and its trace event. Drafted as vLLM's drafter
        drafts (per_step), a pass costs what the cost table says: the drafter times no pass."""
        if self.speculation.per_step:
            seconds = self.costs.cost(len(outcome.span) + 1)
        policy.observe_pass(outcome.verified(), seconds)
        policy.observe_judged(outcome.judged())  # (none unless one chain a pass: CandidatePass.propose)
        self.trace.append(outcome.event(kind, at))

    def _engine_time(self) -> tuple[float, int]:
        return self.seqs.seconds()
