"""bench/requests.py: a client request's passes after its CoT on vLLM, read from bench rows
(hand-built metrics, one per way the walk ends its CoT), and their price on a cost table."""
import pytest

from ssr.bench.report import group_name, render_table
from ssr.bench.requests import after_cot, format_requests, priced_steps, requests_table
from ssr.pricing.costs import H100_TOKEN_SHARE, gpu_preset


def metrics(answer, verify=None, answer_request=None, accepted_prefix=0, spec=None, requests=2):
    engine = {"requests": requests}
    if verify is not None:
        engine.update(verify_prompt_tokens=verify[0], verify_cached_tokens=verify[1])
    if answer_request is not None:
        engine.update(answer_prompt_tokens=answer_request[0], answer_cached_tokens=answer_request[1])
    if spec is not None:
        engine["speculation"] = {"answer": {"drafted": spec[0], "verify_steps": spec[1], "accepted": spec[2]}}
    return {"engine": engine, "answer_tokens": answer, "verify_passes": int(verify is not None),
            "accepted_prefix_tokens": accepted_prefix, "answer_accepted_tokens": spec[2] if spec else 0,
            "seconds": {"verify": 0.5, "continuation": 1.5}}


@pytest.mark.parametrize("row, requests, round_trips, passes", [
    # ar, CoT request then answer request: its prefill (3 past the cache) writes the 1st of 5 tokens
    (metrics(5, answer_request=(103, 100)), 2, 1, [3, 1, 1, 1, 1]),
    # ar, one request: 5 plain steps after the CoT
    (metrics(5, requests=1), 1, 0, [1, 1, 1, 1, 1]),
    # ssr: verify (10 + a 40-token draft past the cache; 30 accepted + the bonus), then an answer
    # request for the other 9: its prefill, then 8 tokens in 4 steps, 2 of them chains of 3 (4 accepted)
    (metrics(40, verify=(150, 100), answer_request=(131, 128), accepted_prefix=30, spec=(6, 2, 4), requests=4),
     4, 2, [50, 3, 4, 4, 1, 1]),
    # ssr-suffix, one request: 20 answer tokens in 5 steps, each a chain of 8 (15 accepted)
    (metrics(20, spec=(40, 5, 15), requests=2), 2, 0, [9, 9, 9, 9, 9]),
])
def test_the_passes_after_the_cot(row, requests, round_trips, passes):
    found = after_cot(row)
    assert (found["requests"], found["round_trips"]) == (requests, round_trips)
    assert sorted(found["passes"]) == sorted(passes)


def test_rows_that_are_not_vllm_walks_or_have_no_answer_are_left_out():
    assert after_cot({"engine": {}, "answer_tokens": 5}) is None
    assert after_cot(metrics(0)) is None


def test_passes_priced_in_steps():
    table = gpu_preset()
    assert priced_steps([1, 1, 1], table) == pytest.approx(3.0)
    assert priced_steps([256], table) == pytest.approx(1 + 255 * H100_TOKEN_SHARE)  # 1.75: the H100's slope
    assert priced_steps([8], table) == pytest.approx(1.021, abs=1e-3) and priced_steps([512], table) == pytest.approx(
        2.509, abs=1e-3)


def test_the_table_per_suite_and_mode():
    rows = [{"suite": "humaneval", "item": "a", "mode": mode, "metrics": m}
            for mode, m in (("ar", metrics(5, requests=1)), ("ssr", metrics(40, verify=(150, 100),
                            answer_request=(131, 128), accepted_prefix=30, spec=(6, 2, 4), requests=4)))]
    lines = requests_table(rows, group_name)
    assert [(line["mode"], line["passes"], line["priced_steps"] > line["passes"] - 1) for line in lines] == \
        [("ar", 5, True), ("ssr", 6, True)]
    text = format_requests(lines, render_table)
    assert "round trips" in text and "ssr" in text
