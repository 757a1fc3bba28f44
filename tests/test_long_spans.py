"""Suffix spans past the match length where a verify pass over dozens of tokens costs about one
step (GPUs): decided from the engine's cost curve, never on a CPU-like one, and lossless."""
import pytest

from ssr.config import GenerationConfig
from ssr.pricing.costs import CostTable, gpu_preset
from ssr.loop import Generation
from ssr.engines.fake import FakeEngine
from ssr.pricing.costs import CostModel
from ssr.pricing.span_policy import span_extension
from ssr.proposing.proposers import request_proposer
from ssr.formats.thinking import FORMATS

FMT = FORMATS["code"]
PROMPTS = [[ord(c) for c in text] for text in ("Please complete the class Stack.", "abcabcabcabc abc")]
# llama.cpp on 2 cores: a scored token costs about half a step
CPU = CostTable(step_s={1: 0.04, 2: 0.07}, score_s={8: 0.16, 32: 0.6, 128: 2.3}, prefill_token_s=0.015)


def generation(mode, prompt, order, costs, **overrides):
    options = dict(mode=mode, thinking_budget=120, draft_at=40, draft_tokens=20, max_answer_tokens=60, policy="fixed")
    options.update(overrides)
    return Generation(FakeEngine(order=order), FMT, GenerationConfig(**options), prompt,
                      costs=CostModel(table=costs))


@pytest.mark.parametrize("costs, extended", [(gpu_preset(), True), (CPU, False)])
def test_spans_go_past_the_match_length_only_where_verifying_them_is_cheap(costs, extended):
    config = GenerationConfig(mode="ssr")
    suffix = request_proposer(config, span_extension(CostModel(table=costs), config.suffix.max_span),
                              PROMPTS[0], None).proposers["suffix"]
    assert (suffix.extend_prob is not None) == extended
    ran = generation("ssr", PROMPTS[0], 1, costs).run()
    assert ran.metrics.engine["suffix_spans"] == ("past the match" if extended else "match length")


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_long_spans_keep_greedy_identity(order, prompt):
    expected = generation("ar", PROMPTS[prompt], order, gpu_preset()).run()
    got = generation("ssr", PROMPTS[prompt], order, gpu_preset()).run()
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
    assert got.metrics.stop == expected.metrics.stop


def test_long_spans_are_longer_than_the_match_allows():
    """A first-order model repeats itself: with GPU costs spans run on past eight tokens (a pass of
    a dozen costs 1.03 steps), with a cut to the match length (the CPU's proposer) they stay at most
    the match length."""
    def longest_span(costs):
        result = generation("ssr", PROMPTS[1], 1, costs, policy="fixed", draft_at=119).run()
        return max(event["proposed"] for event in result.trace if event["kind"] in ("span", "cot_span"))

    assert longest_span(gpu_preset()) > 8 >= longest_span(CPU)
