"""bench/acceptance.py: ssr's prompt lookup replayed against recorded per-position acceptance
(hand-built records: acc_len by vLLM's V1 n-gram rule, worked out by hand)."""
from ssr.bench.acceptance import fidelity, replayed_acc_len


def test_acceptance_per_position_by_the_longest_earliest_ngram():
    # prompt 1 2 3 4 5 9; the output repeats 2 3 4 5 after "1 2 3"? It writes 1 2 3, then the
    # trigram "1 2 3" occurred at the prompt's start: 4 5 9 proposed, 4 5 written, then 7
    prompt, output = [1, 2, 3, 4, 5, 9], [1, 2, 3, 4, 5, 7, 8]
    # position 1: context ...9 1 -> no n >= 3 match (acc 1); 2: "9 1 2" no; 3: "1 2 3" earliest at 0
    # -> proposes 4 5 9 ..., output 4 5 7: 2 accepted (acc 3); 4: "2 3 4" -> 5 9 .. vs 5 7: acc 2;
    # 5: "3 4 5" -> 9 ... vs 7: acc 1; 6: "4 5 7" new: acc 1
    assert replayed_acc_len(prompt, output, 3, 7, 20) == [1, 1, 3, 2, 1, 1]


def test_fidelity_counts_the_positions_that_agree_and_names_the_others():
    record = {"id": "r", "prompt_token_ids": [1, 2, 3, 4, 5, 9], "generated_token_ids": [1, 2, 3, 4, 5, 7, 8],
              "acc_ngram": {"acc_len": [9, 1, 1, 3, 2, 1, 4]}}  # position 0 is the prefill's; 6 disagrees
    result = fidelity([record])
    assert (result.agree, result.total) == (5, 6) and result.misses == [("r", 6, 1, 4, 1)]


def test_steps_at_k_start_where_the_last_one_ended():
    from ssr.bench.acceptance import step_fidelity

    record = {"id": "r", "prompt_token_ids": [1, 2, 3, 4, 5, 9], "generated_token_ids": [1, 2, 3, 4, 5, 7, 8],
              "acc_ngram": {"acc_len": [9, 1, 1, 3, 2, 1, 4]}}
    # k = 1: steps at 1, 2, 3 (accepts 1: 4), 5, 6 -> five steps; 6 records 3 accepted (4 - 1, cut to 1)
    result = step_fidelity([record], k=1)
    assert (result.agree, result.total) == (4, 5) and result.misses == [("r", 6, 1, 2, 1)]
    # k = 3: steps at 1, 2, 3 (accepts 2: 4 5), 6 -> four steps, the last one a miss
    assert (step_fidelity([record], k=3).agree, step_fidelity([record], k=3).total) == (3, 4)
