"""Traces that record draft children (`drafts`): read, tokenized at their fork points, replayed as
the loop runs a child (bench/trace_drafts.py), and the report on them (bench/draft_report.py)."""
from __future__ import annotations

import json
import re

import pytest

from ssr.bench.trace_drafts import DraftChoice
from ssr.bench.trace_replay import CostSetting, replay_all, replay_trace
from ssr.bench.traces import load_traces, parse_trace, read_traces, tokenize_trace
from ssr.config import ConfigError
from ssr.pricing.costs import CostTable, gpu_preset
from test_traces import WordVocab, reasoning

GPU = CostSetting("gpu", gpu_preset())
# a CPU's costs (llama.cpp on 2 cores): a second sequence in a step costs most of a step
CPU = CostSetting("cpu", CostTable(step_s={1: 0.04, 2: 0.07, 4: 0.13}, score_s={8: 0.16, 32: 0.6, 128: 2.3},
                                    prefill_token_s=0.015))


def record(seed: int = 0, drafts: list[tuple[int, float, str]] | None = None) -> dict:
    """A reasoning trace with drafts (budget, share of the CoT's characters seen, answer; None: one
    right draft at a third of the CoT and one wrong at two thirds)."""
    prompt, cot, answer = reasoning(seed, steps=30)
    wrong = "def g(x):\n    return x\n"
    drafts = drafts if drafts is not None else [(100, 1 / 3, answer), (200, 2 / 3, wrong)]
    return {"prompt": prompt, "cot": cot, "answer": answer, "model": "m", "task_id": f"t{seed}",
            "drafts": [{"budget_tokens": b, "cot_chars": int(share * len(cot)), "answer": text}
                       for b, share, text in drafts]}


def tokens_of(data: dict, vocab=None):
    return tokenize_trace(parse_trace(data, "set"), vocab or WordVocab())


def test_a_draft_forks_after_the_cot_tokens_it_saw():
    data = record()
    vocab = WordVocab()
    tokens = tokens_of(data, vocab)
    cut = data["drafts"][0]["cot_chars"]
    (first_at, first), (second_at, _) = tokens.drafts
    seen = vocab.tokenize(data["cot"][:cut])
    assert first_at == len(seen) and tokens.cot_ids[:first_at - 1] == seen[:-1]  # a word across the cut: in
    assert first == vocab.tokenize(data["answer"]) and first_at < second_at < len(tokens.cot_ids)


@pytest.mark.parametrize("draft, reason", [
    ({"budget_tokens": 5, "cot_chars": 0, "answer": "x"}, "must cut the CoT"),
    ({"budget_tokens": 5, "cot_chars": 10 ** 6, "answer": "x"}, "must cut the CoT"),
    ({"budget_tokens": 0, "cot_chars": 10, "answer": "x"}, "budget_tokens >= 1"),
    ({"budget_tokens": 5, "answer": "x"}, "needs budget_tokens, cot_chars and answer"),
    ({"budget_tokens": 5, "cot_chars": 10, "answer": 3}, "expected text"),
])
def test_a_draft_ssr_cannot_use_whole_refuses_its_line(tmp_path, draft, reason):
    data = record()
    data["drafts"] = [draft]
    path = tmp_path / "drafts.jsonl"
    path.write_text(json.dumps(data) + "\n")
    with pytest.raises(ConfigError, match=f"drafts.jsonl:1: not a trace .*{reason}"):
        list(read_traces(path))


def replay(data: dict, choice: str, mode: str = "ssr", setting: CostSetting = GPU, **options) -> dict:
    return replay_trace(tokens_of(data), mode, setting, "cold", drafts=DraftChoice.parse(choice),
                        budgets=(100, 200), **options)


def test_the_right_draft_is_the_answers_prefix_and_the_output_is_the_trace():
    data = record()
    answer_len = len(WordVocab().tokenize(data["answer"]))
    row = replay(data, "100")
    assert row["identical"] and [s["forked_at"] for s in row["metrics"]["stages"]] == [tokens_of(data).drafts[0][0]]
    assert row["metrics"]["accepted_prefix_tokens"] == answer_len + 1  # the whole answer and its EOS
    undrafted = replay(data, "none")
    assert undrafted["identical"] and not undrafted["metrics"]["stages"]
    # the whole answer in the pass that verifies the draft, the first answer token about as soon
    assert row["metrics"]["total_s"] < 0.9 * undrafted["metrics"]["total_s"]
    assert row["metrics"]["first_answer_token_s"] == pytest.approx(undrafted["metrics"]["first_answer_token_s"], rel=0.01)


def test_a_wrong_draft_is_rejected_and_changes_no_token():
    row = replay(record(), "200")
    assert row["identical"] and row["metrics"]["stages"] and row["metrics"]["accepted_prefix_tokens"] <= 3


def test_every_recorded_child_forks_in_turn_and_a_later_one_takes_the_earlier_draft_over():
    data = record(drafts=[(100, 1 / 3, record()["answer"]), (200, 2 / 3, record()["answer"])])
    row = replay(data, "all")
    stages = row["metrics"]["stages"]
    assert row["identical"] and len(stages) == 2 and stages[1]["bootstrapped"] > 0


def test_a_budget_the_cot_never_reached_forks_nothing():
    row = replay(record(), "4096")
    assert row["identical"] and not row["metrics"]["stages"]


def test_a_child_costs_a_step_beside_the_parent_where_batching_is_dear():
    """On a CPU a child's step costs most of a step, on a GPU next to nothing: a wrong draft (no
    spans: ssr-prefix) costs its steps, its fork and its verify pass on the CPU and about nothing
    on the GPU."""
    data = record(drafts=[(50, 0.1, "def g(x):\n    return x\n")])  # forked early, all but `def` wrong
    cpu = {c: replay(data, c, "ssr-prefix", CPU)["metrics"] for c in ("50", "none")}
    gpu = {c: replay(data, c, "ssr-prefix")["metrics"] for c in ("50", "none")}
    written = cpu["50"]["stages"][0]["written"]
    assert written > 5 and cpu["50"]["total_s"] - cpu["none"]["total_s"] > written * (0.07 - 0.04)
    assert gpu["50"]["total_s"] / gpu["none"]["total_s"] < 1.01


def test_modes_that_fork_no_child_ignore_the_drafts():
    data = record()
    for mode in ("ar", "suffix"):
        assert replay(data, "100", mode)["metrics"]["stages"] == []


def test_the_chain_replay_refuses_drafts_rather_than_dropping_them():
    with pytest.raises(ConfigError, match="--drafts none"):
        replay(record(), "100", candidates="chain")
    assert replay(record(), "none", candidates="chain")["identical"]


def test_the_plan_forks_at_a_recorded_budget_or_not_at_all():
    rows = replay_all([tokens_of(record(seed)) for seed in range(4)], ["ssr"], [GPU], ["deployment"],
                      drafts=DraftChoice.parse("plan"))
    for row in rows:
        plan = row["plan"]
        assert row["identical"]
        assert not plan["draft"] or plan["explain"]["budget"] in (100, 200)


def test_the_report_prints_every_choice_and_the_hindsight_line(tmp_path, capsys):
    from ssr.bench.draft_report import main

    path = tmp_path / "drafts.jsonl"
    path.write_text("".join(json.dumps(record(seed)) + "\n" for seed in range(3)))
    assert main([str(path), "--drafts", "none,100,plan", "--modes", "ar,ssr,paper", "--orders", "cold"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"cold +ssr +b=100", out) and re.search(r"cold +paper +plan", out) and "cold: ssr's plan" in out
    assert main([str(path), "--drafts", "sometimes"]) == 2
    assert "--drafts: give plan, all, none" in capsys.readouterr().err
    assert main([str(path), "--drafts", "100", "--modes", "ssr", "--orders", "cold", "--step2", "0.5"]) == 2
    assert "--step2 must be >= 1" in capsys.readouterr().err


def test_a_file_without_drafts_is_refused_by_the_report(tmp_path, capsys):
    from ssr.bench.draft_report import main

    data = record()
    del data["drafts"]
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps(data) + "\n")
    assert main([str(path)]) == 2 and "records draft children" in capsys.readouterr().err


def test_load_traces_keeps_the_drafts(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(record()) + "\n")
    (trace,) = load_traces([path])
    assert [d.budget_tokens for d in trace.drafts] == [100, 200]


def test_a_branch_that_copies_the_cots_own_end_marker_follows_the_parent_not_a_child():
    """A candidate span verified on a fork just before the CoT's natural end may begin with the end
    marker (a draft in the suffix tree holds it): the replayed model writes the answer after it,
    as after the parent's own end; a child forked where the CoT goes on writes its draft."""
    from ssr.bench.replay import ReplayEngine, RowModel

    model = RowModel(prompt_ids=[1, 2], cot_ids=[3, 4, 5], answer_ids=[6, 7], forced_end_ids=[5], answer_prefix_ids=[],
                     draft_ids=[8, 9], draft_forked_at=1)
    engine = ReplayEngine(model, gpu_preset())
    parent = engine.prefill([1, 2])
    engine.score(parent, [3])
    branch = engine.fork(parent)  # holds prompt + [3], pending 4: the CoT's next is its end, 5
    assert list(engine.score(branch, [4, 5, 6], ids=True)) == [5, 6, 7]
    child = engine.fork(engine.prefill([1, 2]))  # forked after the prompt, pending 3 (CoT tokens seen: 1)
    assert list(engine.score(child, [3, 5, 8], ids=True)) == [4, 8, 9]  # the CoT, then after the forced end its draft
