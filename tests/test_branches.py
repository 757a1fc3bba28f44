"""Several candidate spans verified in one forward pass, each on its own fork of the parent
(greedy, cheap verification, engines that feed several sequences per pass): which candidates the
span policy keeps (hand-set acceptance and costs), that the loop stays token-identical to plain
decoding, leaves no sequence behind, and that the simulator replays it exactly."""
from dataclasses import asdict

import pytest

from ssr.bench.simulate import config_from_dict, replay
from ssr.config import GenerationConfig, SamplingParams
from ssr.pricing.costs import CostModel, CostTable, gpu_preset
from ssr.loop import Generation
from ssr.engines.base import Capabilities
from ssr.engines.fake import FakeEngine
from ssr.proposing.source import Source
from ssr.pricing.acceptance import AcceptanceStats
from ssr.pricing.span_policy import MAX_BRANCHES, SpanPolicy
from ssr.formats.thinking import FORMATS

FMT = FORMATS["code"]
PROMPTS = [[ord(c) for c in text] for text in ("Please complete the class Stack.", "abcabcabcabc abc",
                                               "Write a queue in Python.")]
CPU = CostTable(step_s={1: 0.04, 2: 0.07}, score_s={8: 0.16, 32: 0.6, 128: 2.3}, prefill_token_s=0.015)
# transformers fp32 on this CPU: a scored token ~2% of a step
TORCH_CPU = CostTable(step_s={1: 0.082, 2: 0.106}, score_s={8: 0.088, 32: 0.13, 128: 0.356}, prefill_token_s=0.0019)


def learnt(first_token_rate: float, spans: int = 20) -> AcceptanceStats:
    """A source whose spans are accepted whole with this chance, else fail at once (evenly mixed)."""
    stats = AcceptanceStats()
    for i in range(spans):
        whole = int((i + 1) * first_token_rate) > int(i * first_token_rate)
        stats.observe(8, 8 if whole else 0)
    return stats


# (name, costs, first-token rate of sources a / b / c, candidates, max_count, chosen sources)
CHOICES = [
    ("GPU: a second source is nearly free", gpu_preset(), (0.5, 0.5, 0.5), [("a", [1] * 8), ("b", [2] * 8)], 3,
     ["a", "b"]),
    ("GPU: all three, best first", gpu_preset(), (0.3, 0.6, 0.5),
     [("a", [1] * 8), ("b", [2] * 8), ("c", [3] * 8)], 3, ["b", "c", "a"]),
    ("GPU: at most max_count", gpu_preset(), (0.3, 0.6, 0.5),
     [("a", [1] * 8), ("b", [2] * 8), ("c", [3] * 8)], 2, ["b", "c"]),
    ("GPU: a prefix of a chosen span adds nothing", gpu_preset(), (0.5, 0.5, 0.5),
     [("a", [1] * 8), ("b", [1] * 4)], 3, ["a"]),
    ("cheap scoring: a second source where the best often fails", TORCH_CPU, (0.5, 0.5, 0.5),
     [("a", [1] * 8), ("b", [2] * 8)], 3, ["a", "b"]),
    ("cheap scoring: not where the best is almost always right", TORCH_CPU, (1.0, 0.5, 0.5),
     [("a", [1] * 8), ("b", [2] * 8)], 3, ["a"]),
    ("CPU: every scored token costs half a step", CPU, (0.6, 0.5, 0.5), [("a", [1] * 8), ("b", [2] * 8)], 3, ["a"]),
    ("one allowed: the choice of choose()", gpu_preset(), (0.5, 0.6, 0.5), [("a", [1] * 8), ("b", [2] * 8)], 1,
     ["b"]),
]


@pytest.mark.parametrize("name,costs,rates,candidates,max_count,expected", CHOICES, ids=[c[0] for c in CHOICES])
def test_span_policy_keeps_candidates_worth_their_tokens(name, costs, rates, candidates, max_count, expected):
    policy = SpanPolicy(CostModel(table=costs), {"a": learnt(rates[0]), "b": learnt(rates[1]), "c": learnt(rates[2])})
    chosen = policy.choose_many(candidates, max_count)
    assert [source for source, _ in chosen] == expected
    assert policy.choose(candidates)[0] == expected[0]


def test_a_pass_teaches_every_source_and_the_guard_counts_it_once():
    policy = SpanPolicy(CostModel(table=gpu_preset()))
    a, b = Source("a"), Source("b")
    policy.observe_pass([(a, 8, 0), (b, 8, 5)], seconds=gpu_preset().step(1))
    assert policy.stats[a].failed[0] == 1 and policy.stats[b].at_risk[:6] == [1.0] * 6
    assert policy.timed_passes == 1
    assert policy.gain_s == pytest.approx(5 * gpu_preset().step(1))  # 6 tokens for the price of one step


class ClockedEngine(FakeEngine):
    """The fake model with a modelled clock (as the replay engine keeps one): the run and its
    replay then price every span alike and decide alike."""

    def __init__(self, costs: CostTable, **options) -> None:
        super().__init__(**options)
        self.costs, self.seconds = costs, 0.0

    capabilities = Capabilities(shares_passes=True, modelled_clock=True)

    def clock(self) -> float:
        return self.seconds

    pass_clock = clock  # no host time on this clock: its calls alone

    def prefill(self, token_ids):
        self.seconds += self.costs.prefill(len(token_ids))
        return super().prefill(token_ids)

    def step(self, batch):
        self.seconds += self.costs.step(len(batch))
        return super().step(batch)

    def score(self, seq, token_ids):
        self.seconds += self.costs.score(len(token_ids))
        return super().score(seq, token_ids)

    def score_batch(self, feeds):
        self.seconds += max(self.costs.score(sum(len(t) for _, t in feeds)), self.costs.step(len(feeds)))
        return super().score_batch(feeds)


def run(mode, prompt, order=2, costs=None, engine=None, **overrides):
    options = dict(mode=mode, thinking_budget=120, draft_at=30, draft_tokens=40, max_answer_tokens=80, policy="fixed")
    options.update(overrides)
    engine = engine or ClockedEngine(costs or gpu_preset(), order=order)
    generation = Generation(engine, FMT, GenerationConfig(**options), prompt, costs=CostModel(table=costs or gpu_preset()))
    result = generation.run()
    assert engine.live_sequences() == 0  # branches and children all released
    return generation, result


@pytest.mark.parametrize("order", [1, 2, 3])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
@pytest.mark.parametrize("draft_at", [0, 30, 119])
def test_branches_keep_greedy_identity(order, prompt, draft_at):
    _, expected = run("ar", PROMPTS[prompt], order, draft_at=draft_at)
    generation, got = run("ssr", PROMPTS[prompt], order, draft_at=draft_at)
    assert generation.speculation.candidates == MAX_BRANCHES
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
    assert got.metrics.stop == expected.metrics.stop and got.metrics.cot_end == expected.metrics.cot_end
    assert got.metrics.branch_wins <= got.metrics.branch_passes


def test_branches_win_passes_the_first_choice_would_lose():
    wins = passes = 0
    for order in (1, 2, 3):
        for prompt in PROMPTS:
            _, got = run("ssr", prompt, order)
            wins += got.metrics.branch_wins
            passes += got.metrics.branch_passes
            candidates = [event["candidates"] for event in got.trace if "candidates" in event]
            assert all(2 <= count <= MAX_BRANCHES for count in candidates) and len(candidates) == got.metrics.branch_passes
    assert passes > 0 and wins > 0


@pytest.mark.parametrize("case", ["cpu costs", "one pass per sequence", "two sequences"])
def test_one_candidate_where_branches_cannot_pay_or_cannot_run(case):
    if case == "cpu costs":
        generation, got = run("ssr", PROMPTS[1], 1, costs=CPU)
    elif case == "one pass per sequence":
        engine = ClockedEngine(gpu_preset(), order=1)
        engine.capabilities, engine.score_batch = Capabilities(modelled_clock=True), None
        generation, got = run("ssr", PROMPTS[1], engine=engine)
    else:  # a parent and one more sequence: a branch, or the child beside the parent
        _, expected = run("ar", PROMPTS[1], 1, engine=ClockedEngine(gpu_preset(), order=1, max_sequences=2))
        generation, got = run("ssr", PROMPTS[1], engine=ClockedEngine(gpu_preset(), order=1, max_sequences=2))
        assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
        assert all(event.get("candidates", 1) <= 2 for event in got.trace)
        return
    assert generation.speculation.candidates == 1 and got.metrics.branch_passes == 0


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("prompt", range(len(PROMPTS)))
def test_the_simulator_replays_branched_runs_exactly(order, prompt):
    """On a modelled clock the run and its replay see the same seconds: same candidates, same
    winners, same accepted tokens and the same modelled seconds."""
    generation, got = run("ssr", PROMPTS[prompt], order)
    row = {"suite": "fake", "item": "0", "repeat": 0, "mode": "ssr", "prompt_ids": PROMPTS[prompt],
           "cot_ids": got.cot_ids, "forced_ids": got.forced_ids, "answer_ids": got.answer_ids,
           "draft_ids": got.draft_ids, "metrics": got.metrics.as_dict(), "config": asdict(generation.config),
           "answer_prefix_ids": generation.answer_prefix_ids, "forced_end_ids": generation.forced_end_ids,
           "trace": got.trace}
    replayed = replay(row, gpu_preset(), config_from_dict(row["config"]), row["answer_prefix_ids"])
    assert replayed.cot_accepted_tokens == got.metrics.cot_accepted_tokens
    assert replayed.answer_accepted_tokens == got.metrics.answer_accepted_tokens
    assert replayed.accepted_prefix_tokens == got.metrics.accepted_prefix_tokens
    assert replayed.total_s == pytest.approx(got.metrics.total_s, rel=1e-9)


def test_sampling_verifies_several_candidates_as_a_token_tree():
    """Under sampling several candidates are verified too (as one token tree: exact, see
    test_distribution.py); every pass's emitted tokens lie on the winner's branch."""
    passes = 0
    for seed in range(4):
        generation, got = run("ssr", PROMPTS[1], 1, sampling=SamplingParams(temperature=0.7, seed=seed))
        assert generation.speculation.candidates == MAX_BRANCHES
        passes += got.metrics.branch_passes
    assert passes > 0
