"""ssr's drafter as vLLM runs it (engines/vllm_drafter.py), without vLLM: the batch vLLM hands it
built by hand (its InputBatch's fields the drafter reads), the plugin's config rewrite, batch
pricing, and the drafting replayed from a request's own text."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ssr.pricing.costs import CostModel, gpu_preset
from ssr.proposing.history import ResponseHistory
from ssr.engines.vllm_drafter import ChainDrafter, SsrDrafter, replay_chains
from ssr.formats.markers import thinking_at_start
from ssr.engines.vllm_plugin import DRAFTER, SsrConfigError, speculative_config

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14] * 3  # the text repeats: lookup and the suffix tree copy it
GPU = CostModel(table=gpu_preset())


def config(tokens: int = 8, max_model_len: int = 4096, is_hybrid: bool = False):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=tokens),
                           model_config=SimpleNamespace(max_model_len=max_model_len, is_hybrid=is_hybrid))


class Batch:
    """The fields of vLLM's InputBatch the drafter reads: req_ids, req_id_to_index,
    num_prompt_tokens and the rows of token ids (prompt + output)."""

    def __init__(self, prompts: dict[str, list[int]]) -> None:
        self.req_ids = list(prompts)
        self.req_id_to_index = {name: row for row, name in enumerate(self.req_ids)}
        self.num_prompt_tokens = np.array([len(p) for p in prompts.values()])
        self.rows = [list(p) for p in prompts.values()]

    def arrays(self):
        width = max(len(row) for row in self.rows) + 64
        tokens = np.zeros((len(self.rows), width), dtype=np.int64)
        for index, row in enumerate(self.rows):
            tokens[index, :len(row)] = row
        return np.array([len(row) for row in self.rows]), tokens


def drafter(**options) -> SsrDrafter:
    return SsrDrafter(config(**options), costs=gpu_preset(), markers=([], []))


def test_one_chain_per_request_and_a_finished_request_joins_the_history():
    ssr = drafter()
    batch = Batch({"a": PROMPT, "b": [1, 2, 3, 4]})
    ssr.input_batch = batch
    batch.rows[0].append(5)  # the prefill's tokens
    batch.rows[1].append(1)
    drafts = ssr.propose([[5], [1]], *batch.arrays())
    assert len(drafts) == 2 and drafts[0][:4] == [6, 7, 8, 9]  # copies what followed 5 before
    assert all(len(chain) <= 8 for chain in drafts)
    batch.rows[0].extend([6, 7])  # vLLM accepted one draft token and sampled the next
    drafts = ssr.propose([[6, 7], []], *batch.arrays())  # b: a partial prefill step, nothing to draft
    assert drafts[1] == [] and drafts[0][:2] == [8, 9]
    assert ssr.requests["a"].spans.stats  # the verdict on a's first chain was observed
    ssr.input_batch = Batch({"b": [1, 2, 3, 4, 1]})  # a left the batch
    ssr.propose([[2]], *ssr.input_batch.arrays())
    assert set(ssr.requests) == {"b"} and ssr.history.responses == [[5, 6, 7]]
    assert ssr.errors == 0 and ssr.steps == 4  # a twice, b twice (not its prefill step)


def test_a_drafter_error_never_fails_a_request():
    ssr = drafter()
    batch = Batch({"a": PROMPT + [5], "b": PROMPT + [5]})
    ssr.input_batch = batch
    ssr.propose([[5], [5]], *batch.arrays())
    ssr.requests["b"].proposer = None  # broken: its next step raises inside the drafter
    drafts = ssr.propose([[6], [6]], *batch.arrays())
    assert drafts[1] == [] and drafts[0] and ssr.errors == 1
    ssr.input_batch = None  # a runner that never handed over its batch: plain steps, counted
    assert ssr.propose([[7], [7]], *batch.arrays()) == [[], []] and ssr.errors == 2


def test_the_engines_own_probes_are_left_plain():
    """Requests the adapter names with the undrafted role (its cost probes) get no chain."""
    ssr = drafter()
    batch = Batch({"ssr-3-undrafted-1a2b": PROMPT + [5], "ssr-4-answer-3c4d": PROMPT + [5]})
    ssr.input_batch = batch
    drafts = ssr.propose([[5], [5]], *batch.arrays())
    assert drafts[0] == [] and drafts[1][:4] == [6, 7, 8, 9] and set(ssr.requests) == {"ssr-4-answer-3c4d"}


def test_a_measured_cost_table_replaces_the_preset():
    """set_costs (the engine measured this machine): where a verified token costs a tenth of a
    step, the chain a GPU would take whole is cut."""
    cpu = {"step_s": {"1": 0.05, "2": 0.055, "4": 0.06}, "score_s": {"8": 0.09, "32": 0.2, "128": 0.7, "512": 2.7},
           "prefill_token_s": 0.005}
    chains = []
    for table in (None, cpu):
        ssr = drafter(tokens=16)
        if table:
            ssr.set_costs(table)
            assert ssr.costs.score(8) == 0.09
        batch = Batch({"a": PROMPT + [5]})
        ssr.input_batch = batch
        chains.append(ssr.propose([[5]], *batch.arrays())[0])
    on_gpu, on_cpu = chains
    assert on_gpu[:4] == [6, 7, 8, 9] and 0 < len(on_cpu) < len(on_gpu)


def test_spans_back_off_as_the_batch_grows():
    """The same text drafted at batch 1 and in fuller batches (GPU preset): a verified token is
    nearly free alone and costs compute in a full batch, so fewer tokens are proposed there, more
    of them right. (Past a few requests one span a pass comes from the suffix tree alone,
    proposers.ONE_SPAN_PARTS: on this text, copies at shifting offsets, n-gram lookup's earliest
    occurrence accepted 36 of the 39 tokens it proposed at batch 64, the suffix tree alone 25 of
    30: on the development traces it is the better of the two there, host time aside too.)"""
    output = []
    for i in range(12):  # copies of 4 tokens, each followed by one no copy predicts
        output += PROMPT[i % 7: i % 7 + 4] + [90 + i]
    proposed, accepted = {}, {}
    for batch in (1, 8, 64):
        steps = replay_chains(PROMPT, output, GPU, max_span=16,
                              batch_costs=CostModel(table=gpu_preset().at_batch(batch)), batch=batch)
        proposed[batch] = sum(len(step.proposed) for step in steps)
        accepted[batch] = sum(step.accepted or 0 for step in steps)
    assert proposed[1] > 1.5 * proposed[8] > 1.5 * proposed[64] > 0
    assert accepted[8] >= 0.9 * accepted[1] and accepted[64] >= 0.6 * accepted[1]
    assert accepted[64] / proposed[64] > accepted[8] / proposed[8] > accepted[1] / proposed[1]


@pytest.mark.parametrize("batch, tokens, steps", [  # CostTable.at_batch, GPU preset in steps: the H100's
    # fit (21.0 us a token against a 7.11 ms step) over the batch's batch * tokens tokens
    (1, 1, 1.0), (1, 16, 1.0443), (8, 1, 1.0207), (8, 4, 1.0916), (32, 1, 1.0916), (32, 8, 1.7531),
    (64, 8, 2.5092), (64, 1, 1.1861)])
def test_costs_at_a_batch(batch, tokens, steps):
    assert gpu_preset(1.0).at_batch(batch).score(tokens) == pytest.approx(steps, abs=1e-3)


def test_the_plugin_rewrites_method_ssr_and_refuses_what_it_cannot_honour():
    assert speculative_config({"method": "ssr"}) == {"method": "custom_class", "model": DRAFTER,
                                                      "num_speculative_tokens": 32}
    assert speculative_config({"method": "ssr", "num_speculative_tokens": 8, "disable_by_batch_size": 64}) == {
        "method": "custom_class", "model": DRAFTER, "num_speculative_tokens": 8, "disable_by_batch_size": 64}
    for bad, reason in (({"method": "ssr", "model": "eagle"}, "does not take model"),
                        ({"method": "ssr", "prompt_lookup_max": 4}, "does not take prompt_lookup_max"),
                        ({"method": "ssr", "num_speculative_tokens": 0}, "1..128"),
                        ({"method": "ssr", "num_speculative_tokens": "8"}, "1..128")):
        with pytest.raises(SsrConfigError, match=reason):
            speculative_config(bad)
    with pytest.raises(SsrConfigError, match="removed in 0.34.0"):  # a vLLM without custom_class
        speculative_config({"method": "ssr"}, has_custom_class=False)


@pytest.mark.parametrize("method, tokens, config", [
    (None, 8, None),  # no speculation in vLLM's step: the count is not passed on
    ("suffix", None, {"method": "suffix"}),  # vLLM's own default count
    ("ngram", 4, {"method": "ngram", "num_speculative_tokens": 4}),
    ("ssr", None, {"method": "custom_class", "model": DRAFTER, "num_speculative_tokens": 32}),
    ("ssr", 8, {"method": "custom_class", "model": DRAFTER, "num_speculative_tokens": 8}),
])
def test_the_engines_speculative_config_per_method(method, tokens, config):
    from ssr.engines.vllm import speculative_config_of

    assert speculative_config_of(method, tokens) == config


@pytest.mark.parametrize("method, tokens, reason", [("eagle", None, "must be one of ssr, suffix, ngram"),
                                                     ("ssr", -3, "1..128")])
def test_the_engine_refuses_a_method_or_count_it_cannot_honour(method, tokens, reason):
    from ssr.engines.base import EngineError
    from ssr.engines.vllm import speculative_config_of

    with pytest.raises(EngineError, match=reason):
        speculative_config_of(method, tokens)


@pytest.mark.parametrize("prompt, thinking", [([1, 90, 2], True), ([1, 90, 2, 91, 3], False), ([1, 2], False),
                                              ([90, 91, 90], True)])
def test_a_request_starts_in_its_cot_when_its_prompt_opens_one(prompt, thinking):
    assert thinking_at_start(prompt, [90], [91]) is thinking


def test_replayed_chains_are_what_greedy_verification_accepts():
    """Drafting replayed from a text: every chain accepted up to where it parts from the text (the
    last one's bonus is the EOS after it), and the steps cover the text (accepted + 1 tokens a step)."""
    output = PROMPT[:10] + [99, 98] + PROMPT[:6]
    steps = replay_chains(PROMPT, output, GPU, max_span=8)
    position = 1
    for step in steps:
        assert step.at == len(PROMPT) + position
        expected = 0
        while expected < len(step.proposed) and position + expected < len(output) \
                and step.proposed[expected] == output[position + expected]:
            expected += 1
        assert step.accepted == expected  # the last one's too: its verdict came with the step that ended it
        position += step.accepted + 1
    assert position == len(output) + 1 and sum(step.accepted for step in steps) >= 10


def test_a_childs_answer_is_kept_from_the_end_marker_so_the_parent_copies_it_after_its_own():
    """A draft child's prompt closes the CoT (CoT[:b] + end marker): its response joins the history
    from the marker on, and the parent, once it writes the marker itself, is proposed the child's
    answer; a request with no closed CoT in its prompt keeps its output alone."""
    start, end, answer = [90], [91], [40, 41, 42, 43, 44, 45, 46, 47]
    cot = [60, 61, 62, 63, 64, 65, 66, 67]
    history = ResponseHistory(10_000)
    replay_chains(start + [1, 2] + cot[:4] + end, answer, GPU, end_ids=end, history=history, max_span=8)
    assert history.responses == [end + answer]
    steps = replay_chains(start + [1, 2], cot + end + answer, GPU, end_ids=end, thinking=True,
                          history=history, max_span=8)
    after = next(step for step in steps if step.at == len(start) + 2 + len(cot) + 1)  # right after the marker
    assert after.proposed[:4] == answer[:4] and after.accepted >= 4
    replay_chains([1, 2, 3], [7, 8, 9], GPU, end_ids=end, history=history)
    assert history.responses[-1] == [7, 8, 9]


@pytest.mark.parametrize("on_cpu, kept, env, expected", [
    (True, True, "", "kept"),  # a CPU with the table measured for this model: that table
    (True, False, "", "preset"),  # a CPU, nothing measured yet: the preset (the engine measures, then hands it over)
    (False, True, "", "preset"),  # a GPU: the preset, whatever a CPU run kept
    (True, True, "gpu:10", "env"),  # $SSR_DRAFTER_COSTS first
])
def test_the_drafters_cost_table_is_the_environments_else_the_one_kept_for_the_model_on_a_cpu(
        tmp_path, monkeypatch, on_cpu, kept, env, expected):
    from ssr.pricing.costs import CostTable, load_costs
    from ssr.pricing.probe import write_table
    from ssr.engines import vllm_drafter
    from ssr.engines.vllm_costs import table_path

    monkeypatch.setenv("SSR_CACHE", str(tmp_path))
    monkeypatch.setattr(vllm_drafter, "_on_cpu", lambda: on_cpu)
    monkeypatch.setenv("SSR_DRAFTER_COSTS", env) if env else monkeypatch.delenv("SSR_DRAFTER_COSTS", raising=False)
    measured = CostTable(step_s={1: 0.08, 4: 0.09}, score_s={8: 0.08, 128: 0.21}, prefill_token_s=0.0017,
                     source="measured on vLLM")
    if kept:
        write_table(table_path("/models/SmolLM2-test"), measured)
    table = vllm_drafter._engine_costs(SimpleNamespace(model="/models/SmolLM2-test/"))
    assert table == {"kept": measured, "preset": gpu_preset(), "env": load_costs("gpu:10")}[expected]


def test_a_hybrid_model_is_refused_unless_the_vllm_has_the_fix(monkeypatch):
    """vLLM issue #39273: a step proposing nothing after accepted drafts corrupts a hybrid model."""
    monkeypatch.delenv("SSR_DRAFTER_HYBRID", raising=False)
    with pytest.raises(SsrConfigError, match="#39273"):
        SsrDrafter(config(is_hybrid=True), costs=gpu_preset(), markers=([], []))
    monkeypatch.setenv("SSR_DRAFTER_HYBRID", "1")
    assert SsrDrafter(config(is_hybrid=True), costs=gpu_preset(), markers=([], [])).used


def test_forgotten_responses_stay_forgotten_when_their_requests_are_seen_gone_later():
    """The bench forgets responses between the runs of one item; a request of the run before is
    seen to have left the batch only at the next step, after the forget: its response stays out."""
    ssr = drafter()
    ssr.input_batch = batch = Batch({"a": PROMPT})
    batch.rows[0].append(5)
    ssr.propose([[5]], *batch.arrays())
    assert ssr.forget_responses() == 0
    ssr.input_batch = batch = Batch({"b": [1, 2, 3, 4]})  # a left before the forget; seen gone now
    batch.rows[0].append(1)
    ssr.propose([[1]], *batch.arrays())
    ssr.input_batch = Batch({})
    ssr.propose([], np.array([], dtype=np.int64), np.zeros((0, 1), dtype=np.int64))
    assert ssr.history.responses == [[1]] and not ssr.forgotten  # b's, after the forget, is kept
