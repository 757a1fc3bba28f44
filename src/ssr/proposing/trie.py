"""A recency trie of every short window the context has written, shared across requests, and
its candidates as SGLang's NGRAM builds its draft tree (`buildRecency`, BFS: per anchor, a node
takes its most recently written children, fewer the longer the match) — with the prompt indexed
too (SGLang's trie holds decode windows only) and the tree's size left to the span policy, which
prices every path beside ssr's other sources (bench/peers/sglang_ngram.py replays SGLang itself).

Every window of up to `depth` tokens ending at each token is in the trie once: a token extends
the nodes of the context's last 0..depth-1 tokens (the anchors) by one child each, O(depth) a
token. A node keeps its children in the order they were last written (recency), not how often."""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice

from ..verifying.verify import common_prefix
from .history import ResponseHistory
from .proposers import CHAIN
from .source import Source

DEPTH = 18  # longest window kept (SGLang's trie depth, --speculative-ngram-max-trie-depth)
# children a node offers after the longest / the shortest match: SGLang's BFS narrows from 10 to 1
# for its 11 draft nodes; ssr's span policy prices every node, so the tree is offered wider
MIN_BREADTH, MAX_BREADTH = 1, 32
MAX_NODES = 2_000_000  # a deployment's trie starts over past this many nodes (~0.5 GB; SGLang keeps 10M)
NODES = 96  # tokens of the draft tree built a pass, before the span policy cuts it (SGLang verifies 11)


Node = dict  # token -> the node one token deeper, the most recently written last (a child
#              written again moves to the end: the dict's order is the recency list)


class RecencyTrie:
    """The windows of every sequence written into it (prompts, outputs; one trie per deployment)."""

    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth  # longest window
        self.root: Node = {}  # the empty window
        self.nodes = 0  # nodes below the root (bounded by the proposer: MAX_NODES)
        self.last: list[int] = []  # what the latest request wrote (its prompt, then its output), in order

    def walk(self, tokens: Sequence[int]) -> list[Node]:
        """The anchors after `tokens` (at most depth - 1 of them) as write would leave them, for
        windows written already: nothing is written, no recency changes."""
        anchors = [self.root]
        for token in tokens:
            out = [self.root]
            for node in anchors:
                child = node.get(token)
                if child is None:
                    break
                out.append(child)
            anchors = out[: self.depth]
        return anchors

    def write(self, anchors: list[Node], token: int) -> list[Node]:
        """Append `token` after a context whose last 0, 1, .. tokens end at anchors[0], [1], ..
        (anchors[0] is the root) -> the anchors after it."""
        out = [self.root]
        for node in anchors:
            child = node.pop(token, None)
            if child is None:
                child, self.nodes = {}, self.nodes + 1
            node[token] = child  # (re)inserted: now the most recent
            out.append(child)
        return out[: self.depth]  # a window of `depth` tokens is written but extended no further


class TrieProposer:
    """ssr's third source where a pass verifies a token tree: the recency trie's draft tree over
    prompt + output (and, shared through the history, every earlier request's), each root-to-leaf
    path a candidate named by its anchor's match length ("trie/n", n capped at 8)."""

    shape = CHAIN  # its paths are candidates like any other source's; ssr's tree verifies them
    implementation = None

    def __init__(self, prompt: Sequence[int], history: ResponseHistory | None = None, nodes: int = NODES) -> None:
        self.trie = history.kept("ssr-trie", RecencyTrie) if history is not None else RecencyTrie()
        if history is not None and self.trie.nodes > MAX_NODES:  # full: the deployment's windows
            self.trie = history.renew("ssr-trie", RecencyTrie)  # start over (as the history's trees do)
        self.nodes = nodes  # draft tokens a pass
        # the prompt's start the latest request wrote already (turn N of a conversation starts as
        # turn N - 1's prompt and output did) keeps the recency it was written with; the rest is written
        written = common_prefix(self.trie.last, prompt)
        self.anchors = self.trie.walk(prompt[max(0, written - self.trie.depth):written])
        self.trie.last = list(prompt[:written])
        self.observe(prompt[written:])

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Drafts are the suffix tree's to copy from."""

    def observe(self, token_ids: Sequence[int]) -> None:
        for token in token_ids:
            self.anchors = self.trie.write(self.anchors, int(token))
        self.trie.last.extend(token_ids)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        found = self.candidates(max_tokens)
        return (found[0][1], None) if found else ([], None)

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        """The draft tree's root-to-leaf paths, leaves in the order they were made (the longest
        anchor first, as SGLang builds), each with its source."""
        if max_tokens < 1:
            return []
        paths: list[list[int]] = [[]]  # [draft node] its tokens from the root; 0 the root
        children: list[dict[int, int]] = [{}]  # [draft node] token -> child draft node
        match: list[int] = [0]  # [draft node] the anchor length that first reached it
        depth, nodes, anchors = self.trie.depth, self.nodes, self.anchors
        scale = (MAX_BREADTH - MIN_BREADTH) / (depth - 1)
        for n in range(len(anchors) - 1, 0, -1):  # the longest match first
            if not anchors[n] or len(paths) > nodes:  # nothing ever followed it; or the tree is full
                continue
            queue = deque([(0, (depth - 1 - n) * scale + MIN_BREADTH, anchors[n])])
            while queue and len(paths) <= nodes:
                at, breadth, node = queue.popleft()
                if len(paths[at]) >= max_tokens:
                    continue
                for token, child in islice(reversed(node.items()), max(1, int(breadth))):
                    if len(paths) > nodes:
                        break
                    position = children[at].get(token)
                    if position is None:
                        position = children[at][token] = len(paths)
                        paths.append(paths[at] + [token])
                        children.append({})
                        match.append(n)
                    queue.append((position, breadth - scale, child))
        return [(SOURCES[match[i]], paths[i]) for i in range(1, len(paths)) if not children[i]]


SOURCES = [Source.of("trie", min(n, 8)) for n in range(DEPTH + 1)]  # [anchor length] its candidates' source
