"""One speculative pass, the same for the CoT and the answer: propose candidate spans, score
them after the pending token in one forward pass (a living draft child's step beside them),
verify each, keep the winner. Several candidates are laid out as the request's Speculation says:
one token tree on the parent (tree attention: shared prefixes fed once, no forks) or each on its
own fork of the parent; greedy keeps the candidate that accepts most (the model's own tokens,
whichever candidate holds them), sampling verifies them as one token tree (exact)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..engines.base import tree_passes
from ..metrics import Metrics
from ..proposing.proposers import CHAIN, Proposer, Shape
from ..verifying.sampling import target_probs
from ..proposing.source import Source
from ..pricing.span_policy import SpanPolicy, judge, left_out
from ..verifying.tree import TokenTree, build_tree
from ..verifying.verify import Verdict, common_prefix, verify_tree_greedy, verify_tree_sampled
from .children import Draft, DraftChildren
from .sequences import Sequences
from .speculation import Layout, Speculation
from .verifier import Verifier

Candidate = tuple[Source, list[int]]  # (source, span)


@dataclass(frozen=True)
class Outcome:
    """A verified pass: every candidate's verdict and the winner's."""

    candidates: list[Candidate]  # what was verified, in the span policy's order
    verdicts: list[Verdict]  # one per candidate: what it alone got right
    won: int  # the candidate whose tokens the parent keeps
    base: int  # the parent's length before the pass (its pending token not yet fed)
    start_s: float  # the request clock when the pass began
    unverified: tuple[Candidate, ...] = ()  # proposed but not verified (the span policy left them out)

    @property
    def source(self) -> Source:
        return self.candidates[self.won][0]

    @property
    def span(self) -> list[int]:
        return self.candidates[self.won][1]

    @property
    def verdict(self) -> Verdict:
        return self.verdicts[self.won]

    @property
    def committed(self) -> list[int]:
        """The winner's accepted tokens and the token after them (recovered or bonus)."""
        return self.span[: self.verdict.num_accepted] + [self.verdict.next_token]

    def verified(self) -> list[tuple[Source, int, int]]:
        """(source, proposed, accepted) per candidate, for the span policy's statistics."""
        return [(source, len(span), verdict.num_accepted)
                for (source, span), verdict in zip(self.candidates, self.verdicts)]

    def judged(self) -> list[tuple[Source, int, int]]:
        """The unverified candidates judged against the tokens the pass committed (span_policy.judge)."""
        return judge(self.unverified, self.committed) if self.unverified else []

    def event(self, kind: str, at: int) -> dict:
        """The trace's record of the pass; several candidates: how many, which won."""
        several = {"candidates": len(self.candidates), "won": self.won} if len(self.candidates) > 1 else {}
        return {"kind": kind, "at": at, "source": str(self.source), "proposed": len(self.span),
                "accepted": self.verdict.num_accepted, **several}


class CandidatePass:
    def __init__(self, seqs: Sequences, verifier: Verifier, speculation: Speculation, chooses: bool,
                 children: DraftChildren, metrics: Metrics) -> None:
        self.seqs = seqs  # the parent, its forks, a living child
        self.verifier = verifier
        self.speculation = speculation  # how many candidates a pass, laid out how
        self.chooses = chooses  # the ssr modes: the span policy chooses and cuts the spans
        self.children = children  # a living child's step rides in the pass
        self.metrics = metrics  # shared_passes, branch_passes, branch_wins
        self.shape: Shape = CHAIN  # how the request's proposer has its candidates verified (set with it)
        self._forks: list[int] = []  # the pass under way's forks (candidates 2.. on forks of the parent)
        self._tree: TokenTree | None = None  # the pass under way's token tree (tree attention)
        self._unverified: tuple[Candidate, ...] = ()  # the pass under way's candidates the policy left out

    def propose(self, proposer: Proposer | None, room: int, policy: SpanPolicy) -> list[Candidate]:
        """[(source, span of at most `room` tokens)], [] for a plain step. The ssr modes let the
        span policy choose among the sources, cut each span to what the engine's costs justify and
        keep, where several are verified a pass, further candidates worth verifying in it; the
        peers verify what their one proposer proposes, as their users run them (a peer with a
        token tree of its own, Shape.tree: all of it)."""
        self._unverified = ()
        per_step = self.speculation.per_step  # drafted as vLLM's drafter: the guard skips before proposing,
        if per_step and self.chooses and proposer is not None and room > 0 and policy.skips():  # so no host time
            return []
        found = proposer.candidates(room) if proposer is not None and room > 0 else []
        if not found:
            return []
        if not self.chooses:
            return found if self.shape.tree else found[:1]
        most = self.speculation.candidates
        if self.speculation.layout is Layout.TREE and self._as_tree(self.children.alive):  # one tree on the parent
            chosen = policy.choose_many(found, most, tree=True)
        else:
            room_for = 1 if most == 1 else min(most, 1 + max(0, self.seqs.free()))  # the parent, its forks
            chosen = policy.choose_many(found, room_for, guard=not per_step)
        if policy.one_chain:  # the candidates it left out, to be judged against what the pass commits
            self._unverified = left_out(found, chosen)
        return chosen

    def _as_tree(self, child: Draft | None) -> bool:
        """The pass's candidates go on as one token tree: the engine has tree attention and no
        child's step rides in the pass (that needs a pass over several sequences)."""
        return child is None and tree_passes(self.seqs.engine)

    def verify(self, pending: int, candidates: list[Candidate], thinking: bool = False) -> Outcome:
        """Score every candidate in one pass (a living child's step beside them), verify each
        (thinking: under the CoT's banned tokens) and keep the winning one on the parent."""
        base, start = self.seqs.length(self.seqs.parent), self.seqs.now()
        child = self.children.alive
        spans = [span for _, span in candidates]
        greedy = self.verifier.sampling.greedy
        if len(spans) > 1 and self._as_tree(child):  # one pass over the trie's nodes
            scores = self._score_tree(pending, spans, thinking)  # [n, vocab] or [n]
            if greedy:  # one walk down the tree
                verdicts = verify_tree_greedy(self._tree.token_ids, self._tree.paths, scores)
                return Outcome(candidates, verdicts, self._keep(verdicts), base, start, self._unverified)
            scored = [scores[path] for path in self._tree.paths]  # [k_i + 1, vocab]: fancy indexing copies
        else:
            scored = self._score_each(pending, spans, child, thinking)
        if greedy or len(candidates) == 1:
            verdicts = [self.verifier.verdict(span, rows) for span, rows in zip(spans, scored)]
            return Outcome(candidates, verdicts, self._keep(verdicts), base, start, self._unverified)
        won, verdict = verify_tree_sampled(spans, [target_probs(rows, self.verifier.sampling) for rows in scored],
                                           self.verifier.rng)
        emitted = spans[won][: verdict.num_accepted] + [verdict.next_token]
        verdicts = [verdict if i == won else Verdict(common_prefix(span, emitted), verdict.next_token, True)
                    for i, span in enumerate(spans)]  # what each candidate alone got right, for its statistics
        return Outcome(candidates, verdicts, self._keep(verdicts, won), base, start, self._unverified)

    def _score_each(self, pending: int, spans: list[list[int]], child: Draft | None,
                    thinking: bool) -> list[np.ndarray]:
        """[pending] + each span scored in one forward pass -> scores [k_i + 1, vocab] (or ids
        [k_i + 1]) per span: the first span on the parent, each other on a fresh fork of it, a
        living child's next step in the same pass (engine.score_batch)."""
        seqs = self.seqs
        if len(spans) == 1 and child is None:
            feed = [pending] + spans[0]
            padding = [self.shape.pad] * self.shape.padding(len(feed))  # a peer's fixed width
            scored = [seqs.score(seqs.parent, feed + padding, thinking=thinking)[: len(feed)].copy()]
        else:
            self._forks = [seqs.fork(seqs.parent) for _ in spans[1:]]
            feeds = [(seq, [pending] + span) for seq, span in zip([seqs.parent] + self._forks, spans)]
            if child is not None:
                feeds.append((child.seq, child.token_ids[-1:]))
            scored = seqs.score_batch(feeds, thinking=thinking)
            if child is not None:
                self.metrics.shared_passes += 1
                self.children.stepped(child, scored[-1][0])
            scored = scored[: len(spans)]
        return [seqs.mask(each) for each in scored] if thinking else scored

    def _score_tree(self, pending: int, spans: list[list[int]], thinking: bool) -> np.ndarray:
        """The spans' token tree after [pending] on the parent in one pass (tree.build_tree) ->
        scores per node, the banned tokens masked while thinking."""
        self._tree = tree = build_tree(pending, spans)
        padding = self.shape.padding(len(tree.token_ids))  # a peer's fixed width: the root's children
        scores = self.seqs.score_tree(self.seqs.parent, tree.token_ids + [self.shape.pad] * padding,
                                      tree.parents + [0] * padding, thinking=thinking)[: len(tree.token_ids)]
        return self.seqs.mask(scores.copy()) if thinking and not self.seqs.ids else scores

    def _keep(self, verdicts: list[Verdict], won: int | None = None) -> int:
        """The candidate that accepted most (the first of equals), or `won`; its tokens stay on the
        parent (its path of the tree, or its fork becomes the parent), the others are dropped."""
        if won is None:
            won = max(range(len(verdicts)), key=lambda i: (verdicts[i].num_accepted, -i))
        seqs = self.seqs
        if self._tree is not None:  # the winner's path stays on the parent, the other nodes go
            seqs.keep_path(seqs.parent, self._tree.paths[won])
            self._tree = None
        else:
            held = [seqs.parent] + self._forks
            for i, seq in enumerate(held):
                if i != won:
                    seqs.drop(seq)
            seqs.parent, self._forks = held[won], []
        if len(verdicts) > 1:
            self.metrics.branch_passes += 1
            self.metrics.branch_wins += won > 0
        return won
