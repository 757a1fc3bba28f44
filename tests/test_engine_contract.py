"""The engine protocol, one suite for every engine.

Beyond shapes and bookkeeping, the suite demands batch invariance: a sequence's
logits are bit-identical whether it steps alone, steps batched with a forked
child, or has k tokens scored in one pass, also past 512 cached tokens. Greedy
SSR is token-identical to plain decoding because of this. The transformers
engine runs the same suite on the same GGUF weights (dequantized to float32).
"""
import numpy as np
import pytest

from ssr.engines import EngineError, load_engine
from ssr.engines.base import shares_passes, tree_passes
from ssr.engines.fake import FakeTreeEngine
from ssr.verifying.tree import build_tree

TEXT = "def area(radius):\n    return 3.14159 * radius ** 2\n# compute the area of circles, then print\n" * 60

ENGINES = [
    pytest.param(("fake", {}), id="fake"),
    pytest.param(("fake-tree", {}), id="fake-tree"),
    pytest.param(("llama.cpp", {"model": "smollm2-135m"}), id="llama.cpp-smollm2", marks=pytest.mark.model),
    pytest.param(("llama.cpp", {"model": "qwen2.5-coder-0.5b"}), id="llama.cpp-qwen",
                 marks=[pytest.mark.slow, pytest.mark.model]),
    pytest.param(("transformers", {"model": "smollm2-135m"}), id="transformers-smollm2", marks=pytest.mark.model),
    pytest.param(("transformers", {"model": "qwen2.5-coder-0.5b"}), id="transformers-qwen",
                 marks=[pytest.mark.slow, pytest.mark.model]),
]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request):
    kind, options = request.param
    if kind == "fake":
        return load_engine("", "fake")
    if kind == "fake-tree":  # the fake model with tree attention (score_tree, keep_path)
        return FakeTreeEngine()
    if kind == "transformers":
        pytest.importorskip("transformers", reason="the transformers engine needs  pip install -e '.[torch]'")
    return load_engine(options["model"], kind, context_size=2048)


def tokens(engine, start, count):
    ids = engine.tokenize(TEXT)
    assert len(ids) >= start + count
    return ids[start : start + count]


def solo_steps(engine, prompt, fed):
    seq = engine.prefill(prompt)
    rows = np.stack([engine.step([(seq, t)])[0] for t in fed])  # [len(fed), vocab]
    engine.release(seq)
    return rows


def test_shapes_and_lengths(engine):
    prompt = tokens(engine, 0, 20)
    seq = engine.prefill(prompt)
    assert engine.length(seq) == 20
    rows = engine.step([(seq, prompt[0])])
    assert rows.shape == (1, engine.vocab_size)
    rows = engine.score(seq, prompt[:7])
    assert rows.shape == (7, engine.vocab_size) and engine.length(seq) == 28
    engine.truncate(seq, 10)
    assert engine.length(seq) == 10
    engine.release(seq)


def test_fork_shares_prefix_without_recompute(engine):
    prompt, fed = tokens(engine, 0, 30), tokens(engine, 30, 3)
    parent = engine.prefill(prompt)
    child = engine.fork(parent)
    assert engine.length(child) == 30
    rows = engine.step([(parent, fed[0]), (child, fed[0])])  # [2, vocab]
    assert np.array_equal(rows[0], rows[1])
    engine.release(child)
    engine.release(parent)


def test_batched_score_and_truncate_are_bit_identical_to_solo_steps(engine):
    """Past 512 cached tokens too, where llama.cpp's kernels would otherwise switch."""
    prompt, fed = tokens(engine, 0, 480), tokens(engine, 480, 90)
    expected = solo_steps(engine, prompt, fed)  # [90, vocab]
    seq = engine.prefill(prompt)
    got = [engine.step([(seq, t)])[0] for t in fed[:10]]
    child = engine.fork(seq)
    for t in fed[10:50]:
        got.append(engine.step([(seq, t), (child, 7)])[0])  # the child rides along
    engine.release(child)
    got.extend(engine.score(seq, fed[50:80]))  # one pass of 30 tokens
    length = engine.length(seq)
    engine.score(seq, fed[:12])  # rejected speculation ...
    engine.truncate(seq, length)  # ... rolled back
    got.extend(engine.step([(seq, t)])[0] for t in fed[80:])
    engine.release(seq)
    got = np.stack(got)
    differing = np.nonzero(np.abs(got - expected).max(axis=1))[0]
    assert differing.size == 0, f"rows {differing[:10].tolist()} differ, max {np.abs(got - expected).max():.3g}"


def test_shared_pass_is_bit_identical_to_separate_passes(engine):
    """score_batch: a parent's k-token pass and a child's step in one forward pass give the
    logits they give apart (the loop verifies CoT spans beside a living child this way)."""
    if not shares_passes(engine):
        pytest.skip("the engine feeds one sequence per pass")
    prompt, fed = tokens(engine, 0, 520), tokens(engine, 520, 40)
    expected = solo_steps(engine, prompt, fed)  # [40, vocab]
    seq = engine.prefill(prompt)
    child = engine.fork(seq)
    engine.score(child, fed[:5])
    child_alone = engine.score(child, fed[5:6])  # [1, vocab]
    engine.truncate(child, 525)
    parent_rows, child_rows = engine.score_batch([(seq, fed[:24]), (child, fed[5:6])])
    assert parent_rows.shape == (24, engine.vocab_size) and child_rows.shape == (1, engine.vocab_size)
    assert engine.length(seq) == 544 and engine.length(child) == 526
    steps = engine.score_batch([(seq, fed[24:25]), (child, fed[6:7])])[0]  # one token each, as a step
    rest = engine.score_batch([(seq, fed[25:]), (child, fed[7:8])])[0]
    engine.release(child)
    engine.release(seq)
    got = np.concatenate([parent_rows, steps, rest])
    differing = np.nonzero(np.abs(got - expected).max(axis=1))[0]
    assert differing.size == 0, f"rows {differing[:10].tolist()} differ, max {np.abs(got - expected).max():.3g}"
    assert np.array_equal(child_rows, child_alone)


def test_tree_pass_is_bit_identical_to_linear_feeds(engine):
    """score_tree: several candidate spans as one token tree on one sequence give each span the
    logits a linear feed gives it; keep_path leaves the sequence as if the kept path had been
    fed (the steps after it match solo steps)."""
    if not tree_passes(engine):
        pytest.skip("the engine has no tree attention")
    prompt, fed = tokens(engine, 0, 500), tokens(engine, 500, 30)
    expected = solo_steps(engine, prompt, fed)  # [30, vocab]
    spans = [fed[1:20], fed[1:5] + [7, 8, 9], [7] + fed[2:6]]  # the right path, a late branch, a wrong start
    seq = engine.prefill(prompt)
    tree = build_tree(fed[0], spans)
    rows = engine.score_tree(seq, tree.token_ids, tree.parents)  # [nodes, vocab]
    assert rows.shape == (len(tree.token_ids), engine.vocab_size) and engine.length(seq) == 500
    for span, path in zip(spans[1:], tree.paths[1:]):
        alone = engine.prefill(prompt)
        linear = engine.score(alone, [fed[0]] + span)
        engine.release(alone)
        assert np.array_equal(rows[path], linear)
    engine.keep_path(seq, tree.paths[0][:12])
    assert engine.length(seq) == 512
    got = np.concatenate([rows[tree.paths[0]], np.stack([engine.step([(seq, t)])[0] for t in fed[12:]])])
    engine.release(seq)
    want = np.concatenate([expected[:20], expected[12:]])
    differing = np.nonzero(np.abs(got - want).max(axis=1))[0]
    assert differing.size == 0, f"rows {differing[:10].tolist()} differ, max {np.abs(got - want).max():.3g}"


def test_kept_prefix_is_bit_identical_to_a_cold_prefill(engine):
    """Engines that keep the last request's KV (engines/prefix.py): a prefill that extends it
    feeds only the new tokens, and what follows is bit for bit what a cold prefill gives."""
    keeper = getattr(engine, "prefix", None)
    if keeper is None:
        pytest.skip("this engine keeps no prefix")
    turn1, turn2, fed = tokens(engine, 0, 300), tokens(engine, 0, 340), tokens(engine, 340, 12)
    for seq in [engine.allocate() for _ in range(engine.max_sequences)]:  # the last takes the kept one's handle
        engine.release(seq)  # empty: not kept
    assert keeper.kept is None
    seq = engine.prefill(turn1)
    assert keeper.reused == 0
    engine.score(seq, tokens(engine, 300, 5) + [7, 7])  # turn one's answer parts from turn two's prompt
    engine.release(seq)
    seq = engine.prefill(turn2)
    assert keeper.reused == 305 and engine.length(seq) == 340
    kept = np.stack([engine.step([(seq, t)])[0] for t in fed])
    engine.release(seq)
    saved, engine.prefix = engine.prefix, None
    try:
        cold = solo_steps(engine, turn2, fed)
    finally:
        engine.prefix = saved
    assert np.array_equal(kept, cold), f"max difference {np.abs(kept - cold).max():.3g}"
    assert engine.live_sequences() == 0


def test_release_frees_sequences(engine):
    prompt = tokens(engine, 0, 8)
    seqs = [engine.prefill(prompt) for _ in range(engine.max_sequences)]
    with pytest.raises(EngineError):
        engine.prefill(prompt)
    for seq in seqs:
        engine.release(seq)
    engine.release(engine.prefill(prompt))  # a slot is free again
    assert engine.live_sequences() == 0


def test_token_bytes_round_trip(engine):
    text = "def f(x):\n    return x"
    assert b"".join(engine.token_bytes(t) for t in engine.tokenize(text)).decode() == text


def test_greedy_ids_are_the_argmax_of_the_rows(engine):
    """Engines that pick the argmax where the logits live return ids [k] equal to the rows' argmax
    (lowest id on ties), banned ids never chosen; the same for steps, scores and shared passes."""
    if not engine.capabilities.returns_ids:
        pytest.skip("this engine returns rows only")
    prompt, fed = tokens(engine, 0, 12), tokens(engine, 12, 256)
    seq = engine.prefill(prompt)
    rows = engine.score(seq, fed)
    engine.truncate(seq, len(prompt))
    ids = engine.score(seq, fed, ids=True)  # a 256-token span: ids, not rows
    assert ids.shape == (256,) and np.array_equal(ids, np.argmax(rows, axis=1))
    banned = np.unique(ids[:5])
    engine.truncate(seq, len(prompt))
    masked = engine.score(seq, fed[:5], ids=True, banned=banned)
    expected = rows[:5].copy()
    expected[:, banned] = -np.inf
    assert np.array_equal(masked, np.argmax(expected, axis=1)) and not np.isin(masked, banned).any()
    engine.truncate(seq, len(prompt))
    child = engine.fork(seq)
    step = engine.step([(seq, fed[0]), (child, fed[0])], ids=True)
    assert np.array_equal(step, [ids[0], ids[0]])
    if shares_passes(engine):
        engine.truncate(seq, len(prompt))
        engine.truncate(child, len(prompt))
        both = engine.score_batch([(seq, fed[:4]), (child, fed[:2])], ids=True)
        assert np.array_equal(both[0], ids[:4]) and np.array_equal(both[1], ids[:2])
    engine.release(child)
    engine.release(seq)


def _engine_classes():
    from ssr.bench.replay import ReplayEngine, TreeReplayEngine
    from ssr.engines.fake import FakeEngine, FakeRequestsEngine
    from ssr.engines.hf import TransformersEngine
    from ssr.engines.llamacpp import LlamaCppEngine
    from ssr.engines.vllm import VllmEngine

    return [FakeEngine, FakeTreeEngine, FakeRequestsEngine, ReplayEngine, TreeReplayEngine, LlamaCppEngine,
            TransformersEngine, VllmEngine]


@pytest.mark.parametrize("cls", _engine_classes(), ids=lambda cls: cls.__name__)
def test_declared_capabilities_match_the_methods(cls):
    """An engine declares what it can do (engines.base.Capabilities) and the loop reads only the
    declaration: each flag must agree with the optional protocol the class implements."""
    import inspect

    caps, has = cls.capabilities, lambda name: callable(getattr(cls, name, None))
    declares = lambda name: any(name in vars(c).get("__annotations__", {}) for c in cls.__mro__)  # noqa: E731
    assert caps.shares_passes == has("score_batch")
    assert caps.tree_attention == (has("score_tree") and has("keep_path"))
    assert caps.modelled_clock == has("clock")
    assert caps.keeps_prefix == declares("prefix")  # KeepsPrefix: SequenceSlots, the replay's KeptKV
    assert caps.requests == has("open")
    # a prefill that frees the host: a prefill to run beside; on a modelled clock, told what ran beside it
    assert not caps.prefill_frees_host or (has("prefill") and (has("beside_prefill") or not caps.modelled_clock))
    assert caps.returns_ids == (has("step") and "ids" in inspect.signature(cls.step).parameters)
    assert has("live_sequences")
