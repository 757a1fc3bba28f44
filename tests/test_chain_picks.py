"""scripts/chain_picks.py: each chain pass recorded where it was, its features against a brute-force
count of the context, and the share of passes a score picks right."""
import importlib.util
import math
import random
from pathlib import Path

import numpy as np
import pytest

from ssr.bench.traces import TextTrace, TokenTrace
from ssr.pricing.drafting import PolicyStats

pytestmark = pytest.mark.shared_data  # needs nothing from ../shared: runs from a clone too

SPEC = importlib.util.spec_from_file_location("chain_picks", Path(__file__).parents[1] / "scripts" / "chain_picks.py")
chain_picks = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(chain_picks)

END = 7  # the end-of-thinking token of the synthetic traces


def synthetic(seed: int) -> TokenTrace:
    """A CoT that repeats phrases of a small vocabulary with changes, so that copies are right and wrong."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(10, 40) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    cot = []
    while len(cot) < 300:
        phrase = list(rng.choice(phrases))
        if rng.random() < 0.3:
            phrase[rng.randrange(len(phrase))] = rng.randrange(10, 40)
        cot += phrase
    trace = TextTrace(set="synthetic", model="m", item=str(seed), messages=(("user", "x"),), cot="", answer="")
    return TokenTrace(trace, prompt_ids=phrases[0] + phrases[1], cot_ids=cot + [END], answer_ids=phrases[2] + [2])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_pass_is_recorded_where_it_was(seed):
    """The tokens each pick would accept against the text after the pass's place are what the
    replay verified, pass by pass (the place counts the pending token the pass feeds)."""
    tokens = synthetic(seed)
    passes = chain_picks.record(tokens, "cold", None, PolicyStats())
    output = tokens.cot_ids + tokens.answer_ids
    assert passes
    verified = _verified(tokens)
    assert [chain_picks.common_prefix(each["picked"], output[each["at"]:]) for each in passes] == verified
    for each in passes:
        assert any(span[:len(each["picked"])] == each["picked"] for span in each["spans"])
        assert [len(curve) for curve in each["curves"]] == [len(span) for span in each["spans"]]


def _verified(tokens: TokenTrace) -> list[int]:
    """Tokens accepted by each verified span of the replay, from its own trace of events."""
    result = chain_picks.replay_trace(tokens, "ssr", chain_picks.CostSetting("gpu", chain_picks.gpu_preset()),
                                      "cold", None, PolicyStats(), candidates="chain")
    return [event["accepted"] for event in result["trace"] if event["kind"].endswith("span")]


def brute(text: list[int], at: int, token: int, k: int) -> list[float]:
    """A feature group for the last k tokens before `at`, counted by scanning the text."""
    key = text[at - k:at]
    after = [text[i + k] for i in range(0, at - k) if text[i:i + k] == key]  # what followed each occurrence
    if not after:
        return [0.0, 0.0, 0.0, 0.0, 0.0, 12.0]
    count = after.count(token)
    top = max(after.count(each) for each in set(after))
    places = [i + k for i in range(0, at - k) if text[i:i + k] == key and text[i + k] == token]
    return [1.0, count / len(after), math.log1p(count), float(count == top), float(after[-1] == token),
            math.log1p(at - places[-1]) if places else 12.0]


def test_features_match_a_brute_force_count():
    rng = random.Random(5)
    text = [rng.randrange(4) for _ in range(120)]
    prompt = 10
    passes = [{"at": at, "picked": [text[prompt + at]], "spans": [[a], [b]], "curves": [[0.4], [0.2]]}
              for at, a, b in ((5, 0, 1), (40, 2, 3), (41, 1, 1), (90, 3, 0))]
    rows = chain_picks.features(passes, text, prompt)
    seen = 0
    for index, each in enumerate(passes):
        at = prompt + each["at"]
        tokens = {span[0]: [] for span in each["spans"]}
        for span, curve in zip(each["spans"], each["curves"]):
            tokens[span[0]].append(curve[0])
        for token, firsts in tokens.items():
            row, right, picked, which = rows[seen]
            seen += 1
            expected = [1 - math.prod(1 - c for c in firsts), max(firsts), math.log(len(firsts))]
            for k in range(1, chain_picks.ORDERS + 1):
                expected += brute(text, at, token, k)
            assert row == pytest.approx(expected)
            assert (right, picked, which) == (token == text[at], token == each["picked"][0], index)
    assert seen == len(rows)


@pytest.mark.parametrize("score,share", [
    ([0.9, 0.1, 0.2, 0.8], 1.0),  # each pass's right token scored highest
    ([0.1, 0.9, 0.8, 0.2], 0.0),
    ([0.9, 0.1, 0.8, 0.2], 0.5),
])
def test_right_share_counts_passes_by_their_best_scored_token(score, share):
    right = np.array([1.0, 0.0, 0.0, 1.0])
    pass_of = np.array([0, 0, 1, 1])
    assert chain_picks.right_share(np.array(score), right, pass_of) == share
