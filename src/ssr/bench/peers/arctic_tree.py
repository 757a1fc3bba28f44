"""arctic-inference's suffix decoding in its tree mode, for the trace replay (`arctic-tree`).

`SuffixDecodingCache.speculate(..., use_tree_spec=True)` (arctic_inference/suffix_decoding/
cache.py, 0.3.0): a best-first walk over path probabilities (a child's: its parent's times
count(child) / count(node)), children under min_token_prob pruned, up to max_spec_tokens nodes
with their parents; the request's tree (prompt + output) and the global tree of earlier
responses each speculate, the higher score wins. No serving path turns it on (vLLM's suffix
method and arctic's own vLLM plugin call it in path mode); it is the default of arctic's own
offline simulator (arctic_inference/suffix_decoding/simulator.py), run here with that
simulator's defaults: --max-depth 64, --max-spec-tokens 0 (= the depth), --max-spec-factor
1.0, --min-token-prob 0.1, --use-tree-spec True, --use-cached-prompt True (the prompt is in
the request's tree), --max-cached-requests -1 (unlimited; the history's cache keeps 10,000,
more than a group of traces holds). The simulator verifies greedily along `parents` and adds
the accepted tokens and the bonus to the request's response, as this replay's loop does.
"""
from __future__ import annotations

from collections.abc import Sequence

from ...proposing.history import ResponseHistory
from ...proposing.proposers import Shape
from ...proposing.source import Source
from . import TreeSource

MAX_DEPTH = 64  # simulator.py --max-depth
MIN_TOKEN_PROB = 0.1  # --min-token-prob
SPEC_FACTOR = 1.0  # --max-spec-factor


def leaf_paths(token_ids: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """Each leaf's tokens from the root down, for a tree given as (token, parent index; -1 the
    root) with parents before their children: the tree's candidates (build_tree merges them
    back into the same tree)."""
    paths: list[list[int]] = []
    has_child = [False] * len(token_ids)
    for parent in parents:
        if parent >= 0:
            has_child[parent] = True
    prefix: list[list[int]] = []
    for node, (token, parent) in enumerate(zip(token_ids, parents)):
        prefix.append((prefix[parent] if parent >= 0 else []) + [int(token)])
        if not has_child[node]:
            paths.append(prefix[node])
    return paths


class ArcticTreeProposer(TreeSource):
    """The tree above, verified as one token tree a step (priced by its nodes)."""

    source = Source("arctic-tree")
    shape = Shape(tree=True)
    implementation = "arctic-inference"

    def __init__(self, prompt: Sequence[int], history: ResponseHistory | None = None) -> None:
        history = history if history is not None else ResponseHistory(0)
        self.cache, self.request_id = history.arctic(MAX_DEPTH)
        self.cache.start_request(self.request_id, list(prompt))
        self.context = list(prompt[-MAX_DEPTH:])  # speculate keeps the last max_depth tokens

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Arctic speculates from the request and earlier responses only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        if token_ids:
            self.cache.add_active_response(self.request_id, list(token_ids))
            self.context = (self.context + list(token_ids))[-MAX_DEPTH:]

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        limit = min(max_tokens, MAX_DEPTH)
        if limit < 1:
            return []
        draft = self.cache.speculate(self.request_id, self.context, max_spec_tokens=limit,
                                     max_spec_factor=SPEC_FACTOR, min_token_prob=MIN_TOKEN_PROB, use_tree_spec=True)
        return [(self.source, path) for path in leaf_paths(draft.token_ids, draft.parents)]
