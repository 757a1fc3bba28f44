"""Several candidate spans verified in one forward pass (engines that feed several sequences per
pass, where verifying costs about a step), for decode.Generation: on an engine with tree
attention (`score_tree`) the candidates as one token tree on the parent (tree.build_tree: shared
prefixes fed once, no forks), else each on its own fork of the parent (a living draft child's
step in the same pass); verify each — greedy: the candidate that accepts most wins; sampling:
the candidates as one token tree (verify_tree_sampled, exact) — and keep the winner's tokens
only (its path of the tree, or its branch as the parent). Needs the generation's engine, parent,
config, metrics, rng, banned_ids and its _score, _verdict, _want, _grow_draft, _own and _drop."""
from __future__ import annotations

import numpy as np

from .draft import Draft
from .engines.base import tree_passes
from .metrics import StageClock
from .proposers import Shape
from .sampling import target_probs
from .tree import TokenTree, build_tree
from .verify import Verdict, common_prefix, verify_tree_greedy, verify_tree_sampled


class Branches:
    _forks: list[int]  # the branches of the pass under way (candidates 2.. on forks of the parent)
    _tree: TokenTree | None  # the pass under way's token tree (on engines with tree attention)
    shape: Shape  # how the request's proposer has its candidates verified (tree, width)

    def _verify_candidates(self, pending: int, proposals: list[tuple[str, list[int]]], child: Draft | None = None,
                           clock: StageClock | None = None, thinking: bool = False) -> tuple[int, list[Verdict]]:
        """Score every candidate span in one pass (a living child's step beside them), verify each
        (thinking: under the CoT's banned tokens) and keep the winning branch as the parent:
        (the winner's index, every candidate's verdict)."""
        spans = [span for _, span in proposals]
        if child is None and len(spans) > 1 and tree_passes(self.engine):  # one pass over the trie's nodes
            rows = self._score_tree(pending, spans, thinking)  # [n, vocab] or [n]
            if self.config.sampling.greedy:  # one walk down the tree
                verdicts = verify_tree_greedy(self._tree.token_ids, self._tree.paths, rows)
                return self._keep_branch(verdicts), verdicts
            scored = [rows[path] for path in self._tree.paths]  # [k_i + 1, vocab]: fancy indexing copies
        else:
            scored = self._score_candidates(pending, spans, child, clock, thinking)
            for each in scored if thinking else ():  # [k_i + 1, vocab] each (ids: masked by the engine)
                if each.ndim == 2:
                    each[:, self.banned_ids] = -np.inf
        if self.config.sampling.greedy or len(proposals) == 1:
            verdicts = [self._verdict(span, rows) for (_, span), rows in zip(proposals, scored)]
            return self._keep_branch(verdicts), verdicts
        won, verdict = verify_tree_sampled(spans, [target_probs(rows, self.config.sampling) for rows in scored],
                                           self.rng)
        emitted = spans[won][: verdict.num_accepted] + [verdict.next_token]
        verdicts = [verdict if i == won else Verdict(common_prefix(span, emitted), verdict.next_token, True)
                    for i, span in enumerate(spans)]  # what each candidate alone got right, for its statistics
        self._keep_branch(verdicts, won)
        return won, verdicts

    def _score_candidates(self, pending: int, spans: list[list[int]], child: Draft | None = None,
                          clock: StageClock | None = None, thinking: bool = False) -> list[np.ndarray]:
        """[pending] + each span scored in one forward pass -> rows [k_i + 1, vocab] (or token ids
        [k_i + 1]) per span: the first span on the parent, each other on a fresh fork of it (a
        branch), a living child's next step in the same pass (engine.score_batch)."""
        if len(spans) == 1 and child is None:
            feed = [pending] + spans[0]
            padding = [self.shape.pad] * self.shape.padding(len(feed))  # a peer's fixed width
            return [self._score(self.parent, feed + padding, thinking=thinking)[: len(feed)].copy()]
        self._forks = [self._own(self.engine.fork(self.parent)) for _ in spans[1:]]
        feeds = [(seq, [pending] + span) for seq, span in zip([self.parent] + self._forks, spans)]
        if child is not None:
            feeds.append((child.seq, child.token_ids[-1:]))
        rows = [each.copy() for each in self.engine.score_batch(feeds, **self._want(thinking))]
        if child is not None:
            self.metrics.shared_passes += 1
            child.written += 1
            self._grow_draft(child, rows[-1][0], clock)
        return rows[: len(spans)]

    def _score_tree(self, pending: int, spans: list[list[int]], thinking: bool = False) -> np.ndarray:
        """The spans' token tree after [pending] on the parent in one pass (engine.score_tree;
        tree.build_tree) -> rows [n, vocab] per node, banned tokens masked while thinking, or
        token ids [n] (masked by the engine)."""
        self._tree = tree = build_tree(pending, spans)
        padding = self.shape.padding(len(tree.token_ids))  # a peer's fixed width: the root's children
        rows = self.engine.score_tree(self.parent, tree.token_ids + [self.shape.pad] * padding,
                                      tree.parents + [0] * padding, **self._want(thinking))[: len(tree.token_ids)]
        if thinking and rows.ndim == 2:
            rows = rows.copy()
            rows[:, self.banned_ids] = -np.inf
        return rows

    def _keep_branch(self, verdicts: list[Verdict], won: int | None = None) -> int:
        """The candidate that accepted most (the first of equals), or `won`; its sequence becomes
        the parent's, the other branches are released."""
        if won is None:
            won = max(range(len(verdicts)), key=lambda i: (verdicts[i].num_accepted, -i))
        if self._tree is not None:  # the winner's path stays on the parent, the other nodes go
            self.engine.keep_path(self.parent, self._tree.paths[won])
            self._tree = None
        else:
            held = [self.parent] + self._forks
            for i, seq in enumerate(held):
                if i != won:
                    self._drop(seq)
            self.parent, self._forks = held[won], []
        if len(verdicts) > 1:
            self.metrics.branch_passes += 1
            self.metrics.branch_wins += won > 0
        return won

    @staticmethod
    def _verified(proposals: list[tuple[str, list[int]]], verdicts: list[Verdict]) -> list[tuple[str, int, int]]:
        return [(source, len(span), verdict.num_accepted) for (source, span), verdict in zip(proposals, verdicts)]

    @staticmethod
    def _branch_event(proposals: list[tuple[str, list[int]]], won: int) -> dict:
        """Trace fields of a pass that verified several candidates: how many, which won."""
        return {"candidates": len(proposals), "won": won} if len(proposals) > 1 else {}
