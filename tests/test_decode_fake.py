"""The decoding loop on the deterministic fake engine: identity, cleanup, budgets."""
import time
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from ssr.config import GenerationConfig, SamplingParams, SuffixParams
from ssr.pricing.costs import CostModel, gpu_preset
from ssr.loop import Generation
from ssr.engines.fake import FakeEngine, FakeTreeEngine
from ssr.formats.thinking import FORMATS

FMT = FORMATS["code"]
PROMPT = [ord(c) for c in "Please complete the class Stack."]


def run(mode, engine=None, **overrides):
    engine = engine or FakeEngine()
    options = dict(mode=mode, thinking_budget=40, draft_at=15, draft_tokens=30, max_answer_tokens=60, policy="fixed")
    options.update(overrides)
    return Generation(engine, FMT, GenerationConfig(**options), PROMPT).run(), engine


@pytest.mark.parametrize("mode", ["ssr", "ssr-prefix", "ssr-suffix", "suffix", "pld"])
@pytest.mark.parametrize("draft_at", [0, 7, 39])
def test_greedy_identity_on_fake(mode, draft_at):
    expected, _ = run("ar", draft_at=draft_at)
    got, engine = run(mode, draft_at=draft_at)
    assert got.cot_ids == expected.cot_ids
    assert got.answer_ids == expected.answer_ids
    assert got.answer == expected.answer
    assert engine.live_sequences() == 0  # parent and children released


def test_ssr_accepts_draft_and_saves_steps():
    ar, _ = run("ar", draft_at=30)
    ssr, _ = run("ssr", draft_at=30)
    m = ssr.metrics
    # the child writes one token at the fork and one per batched step until the CoT ends
    assert m.draft_tokens == 1 + (40 - 30) and m.verify_passes >= 1
    assert m.accepted_prefix_tokens + m.answer_accepted_tokens > 0
    assert m.batched_steps == 40 - 30  # the child rode along until the CoT ended
    assert ssr.metrics.decode_steps < ar.metrics.decode_steps


def test_stage_metrics_are_consistent():
    result, _ = run("ssr")
    m = result.metrics
    assert m.cot_tokens == len(result.cot_ids) == 40 and m.cot_end == "budget"
    assert m.answer_tokens == len(result.answer_ids)
    assert 0 < m.first_answer_token_s <= m.total_s
    staged = sum(v for k, v in m.seconds.items() if k != "draft")
    assert staged == pytest.approx(m.total_s, rel=0.2, abs=0.01)
    assert result.answer.startswith("```python")


class SlowEngine(FakeEngine):
    """A fake engine whose every forward pass takes 3 ms of wall time."""

    def step(self, *args, **kwargs):
        time.sleep(0.003)
        return super().step(*args, **kwargs)

    def score(self, *args, **kwargs):
        time.sleep(0.003)
        return super().score(*args, **kwargs)


@pytest.mark.parametrize("mode", ["ar", "ssr", "suffix"])
def test_host_time_is_the_wall_time_outside_the_engine_and_the_reader(mode):
    """metrics.host_s: the request's wall time less the engine's calls and the reader's pauses;
    engine_passes counts every step and score pass."""
    engine = SlowEngine()
    config = GenerationConfig(mode=mode, thinking_budget=40, draft_at=15, draft_tokens=30, max_answer_tokens=60,
                              policy="fixed")
    generation = Generation(engine, FMT, config, PROMPT)
    start = time.perf_counter()
    for _ in generation:
        time.sleep(0.002)  # the reader's own work: not the loop's
    wall = time.perf_counter() - start
    m = generation.result.metrics
    # steps, span passes, the draft's verify pass (the close's score pass without one), a
    # child's first pass (its forced tokens); chunked verification may add a pass or two
    passes = m.decode_steps + m.cot_passes + m.verify_passes + len(m.stages)
    assert passes <= m.engine_passes <= passes + 3
    assert 0 < m.host_s < wall - 0.003 * m.engine_passes - 0.002 * m.answer_tokens * 0.5
    assert m.host_ms_per_pass == pytest.approx(1e3 * m.host_s / m.engine_passes)


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 17])
@pytest.mark.parametrize("mode", ["ar", "ssr"])
def test_max_tokens_is_exact(max_tokens, mode):
    result, _ = run(mode, max_answer_tokens=max_tokens, draft_tokens=30)
    assert len(result.answer_ids) == max_tokens
    assert result.metrics.stop == "max_tokens"


def test_eos_inside_draft_ends_answer_exactly():
    engine = FakeEngine(eos_bias=6.5)  # EOS likely within a few answer tokens
    expected, _ = run("ar", engine=FakeEngine(eos_bias=6.5))
    got, _ = run("ssr", engine=engine)
    assert expected.metrics.stop == "eos"
    assert got.answer_ids == expected.answer_ids and got.metrics.stop == "eos"
    assert 0 not in got.answer_ids


def test_zero_thinking_budget():
    expected, _ = run("ar", thinking_budget=0, draft_at=0)
    got, _ = run("suffix", thinking_budget=0, draft_at=0)
    assert expected.cot_ids == [] and expected.metrics.cot_end == "budget"
    assert got.answer_ids == expected.answer_ids


def test_natural_end_marker_stops_thinking():
    engine = FakeEngine()
    forced = [ord(c) for c in "plan</think>"]  # the model "writes" the marker itself

    class Scripted(FakeEngine):
        def _logits(self, tokens):
            logits = super()._logits(tokens)
            written = len(tokens) - len(PROMPT) + 1  # CoT tokens fed so far, plus the next
            if 0 < written <= len(forced):
                logits[forced[written - 1]] = 100.0
            return logits

    result, _ = run("ssr", engine=Scripted(), draft_at=3)
    assert result.metrics.cot_end == "natural"
    assert result.cot_ids == forced and result.reasoning == FMT.steer + "plan"
    expected, _ = run("ar", engine=Scripted(), draft_at=3)
    assert result.answer_ids == expected.answer_ids
    del engine


def answer_prefix_counts(mode, verify, seeds, positions=2, drift=1.5, engine=FakeEngine):
    counts = Counter()
    for seed in seeds:
        config = GenerationConfig(
            mode=mode, thinking_budget=6, draft_at=2, draft_tokens=4, max_answer_tokens=positions, policy="fixed",
            sampling=SamplingParams(temperature=1.0, seed=seed), verify=verify,
            suffix=SuffixParams(max_depth=8, max_span=4),
        )
        counts[tuple(Generation(engine(order=2, drift=drift), FMT, config, PROMPT).run().answer_ids)] += 1
    return counts


def contingency_p(a, b):
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    head, rest = keys[:12], keys[12:]
    table = [[a[k] for k in head] + [sum(a[k] for k in rest)],
             [b[k] for k in head] + [sum(b[k] for k in rest)]]
    table = np.array(table)
    table = table[:, table.sum(axis=0) > 0]
    return chi2_contingency(table).pvalue


def test_sampling_distribution_matches_plain_decoding():
    """Same answer distribution as `ar` at temperature 1 (two-sample chi-square)."""
    ar = answer_prefix_counts("ar", "exact", range(0, 1500))
    ssr = answer_prefix_counts("ssr", "exact", range(10000, 11500))
    assert contingency_p(ar, ssr) > 1e-3


def output_prefix_counts(mode, seeds, engine, positions=3):
    """Counts of the output's first CoT tokens, GPU-like costs (several candidates a pass)."""
    counts = Counter()
    for seed in seeds:
        config = GenerationConfig(mode=mode, thinking_budget=8, draft_at=7, draft_tokens=4, max_answer_tokens=2,
                                  policy="fixed", sampling=SamplingParams(temperature=1.0, seed=seed),
                                  suffix=SuffixParams(max_depth=8, max_span=4))
        result = Generation(engine(order=2, drift=1.5), FMT, config, PROMPT, costs=CostModel(table=gpu_preset())).run()
        counts[tuple(result.cot_ids[:positions])] += 1
    return counts


def test_sampling_distribution_on_a_tree_engine_matches_plain_decoding():
    """The same where several candidates a pass are verified as one token tree (an engine with
    tree attention; verify.verify_tree_sampled), over the CoT's first tokens; the trees ran."""
    engines = []

    def tree_engine(**options):
        engines.append(FakeTreeEngine(**options))
        return engines[-1]

    ssr = output_prefix_counts("ssr", range(20000, 21500), tree_engine)
    assert sum(engine.calls["score_tree"] for engine in engines) > 1000
    assert contingency_p(output_prefix_counts("ar", range(0, 1500), FakeEngine), ssr) > 1e-3
