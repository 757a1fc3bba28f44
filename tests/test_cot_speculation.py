"""CoT speculation: spans over prompt + CoT so far are verified while no draft child lives.
Greedy output stays token-identical to `ar` (banned tokens, budgets, stage forks, loops);
sampled output keeps `ar`'s distribution."""
from collections import Counter

import pytest

from ssr.config import GenerationConfig, SamplingParams
from ssr.loop import Generation
from ssr.engines.base import Capabilities
from ssr.engines.fake import FakeEngine
from ssr.formats.thinking import FORMATS
from test_decode_fake import contingency_p

FMT = FORMATS["code"]
PROMPTS = [[ord(c) for c in text] for text in ("Please complete the class Stack.", "abcabcabcabc abc")]
BANNED = [ord(c) for c in "`e"]


class OnePerPassEngine(FakeEngine):
    """The fake engine without score_batch: a child's step and a CoT span cannot share a pass."""

    capabilities = Capabilities()
    score_batch = None


def run(mode, prompt, order, shared=True, **overrides):
    options = dict(mode=mode, thinking_budget=120, draft_at=40, draft_tokens=20, max_answer_tokens=60, policy="fixed")
    options.update(overrides)
    engine = (FakeEngine if shared else OnePerPassEngine)(order=order)
    result = Generation(engine, FMT, GenerationConfig(**options), prompt, banned_ids=BANNED).run()
    assert engine.live_sequences() == 0
    return result


@pytest.mark.parametrize("mode", ["suffix", "pld", "ssr", "ssr-suffix"])
@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
@pytest.mark.parametrize("stages", [(40, 0), (0, 0), (30, 25), (119, 0)])
def test_cot_spans_keep_greedy_identity(mode, order, prompt, stages):
    draft_at, interval = stages
    expected = run("ar", PROMPTS[prompt], order, draft_at=draft_at, draft_interval=interval)
    got = run(mode, PROMPTS[prompt], order, draft_at=draft_at, draft_interval=interval, adaptive_spans=False)
    assert got.cot_ids == expected.cot_ids and got.answer_ids == expected.answer_ids
    assert got.metrics.cot_end == expected.metrics.cot_end
    assert not set(got.cot_ids) & set(BANNED)
    if mode in ("suffix", "pld") and order == 1:  # a first-order model repeats itself: spans are taken
        assert got.metrics.cot_passes > 0 and got.metrics.cot_accepted_tokens > 0
        assert got.metrics.decode_steps < expected.metrics.decode_steps
    if mode.startswith("ssr"):  # children fork where they fork without CoT spans
        plain = run("ssr-prefix", PROMPTS[prompt], order, draft_at=draft_at, draft_interval=interval)
        assert [stage["forked_at"] for stage in got.metrics.stages] == \
            [stage["forked_at"] for stage in plain.metrics.stages]
        # spans beside the child: the CoT ends in fewer passes, the child writes a step per pass
        assert got.draft_ids == plain.draft_ids[: len(got.draft_ids)]
        apart = run(mode, PROMPTS[prompt], order, shared=False, draft_at=draft_at, draft_interval=interval,
                    adaptive_spans=False)
        assert (apart.cot_ids, apart.answer_ids, apart.draft_ids) == (expected.cot_ids, expected.answer_ids,
                                                                     plain.draft_ids)
        assert apart.metrics.shared_passes == 0 and not apart.metrics.spans_beside_child


def test_cot_spans_go_on_beside_a_living_child():
    """One pass carries the parent's span and the child's step: the child writes exactly one
    token per CoT pass or step while it lives, and the output is plain decoding's."""
    expected = run("ar", PROMPTS[1], 1)
    got = run("ssr", PROMPTS[1], 1, draft_at=10, draft_tokens=30, adaptive_spans=False)
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
    stage = got.metrics.stages[0]
    assert got.metrics.spans_beside_child and got.metrics.shared_passes > 0
    assert stage["written"] == got.metrics.shared_passes + got.metrics.batched_steps
    apart = run("ssr", PROMPTS[1], 1, shared=False, draft_at=10, draft_tokens=30, adaptive_spans=False)
    assert apart.metrics.cot_passes < got.metrics.cot_passes  # none while the child lived


@pytest.mark.parametrize("budget", [1, 2, 7, 33])
def test_cot_spans_stop_exactly_at_the_budget(budget):
    expected = run("ar", PROMPTS[1], 1, thinking_budget=budget, draft_at=0)
    got = run("pld", PROMPTS[1], 1, thinking_budget=budget, draft_at=0)
    assert len(got.cot_ids) == len(expected.cot_ids) <= budget
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)


def test_forks_land_on_stage_budgets_with_spans():
    got = run("ssr", PROMPTS[1], 1, draft_at=10, draft_interval=30, draft_tokens=5, adaptive_spans=False)
    assert [stage["forked_at"] for stage in got.metrics.stages] == [10, 40, 70, 100]
    assert got.metrics.cot_passes > 0  # between the short-lived children


def cot_prefix_counts(mode, seeds, positions=3, shared=None):
    counts = Counter()
    for seed in seeds:
        config = GenerationConfig(mode=mode, thinking_budget=positions, max_answer_tokens=8, draft_tokens=8, policy="fixed",
                                  draft_at=0, sampling=SamplingParams(temperature=1.0, seed=seed))
        result = Generation(FakeEngine(order=1, drift=1.5), FMT, config, PROMPTS[1]).run()
        counts[tuple(result.cot_ids)] += 1
        if shared is not None:
            shared[0] += result.metrics.shared_passes
    return counts


@pytest.mark.parametrize("mode", ["pld", "ssr"])
def test_cot_spans_keep_the_sampling_distribution(mode):
    """ssr: a draft child forks at once, so its CoT spans are verified beside it, its step in
    the same pass (its sampled tokens draw from the same generator)."""
    shared = [0]
    ar = cot_prefix_counts("ar", range(0, 1500))
    got = cot_prefix_counts(mode, range(10000, 11500), shared=shared)
    assert contingency_p(ar, got) > 1e-3
    assert (shared[0] > 100) is (mode == "ssr")


def test_distribution_test_catches_a_biased_cot(monkeypatch):
    """The test above can fail: accepting every CoT span token changes the law."""
    from ssr.loop import verifier
    from ssr.verifying.verify import Verdict

    def accept_all(draft_ids, draft_probs, target, rng, approx=False):
        return Verdict(len(draft_ids), int(target[-1].argmax()), False)

    ar = cot_prefix_counts("ar", range(0, 1500))
    monkeypatch.setattr(verifier, "verify_sampled", accept_all)
    biased = cot_prefix_counts("pld", range(10000, 11500))
    assert contingency_p(ar, biased) < 1e-6
