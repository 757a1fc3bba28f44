"""One chain a pass: the candidates the span policy leaves out are judged against the tokens the
pass committed, and their sources learn from it (SpanPolicy `one_chain`)."""
import pytest

from ssr.pricing.costs import CostModel
from ssr.pricing.acceptance import AcceptanceStats
from ssr.pricing.span_policy import JUDGED_DECAY, SpanPolicy, judge, left_out
from ssr.proposing.source import Source

A, B, C = Source.of("lookup", 3), Source.of("frequent"), Source.of("recent", 2)
GPU_LIKE = CostModel(step_s=0.020, token_s=0.0002)  # a pass of k tokens ~ one step

JUDGE = [  # (span, committed, (tokens judged, of them right))
    ("right through what was committed, longer: judged as far as it goes", [5, 6, 7, 8], [5, 6, 7], (3, 3)),
    ("wrong at once", [9, 6], [5, 6, 7], (2, 0)),
    ("shorter than what was committed, all right", [5, 6], [5, 6, 7], (2, 2)),
    ("right twice, then wrong", [5, 6, 0, 8, 9], [5, 6, 7, 8, 9], (5, 2)),
    ("one token committed (a plain bonus), the span's first right", [5, 1, 2], [5], (1, 1)),
    ("one token committed, the span's first wrong", [4, 1, 2], [5], (1, 0)),
]


@pytest.mark.parametrize("name,span,committed,expected", JUDGE, ids=[case[0] for case in JUDGE])
def test_a_left_out_candidate_is_judged_as_far_as_the_committed_tokens_go(name, span, committed, expected):
    assert judge([(A, span)], committed) == [(A,) + expected]


def test_a_judged_span_teaches_its_source_what_a_verified_one_would():
    """A span judged (k judged, r right) is observed as a verified span of k tokens with r
    accepted: a failure at r where r < k, none where it is right as far as it is judged."""
    for span, committed in [(s, c) for _, s, c, _ in JUDGE]:
        judged, verified = SpanPolicy(GPU_LIKE, one_chain=True), SpanPolicy(GPU_LIKE, one_chain=True)
        [(_, num, right)] = judge([(A, span)], committed)
        judged.observe_judged([(A, num, right)])
        verified.observe(num, right, source=A)
        assert judged.stats[A].at_risk == verified.stats[A].at_risk
        assert judged.stats[A].failed == verified.stats[A].failed


def test_left_out_keeps_what_the_policy_did_not_choose():
    found = [(A, [1, 2, 3, 4]), (B, [1, 2, 3, 4]), (C, [7, 8]), (A, [5, 6])]
    chosen = [(A, [1, 2])]  # A's first span, cut to 2
    assert left_out(found, chosen) == ((B, [1, 2, 3, 4]), (C, [7, 8]), (A, [5, 6]))
    assert left_out(found, []) == tuple(found)
    assert left_out(found, found) == ()


def test_only_a_judging_policy_learns_from_judged_spans_and_it_remembers_longer():
    quiet, judging = SpanPolicy(GPU_LIKE), SpanPolicy(GPU_LIKE, one_chain=True)
    for policy in (quiet, judging):
        policy.observe_judged([(B, 4, 4)])
    assert B not in quiet.stats and judging.stats[B].at_risk == [1.0] * 4
    assert quiet.stats[A].decay == AcceptanceStats.decay and judging.stats[A].decay == JUDGED_DECAY
    assert JUDGED_DECAY > AcceptanceStats.decay  # it learns from every candidate: each span weighs less
    carried = SpanPolicy(GPU_LIKE, dict(quiet.stats), one_chain=True)  # an earlier request's record, carried
    assert carried.stats[A].decay == JUDGED_DECAY


def test_a_source_never_picked_is_picked_once_judged_right():
    """One chain a pass: A (3 tokens matched) is picked and its spans are right at the first
    token half the time; B (the context's commonest token, a prior of 0.05) is never picked, so
    verified alone it never shows it is right every time. Judged, it is picked within passes."""
    candidates = [(A, [1, 2, 3, 4]), (B, [5, 6, 7, 8])]
    picks = {}
    for judges in (False, True):
        policy = SpanPolicy(GPU_LIKE, one_chain=judges)
        for turn in range(12):
            source, span = policy.choose(candidates)
            policy.observe(len(span), 0 if turn % 2 else len(span), source=source)
            policy.observe_judged(judge(left_out(candidates, [(source, span)]), [5, 6, 7, 8, 9]))
        picks[judges] = policy.choose(candidates)[0]
    assert picks == {False: A, True: B}


@pytest.mark.parametrize("prompt", ["Please complete the class Stack.", "abcabcabcabc abc"])
def test_a_chain_judges_and_its_output_is_still_plain_decodings(prompt, monkeypatch):
    """In one chain a pass (an engine of one sequence, verification about a step) the candidates
    the policy left out are judged every pass, some of them right; the output is token for token
    plain decoding's."""
    from ssr.bench.trace_replay import NO_DRAFT
    from ssr.config import GenerationConfig
    from ssr.engines.fake import FakeEngine
    from ssr.formats.thinking import FORMATS
    from ssr.loop import Generation
    from ssr.loop.speculation import Layout
    from ssr.pricing.costs import gpu_preset

    judged = []
    observe = SpanPolicy.observe_judged
    monkeypatch.setattr(SpanPolicy, "observe_judged", lambda self, each: (judged.extend(each), observe(self, each)))
    results = {}
    for mode in ("ar", "ssr"):
        config = GenerationConfig(mode=mode, thinking_budget=120, max_answer_tokens=80, policy="fixed")
        generation = Generation(FakeEngine(order=2, max_sequences=1), FORMATS["code"], config,
                                [ord(c) for c in prompt], costs=CostModel(table=gpu_preset()), plan=NO_DRAFT)
        results[mode] = generation.run()
    assert generation.speculation.layout is Layout.CHAIN and generation.spans.one_chain
    passes = sum(1 for event in results["ssr"].trace if "source" in event)
    assert len(judged) > passes and any(right for _, _, right in judged)
    assert (results["ssr"].cot_ids, results["ssr"].answer_ids) == (results["ar"].cot_ids, results["ar"].answer_ids)
