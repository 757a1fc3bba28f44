"""SGLang's `--speculative-algorithm NGRAM`, for the trace replay (`sglang-ngram`, and
`sglang-ngram-prob` for `--speculative-ngram-match-type PROB`), read in the SGLang 0.5.23 wheel
(paths below are the repository's, under python/sglang/):

- defaults (srt/arg_groups/fields/spec.py, srt/arg_groups/speculative_hook.py `_handle_ngram`):
  D = 12 draft tokens counting the root, so 11 draft nodes (kernels/jit/csrc/ngram_corpus/param.h);
  BFS breadth 1..10; match type BFS; trie depth 18; capacity 10M nodes (never filled by a trace:
  a position adds at most 18 nodes, so eviction, trie.cpp `squeeze`, never runs here);
- one trie for the whole server, kept across requests (srt/speculative/ngram_worker.py): after
  each verify the window used to match that step (the last 18 tokens of prompt + output, the
  tokens accepted in the step not yet in it) is inserted, every suffix of it (trie.cpp `insert`:
  a node's count grows, and it moves to the front of its parent's recency list); prefill inserts
  nothing (the prompt is not indexed, a FIXME there) and drafts nothing;
- anchors (trie.cpp `MatchState`): per request, the trie nodes of the context's last d tokens,
  d = 1..18, found afresh at the request's first step and then advanced token by token from the
  previous step's (computed before that step's insert), kept where they have children, longest first;
- the draft tree (trie.cpp `buildRecency`, BFS): per anchor a FIFO from the draft's root, seed
  breadth (17 - d) * 9/17 + 1; a node takes its first int(b) (at least 1) children by recency,
  each child enqueued with b - 9/17; nodes keyed by (draft parent, token), so anchors that agree
  merge; until 11 nodes. PROB (`buildFrequency`): one max-heap of path probabilities over every
  anchor, a node's top 10 children by count (ties: smaller token), prob = parent's * count / sum;
- every step verifies all D tokens (result.cpp: missing nodes padded with token 0 under the root),
  greedily down the tree (an accepted pad counts: the target wrote token 0).
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from ...proposing.history import ResponseHistory
from ...proposing.proposers import Shape
from ...proposing.source import Source
from . import TreeSource

DRAFT_TOKENS = 12  # --speculative-num-draft-tokens unset: D, the root included
MAX_DEPTH = 18  # --speculative-ngram-max-trie-depth
MIN_BFS, MAX_BFS = 1, 10  # --speculative-ngram-min-bfs-breadth, --speculative-ngram-max-bfs-breadth
PAD = 0  # result.cpp: padding nodes are token 0, children of the root


class Node:
    __slots__ = ("token", "count", "touched", "children")

    def __init__(self, token: int, touched: int) -> None:
        self.token = token  # the token this node adds to its parent's path
        self.count = 1  # insertions through it (trie.cpp `freq`): occurrences times steps in the window
        self.touched = touched  # when it was last inserted through: its place in its parent's recency list
        self.children: dict[int, Node] = {}  # token -> child

    def most_recent(self, count: int) -> list[Node]:
        """The first `count` children of trie.cpp's per-node LRU list (a child moves to its front
        whenever it is touched): the most recently touched first (touch times are distinct)."""
        return heapq.nlargest(count, self.children.values(), key=lambda node: node.touched)


class Trie:
    """The server's one trie of decode windows (every suffix of each, up to MAX_DEPTH deep)."""

    def __init__(self) -> None:
        self.root = Node(-1, 0)
        self.clock = 0  # touches so far: a touch later than another is more recent

    def insert(self, window: Sequence[int]) -> None:
        for start in range(len(window)):
            node = self.root
            for token in window[start: start + MAX_DEPTH]:
                self.clock += 1
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node(token, self.clock)
                else:
                    child.count += 1
                    child.touched = self.clock
                node = child


class SglangNgramProposer(TreeSource):
    """One request's drafts from the shared trie, as a token tree of D nodes a step."""

    shape = Shape(tree=True, width=DRAFT_TOKENS, pad=PAD)

    def __init__(self, prompt: Sequence[int], history: ResponseHistory | None = None, prob: bool = False) -> None:
        self.source = Source("sglang-ngram-prob" if prob else "sglang-ngram")
        self.prob = prob  # PROB match type: frequency expansion instead of recency BFS
        self.trie = history.kept("sglang-ngram", Trie) if history is not None else Trie()  # both types share it
        self.tokens = list(prompt)  # prompt + output; the last is the token the step verifies after
        self.output = 0  # output tokens so far (prefill drafts and inserts nothing)
        self.anchors: list[Node | None] | None = None  # [d - 1]: the node of the last d tokens (MatchState)
        self.matched_at = 0  # len(tokens) when the anchors were last brought up to date

    def add_source(self, token_ids: Sequence[int]) -> None:
        """NGRAM drafts from its trie only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        if self.output:  # after a decode step's verify: the window it matched with
            self.trie.insert(self.tokens[-MAX_DEPTH:])
        self.tokens += [int(t) for t in token_ids]
        self.output += len(token_ids)

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        """The draft tree's root-to-leaf paths (a pad path [0] where the tree has room for pads
        and no real token 0 under the root: SGLang verifies pads like any node)."""
        if not self.output or max_tokens < 1:
            return []
        anchors = self._match()
        tree = self._frequency(anchors) if self.prob else self._recency(anchors)
        paths = _paths(tree)
        if len(tree) < DRAFT_TOKENS and PAD not in tree[0]:  # len(tree): the root and the nodes
            paths.append([PAD])
        return [(self.source, path[:max_tokens]) for path in paths]

    def _match(self) -> list[tuple[Node, int]]:
        """(anchor node, its depth d) with children, longest first (trie.cpp `MatchState`)."""
        context = self.tokens[-MAX_DEPTH:]
        new = len(self.tokens) - self.matched_at
        if self.anchors is None or new > len(context):  # the request's first step: found afresh
            self.anchors = [_walk(self.trie.root, context[-d:]) for d in range(1, len(context) + 1)]
        else:  # advanced by the tokens since the last match
            for token in context[len(context) - new:]:
                depth = min(len(self.anchors) + 1, MAX_DEPTH)
                advanced: list[Node | None] = [self.trie.root.children.get(token)]
                for parent in self.anchors[: depth - 1]:
                    advanced.append(parent.children.get(token) if parent is not None else None)
                self.anchors = advanced
        self.matched_at = len(self.tokens)
        return [(node, d) for d, node in reversed(list(enumerate(self.anchors, 1))) if node is not None and node.children]

    def _recency(self, anchors: list[tuple[Node, int]]) -> list[dict[int, int]]:
        """trie.cpp `buildRecency`: [draft node] token -> child draft node; node 0 the root."""
        scale = (MAX_BFS - MIN_BFS) / (MAX_DEPTH - 1)
        tree: list[dict[int, int]] = [{}]
        for anchor, depth in anchors:
            queue = deque([(0, (MAX_DEPTH - 1 - depth) * scale + MIN_BFS, anchor)])
            while queue and len(tree) < DRAFT_TOKENS:
                parent, breadth, node = queue.popleft()
                for child in node.most_recent(max(1, int(breadth))):
                    if len(tree) >= DRAFT_TOKENS:
                        break
                    position = tree[parent].get(child.token)
                    if position is None:
                        position = tree[parent][child.token] = len(tree)
                        tree.append({})
                    queue.append((position, breadth - scale, child))
        return tree

    def _frequency(self, anchors: list[tuple[Node, int]]) -> list[dict[int, int]]:
        """trie.cpp `buildFrequency`: one max-heap of path probabilities over every anchor (ties:
        first pushed first; std::priority_queue leaves them unspecified)."""
        tree: list[dict[int, int]] = [{}]
        heap: list[tuple[float, int, int, Node]] = []
        pushed = 0

        def expand(parent: int, node: Node, prob: float) -> None:
            nonlocal pushed
            top = sorted(node.children.values(), key=lambda c: (-c.count, c.token))[:MAX_BFS]
            total = sum(c.count for c in top) or 1
            for child in top:
                pushed += 1
                heapq.heappush(heap, (-child.count / total * prob, pushed, parent, child))

        for anchor, _ in anchors:
            expand(0, anchor, 1.0)
            while heap and len(tree) < DRAFT_TOKENS:
                neg, _, parent, node = heapq.heappop(heap)
                position = tree[parent].get(node.token)
                if position is None:
                    position = tree[parent][node.token] = len(tree)
                    tree.append({})
                expand(position, node, -neg)
        return tree


def _walk(node: Node, tokens: Sequence[int]) -> Node | None:
    for token in tokens:
        node = node.children.get(token)
        if node is None:
            return None
    return node


def _paths(tree: list[dict[int, int]]) -> list[list[int]]:
    """Every leaf's tokens from the root down."""
    paths, stack = [], [(0, [])]
    while stack:
        node, path = stack.pop()
        if not tree[node]:
            if path:
                paths.append(path)
            continue
        stack.extend((child, path + [token]) for token, child in tree[node].items())
    return paths
