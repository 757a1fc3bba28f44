"""One request, decoded plainly (`ar`) or with self-speculation (`ssr` and friends).

The request walks four stages:
  1. think    - the parent writes its CoT; at b_d a draft child forks, is forced
                to end thinking and writes up to m answer tokens, batched with the parent;
                multi-stage: at b2, b3, ... a new child forks, bootstrapped from the
                previous draft (verified on the new child, kept up to the first mismatch);
                the proposer's spans over prompt + CoT so far are verified in one pass each
                (the CoT is speculated too) while no child lives, or beside it where the
                engine feeds several sequences per pass (the child's step rides in the pass)
  2. close    - the parent's CoT ends (its end marker, EOS or b_v); the end marker and
                answer prefix are forced and the latest draft verified (chunks, early exit)
  3. continue - the same proposer (suffix tree over prompt, drafts and the output so far)
                guesses spans; each span is verified in one pass, the longest match kept
  4. finish   - outstanding children released, metrics closed
Where verifying costs about a step (GPUs) and the engine feeds several sequences per pass, a
span pass verifies several candidate spans (the suffix tree's best and its other branches,
n-gram lookup): on an engine with tree attention up to MAX_TREE_CANDIDATES as one token tree
on the parent, else up to MAX_BRANCHES each on its own fork of the parent; greedy: the
candidate that accepts most wins (the model's own tokens, whichever candidate holds them);
sampling: the candidates are verified as one token tree (verify.verify_tree_sampled, exact).
Whether and when children fork, how long they write and how the draft is verified is
the policy's plan (policy.py: measured costs under `--policy auto`, the flags under
`fixed`); it changes speed only, never tokens.
Every sequence keeps one *pending* token: committed, not yet fed to the engine.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np

from .config import ConfigError, GenerationConfig
from .costs import CostModel
from .branches import Branches
from .draft import Draft, DraftChildren
from .engines.base import Engine, PassTimer, shares_passes, tree_passes
from .metrics import Metrics, StageClock
from .policy import Plan, PolicyStats, plan_request
from .history import ResponseHistory
from .proposers import CHAIN, Proposer, request_proposer
from .sampling import target_probs
from .spans import MAX_BRANCHES, MAX_TREE_CANDIDATES, SpanPolicy, span_extension
from .text import TextStream
from .thinking import ThinkingFormat
from .verify import Verdict, verify_greedy, verify_sampled
from .walk import Chunk, Walk


class Generation(Branches, DraftChildren, Walk):
    """Iterate for chunks as they are decoded; `result` is set when iteration ends."""

    def __init__(self, engine: Engine, fmt: ThinkingFormat, config: GenerationConfig,
                 prompt_ids: Sequence[int], banned_ids: Sequence[int] = (),
                 costs: CostModel | None = None, stats: PolicyStats | None = None,
                 proposer: Proposer | None = None, plan: Plan | None = None,
                 history: ResponseHistory | None = None) -> None:
        super().__init__(PassTimer(engine), fmt, config, prompt_ids, stats)  # timed: host_s is the rest
        self.history = history  # earlier responses: suffix trees copy from them; this one joins at the end
        self._proposer = proposer  # spans from this proposer instead of the mode's (`ssr simulate --spans recorded`)
        self.banned_ids = np.asarray(sorted(banned_ids), dtype=np.int64)  # -inf while thinking
        self.rng = np.random.default_rng(config.sampling.seed)
        # greedy on an engine that picks the argmax where its logits live: token ids come back, not rows
        self.ids = config.sampling.greedy and getattr(engine, "returns_ids", False)
        self._now = getattr(engine, "clock", time.perf_counter)  # a replay engine models its own seconds
        # engine costs: the model's (measured, rescaled at start-up), learnt further from this
        # request's own calls only, so one request's load (another mode, a busy machine) does not
        # price the next one's spans
        self.costs = replace(costs) if costs is not None else CostModel()
        # drafting: whether, when, how (`plan` given: a replay of a run's own plan)
        beside = shares_passes(engine) and config.proposer is not None  # CoT spans beside a living child
        self.plan = plan or plan_request(config, self.costs, stats or PolicyStats(), spans_beside_child=beside)
        learnt = stats.spans if stats is not None else {}  # span acceptance earlier requests measured
        self.spans = SpanPolicy(self.costs, learnt.get("answer"))  # answer span lengths worth a verify pass
        self.cot_spans = SpanPolicy(self.costs, learnt.get("cot"))  # the same for CoT spans (accepted less)
        self.metrics = Metrics(mode=config.mode, prompt_tokens=len(prompt_ids), policy=self.plan.as_dict(),
                               spans_beside_child=beside)
        # candidate spans verified per pass: several only where one pass holds several sequences
        # and verifying costs ~a step (GPUs); as one token tree on the parent where the engine has
        # tree attention, else each on its own sequence; greedy keeps the candidate that accepts
        # most (it holds the model's own tokens), sampling verifies them as a token tree
        self.extend = span_extension(self.costs, config.suffix.max_span)  # not None: verification is cheap
        several = beside and self.extend is not None and config.adaptive_spans and config.uses_draft
        self.trees = several and tree_passes(engine)  # candidates as one token tree (no forks)
        # one chain a pass (an engine of one sequence a request, as vLLM's drafter sees it): the
        # span policy still picks it among every source's candidates
        self.chain = several and not self.trees and engine.max_sequences < 2
        self.branches = (MAX_TREE_CANDIDATES if self.trees else 1 if self.chain else MAX_BRANCHES) if several else 1
        self.parent = -1  # the parent's sequence (a winning branch's sequence takes its place)
        self._forks: list[int] = []  # the branches of the pass under way (candidates 2.. on forks of the parent)
        self._tree = None  # the pass under way's token tree (engines with tree attention: no forks)
        self.shape = CHAIN  # how the proposer has its candidates verified (set with the proposer)
        self._check_context(config.suffix.max_span + 1 + (self.plan.draft_tokens if self.plan.draft else 0),
                            " + draft tokens" if config.uses_draft else "")

    # -- stages -------------------------------------------------------------------------

    def _run(self) -> Iterator[Chunk]:
        clock = StageClock(self.metrics, self._now)
        self._live: set[int] = set()
        self._trace: list[dict] = []
        self.answer_ids: list[int] = []
        try:
            self.parent = self._own(self.engine.prefill(self.prompt_ids[:-1]))
            kept = getattr(self.engine, "prefix", None)  # engines that keep the last request's KV (optional)
            self.metrics.cached_prompt_tokens = kept.reused if kept is not None else 0
            since = clock.add("prefill", 0.0)
            proposer = self._proposer or request_proposer(
                self.config, self.extend, self.prompt_ids, self.history, several=self.branches > 1 or self.chain,
                trees=self.trees or self.chain)  # a chain is picked among every source's candidates too
            self.shape = proposer.shape if proposer is not None else CHAIN
            if self.shape.tree and not tree_passes(self.engine):
                raise ConfigError("a proposer that verifies its own token tree needs an engine with tree attention")
            if self.config.uses_draft and self.config.proposer == "suffix":
                self.metrics.engine["suffix_spans"] = "past the match" if self.extend is not None else "match length"
            if hasattr(proposer, "implementation"):  # the suffix tree's: arctic-inference or ssr's own
                self.metrics.engine["suffix_tree"] = proposer.implementation
            # 1. think (a draft child forks at b_d; CoT spans, beside it where passes are shared)
            cot_ids, pending, cot_end, drafts = yield from self._think(self.prompt_ids[-1], clock, proposer)
            since = clock.add("cot", since)
            # 2. close the CoT, verify the latest draft
            draft = drafts[-1] if drafts else None
            if proposer is not None:
                for each in drafts:  # spans may copy from every stage's draft
                    proposer.add_source(self.answer_prefix_ids + each.token_ids)
            yield from self._close(pending, cot_end, draft, proposer)
            self.metrics.first_answer_token_s = since = clock.add("verify", since)
            # 3. continue
            yield from self._continue(proposer)
            clock.add("continuation", since)
        finally:
            for seq in list(self._live):
                self._drop(seq)
        tail = self._answer_text.flush()
        if tail:
            yield Chunk("answer", tail, ())
        self.metrics.total_s = clock.now()
        self._close_metrics(drafts)
        if self.stats is not None and self.config.adaptive_spans and self.config.uses_draft:
            self.stats.spans.update(answer=dict(self.spans.stats), cot=dict(self.cot_spans.stats))
        self._finish(cot_ids, drafts[-1].token_ids if drafts else [])
        if self.history is not None:
            self.history.add(self.result.output_ids)

    def _think(self, pending: int, clock: StageClock, proposer: Proposer | None):
        """Stage 1: returns (cot_ids, pending token or None, how the CoT ended, drafts).
        A child forks at each stage budget of the plan, bootstrapped from the previous
        child's draft; only the latest child is alive (it rides in the parent's step).
        Proposed spans are verified (never across a stage budget) while no child is alive, or
        beside it where the engine feeds both in one pass (the child's step rides along)."""
        config, metrics = self.config, self.metrics
        self._reasoning_text = stream = TextStream(self.fmt.end, shown=self.fmt.steer)
        if self.fmt.steer:  # prefilled by the prompt, shown as the reasoning's start
            yield Chunk("reasoning", self.fmt.steer, ())
        cot_ids: list[int] = []
        drafts: list[Draft] = []  # one per stage, the latest last
        stages = list(self.plan.stages) if self.plan.draft else []
        cot_end = "budget"
        while len(cot_ids) < config.thinking_budget:
            if stages and len(cot_ids) == stages[0]:
                stages.pop(0)
                drafts.append(self._fork_draft(pending, len(cot_ids), clock, drafts[-1] if drafts else None))
            child = drafts[-1] if drafts and drafts[-1].seq is not None else None
            if proposer is not None and config.cot_spans and (child is None or metrics.spans_beside_child):
                room = min([config.thinking_budget] + stages[:1]) - len(cot_ids) - 1  # tokens after the bonus
                proposals = self._propose(proposer, room, self.cot_spans)
                if proposals:
                    pending, end = yield from self._cot_span(pending, proposals, cot_ids, stream, proposer, child,
                                                             clock)
                    if end:
                        cot_end = end
                        break
                    continue
            batch = [(self.parent, pending)]
            if child is not None:
                batch.append((child.seq, child.token_ids[-1]))
            logits = self._step(batch, thinking=True)  # [len(batch), vocab], or [len(batch)] token ids
            metrics.cot_steps += 1
            if child is not None:
                child.written += 1
                self._grow_draft(child, logits[1], clock)
            row = logits[0].copy()
            if row.ndim:  # logits: the parent's row masked; ids: the engine masked it
                row[self.banned_ids] = -np.inf
            token = self._verdict([], row[None]).next_token
            chunk, end = self._cot_token(token, cot_ids, stream)
            if chunk:
                yield chunk
            pending = None if end == "eos" else token
            if proposer is not None and pending is not None:
                proposer.observe([token])
            if end:
                cot_end = end
                break
        tail = stream.flush()
        if tail:
            yield Chunk("reasoning", tail, ())
        for draft in drafts:  # outstanding children end with the parent's CoT
            if draft.seq is not None:
                self._finish_draft(draft, clock)
        metrics.cot_tokens, metrics.cot_end = len(cot_ids), cot_end
        return cot_ids, pending, cot_end, drafts

    def _cot_span(self, pending: int, proposals: list[tuple[str, list[int]]], cot_ids: list[int],
                  stream: TextStream, proposer: Proposer, child: Draft | None, clock: StageClock):
        """One speculative CoT pass, as in stage 3 but under the CoT's rules (banned tokens,
        end marker, EOS, loops), a living child's step in the same forward pass: returns
        (pending token or None, how the CoT ended or "")."""
        base, start, at = self.engine.length(self.parent), self._now(), len(cot_ids)
        won, verdicts = self._verify_candidates(pending, proposals, child, clock, thinking=True)  # 2.-3.
        (source, span), verdict = proposals[won], verdicts[won]
        committed = span[: verdict.num_accepted] + [verdict.next_token]
        end, fed = "", 0  # fed: tokens processed; the last of them becomes pending
        for token in committed:
            fed += 1
            chunk, end = self._cot_token(token, cot_ids, stream)
            if chunk:
                yield chunk
            if end:
                break
        self.engine.truncate(self.parent, base + fed)  # 4. pending + the tokens before the new pending
        kept = committed[: fed - 1 if end == "eos" else fed]  # EOS is not part of the CoT
        proposer.observe(kept)  # 5.
        child_s = self.costs.step(2) - self.costs.step(1) if child is not None else 0.0  # a plain step carries it too
        self.cot_spans.observe_pass(self._verified(proposals, verdicts), self._now() - start - child_s)
        self.metrics.cot_passes += 1
        self.metrics.cot_proposed_tokens += len(span)
        self.metrics.cot_accepted_tokens += min(verdict.num_accepted, fed)
        self._trace.append({"kind": "cot_span", "at": at, "source": source, "proposed": len(span),
                            "accepted": verdict.num_accepted, **self._branch_event(proposals, won)})
        return (None if end == "eos" else committed[fed - 1]), end

    def _close(self, pending: int | None, cot_end: str, draft: Draft | None,
               proposer: Proposer | None) -> Iterator[Chunk]:
        """Stage 2: force end marker + answer prefix and verify the latest draft."""
        forced = ([] if cot_end == "natural" else self.forced_end_ids) + self.answer_prefix_ids
        self._forced_ids = forced
        self.metrics.forced_tokens = len(forced)
        fed = ([] if pending is None else [pending]) + forced
        draft_ids: list[int] = []
        if draft is not None and self.config.verifies_draft_prefix:
            draft_ids = draft.token_ids[: self.config.max_tokens]
        num_accepted, verdict, _ = self._verify_chunked(self.parent, fed, draft_ids, draft.probs if draft else [])
        if draft_ids:
            self.metrics.verify_passes += 1
            self.metrics.accepted_prefix_tokens = num_accepted
            self._trace.append({"kind": "draft", "forked_at": draft.forked_at, "proposed": len(draft_ids),
                                "accepted": num_accepted})
        if proposer is not None:
            proposer.observe(forced)
        prefix = self.fmt.answer_prefix.lstrip()
        self._answer_text = TextStream(shown=prefix)
        if prefix:
            yield Chunk("answer", prefix, tuple(self.answer_prefix_ids))
        yield from self._commit(draft_ids[:num_accepted] + [verdict.next_token], proposer)

    def _verify_chunked(self, seq: int, fed: list[int], draft_ids: list[int], draft_probs: list[np.ndarray],
                        keep_rows: bool = False) -> tuple[int, Verdict, list[np.ndarray]]:
        """Feed `fed`, then draft_ids in chunks that double while every token is accepted (the
        first chunk rides with `fed`; an early mismatch wastes at most one chunk); seq keeps
        fed + the accepted tokens. Returns (num_accepted, verdict, and with keep_rows the target
        logits of positions 0 .. num_accepted)."""
        base = self.engine.length(seq)
        chunk = self.plan.verify_chunk
        rows = self._score(seq, fed + draft_ids[:chunk])  # [len(fed) + chunk, vocab]
        target = rows[len(fed) - 1 :]  # [chunk + 1, vocab]: row i predicts draft position i
        kept: list[np.ndarray] = []
        num_accepted = 0
        while True:
            chunk_ids = draft_ids[num_accepted : num_accepted + len(target) - 1]
            probs = np.stack(draft_probs[num_accepted : num_accepted + len(chunk_ids)]) \
                if draft_probs and chunk_ids else None  # [len(chunk_ids), vocab]
            verdict = self._verdict(chunk_ids, target, probs)
            num_accepted += verdict.num_accepted
            if verdict.recovered or num_accepted == len(draft_ids):
                break
            if keep_rows:
                kept.extend(target[:-1])
            chunk *= 2
            rows = self._score(seq, draft_ids[num_accepted : num_accepted + chunk])
            target = np.concatenate([target[-1:], rows])  # [chunk + 1, vocab]
        if keep_rows:
            kept.extend(target[: verdict.num_accepted + 1])
        self.engine.truncate(seq, base + len(fed) + num_accepted)
        return num_accepted, verdict, kept

    def _continue(self, proposer: Proposer | None) -> Iterator[Chunk]:
        """Stage 3: loop of
        # 1. propose spans    # 2. score them with the pending token in one pass
        # 3. verify           # 4. commit the accepted tokens, roll back the rest
        # 5. observe (proposer and acceptance statistics)
        """
        metrics = self.metrics
        while not metrics.stop:
            pending = self.answer_ids[-1]
            proposals = self._propose(proposer, self.config.max_tokens - len(self.answer_ids), self.spans)  # 1.
            if not proposals:
                rows = self._step([(self.parent, pending)])  # [1, vocab]
                yield from self._commit([self._verdict([], rows).next_token], proposer)
                continue
            base, start = self.engine.length(self.parent), self._now()
            won, verdicts = self._verify_candidates(pending, proposals)  # 2.-3.
            (source, span), verdict = proposals[won], verdicts[won]
            self.engine.truncate(self.parent, base + 1 + verdict.num_accepted)  # 4.
            metrics.verify_passes += 1
            metrics.suffix_proposed_tokens += len(span)
            metrics.suffix_accepted_tokens += verdict.num_accepted
            self.spans.observe_pass(self._verified(proposals, verdicts), self._now() - start)  # 5.
            self._trace.append({"kind": "span", "at": len(self.answer_ids), "source": source, "proposed": len(span),
                                "accepted": verdict.num_accepted, **self._branch_event(proposals, won)})
            yield from self._commit(span[: verdict.num_accepted] + [verdict.next_token], proposer)

    def _propose(self, proposer: Proposer | None, room: int, spans: SpanPolicy) -> list[tuple[str, list[int]]]:
        """[(source, span of at most `room` tokens)], [] for a plain step. The ssr modes let the
        span policy choose among the sources, cut each span to what the engine's costs justify and
        keep, where branches are on, further candidates worth verifying in the same pass; the peers
        `suffix` and `pld` verify what their one proposer proposes, as their users run them (a
        peer with a token tree of its own, Shape.tree: all of it)."""
        found = proposer.candidates(room) if proposer is not None and room > 0 else []
        if not found:
            return []
        if self.config.adaptive_spans and self.config.uses_draft:
            if self.trees and len(self._live) == 1:  # the parent alone: one token tree on it
                return spans.choose_many(found, self.branches, tree=True)
            free = self.engine.max_sequences - getattr(self.engine, "live_sequences", lambda: len(self._live))()
            return spans.choose_many(found, min(self.branches, 1 + max(0, free)))
        return found if self.shape.tree else found[:1]

    # -- helpers ------------------------------------------------------------------------

    def _engine_time(self) -> tuple[float, int]:
        return self.engine.seconds, self.engine.passes

    def _want(self, thinking: bool) -> dict:
        """What to ask the engine for: token ids (greedy, on engines that argmax where the logits
        live; while thinking the banned tokens are masked there, `banned`) or rows (no keywords)."""
        if not self.ids:
            return {}
        return {"ids": True, "banned": self.banned_ids} if thinking and len(self.banned_ids) else {"ids": True}

    def _step(self, batch: list[tuple[int, int]], thinking: bool = False) -> np.ndarray:
        """engine.step, timed: solo steps teach the cost model. Rows [n, vocab] or ids [n]."""
        start = self._now()
        rows = self.engine.step(batch, **self._want(thinking))
        self.metrics.decode_steps += 1
        if len(batch) == 1:
            self.costs.observe_step(self._now() - start)
        else:
            self.metrics.batched_steps += 1
        return rows

    def _score(self, seq: int, token_ids: list[int], thinking: bool = False) -> np.ndarray:
        """engine.score, timed for the cost model. Rows [k, vocab] or ids [k]."""
        start = self._now()
        rows = self.engine.score(seq, token_ids, **self._want(thinking))
        self.costs.observe_score(len(token_ids), self._now() - start)
        return rows

    def _verdict(self, draft_ids: list[int], target_logits: np.ndarray,
                 draft_probs: np.ndarray | None = None) -> Verdict:
        """Greedy argmax match, or rejection sampling against the sampling distribution."""
        sampling = self.config.sampling
        if sampling.greedy:
            return verify_greedy(draft_ids, target_logits)
        return verify_sampled(
            np.asarray(draft_ids, dtype=np.int64), draft_probs,
            target_probs(target_logits, sampling), self.rng, approx=self.config.verify == "approx",
        )

    def _own(self, seq: int) -> int:
        self._live.add(seq)
        return seq

    def _drop(self, seq: int) -> None:
        self._live.discard(seq)
        self.engine.release(seq)

