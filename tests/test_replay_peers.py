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
from ssr.pricing.costs import CostModel
from ssr.loop import Generation
from ssr.proposing.source import Source
from ssr.proposing.proposers import Shape
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

    source = Source("fixed")
    shape = Shape(tree=True, width=12, pad=0)
    implementation = None

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


def test_the_mode_table_names_every_replay_peer():
    """config.MODE_TABLE holds every mode `ssr traces` replays; the replay-only peers there are the
    proposers bench/peers builds, and each replays in a loop the engines run."""
    from ssr.bench.peers import REPLAY_PEERS
    from ssr.bench.oracle import ORACLES
    from ssr.config import MODE_TABLE, MODES, TRACE_MODES

    own = {name for name in TRACE_MODES if MODE_TABLE[name].own_proposer}
    assert own == set(REPLAY_PEERS) | set(ORACLES)
    assert all(MODE_TABLE[name].replays_as in MODES for name in TRACE_MODES if name not in MODES)
    assert mode_config("paper").cot_spans is False and mode_config("ngram-v1").mode == "ngram"
