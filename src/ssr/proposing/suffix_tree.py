"""Suffix tree (a depth-limited suffix trie with counts) for suffix decoding.

After ArcticInference's suffix decoding: every substring of length <= max_depth of
the sequences added is a path from the root, and each node counts the occurrences
of its path. Sequences grow online in O(max_depth) per token. A proposal matches
the longest suffix of the context that occurs in the tree and follows the most
frequent continuation while its estimated probability stays high.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence


MATCH_BUCKETS = (4, 8, 16)  # a span's source names its match length: suffix/<4, /4-7, /8-15, /16+


def match_bucket(match_len: int) -> int:
    """The bucket of a match length (MATCH_BUCKETS): span policies measure each apart."""
    return bisect_right(MATCH_BUCKETS, match_len)  # the edges it reaches


class _Node:
    """A path of the trie. Most nodes have one child (a depth-limited trie of new text is
    chains), so the first child is kept inline and a dict made only for the others: a node
    costs ~70 bytes instead of ~290 with a dict each (the cache of earlier responses holds
    ~depth nodes per token)."""

    __slots__ = ("count", "token", "child", "more")

    def __init__(self) -> None:
        self.count = 0  # occurrences of this node's path in all sequences added
        self.token = -1  # first child's token (-1: none)
        self.child: _Node | None = None  # first child: the node of path + [token]
        self.more: dict[int, _Node] | None = None  # the other children, by token

    def get(self, token: int) -> _Node | None:
        """The child for `token`, or None."""
        if self.token == token:
            return self.child
        return self.more.get(token) if self.more is not None else None

    def add(self, token: int) -> _Node:
        """A new child for `token` (not a child yet)."""
        node = _Node()
        if self.child is None:
            self.token, self.child = token, node
        else:
            if self.more is None:
                self.more = {}
            self.more[token] = node
        return node

    def children(self) -> list[tuple[int, _Node]]:
        """(token, child) pairs, the first child first."""
        if self.child is None:
            return []
        first = [(self.token, self.child)]
        return first if self.more is None else first + list(self.more.items())


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth  # longest path stored (pattern + continuation)
        self.root = _Node()  # empty path; its count is the number of tokens added
        self._active: list[list[_Node]] = []  # per sequence: nodes of its suffixes, by length

    def add_sequence(self, token_ids: Iterable[int] = ()) -> int:
        """Start a new sequence (no substring spans two sequences); returns its handle."""
        self._active.append([self.root])
        handle = len(self._active) - 1
        self.extend(handle, token_ids)
        return handle

    def extend(self, handle: int, token_ids: Iterable[int]) -> None:
        """Append tokens to a sequence: each new suffix ending at them is counted once."""
        active = self._active[handle]
        for token in token_ids:
            grown = [self.root]
            for node in active[: self.max_depth]:
                child = node.get(token)
                if child is None:
                    child = node.add(token)
                child.count += 1
                grown.append(child)
            self.root.count += 1
            active = grown
        self._active[handle] = active

    def find(self, pattern: Sequence[int]) -> _Node | None:
        node = self.root
        for token in pattern:
            node = node.get(token)
            if node is None:
                return None
        return node

    def suffix_nodes(self, handle: int) -> list[_Node]:
        """Nodes of a sequence's suffixes by length (0: the root), as grown by `extend`."""
        return self._active[handle]

    def advance(self, nodes: list[_Node | None], token: int) -> list[_Node | None]:
        """The nodes of a context's suffixes (by length) after `token` is appended to it, for a
        context that is not itself in the tree (another request's tree, earlier responses)."""
        grown: list[_Node | None] = [self.root]
        for node in nodes[: self.max_depth]:
            grown.append(node.get(token) if node is not None else None)
        while grown[-1] is None:
            grown.pop()
        return grown

    def match(self, context: Sequence[int]) -> list[_Node | None]:
        """The nodes of the context's suffixes by length (None where not in the tree)."""
        nodes: list[_Node | None] = [self.root]
        for token in context[-self.max_depth:]:
            nodes = self.advance(nodes, token)
        return nodes

    def propose(
        self, context: Sequence[int], max_span: int, span_factor: float, min_prob: float,
        extend_prob: float | None = None,
    ) -> tuple[list[int], list[float], int]:
        """`propose_from` the context's suffixes."""
        return self.propose_from(self.match(context), max_span, span_factor, min_prob, extend_prob)

    def propose_from(
        self, nodes: list[_Node | None], max_span: int, span_factor: float, min_prob: float,
        extend_prob: float | None = None,
    ) -> tuple[list[int], list[float], int]:
        """Span to verify after a context whose suffixes are at `nodes` (by length), the
        estimated probability that each prefix of it is right, and the length of the suffix
        it was matched on.

        Suffixes of length L, L - s, L - 2s, ... >= 1 propose (L the longest found, below the
        depth limit; s = ceil(L / 8): at most 8 candidates): the span follows the most frequent
        child (ties: smallest token id) while count(child)/count(node), multiplied along the
        span, stays >= min_prob; it is at most min(max_span, span_factor * match length) tokens
        and never leaves the depth limit. The span with the most expected accepted tokens (the
        sum of its probabilities) wins, the longer match on ties (as ArcticInference scores its
        candidates): a long match near the depth limit leaves room for one token only, a
        shorter one for a long span.

        extend_prob (engines where verifying dozens of tokens costs about one step): the winning
        span is then followed on beyond span_factor * match length, up to max_span and the depth
        limit, while its probability stays >= extend_prob (the match is chosen as without it).
        """
        longest = min(len(nodes) - 1, self.max_depth - 1)
        while longest > 0 and nodes[longest] is None:
            longest -= 1
        best: tuple[list[int], list[float], int] = ([], [], 0)
        best_score = 0.0
        for match_len in range(longest, 0, -max(1, -(-longest // 8))):
            node = nodes[match_len]
            if node is None:
                continue
            limit = min(max_span, int(span_factor * match_len), self.max_depth - match_len)
            span, probs = _follow(node, limit, min_prob)
            if span and sum(probs) > best_score:
                best, best_score = (span, probs, match_len), sum(probs)
        match_len = best[2]
        if extend_prob is not None and match_len:
            span, probs = _follow(nodes[match_len], min(max_span, self.max_depth - match_len), extend_prob)
            if len(span) > len(best[0]):
                best = (span, probs, match_len)
        return best

    def check_integrity(self) -> None:
        """Raise AssertionError if counts or depths are inconsistent."""
        stack = [(self.root, 0)]
        while stack:
            node, depth = stack.pop()
            assert depth <= self.max_depth, f"node deeper than {self.max_depth}"
            assert node.count >= 1 or node is self.root, "empty node"
            children = node.children()
            child_total = sum(child.count for _, child in children)
            # each occurrence of path+[t] is an occurrence of path followed by t
            assert child_total <= node.count, f"children count {child_total} > {node.count}"
            assert len({token for token, _ in children}) == len(children), "a token twice"
            stack.extend((child, depth + 1) for _, child in children)


def _follow(node: _Node, limit: int, min_prob: float) -> tuple[list[int], list[float]]:
    span: list[int] = []
    probs: list[float] = []  # probs[i]: product of count(child)/count(node) up to span[i]
    prob = 1.0
    while len(span) < limit and node.child is not None:
        token, child = max(node.children(), key=lambda item: (item[1].count, -item[0]))
        prob *= child.count / node.count
        if prob < min_prob:
            break
        span.append(token)
        probs.append(prob)
        node = child
    return span, probs
