"""vLLM's own speculation read from its per-step metrics and the output stream: hand-built
steps, merged outputs, cuts at max_tokens and at the walk's stop."""
import pytest

from ssr.engines.vllm_speculation import speculation_events

CASES = [  # (outputs' token counts, accepted per verify step, drafted per step, used,
    #          expected [(at, accepted, proposed)], aligned)
    # one output per step: the first is the prefill's token; a 3-token output = 2 accepted
    ([1, 1, 3, 1, 2], [0, 2, 0, 1], [4, 5, 2, 3], 99, [(2, 2, 5), (6, 1, 3)], True),
    # two plain steps merged into one 2-token output: nothing accepted there
    ([1, 2, 3], [0, 2], [3, 4], 99, [(3, 2, 4)], True),
    # a verify step merged with a plain step after it (output of 4 = 3 + 1)
    ([1, 4, 1], [2], [6], 99, [(1, 2, 6)], True),
    # the last step accepted 5 but max_tokens let 2 of its tokens out
    ([1, 1, 2], [0, 5], [1, 8], 99, [(2, 1, 8)], True),
    # the walk stopped inside a span: only the tokens it kept count
    ([1, 6], [5], [7], 3, [(1, 2, 7)], True),
    # more verify steps than the outputs hold (metrics and stream disagree): said, not hidden
    ([1, 1], [2, 3], [2, 3], 99, [], False),
]


@pytest.mark.parametrize("steps,accepted,drafted,used,expected,aligned", CASES)
def test_verify_steps_laid_over_the_outputs(steps, accepted, drafted, used, expected, aligned):
    events, summary = speculation_events(steps, accepted, drafted, "span", 10, used, "vllm-suffix")
    assert [(event["at"] - 10, event["accepted"], event["proposed"]) for event in events] == expected
    assert summary["aligned"] is aligned
    assert summary["accepted"] == sum(accepted) and summary["drafted"] == sum(drafted)
    assert summary["verify_steps"] == len(accepted)
    assert summary["accepted_in_output"] == sum(taken for _, taken, _ in expected)
    assert all(event["kind"] == "span" and event["source"] == "vllm-suffix" for event in events)


def test_without_metrics_the_stream_alone_is_read():
    """An aborted request has no metrics: every multi-token output counts as one verify step."""
    events, summary = speculation_events([1, 2, 1, 4], None, None, "cot_span", 0, 99, "vllm-ngram")
    assert [(event["at"], event["accepted"]) for event in events] == [(1, 1), (4, 3)]
    assert summary == {"drafted": None, "accepted": None, "verify_steps": None, "accepted_in_output": 4,
                       "aligned": None}
