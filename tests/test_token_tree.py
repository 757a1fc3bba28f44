"""Candidate spans as one token tree (tree.py) verified on one sequence in one pass (tree
attention): the trie against a brute-force one, the engines' tree passes against linear feeds,
and the loop on a tree engine token-identical to plain decoding, with no fork per candidate."""
import random

import numpy as np
import pytest

from ssr.bench.replay import RowModel, TreeReplayEngine
from ssr.bench.trace_replay import NO_DRAFT
from ssr.config import GenerationConfig, SamplingParams
from ssr.pricing.costs import CostModel, gpu_preset
from ssr.loop import Generation
from ssr.loop.speculation import Layout
from ssr.engines.base import EngineError, tree_passes
from ssr.engines.fake import FakeEngine, FakeTreeEngine
from ssr.pricing.span_policy import MAX_TREE_CANDIDATES
from ssr.formats.thinking import FORMATS
from ssr.verifying.tree import build_tree
from ssr.verifying.verify import verify_greedy, verify_tree_greedy

FMT = FORMATS["code"]
PROMPTS = [[ord(c) for c in text] for text in ("Please complete the class Stack.", "abcabcabcabc abc",
                                               "Write a queue in Python.")]


def _brute_nodes(pending, spans):
    """Every distinct prefix of [pending] + span, as tuples."""
    return {tuple([pending] + list(span[:k])) for span in spans for k in range(len(span) + 1)}



@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("as_logits", [False, True], ids=["ids", "logits"])
def test_tree_walk_verifies_each_candidate_as_verify_greedy_on_its_path(seed, as_logits):
    rng = random.Random(seed)
    spans = [[rng.randrange(3) for _ in range(rng.randrange(1, 6))] for _ in range(rng.randrange(1, 7))]
    tree = build_tree(7, spans)
    target = np.array([rng.randrange(3) for _ in tree.token_ids])  # [n] the token after each node
    if as_logits:  # [n, vocab]: the argmax is the target token
        target = np.eye(4)[target] + rng.random() * 0.5
    verdicts = verify_tree_greedy(tree.token_ids, tree.paths, target)
    assert verdicts == [verify_greedy(span, target[path]) for span, path in zip(spans, tree.paths)]


def test_tree_walk_refuses_rows_that_are_not_the_nodes():
    tree = build_tree(7, [[1, 2], [3]])
    with pytest.raises(ValueError, match="4 tree nodes"):
        verify_tree_greedy(tree.token_ids, tree.paths, np.zeros(3, dtype=int))

@pytest.mark.parametrize("seed", range(30))
def test_tree_is_the_trie_of_the_spans(seed):
    rng = random.Random(seed)
    spans = [[rng.randrange(3) for _ in range(rng.randrange(0, 6))] for _ in range(rng.randrange(1, 6))]
    tree = build_tree(7, spans)
    prefixes = []  # node -> its tokens from the root
    for token, parent in zip(tree.token_ids, tree.parents):
        assert parent < len(prefixes)  # a parent before its children
        prefixes.append((prefixes[parent] if parent >= 0 else ()) + (token,))
    assert len(set(prefixes)) == len(prefixes) and set(prefixes) == _brute_nodes(7, spans)
    for span, path in zip(spans, tree.paths):
        assert [tree.token_ids[node] for node in path] == [7] + span
        assert all(tree.parents[child] == parent for parent, child in zip(path, path[1:]))
    assert tree.depths == [len(prefix) - 1 for prefix in prefixes]
    for i, span in enumerate(spans):  # a span adds its tokens past the longest prefix an earlier one shares
        shared = max((len(p) for p in _brute_nodes(7, spans[:i]) & _brute_nodes(7, [span])), default=1) - 1
        assert len(build_tree(7, spans[: i + 1]).token_ids) - len(build_tree(7, spans[:i]).token_ids) == \
            len(span) - shared


TREES = [  # (name, pending, spans): shared prefixes, a span inside another, branches off an older path
    ("two spans share a prefix", 5, [[1, 2, 3], [1, 2, 4]]),
    ("a branch off an older path", 5, [[1, 2, 3], [4, 5], [1, 2, 6]]),
    ("a span inside another", 5, [[1, 2, 3, 4], [1, 2]]),
    ("an empty span", 5, [[], [9, 9]]),
]


@pytest.mark.parametrize("name,pending,spans", TREES, ids=[t[0] for t in TREES])
def test_fake_tree_pass_equals_linear_feeds(name, pending, spans):
    engine = FakeTreeEngine(order=3)
    seq = engine.prefill([10, 11, 12])
    tree = build_tree(pending, spans)
    rows = engine.score_tree(seq, tree.token_ids, tree.parents)  # [n, vocab]
    assert engine.length(seq) == 3  # the tree is not part of the sequence until a path is kept
    reference = FakeEngine(order=3)
    for span, path in zip(spans, tree.paths):
        ref = reference.prefill([10, 11, 12])
        np.testing.assert_array_equal(rows[path], reference.score(ref, [pending] + span))
        reference.release(ref)
    engine.keep_path(seq, tree.paths[-1])
    assert engine._tokens[seq] == [10, 11, 12, pending] + spans[-1]
    with pytest.raises(EngineError):
        engine.keep_path(seq, tree.paths[0])  # one kept path per tree pass


def test_replay_tree_pass_predicts_the_trace_and_prices_the_nodes():
    model = RowModel(prompt_ids=[1, 2], cot_ids=[3, 4, 5, 6], answer_ids=[7], forced_end_ids=[6],
                     answer_prefix_ids=[], draft_ids=[], draft_forked_at=None)
    costs = gpu_preset()
    engine = TreeReplayEngine(model, costs)
    seq = engine.prefill([1])
    tree = build_tree(2, [[3, 4, 9], [3, 8], [4]])
    before = engine.seconds
    ids = engine.score_tree(seq, tree.token_ids, tree.parents, ids=True)
    assert engine.seconds - before == pytest.approx(costs.score(len(tree.token_ids), 1))
    assert [list(ids[path]) for path in tree.paths] == [engine.cot[:4], engine.cot[:3], engine.cot[:2]]  # by position
    engine.keep_path(seq, tree.paths[0][:3])
    assert engine.length(seq) == 4 and engine.passes == 1


def run(mode, prompt, order=2, engine=None, plan=None, **overrides):
    options = dict(mode=mode, thinking_budget=120, draft_at=30, draft_tokens=40, max_answer_tokens=80, policy="fixed")
    options.update(overrides)
    engine = engine or FakeTreeEngine(order=order)
    generation = Generation(engine, FMT, GenerationConfig(**options), prompt, costs=CostModel(table=gpu_preset()),
                            plan=plan)
    result = generation.run()
    assert engine.live_sequences() == 0
    return generation, result, engine


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
@pytest.mark.parametrize("draft_at", [0, 30])
def test_tree_passes_keep_greedy_identity(order, prompt, draft_at):
    _, expected, _ = run("ar", PROMPTS[prompt], order, engine=FakeEngine(order=order), draft_at=draft_at)
    generation, got, engine = run("ssr", PROMPTS[prompt], order, draft_at=draft_at)
    assert tree_passes(engine) and generation.speculation.layout is Layout.TREE and generation.speculation.candidates == MAX_TREE_CANDIDATES
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
    assert got.metrics.stop == expected.metrics.stop and got.metrics.cot_end == expected.metrics.cot_end


def test_tree_passes_verify_several_candidates_without_forks():
    trees = passes = 0
    for order in (1, 2, 3):
        for prompt in PROMPTS:
            _, got, engine = run("ssr", prompt, order, plan=NO_DRAFT)
            trees += engine.calls["score_tree"]
            passes += got.metrics.branch_passes
            assert engine.calls["fork"] == 0  # no draft, and candidates need no fork on a tree
            candidates = [event["candidates"] for event in got.trace if "candidates" in event]
            assert all(2 <= count <= MAX_TREE_CANDIDATES for count in candidates)
    assert trees == passes > 0


@pytest.mark.parametrize("seed", range(3))
def test_sampling_on_tree_passes_runs_and_releases_everything(seed):
    generation, got, engine = run("ssr", PROMPTS[1], 1, sampling=SamplingParams(temperature=0.7, seed=seed))
    assert generation.speculation.layout is Layout.TREE and got.metrics.cot_tokens > 0


def _whole_or_nothing(rate, spans=20):
    from ssr.pricing.acceptance import AcceptanceStats

    stats = AcceptanceStats()
    for i in range(spans):
        stats.observe(8, 8 if int((i + 1) * rate) > int(i * rate) else 0)
    return stats


@pytest.mark.parametrize("tree,expected", [(True, ["a", "c"]), (False, ["a", "b", "c"])])
def test_a_tree_prices_a_span_by_where_it_parts_from_the_chosen_ones(tree, expected):
    """b shares a's first four tokens; a's spans are accepted whole or fail at once, so b only
    gains where a fails after four right tokens — seldom, and not worth its four nodes at 5% of
    a step each: a tree leaves it out; c starts another way and is kept either way. (Forks price
    every candidate by the chosen ones' first-token misses, as before trees.)"""
    from ssr.pricing.span_policy import SpanPolicy

    stats = {"a": _whole_or_nothing(0.5), "b": _whole_or_nothing(0.5), "c": _whole_or_nothing(0.5)}
    policy = SpanPolicy(CostModel(step_s=1.0, token_s=0.05), stats)
    candidates = [("a", [1] * 8), ("b", [1] * 4 + [2] * 4), ("c", [3] * 8)]
    assert [source for source, _ in policy.choose_many(candidates, 4, tree=tree)] == expected


@pytest.mark.parametrize("probs,worth,token_s,expected", [
    ([0.9, 0.5, 0.2, 0.05], 0.5, 0.05, 3),  # 0.45, 0.25, 0.10 pay for 0.05 a node; 0.025 does not
    ([0.9, 0.5, 0.2, 0.05], 0.5, 0.0, 4),  # nodes that cost nothing all pay
    ([0.9, 0.5, 0.2, 0.05], 0.05, 0.05, 0),  # where the chosen ones seldom miss, none does
    ([0.9, 0.5, 0.2, 0.05], 0.5, 0.2, 2),  # dearer nodes: fewer
    ([], 0.5, 0.05, 0),
])
def test_a_candidate_beside_the_chosen_ones_keeps_the_nodes_that_pay(probs, worth, token_s, expected):
    from ssr.pricing.span_policy import SpanPolicy

    policy = SpanPolicy(CostModel(step_s=1.0, token_s=token_s))
    assert policy._paying(probs, 0, len(probs), worth, policy.costs.costs(8), fed=3) == expected
    curve = [1.0, 1.0] + probs + [0.9]  # its nodes past a shared prefix of 2, in a longer curve
    assert policy._paying(curve, 2, 2 + len(probs), worth, policy.costs.costs(8), fed=3) == expected
    assert policy._paying(probs, 0, len(probs), worth, policy.costs.costs(4), fed=3) == expected  # past the list


def _halving():
    """A source each of whose tokens is right half the time after the ones before (0.5, 0.25, ...)."""
    from ssr.pricing.acceptance import AcceptanceStats

    halving = AcceptanceStats(prior_weight=1e-9, decay=1.0)
    for accepted in range(9):
        for _ in range(2 ** (8 - accepted) if accepted < 8 else 2):
            halving.observe(8, accepted)
    return halving


@pytest.mark.parametrize("token_s,kept", [(0.0, 8), (0.01, 2), (0.04, 0)])
def test_a_tree_cuts_a_candidate_beside_the_chosen_one_where_its_nodes_stop_paying(token_s, kept):
    """a's first token is right 94% of the time; c parts from it at once and each of its tokens is
    right half the time after the ones before (0.5, 0.25, 0.125, ...), worth that x a's 6.4% miss
    a step (0.032, 0.016, 0.008, ...): at 1% of a step a node, c keeps two tokens; at 4%, none."""
    from ssr.pricing.span_policy import SpanPolicy

    policy = SpanPolicy(CostModel(step_s=1.0, token_s=token_s), {"a": _whole_or_nothing(0.9), "c": _halving()})
    chosen = policy.choose_many([("a", [1] * 8), ("c", [3] * 8)], 4, tree=True)
    assert [(source, len(span)) for source, span in chosen] == [("a", 8)] + ([("c", kept)] if kept else [])


@pytest.mark.parametrize("beside", [[], [("b", [2] * 8)]])
def test_a_chosen_one_that_starts_another_way_takes_nothing_off_a_candidate(beside):
    """a (the first choice) and b start with different tokens, each right half the time; c starts
    a third way. Where c is right a and b are both wrong, so b, chosen beside a, takes nothing off
    c's worth: at 0.6% of a step a node c keeps the six nodes it keeps beside a alone (priced by
    a's miss only). Priced by the chance that a and b both miss, it kept four."""
    from ssr.pricing.span_policy import SpanPolicy

    stats = {"a": _whole_or_nothing(0.5), "b": _whole_or_nothing(0.5), "c": _halving()}
    policy = SpanPolicy(CostModel(step_s=1.0, token_s=0.006), stats)
    chosen = policy.choose_many([("a", [1] * 8)] + beside + [("c", [3] * 8)], 4, tree=True)
    assert [(source, len(span)) for source, span in chosen] == [("a", 8)] + [(b, 8) for b, _ in beside] + [("c", 6)]


@pytest.mark.parametrize("engine, layout", [(FakeTreeEngine(order=2), Layout.TREE),
                                            (FakeEngine(order=2, max_sequences=1), Layout.CHAIN)])
def test_the_recency_trie_offers_its_paths_to_token_trees_not_to_one_chain(engine, layout):
    """One chain a pass picks one candidate: the trie's many paths lost more picks than they won
    there (docs/traces.md, "Several candidates"), so only a token tree verifies them."""
    generation, _, _ = run("ssr", PROMPTS[1], engine=engine, plan=NO_DRAFT)
    assert generation.speculation.layout is layout and generation.speculation.trie == (layout is Layout.TREE)
    sources = {event["source"].split("/")[0] for event in generation.result.trace if "source" in event}
    assert ("trie" in sources) == (layout is Layout.TREE) and "suffix" in sources
