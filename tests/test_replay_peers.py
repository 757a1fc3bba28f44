"""The peers replayed with their own proposers (bench/peers/): each against a brute-force
transcription of its source's rule, or against the peer's own simulator, and the loop's
handling of the shapes they declare (a token tree of their own, a fixed width a pass)."""
from __future__ import annotations

import random

import pytest

from ssr.bench.peers.arctic_tree import leaf_paths
from ssr.bench.peers.vllm_ngram import VllmNgramProposer
from ssr.bench.replay import REPLAY_FORMAT, ReplayEngine, RowModel, TreeReplayEngine
from ssr.bench.trace_replay import mode_config, replay_trace
from ssr.bench.traces import load_traces, tokenize_trace
from ssr.config import ConfigError
from ssr.costs import CostModel
from ssr.decode import Generation
from ssr.proposers import Shape
from test_traces import GPU, WordVocab, write_traces

pytestmark = pytest.mark.shared_data  # needs nothing from ../shared: runs from a clone too


def vllm_kernel(tokens: list[int], n_min: int, n_max: int, k: int) -> list[int]:
    """vLLM 0.32.0 `_ngram_scan_kernel` + `_ngram_finalize_kernel` (v1/worker/gpu/spec_decode/
    ngram/speculator.py) for one request, transcribed: every (n, pos) scored n * (L + 1) + pos + 1
    where the n tokens at pos equal the last n and pos <= L - n - 1; the maximum wins; K tokens
    after it, the last sampled token where there are none (or nothing matched)."""
    length, best = len(tokens), 0
    if length >= n_min:
        for pos in range(length):
            for n in range(n_min, n_max + 1):
                if pos <= length - n - 1 and tokens[pos: pos + n] == tokens[length - n:]:
                    best = max(best, n * (length + 1) + pos + 1)
    if not best:
        return [tokens[-1]] * k
    n, pos = divmod(best - 1, length + 1)
    start = pos + n
    return [tokens[start + i] if start + i < length else tokens[-1] for i in range(k)]


@pytest.mark.parametrize("seed", range(30))
def test_vllm_ngram_drafts_what_vllms_kernels_draft(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 4])
    n_min = rng.randrange(1, 4)
    n_max, k = n_min + rng.randrange(0, 3), rng.randrange(1, 7)
    prompt = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 8))]
    proposer, tokens = VllmNgramProposer(prompt, n_min, n_max, k), list(prompt)
    for _ in range(12):
        assert proposer.propose(100)[0] == vllm_kernel(tokens, n_min, n_max, k), (tokens, n_min, n_max, k)
        piece = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 4))]
        proposer.observe(piece)
        tokens += piece


@pytest.mark.parametrize("tokens, draft", [
    ([1, 2, 3, 4, 9, 1, 2, 3, 4], [9, 1, 2, 3, 4]),  # the 4-gram occurs once before: what followed it
    ([1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4], [6, 1, 2, 3, 4]),  # the rightmost occurrence, not the first
    ([1, 2, 3, 4, 7, 8, 1, 2, 3, 4], [7, 8, 1, 2, 3]),
    ([5, 6, 7, 8, 9], [9, 9, 9, 9, 9]),  # no match: K copies of the last token
    ([3, 3, 3, 3, 3], [3, 3, 3, 3, 3]),  # the suffix overlaps its occurrence: one token, then the last
])
def test_vllm_ngram_with_the_docs_config(tokens, draft):
    """{"num_speculative_tokens": 5, "prompt_lookup_max": 4}: n = 4, always 5 tokens."""
    assert VllmNgramProposer(tokens).propose(100)[0] == draft == vllm_kernel(tokens, 4, 4, 5)


def test_leaf_paths_rebuild_the_tree():
    #        root
    #       /    \
    #      5      6
    #     / \      \
    #    7   8      9
    token_ids, parents = [5, 6, 7, 8, 9], [-1, -1, 0, 0, 1]
    assert leaf_paths(token_ids, parents) == [[5, 7], [5, 8], [6, 9]]
    assert leaf_paths([4], [-1]) == [[4]] and leaf_paths([], []) == []


def _tokens(tmp_path, count=3):
    vocab = WordVocab()
    return [tokenize_trace(t, vocab) for t in load_traces([write_traces(tmp_path / "s.jsonl.gz", count=count)])]


def test_arctic_tree_accepts_what_arctics_own_simulator_accepts(tmp_path):
    """arctic's simulator (suffix_decoding/simulator.py `suffix_decode`, its defaults) and the
    replay's `arctic-tree` accept the same tokens at every step of the CoT (the loop ends a pass
    at the end-of-thinking token, so the steps that reach it are left out)."""
    np = pytest.importorskip("numpy")
    simulator = pytest.importorskip("arctic_inference.suffix_decoding.simulator")
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    for tokens in _tokens(tmp_path):
        output = tokens.cot_ids + tokens.answer_ids
        steps = simulator.suffix_decode(SuffixDecodingCache(64, -1), 0, np.array(tokens.prompt_ids, dtype=np.int32),
                                        np.array(output, dtype=np.int32), 0, 1.0, 0.1, True, True)
        expected, at = {}, 0
        for step in steps:
            if at + step["num_out_toks"] < len(tokens.cot_ids):
                expected[at] = step["num_accept_toks"]
            at += step["num_out_toks"]
        row = replay_trace(tokens, "arctic-tree", GPU, "cold")
        got = {event["at"]: event["accepted"] for event in row["trace"] if event["kind"] == "cot_span"}
        assert row["identical"] and sum(expected.values()) > 10
        assert {at: got.get(at, 0) for at in expected} == expected


class FixedTree:
    """A peer that verifies a tree of its own, padded to a fixed width (SGLang's NGRAM shape)."""

    source = "fixed"
    shape = Shape(tree=True, width=12, pad=0)

    def __init__(self):
        self.calls = 0

    def observe(self, token_ids):
        pass

    def add_source(self, token_ids):
        pass

    def propose(self, max_tokens):
        return [], None

    def candidates(self, max_tokens):
        self.calls += 1
        return [(self.source, [])] if self.calls % 2 else [(self.source, [1, 2]), (self.source, [3])]


class Feeds(TreeReplayEngine):
    """The tree replay engine, recording the tokens each verify pass feeds."""

    fed: list[int]

    def score(self, seq, token_ids, **kw):
        self.fed.append(len(token_ids))
        return super().score(seq, token_ids, **kw)

    def score_tree(self, seq, token_ids, parents, **kw):
        self.fed.append(len(token_ids))
        return super().score_tree(seq, token_ids, parents, **kw)


def _generation(tokens, engine_class, proposer):
    model = RowModel(prompt_ids=tokens.prompt_ids, cot_ids=tokens.cot_ids, answer_ids=tokens.answer_ids,
                     forced_end_ids=tokens.cot_ids[-1:], answer_prefix_ids=[], draft_ids=[], draft_forked_at=None)
    engine = engine_class(model, GPU.costs, max_sequences=8)
    engine.fed = []
    return engine, Generation(engine, REPLAY_FORMAT, mode_config("oracle"), tokens.prompt_ids,
                              costs=CostModel(table=GPU.costs), proposer=proposer)


def test_a_fixed_width_peer_feeds_its_width_every_pass(tmp_path):
    """Every verify pass feeds the declared width (padding as the root's children), a match or
    not, so it is priced by it; the output is still the trace's."""
    tokens = _tokens(tmp_path, count=1)[0]
    engine, generation = _generation(tokens, Feeds, FixedTree())
    result = generation.run()
    assert result.cot_ids == engine.cot and result.answer_ids == engine.answer
    metrics = result.metrics
    assert metrics.cot_passes + metrics.verify_passes > 10 and metrics.cot_steps == 0  # no plain step
    verify_feeds = [fed for fed in engine.fed if fed != len(tokens.cot_ids[-1:])]  # the CoT's close aside
    assert verify_feeds and set(verify_feeds) == {12}


def test_a_tree_peer_needs_an_engine_with_tree_attention(tmp_path):
    tokens = _tokens(tmp_path, count=1)[0]
    _, generation = _generation(tokens, ReplayEngine, FixedTree())
    with pytest.raises(ConfigError, match="tree attention"):
        generation.run()


# -- SGLang NGRAM -----------------------------------------------------------------------------

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
    assert proposer.candidates(100) == [("sglang-ngram", [0])]  # an empty trie: root + 11 pads
    proposer.observe([5])  # inserts [5, 6, 7, 8]'s suffixes
    proposer.observe([6])
    assert sorted(path for _, path in proposer.candidates(100)) == [[0], [7, 8, 5]]


def test_sglang_ngram_keeps_its_trie_across_requests():
    from ssr.bench.peers.sglang_ngram import SglangNgramProposer
    from ssr.history import ResponseHistory

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
    from ssr.history import ResponseHistory

    monkeypatch.setattr(mod, "MOD_N", 2)
    monkeypatch.setattr(mod, "MOD_MIN", 3)
    monkeypatch.setattr(mod, "MOD_MAX", 4)
    history = ResponseHistory()
    proposer = mod.NgramModProposer([1, 2, 3, 4, 5, 9, 9], history)
    assert proposer.candidates(10) == []  # the first token is sampled without a draft
    proposer.observe([1])
    assert proposer.candidates(10) == []  # [9, 1] was never seen: the first slot is empty
    proposer.observe([2])
    assert proposer.candidates(10) == [("llamacpp-ngram-mod", [3, 4, 5, 9])]  # [1, 2] -> 3, [2, 3] -> 4 ...
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
        assert cycle.candidates(10) == [("llamacpp-ngram-mod", [1, 2, 1, 2])] and cycle.pool.low == poor
        cycle.observe([7])
        assert cycle.candidates(10) == []  # [2, 7] unseen: no draft, the streak goes on
        cycle.observe([1])
        cycle.candidates(10)  # [7, 1] unseen
        cycle.observe([2])
    assert not cycle.pool.slots and cycle.indexed == 0 and cycle.pool.low == 0
    assert cycle.pool is proposer.pool  # one server, one pool
    assert mod.NgramModProposer([1, 2, 3]).pool is not proposer.pool


def test_every_peer_replays_the_trace_and_none_beats_the_oracle(tmp_path):
    """Each replay-only peer, cold and in deployment order, writes the trace's own tokens."""
    from ssr.bench.peers import REPLAY_PEERS
    from ssr.bench.trace_replay import replay_all

    rows = replay_all(_tokens(tmp_path, count=3), ["oracle", *REPLAY_PEERS], [GPU])
    assert rows and all(row["identical"] for row in rows)
    passes = {(r["order"], r["item"], r["mode"]): r["metrics"]["decode_steps"] + r["metrics"]["cot_passes"]
              + r["metrics"]["verify_passes"] for r in rows}
    for (order, item, mode), count in passes.items():
        assert count >= passes[(order, item, "oracle")], mode


def test_the_renamed_ngram_mode_says_its_new_names():
    with pytest.raises(ConfigError, match="ngram-v1.*vllm-ngram"):
        mode_config("ngram")
