"""A recency trie of every short window the context has written, shared across requests, and
its candidates as SGLang's NGRAM builds its draft tree (`buildRecency`, BFS: per anchor, a node
takes its most recently written children, fewer the longer the match) — with the prompt indexed
too (SGLang's trie holds decode windows only) and the tree's size left to the span policy, which
prices every path beside ssr's other sources (bench/peers/sglang_ngram.py replays SGLang itself).

Every window of up to `depth` tokens ending at each token is in the trie once: a token extends
the nodes of the context's last 0..depth-1 tokens (the anchors) by one child each. A node keeps
its children in the order they were last written (recency), not how often.

Most windows of new text are written once (a 110,863-token agent prompt: 1.5M windows, 14 new a
token), and a dict each made that prompt 330 MB and 1.6-2.2 s, most of it Python's garbage
collector walking them. So a window written once is a `Chain` in its parent dict: where the text
it was written in goes on, its one child the next token there. It becomes a dict when another
child is written after it (`_dict`). The context's windows that are new are not anchors: they
are counted (`fresh`), and the next token extends each of them by being appended to the text. A
token costs the windows written before it (about 5 there), not depth - 1: 0.5-0.8 s and 34 MB
on that prompt, the same windows in the same order (docs/agents.md, "A long prompt's setup")."""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Union

from ..verifying.verify import common_prefix
from .history import ResponseHistory
from .proposers import CHAIN
from .source import Source

DEPTH = 18  # longest window kept (SGLang's trie depth, --speculative-ngram-max-trie-depth)
# children a node offers after the longest / the shortest match: SGLang's BFS narrows from 10 to 1
# for its 11 draft nodes; ssr's span policy prices every node, so the tree is offered wider
MIN_BREADTH, MAX_BREADTH = 1, 32
MAX_NODES = 2_000_000  # a deployment's trie starts over past this many windows (SGLang keeps 10M nodes)
NODES = 96  # tokens of the draft tree built a pass, before the span policy cuts it (SGLang verifies 11)


# A window written once is a Chain, not a dict: (text, end), the node ending at text[end] (text: the
# tokens a request wrote, a list that grows while the request runs), its one child text[end + 1]
# (while the text holds it and the window is shorter than the depth), and so on down the text.
Chain = tuple
# An anchor inside a chain, with what turning it into dicts needs: (text, end, holder, key, first),
# its node ending at text[end], the chain's first node ending at text[first] and held by the dict
# `holder` under the token `key`. (Plain tuples: a long prompt makes millions.)
Anchor = tuple
Node = Union[dict, Chain]  # a dict: token -> the node one token deeper, the most recently written
#                            last (a child written again moves to the end: the dict's order is the
#                            recency list); a Chain: a node written once


class RecencyTrie:
    """The windows of every sequence written into it (prompts, outputs; one trie per deployment)."""

    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth  # longest window
        self.root: dict = {}  # the empty window
        self.nodes = 0  # nodes below the root, chains' included (bounded by the proposer: MAX_NODES)
        self.version = 0  # batches written: a request's anchors stand while no other request writes
        # what the latest request wrote (its prompt, then its output), in order: its Chains' text
        self.last: list[int] = []

    def children(self, node: Node, length: int):
        """(token, node) of `node` (a window of `length` tokens), the most recently written first."""
        if type(node) is dict:
            return reversed(node.items())
        text, end = node
        return ((text[end + 1], (text, end + 1)),) if end + 1 < len(text) and length < self.depth else ()

    def walk(self, tokens: Sequence[int]) -> list:
        """The anchors after `tokens` (at most depth - 1 of them) as write would leave them, for
        windows written already: nothing is written, no recency changes."""
        anchors: list = [self.root]
        for token in tokens:
            out: list = [self.root]
            for node in anchors:
                if type(node) is dict:
                    child = node.get(token)
                    if child is not None and type(child) is not dict:  # a chain's first node
                        child = (child[0], child[1], node, token, child[1])
                else:
                    text, end, holder, key, first = node
                    child = (text, end + 1, holder, key, first) if end + 1 < len(text) and text[end + 1] == token \
                        else None
                if child is None:
                    break
                out.append(child)
            anchors = out[: self.depth]
        return anchors

    def write(self, anchors: list, fresh: int, text: list[int]) -> tuple[list, int]:
        """Append text[-1] after a context whose last 0, 1, .. tokens end at anchors[0], [1], ..
        (anchors[0] is the root) and whose next `fresh` windows, longer, are new (written first
        just now, in text: the writing request's tokens, this one last) -> the same after it. A new
        window's one child is the token after it: it is written by counting it."""
        token, at = text[-1], len(text) - 1
        out: list = [self.root]
        made = 0  # windows new with this token, after the anchors (a new window's longer ones are new)
        for node in anchors:
            if type(node) is not dict:
                node = self.resolve(node)  # (its chain may have been made dicts since, by another anchor)
                if type(node) is not dict:
                    chain, end = node[0], node[1]
                    if end + 1 < len(chain) and chain[end + 1] == token:  # its one child
                        if chain is text and end + 1 == at:  # new: the anchors found again (`TrieProposer._sync`)
                            self.nodes += 1
                        out.append((chain, end + 1, node[2], node[3], node[4]))
                        continue
                    node = self._dict(node)  # a second child: the chain's nodes down to it made dicts
            child = node.pop(token, None)
            if child is None:
                node[token] = (text, at)  # a new window, now the most recent
                made += 1
            else:
                node[token] = child  # (re)inserted: now the most recent
                out.append(child if type(child) is dict else (child[0], child[1], node, token, child[1]))
        self.nodes += made + fresh
        out = out[: self.depth]  # a window of `depth` tokens is written but extended no further
        return out, min(made + fresh, self.depth - len(out))

    def resolve(self, anchor: Anchor):
        """The anchor's node now: a dict where its chain was made dicts down to it since (by another
        anchor of the same chain: a repeated token makes two), else the anchor, held where it is now."""
        text, end, holder, key, at = anchor
        node = holder[key]
        if type(node) is not dict:  # (mostly: its chain as it was)
            return anchor
        while type(node) is dict:
            if at == end:
                return node
            at += 1
            holder, key, node = node, text[at], node[text[at]]
        return (text, end, holder, key, at)

    def _dict(self, anchor: Anchor) -> dict:
        """The anchor's node (resolved: its holder holds its chain) as a dict, and the chain's nodes
        above it: their one child each, the node's own kept (the holder's order unchanged)."""
        text, end, holder, key, at = anchor
        made = holder[key] = {}  # a value replaced keeps its place: the recency order stands
        while at < end:
            at += 1
            made[text[at]] = made = {}
        if end + 1 < len(text):  # (an anchor is shorter than the depth: its child is in the trie)
            made[text[end + 1]] = (text, end + 1)
        return made


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
        self.text = self.trie.last = list(prompt[:written])  # what this request wrote, after that start
        # [n]: the node of the context's last n tokens, a window written before (a dict, or an Anchor)
        self.anchors: list = []
        self.fresh = 0  # the context's windows past the anchors, longer, new: written once, just now
        self.version: int | None = None  # the trie's version its anchors were found at (None: not yet)
        self.observe(prompt[written:])  # (its anchors found first, after the start kept)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Drafts are the suffix tree's to copy from."""

    def prepare(self) -> None:
        """Nothing deferred: the prompt is written as the proposer is made."""

    def observe(self, token_ids: Sequence[int]) -> None:
        self._sync()
        trie, text, anchors, fresh = self.trie, self.text, self.anchors, self.fresh
        for token in token_ids:
            text.append(int(token))
            anchors, fresh = trie.write(anchors, fresh, text)
        self.anchors, self.fresh = anchors, fresh
        trie.version = self.version = trie.version + 1

    def _sync(self) -> None:
        """The anchors found, where they were not yet or another request sharing the trie wrote
        since (its writes may have made this one's new windows dicts)."""
        if self.version != self.trie.version:
            self.anchors = self.trie.walk(self.text[max(0, len(self.text) - self.trie.depth + 1):])
            self.fresh, self.version = 0, self.trie.version

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        found = self.candidates(max_tokens)
        return (found[0][1], None) if found else ([], None)

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        """The draft tree's root-to-leaf paths, leaves in the order they were made (the longest
        anchor first, as SGLang builds), each with its source."""
        if max_tokens < 1:
            return []
        self._sync()
        paths: list[list[int]] = [[]]  # [draft node] its tokens from the root; 0 the root
        children: list[dict[int, int]] = [{}]  # [draft node] token -> child draft node
        match: list[int] = [0]  # [draft node] the anchor length that first reached it
        trie, nodes, anchors = self.trie, self.nodes, self.anchors
        depth = trie.depth
        scale = (MAX_BREADTH - MIN_BREADTH) / (depth - 1)
        for n in range(len(anchors) - 1, 0, -1):  # the longest match first
            anchor = anchors[n] if type(anchors[n]) is dict else trie.resolve(anchors[n])
            anchor = anchor if type(anchor) is dict else anchor[:2]  # (its chain from there)
            if not any(True for _ in trie.children(anchor, n)) or len(paths) > nodes:  # nothing ever
                continue  # followed it; or the tree is full
            queue = deque([(0, (depth - 1 - n) * scale + MIN_BREADTH, anchor)])
            while queue and len(paths) <= nodes:
                at, breadth, node = queue.popleft()
                if len(paths[at]) >= max_tokens:
                    continue
                for token, child in islice(trie.children(node, n + len(paths[at])), max(1, int(breadth))):
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
