"""The n-gram peers replayed with their own proposers: SGLang's NGRAM (its trie, anchors and
breadth-first tree against a transcription that keeps the source's LRU lists) and llama-server's
ngram-simple and ngram-mod (against their source's rules)."""
from __future__ import annotations

import random

import pytest

from ssr.proposing.source import Source

pytestmark = pytest.mark.shared_data  # needs nothing from ../shared: runs from a clone too


# -- SGLang NGRAM ---------------------------------------------------------------------------

class LruNode:
    """trie.cpp's node as its source keeps it: children by token and an LRU list, front first."""

    def __init__(self, token):
        self.token, self.freq, self.children, self.lru = token, 1, {}, []


def lru_insert(root, window, depth=18):
    for start in range(len(window)):
        node = root
        for token in window[start: start + depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = LruNode(token)
            else:
                child.freq += 1
                node.lru.remove(child)
            node.lru.insert(0, child)
            node = child


def lru_walk(node, tokens):
    for token in tokens:
        node = node.children.get(token)
        if node is None:
            return None
    return node


def sglang_bfs(anchors, draft=11, depth=18, low=1, high=10):
    """trie.cpp `buildRecency` transcribed: a FIFO per anchor, merged by (draft parent, token)."""
    from collections import deque

    scale = (high - low) / (depth - 1)
    tree = [{}]
    for node, d in anchors:
        queue = deque([(0, (depth - 1 - d) * scale + low, node)])
        while queue and len(tree) <= draft:
            parent, breadth, node = queue.popleft()
            for child in node.lru[: max(1, int(breadth))]:
                if len(tree) > draft:
                    break
                if child.token not in tree[parent]:
                    tree[parent][child.token] = len(tree)
                    tree.append({})
                queue.append((tree[parent][child.token], breadth - scale, child))
    return tree


def tree_paths(tree):
    out, stack = set(), [(0, ())]
    while stack:
        node, path = stack.pop()
        if not tree[node] and path:
            out.add(path)
        stack.extend((child, path + (token,)) for token, child in tree[node].items())
    return out


def sglang_reference(prompt, output, depth=18):
    """SGLang's NGRAM at batch 1 on a known output, as its worker runs it (ngram_worker.py,
    trie.cpp): the trees it drafts, step by step, and what each step commits."""
    root, seq, anchors, matched = LruNode(-1), list(prompt) + output[:1], None, 0
    steps = []
    while len(seq) < len(prompt) + len(output):
        context = seq[-depth:]
        if anchors is None:  # MatchState: rebuilt on the first step, advanced after
            anchors = [lru_walk(root, context[-d:]) for d in range(1, len(context) + 1)]
        else:
            for token in context[len(context) - (len(seq) - matched):]:
                advanced = [root.children.get(token)]
                for parent in anchors[: min(len(anchors) + 1, depth) - 1]:
                    advanced.append(parent.children.get(token) if parent is not None else None)
                anchors = advanced
        matched = len(seq)
        live = [(node, d) for d, node in reversed(list(enumerate(anchors, 1))) if node is not None and node.children]
        tree = sglang_bfs(live)
        node, accepted, at = 0, [], len(seq) - len(prompt)
        while at + len(accepted) < len(output) and output[at + len(accepted)] in tree[node]:
            node = tree[node][output[at + len(accepted)]]
            accepted.append(output[at + len(accepted)])
        committed = output[at: at + len(accepted) + 1]
        steps.append((tree_paths(tree), committed))
        lru_insert(root, context, depth)
        seq += committed
    return steps


@pytest.mark.parametrize("seed", range(25))
def test_sglang_ngram_drafts_the_trees_sglangs_trie_drafts(seed):
    from ssr.bench.peers.sglang_ngram import SglangNgramProposer

    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])
    prompt = [rng.randrange(1, alphabet + 1) for _ in range(rng.randrange(1, 20))]
    output = [rng.randrange(1, alphabet + 1) for _ in range(rng.randrange(20, 120))]
    proposer = SglangNgramProposer(prompt)
    proposer.observe(output[:1])  # the token prefill samples (no draft, nothing inserted)
    for paths, committed in sglang_reference(prompt, output):
        got = {tuple(path) for _, path in proposer.candidates(100) if path != [0]}
        assert got == paths
        proposer.observe(committed)


def test_sglang_ngram_pads_its_tree_and_a_pad_can_be_accepted():
    from ssr.bench.peers.sglang_ngram import SglangNgramProposer

    proposer = SglangNgramProposer([5, 6, 7])
    assert proposer.candidates(100) == []  # prefill drafts nothing
    proposer.observe([8])
    assert proposer.candidates(100) == [(Source("sglang-ngram"), [0])]  # an empty trie: root + 11 pads
    proposer.observe([5])  # inserts [5, 6, 7, 8]'s suffixes
    proposer.observe([6])
    assert sorted(path for _, path in proposer.candidates(100)) == [[0], [7, 8, 5]]


def test_sglang_ngram_keeps_its_trie_across_requests():
    from ssr.bench.peers.sglang_ngram import SglangNgramProposer
    from ssr.proposing.history import ResponseHistory

    history = ResponseHistory()
    first = SglangNgramProposer([1, 2], history)
    for token in [3, 4, 5, 6]:
        first.observe([token])
    second = SglangNgramProposer([9, 3], history)  # the prompt is not indexed: only decode windows
    second.observe([4])
    # the first request inserted [1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5] (each step the window it
    # matched with, before the step's own tokens): after [3, 4] comes 5, and 6 never went in
    assert [5] in [path for _, path in second.candidates(100)]
    assert SglangNgramProposer([9, 3]).candidates(100) == []  # a fresh server knows nothing


# -- llama.cpp n-gram modes -------------------------------------------------------------------

def simple_reference(tokens, n=12, m=48):
    """common_ngram_simple_draft (common/ngram-map.cpp) transcribed: `tokens` the KV history,
    id_last the token just sampled."""
    *history, last = tokens
    size = len(history)
    if size <= n + m + 1:
        return []
    pattern = history[size - n + 1:] + [last]
    for j in range(size - n - 1, 0, -1):
        if history[j: j + n] == pattern:
            count = min(m, size - (j + n))
            return [] if count < n else history[j + n: j + n + count]
    return []


@pytest.mark.parametrize("seed", range(20))
def test_llamacpp_ngram_simple_drafts_what_llama_cpp_drafts(seed, monkeypatch):
    from ssr.bench.peers import llamacpp_ngram

    rng = random.Random(seed)
    n, m = rng.choice([(12, 48), (2, 5), (3, 4)])
    monkeypatch.setattr(llamacpp_ngram, "SIMPLE_N", n)
    monkeypatch.setattr(llamacpp_ngram, "SIMPLE_M", m)
    alphabet = rng.choice([2, 3])
    tokens = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 30))]
    proposer = llamacpp_ngram.NgramSimpleProposer(tokens)
    proposer.observe([rng.randrange(alphabet)])
    tokens = proposer.tokens[:]
    drafted = 0
    for _ in range(60 if n == 12 else 25):
        draft = proposer.propose(1000)[0]
        assert draft == simple_reference(tokens, n, m), (tokens, n, m)
        drafted += bool(draft)
        piece = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
        proposer.observe(piece)
        tokens += piece
    assert drafted or n == 12


def test_llamacpp_ngram_mod_rules(monkeypatch):
    """On a small configuration (n 2, min 3, max 4, pending > 32 -> the same 32): the prompt is
    indexed at begin, a draft follows the pool slot by slot and is dropped under the minimum,
    history joins in batches, five poor drafts in a row empty the pool, and the pool is kept
    across requests."""
    from ssr.bench.peers import llamacpp_ngram as mod
    from ssr.proposing.history import ResponseHistory

    monkeypatch.setattr(mod, "MOD_N", 2)
    monkeypatch.setattr(mod, "MOD_MIN", 3)
    monkeypatch.setattr(mod, "MOD_MAX", 4)
    history = ResponseHistory()
    proposer = mod.NgramModProposer([1, 2, 3, 4, 5, 9, 9], history)
    assert proposer.candidates(10) == []  # the first token is sampled without a draft
    proposer.observe([1])
    assert proposer.candidates(10) == []  # [9, 1] was never seen: the first slot is empty
    proposer.observe([2])
    assert proposer.candidates(10) == [(Source("llamacpp-ngram-mod"), [3, 4, 5, 9])]  # [1, 2] -> 3, [2, 3] -> 4 ...
    proposer.observe([3, 4, 5, 9, 9])  # accepted all: no poor draft
    assert proposer.pool.low == 0
    short = mod.NgramModProposer([7, 8, 6], ResponseHistory())
    short.observe([7])
    assert short.candidates(10) == []  # [6, 7] unseen
    short.observe([8])
    assert short.candidates(10) == []  # [7, 8] -> 6 -> [8, 6] unseen: 1 token, under the minimum 3
    cycle = mod.NgramModProposer([1, 2, 1, 2, 1, 2], history)  # [1, 2] -> 1, [2, 1] -> 2
    cycle.observe([1])
    cycle.observe([2])
    for poor in range(5):  # five drafts in a row with none accepted (steps without a draft between)
        assert cycle.candidates(10) == [(Source("llamacpp-ngram-mod"), [1, 2, 1, 2])] and cycle.pool.low == poor
        cycle.observe([7])
        assert cycle.candidates(10) == []  # [2, 7] unseen: no draft, the streak goes on
        cycle.observe([1])
        cycle.candidates(10)  # [7, 1] unseen
        cycle.observe([2])
    assert not cycle.pool.slots and cycle.indexed == 0 and cycle.pool.low == 0
    assert cycle.pool is proposer.pool  # one server, one pool
    assert mod.NgramModProposer([1, 2, 3]).pool is not proposer.pool
