"""ssr's suffix source on arctic-inference's C++ suffix tree (the tree vLLM's `suffix` method
runs on): a token costs ~2 us to add and a proposal ~tens of us, against ~depth Python
operations per token in ssr's own tree (suffix_tree.py, kept where arctic-inference is not
installed and as the reference the tests check this against).

One request tree holds the prompt, the output as it is committed and the drafts, each as a
sequence of its own (no match spans two of them); the earlier responses' tree is the
response history's (ResponseHistory.native). A proposal asks both trees for their best span
after the last max_depth tokens of prompt + output and keeps the one with the higher score
(the sum of its estimated probabilities), as vLLM's suffix method does; spans go on past the
match length (`extend_prob`, where verifying is cheap) by asking with no length factor.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice

from ..config import SuffixParams
from .proposers import CHAIN
from .source import Source
from .suffix_tree import MATCH_BUCKETS, match_bucket


def native_tree(max_depth: int):
    """A C++ suffix tree (ImportError without arctic-inference)."""
    from arctic_inference.suffix_decoding._C import SuffixTree

    return SuffixTree(max_depth)


class NativeSuffixProposer:
    """SuffixProposer's interface (observe, add_source, propose, candidates) on C++ trees."""

    source = Source("suffix")
    implementation = "arctic-inference"
    shape = CHAIN

    def __init__(self, params: SuffixParams, prompt: Sequence[int], history=None,
                 extend_prob: float | None = None, alternatives: int = 0, kind: str = "suffix") -> None:
        self.params = params
        self.kind = kind  # its candidates' source kind
        self.alternatives = alternatives  # further candidates from the tree's other continuations (several a pass)
        self.extend_prob = extend_prob  # not None: spans past the match length, down to this probability
        self.tree = native_tree(params.max_depth)  # this request: prompt (0), output (1), drafts (2 ..)
        self.tree.extend(0, list(prompt))
        self._sequences = 2  # sequence ids handed out
        self.history = history.native(params.max_depth) if history is not None else None  # earlier responses
        self.context = list(prompt[-params.max_depth:])  # the last max_depth tokens of prompt + output
        # [bucket]: the Source its best spans are named by (match_bucket of their match length)
        self._sources = tuple(Source.suffix(bucket, kind=kind) for bucket in range(len(MATCH_BUCKETS) + 1))

    def add_source(self, token_ids: Sequence[int]) -> None:
        self.tree.extend(self._sequences, list(token_ids))
        self._sequences += 1

    def prepare(self) -> None:
        """Nothing deferred: the prompt's tree is built as the proposer is made."""

    def observe(self, token_ids: Sequence[int]) -> None:
        if token_ids:
            self.tree.extend(1, list(token_ids))
            self.context = (self.context + list(token_ids))[-self.params.max_depth:]

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        span, probs, _ = self._best(max_tokens)
        return span, probs

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        """The best span, its source named by its match length's bucket; with `alternatives`, then
        the other branches of the tree's continuations after the same match (source "…~"),
        best first: where several candidates are verified in one pass, one of them may hold the
        token the best one misses."""
        return self._candidates(max_tokens, self.alternatives)

    def _candidates(self, max_tokens: int, alternatives: int) -> list[tuple[Source, list[int]]]:
        best = self._best_draft(max_tokens)
        if best is None:
            return []
        span, bucket = list(best.token_ids), match_bucket(best.match_len)
        out = [(self._sources[bucket], span)]
        if not alternatives:  # one span a pass (drafted per step for every request of a batch): no more
            return out
        for other in islice(self._branches(max_tokens), alternatives):
            if other[: len(span)] != span[: len(other)]:  # not a prefix of the best, nor extended by it
                out.append((Source.suffix(bucket, True, self.kind), other))
        return out

    def _branches(self, max_tokens: int) -> Iterator[list[int]]:
        """Root-to-leaf paths of the request tree's continuation tree (arctic's tree speculation),
        in the tree's order (most probable first), built as they are asked for."""
        if self.alternatives < 1:
            return
        limit = min(max_tokens, self.params.max_span)
        draft = self.tree.speculate(self.context, max(limit, 32), float(limit), 0.0, 0.0, True)
        tokens, parents = draft.token_ids, draft.parents
        has_child = set(parents)
        for leaf in range(len(tokens)):
            if leaf in has_child:
                continue
            path, node = [], leaf
            while node >= 0:
                path.append(tokens[node])
                node = parents[node]
            yield path[::-1][:limit]

    def best_only(self) -> "BestSpan":
        """Its best span alone (no other branch), read from this proposer's state."""
        return BestSpan(self)

    def _best(self, max_tokens: int) -> tuple[list[int], list[float], int]:
        """(span, probabilities, match length): the request tree's or, when it scores higher, the
        earlier responses' tree's."""
        best = self._best_draft(max_tokens)
        if best is None:
            return [], [], 0
        return list(best.token_ids), list(best.probs), best.match_len

    def _best_draft(self, max_tokens: int):
        """_best's draft as the tree gives it (token_ids, probs, match_len, score), None for none."""
        limit = min(max_tokens, self.params.max_span)
        if limit < 1:
            return None
        if self.extend_prob is None:
            factor, min_prob = self.params.span_factor, self.params.min_prob
        else:  # past the match length: as long as the tree's continuation goes
            factor, min_prob = float(limit), self.extend_prob
        best = None
        for tree in (self.tree, self.history):
            if tree is None:
                continue
            draft = tree.speculate(self.context, limit, factor, 0.0, min_prob, False)
            if draft.token_ids and (best is None or draft.score > best.score):
                best = draft
        return best


class BestSpan:
    """A suffix source's candidates as one span a pass takes them (request_proposer without
    `several`: its best span, no other branch), read from the state of the source it views
    (`suffix`: NativeSuffixProposer or SuffixProposer, its extend_prob as set), which alone is observed."""

    shape = CHAIN
    implementation = None

    def __init__(self, suffix) -> None:
        self.suffix = suffix  # the viewed source: its trees, context and params

    def prepare(self) -> None:
        """The viewed source's to do."""

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        return self.suffix._candidates(max_tokens, 0)
