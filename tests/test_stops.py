"""Stops a person expects (the answer's closing fence, runaway repetition): the same token
in every mode, on the fake engine; LoopGuard table-driven."""
from dataclasses import replace

import pytest

from ssr.config import GenerationConfig
from ssr.loop import Generation
from ssr.engines.fake import FakeEngine
from ssr.formats.text import LoopGuard
from ssr.formats.thinking import FORMATS

PROMPT = [ord(c) for c in "Write is_prime(n)."]
MODES = ["ar", "ssr", "ssr-prefix", "ssr-suffix", "suffix", "pld"]


def run(mode, fmt, engine=None, **overrides):
    options = dict(mode=mode, thinking_budget=40, draft_at=15, draft_tokens=30, max_answer_tokens=80, policy="fixed")
    options.update(overrides)
    return Generation(engine or FakeEngine(), fmt, GenerationConfig(**options), PROMPT).run()


@pytest.mark.parametrize("mode", MODES)
def test_answer_stop_text_ends_the_answer_identically(mode):
    code = FORMATS["code"]
    unstopped = run("ar", code).answer[len(code.answer_prefix.strip()):]
    stop = unstopped[12:14]  # a stop text the fake model writes after a dozen answer tokens
    fmt = replace(code, answer_stop=stop)
    expected, got = run("ar", fmt), run(mode, fmt)
    assert expected.metrics.stop == "answer_stop" and expected.answer.endswith(stop)
    assert expected.answer.count(stop) == 1  # the first occurrence ends it
    assert got.answer_ids == expected.answer_ids and got.metrics.stop == "answer_stop"


def test_code_format_stops_at_closing_fence():
    assert FORMATS["code"].answer_stop == "\n```" and FORMATS["cpp"].answer_stop == "\n```"
    assert FORMATS["trace"].answer_stop == "" and FORMATS["think"].answer_stop == ""


@pytest.mark.parametrize("mode", ["ar", "ssr"])
def test_no_repetition_stop_by_default(mode):
    """Off unless asked for: a looping model writes on to its budget and limit, as it would plainly."""
    got = run(mode, FORMATS["plain"], LoopingEngine(), thinking_budget=200, draft_at=20)
    assert got.metrics.cot_end == "budget" and len(got.cot_ids) == 200
    assert got.metrics.stop == "max_tokens" and len(got.answer_ids) == 80


class LoopingEngine(FakeEngine):
    """Writes `*` and newline in turn after the first 6 tokens of a sequence's output."""

    def _logits(self, tokens):
        logits = super()._logits(tokens)
        if len(tokens) > len(PROMPT) + 6:
            logits[ord("\n") if tokens[-1] != ord("\n") else ord("*")] = 100.0
        return logits


@pytest.mark.parametrize("mode", MODES)
def test_runaway_repetition_ends_cot_and_answer_identically(mode):
    fmt = FORMATS["plain"]
    expected = run("ar", fmt, LoopingEngine(), thinking_budget=200, draft_at=20, repetition_stop=16)
    got = run(mode, fmt, LoopingEngine(), thinking_budget=200, draft_at=20, repetition_stop=16)
    assert expected.metrics.cot_end == "repetition" and len(expected.cot_ids) < 60
    assert expected.metrics.stop == "repetition" and len(expected.answer_ids) < 60
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
    assert (got.metrics.cot_end, got.metrics.stop) == ("repetition", "repetition")


def test_repetition_stop_off_runs_to_the_budget():
    result = run("ar", FORMATS["plain"], LoopingEngine(), thinking_budget=100, draft_at=20, repetition_stop=0)
    assert result.metrics.cot_end == "budget" and result.metrics.stop == "max_tokens"


LOOPS = [  # (text, lines, tripped)
    ("* \n" * 16, 16, True),
    ("* \n" * 15, 16, False),
    ("".join(f"    if n == {i}:\n        return False\n" for i in range(8)), 16, True),  # period 2, digits
    ("".join(f"a{i}\nb\nc\nd\n" for i in range(4)), 16, True),  # period 4
    ("".join(f"a\nb\nc\nd\ne{i}\n" for i in range(4)), 16, False),  # period 5: not a loop
    ("".join(f"def get_{name}(self):\n    return self.{name}\n" for name in "abcdefghij"), 16, False),
    ("\n" * 16, 16, True),  # blank lines
    ("* \n" * 100, 0, False),  # off
    ("x" * 5000, 16, False),  # one long line: no completed lines
]


@pytest.mark.parametrize("text,lines,tripped", LOOPS)
def test_loop_guard(text, lines, tripped):
    whole, split = LoopGuard(lines), LoopGuard(lines)
    assert whole.push(text) is tripped
    assert any([split.push(text[i:i + 3]) for i in range(0, len(text), 3)]) is tripped  # chunking does not matter


def test_loop_guard_stays_tripped():
    guard = LoopGuard(4)
    assert guard.push("a\n" * 4) and guard.push("something else\n")
