"""Accepted tokens attributed to their source, on hand-built rows; totals equal the metrics."""
import pytest

from ssr.bench.sources import accepted_sources

PROMPT = [1, 2, 3, 4, 5, 6]
COT = [7, 8, 9, 10, 7, 8, 9, 10]
DRAFT = [20, 21, 22, 23, 24]


def row(answer, trace, prefix=0, cot=COT):
    return {"prompt_ids": PROMPT, "cot_ids": cot, "answer_ids": answer, "draft_ids": DRAFT, "trace": trace,
            "metrics": {"accepted_prefix_tokens": prefix}}


CASES = [  # (answer, trace, accepted prefix, expected counts)
    ([20, 21, 22, 23], [], 4, {"draft prefix": 4}),
    ([9, 1, 2, 3, 4, 5], [{"kind": "span", "at": 4, "accepted": 2}], 0, {"prompt": 2}),  # 2,3,4,5 in prompt
    ([30, 7, 8, 9, 10], [{"kind": "span", "at": 4, "accepted": 1}], 0, {"cot": 1}),
    ([20, 21, 22, 23, 24], [{"kind": "span", "at": 3, "accepted": 2}], 0, {"draft": 2}),  # only in the draft
    ([40, 41, 42, 43, 40, 41, 42, 43], [{"kind": "span", "at": 7, "accepted": 1}], 0, {"answer": 1}),
    ([50, 51, 52, 53, 54], [{"kind": "span", "at": 2, "accepted": 3}], 0, {"other": 3}),
    ([], [{"kind": "cot_span", "at": 7, "accepted": 1}], 0, {"cot:cot": 1}),  # 8 9 10 ... 7 8 9 10 repeats
    ([], [{"kind": "cot_span", "at": 2, "accepted": 2}], 0, {"cot:prompt": 0, "cot:other": 2}),
    ([], [{"kind": "cot_span", "at": 3, "accepted": 2}], 0, {"cot:prompt": 2}),
]


def test_answer_windows_see_the_forced_tokens_before_the_answer():
    """The answer follows prompt + CoT + forced tokens: a window over its first tokens holds them."""
    forced_row = dict(row([4, 5], [{"kind": "span", "at": 0, "accepted": 2}]), forced_ids=[1, 2, 3])
    assert accepted_sources(forced_row) == {"draft prefix": 0, "prompt": 2}  # 1 2 3 | 4 5: the prompt's text
    assert accepted_sources(row([4, 5], [{"kind": "span", "at": 0, "accepted": 2}]))["prompt"] == 0


@pytest.mark.parametrize("answer,trace,prefix,expected", CASES)
def test_accepted_sources(answer, trace, prefix, expected):
    cot = [1, 2, 3, 4, 5] if expected.get("cot:prompt") else COT  # a CoT that copies the prompt
    counts = accepted_sources(row(answer, trace, prefix, cot))
    assert {name: count for name, count in counts.items() if count} == \
        {name: count for name, count in expected.items() if count}
    assert sum(counts.values()) == prefix + sum(event["accepted"] for event in trace)
