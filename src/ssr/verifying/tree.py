"""Candidate spans as one token tree, verified in one pass on one sequence (tree attention).

Several candidate spans after the same pending token share their first tokens often (two
occurrences of a phrase, the suffix tree's best path and a lookup of the same text). Merged
into a trie they are fed once: the pending token is the root, every distinct prefix one node.
An engine with tree attention (`score_tree`) feeds the nodes after a sequence's tokens in one
pass — node i sees the sequence and its own ancestors only, at position length + depth(i) —
and keeps the winner's path afterwards (`keep_path`); one sequence's pass over n nodes costs
what a pass over n tokens does, with no fork per candidate.

    TokenTree.token_ids  [n]  node tokens, node 0 the pending token
    TokenTree.parents    [n]  parent node (-1: the root follows the sequence's last token)
    TokenTree.paths      [c]  per candidate its nodes root-first (the root, then one per token)

Rows for candidate c are rows[paths[c]]: [len(span) + 1, vocab], as a linear feed of
[pending] + span would return them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .verify import common_prefix


@dataclass(frozen=True)
class TokenTree:
    token_ids: list[int]  # [n] node tokens; node 0 is the pending token (the root)
    parents: list[int]  # [n] each node's parent node, parents[i] < i; -1 for the root
    paths: list[list[int]]  # [c] per candidate span its nodes, root first

    @property
    def depths(self) -> list[int]:
        """[n] tokens between the root and each node (the root: 0)."""
        out: list[int] = []
        for parent in self.parents:
            out.append(0 if parent < 0 else out[parent] + 1)
        return out


def build_tree(pending: int, spans: Sequence[Sequence[int]]) -> TokenTree:
    """The trie of [pending] + each span: a prefix shared by several spans is one run of nodes.
    Nodes are numbered in the order the spans first reach them (a parent before its children).
    Each span joins the tree where it parts from the earlier span it shares most with; its
    other tokens are new nodes in a row (prefix checks against the earlier spans with the same
    first token only, list copies otherwise)."""
    token_ids, parents, paths = [pending], [-1], []
    by_first: dict[int, list[int]] = {}  # first token -> the earlier spans starting with it
    for i, span in enumerate(spans):
        shared, path = 0, [0]  # tokens shared with an earlier span, and that span's path
        for earlier in by_first.setdefault(span[0], []) if span else ():  # (most spans part at once)
            common = common_prefix(spans[earlier], span)
            if common > shared:
                shared, path = common, paths[earlier]
        if span:
            by_first[span[0]].append(i)
        first = len(token_ids)  # the span's new nodes: first, first + 1, ...
        token_ids.extend(span[shared:])
        parents.extend(range(first - 1, first - 1 + len(span) - shared))
        if len(span) > shared:
            parents[first] = path[shared]
        paths.append(path[: shared + 1] + list(range(first, first + len(span) - shared)))
    return TokenTree(token_ids, parents, paths)
