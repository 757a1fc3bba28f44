"""A GPU run's recorded acceptance replayed (bench/recorded.py), the drafters' costs of a measured
table (pricing/costs.py DraftCost) and the check against SpecDecode-Bench (bench/specdecode.py)."""
from __future__ import annotations

import json
import random

import pytest

from ssr.bench.recorded import RECORDED, RecordedProposer
from ssr.bench.trace_replay import CostSetting, replay_all, replay_trace
from ssr.bench.traces import load_traces, read_traces, tokenize_trace
from ssr.config import RECORDED_MODES, ConfigError
from ssr.pricing.costs import DraftCost, load_costs

H100 = CostSetting("specdecode-h100", load_costs("specdecode-h100"))
WRONG = 99  # a token the output never holds


@pytest.mark.parametrize("seen, acc_len, k, always, proposal", [
    # (output tokens committed, acc_len per position, k, drafts every step) -> the proposal
    (1, [1, 3, 1, 1, 1, 1], 3, False, [11, 12, WRONG]),  # 2 accepted at position 1, then one the model never writes
    (1, [1, 9, 1, 1, 1, 1], 3, False, [11, 12, 13]),  # more accepted than k: k
    (2, [1, 1, 1, 1, 1, 1], 3, False, []),  # nothing accepted, an n-gram: no draft (a plain step)
    (2, [1, 1, 1, 1, 1, 1], 3, True, [WRONG] * 3),  # EAGLE drafts k every step
    (4, [1, 1, 1, 1, 5, 1], 5, True, [14, 15, WRONG, WRONG, WRONG]),  # the output ends 2 tokens on: a wrong tail
    (5, [1, 1, 1], 3, True, [WRONG] * 3),  # past the record's end: nothing accepted
])
def test_the_recorded_proposer_proposes_what_the_gpu_run_accepted(seen, acc_len, k, always, proposal):
    output = [10, 11, 12, 13, 14, 15]
    proposer = RecordedProposer(output, acc_len, k, WRONG, always, "recorded")
    proposer.observe(output[:seen])
    span, _ = proposer.propose(64)
    assert span == proposal


def test_the_reference_modes_are_the_configs():
    assert set(RECORDED) == {mode.name for mode in RECORDED_MODES}


def _record_file(tmp_path, acc_eagle=None, name="bench-gsm8k.jsonl"):
    rng = random.Random(3)
    prompt = [rng.randrange(1000) for _ in range(50)]
    output = [rng.randrange(1000, 2000) for _ in range(60)]
    acc = acc_eagle if acc_eagle is not None else [1 + (i % 5) for i in range(len(output))]
    path = tmp_path / name
    path.write_text(json.dumps({"id": "a", "prompt_token_ids": prompt, "generated_token_ids": output,
                                "acc_ngram": {"acc_len": [1] * len(output)}, "acc_eagle": {"acc_len": acc}}) + "\n")
    return path, output, acc


@pytest.mark.parametrize("k", [3, 5])
def test_recorded_eagle_takes_the_steps_the_record_takes(tmp_path, k):
    """Each step emits min(acc_len[i], k + 1) tokens from the step's start (the bonus counted), in a
    pass of k + 1 tokens: the same output, the passes a walk over the record takes."""
    path, output, acc = _record_file(tmp_path)
    (tokens,) = [tokenize_trace(t, None) for t in load_traces([path])]
    (row,) = replay_all([tokens], ["recorded-eagle"], [H100], ["cold"], candidates="chain", recorded_k=k)
    position, expected = 1, {}  # the prefill wrote position 0
    while position < len(output):
        taken = min(acc[position] - 1, k, len(output) - position)
        if taken:
            expected[position] = taken
        position += taken + 1
    accepted = {e["at"]: e["accepted"] for e in row["trace"] if e["kind"] == "span" and e["accepted"]}
    assert row["identical"] and row["answer_ids"] == output
    assert accepted == expected and len(expected) > 10
    assert row["drafting_s"] > 0


def test_recorded_ngram_steps_plainly_where_nothing_was_accepted(tmp_path):
    path, output, _ = _record_file(tmp_path)
    (tokens,) = [tokenize_trace(t, None) for t in load_traces([path])]
    (row,) = replay_all([tokens], ["recorded-ngram"], [H100], ["cold"], candidates="chain")
    (ar,) = replay_all([tokens], ["ar"], [H100], ["cold"], candidates="chain")
    assert row["identical"] and row["drafting_s"] == 0 and row["metrics"]["total_s"] == pytest.approx(
        ar["metrics"]["total_s"])


def test_a_reference_mode_on_a_trace_without_its_record_is_refused(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"id": "x", "prompt_token_ids": [1, 2, 3], "generated_token_ids": [4, 5]}) + "\n")
    (tokens,) = [tokenize_trace(t, None) for t in load_traces([path])]
    with pytest.raises(ConfigError, match="recorded-eagle: trace 'x' of plain holds no acc_eagle"):
        replay_trace(tokens, "recorded-eagle", H100, "cold")


@pytest.mark.parametrize("record", [{"acc_len": [1, 0]}, {"acc_len": "3"}, [2, 3]])
def test_a_malformed_record_is_refused_by_line(tmp_path, record):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"prompt_token_ids": [1], "generated_token_ids": [2, 3], "acc_eagle": record}) + "\n")
    with pytest.raises(ConfigError, match="ids.jsonl:1: .*acc_eagle.acc_len must be a list of integers >= 1"):
        list(read_traces(path))


@pytest.mark.parametrize("batch, tokens, kv, verify, drafted", [
    # SpecDecode-Bench's predictor.py at their batch (B copies of a request, each `kv` cached):
    # verify = 3.92645679e-08 * B * kv + 2.10103129e-05 * B * tokens + 5.88590713e-03 + 1.20683946e-03;
    # EAGLE's draft = 2.37768493e-09 * B * kv + 8.41429603e-07 * tokens + 2.13526175e-03
    (1, 4, 500, 0.0071964201, 0.0021398163),
    (16, 4, 500, 0.0087515232, 0.0021576489),
    (16, 6, 2000, 0.0103662028, 0.0022163962),
])
def test_a_batch_reads_every_requests_kv_and_eagle_drafts_at_their_cost(batch, tokens, kv, verify, drafted):
    table = load_costs("specdecode-h100").at_batch(batch)
    assert table.score(tokens, kv) == pytest.approx(verify, rel=1e-5)
    assert table.drafting["eagle"].seconds(verify, tokens, kv) == pytest.approx(drafted, rel=1e-5)
    assert table.drafting["ngram"].seconds(verify, tokens, kv) == pytest.approx(0.005875 * verify)


def test_a_table_with_drafting_costs_reads_back_from_its_json(tmp_path):
    table = load_costs("specdecode-h100")
    path = tmp_path / "h100.json"
    path.write_text(table.to_json())
    again = load_costs(str(path))
    assert again.drafting == table.drafting and isinstance(again.drafting["eagle"], DraftCost)
    assert load_costs("gpu").drafting == {}  # ssr's preset prices no peer's drafter


def test_the_check_against_specdecode_bench_prints_predicted_against_measured(tmp_path, capsys):
    from ssr.bench.specdecode import main, workload

    path, _, _ = _record_file(tmp_path, name="llama3.1-8b-gsm8k.jsonl")
    assert workload(path) == "gsm8k" and workload(tmp_path / "other.jsonl") is None
    assert main([str(path), "--batch", "1,16", "--k", "3", "--ssr", "chain"]) == 0
    printed = capsys.readouterr().out
    assert "batch   1  EAGLE k=3    predicted" in printed and "EAGLE-3 measured 1.76" in printed
    assert "batch  16  n-gram k=3   predicted" in printed and "n-gram k=3 measured 1.15" in printed
    assert "batch  16  ssr chain    ratio to ar" in printed
