"""loop/vllm_walk.py on the fake model behind vLLM's request interface (no vLLM needed): identity
with `ar`, which draft is verified, the prefix-cache rule for prompt logprobs, requests."""
from dataclasses import replace

import pytest

from ssr.config import ConfigError, GenerationConfig, SamplingParams
from ssr.loop.vllm_walk import VllmGeneration
from ssr.engines.fake import FakeRequestsEngine
from ssr.formats.thinking import FORMATS

from test_decode_fake import FMT, PROMPT


def run(mode, engine=None, **overrides):
    engine = engine or FakeRequestsEngine()
    options = dict(mode=mode, thinking_budget=40, draft_at=15, draft_tokens=30, max_answer_tokens=60, policy="fixed")
    options.update(overrides)
    return VllmGeneration(engine, FMT, GenerationConfig(**options), PROMPT).run(), engine


def roles(engine):
    return [request_id.split("-")[-1] for request_id, _, _ in engine.opened]


@pytest.mark.parametrize("mode", ["ssr", "ssr-prefix"])
@pytest.mark.parametrize("draft_at, interval", [(0, 0), (7, 0), (15, 0), (39, 0), (4, 9), (20, 1)])
def test_greedy_identity_on_fake_requests(mode, draft_at, interval):
    expected, _ = run("ar")
    got, engine = run(mode, draft_at=draft_at, draft_interval=interval)
    assert got.cot_ids == expected.cot_ids and got.forced_ids == expected.forced_ids
    assert got.answer_ids == expected.answer_ids and got.answer == expected.answer
    forks = list(range(draft_at, 40, interval)) if interval else [draft_at]
    assert [stage["forked_at"] for stage in got.metrics.stages] == forks
    restarts = got.metrics.engine.get("child_restarts", 0)  # a bootstrapped child whose carried draft failed
    assert roles(engine).count("draft") == len(forks) + restarts and roles(engine).count("verify") == 1


def test_child_prompt_extends_the_parent_and_the_latest_draft_is_verified():
    got, engine = run("ssr", draft_at=10, draft_interval=10)
    parent_prompt = engine.opened[0][1]
    drafts = [(prompt, params) for request_id, prompt, params in engine.opened if request_id.endswith("draft")]
    forced = engine.tokenize(FMT.forced_end + FMT.answer_prefix)
    contexts = [parent_prompt + got.cot_ids[: stage["forked_at"]] + forced for stage in got.metrics.stages]
    for prompt, params in drafts:  # each extends a stage's context; later stages carry a draft after it
        context = next(c for c in contexts if prompt[: len(c)] == c)
        carried = len(prompt) - len(context)
        assert (carried == 0) == (context == contexts[0])
        assert params.max_tokens == max(1, 30 - carried) and params.temperature == 0
    assert len(drafts) == len(contexts) + got.metrics.engine.get("child_restarts", 0)
    steady, _ = run("ssr", engine=FakeRequestsEngine(drift=0.0), draft_at=10, draft_interval=10)  # CoT barely matters
    assert [stage["bootstrapped"] for stage in steady.metrics.stages] == [0, 30, 30]  # carried on, not redone
    assert [stage["accepted"] for stage in steady.metrics.stages[:2]] == [30, 30]  # by the next stage
    used = [stage for stage in got.metrics.stages if stage["used"]]
    assert used == [got.metrics.stages[-1]] and used[0]["accepted"] == got.metrics.accepted_prefix_tokens
    verify = next(prompt for request_id, prompt, _ in engine.opened if request_id.endswith("verify"))
    assert verify == parent_prompt + got.cot_ids + got.forced_ids + got.draft_ids


def test_ar_is_a_cot_request_then_an_answer_request():
    got, engine = run("ar")
    assert roles(engine) == ["parent", "answer"]
    assert engine.opened[1][1] == PROMPT + got.cot_ids + got.forced_ids


NATIVE = replace(FORMATS["think"], start="", end="x", forced_end="x")  # the fake model writes "x" itself


def run_native(mode, engine=None, **overrides):
    engine = engine or FakeRequestsEngine()
    options = dict(mode=mode, max_tokens=150, draft_at=4, draft_tokens=30, policy="fixed")
    options.update(overrides)
    return VllmGeneration(engine, NATIVE, GenerationConfig(**options), PROMPT).run(), engine


@pytest.mark.parametrize("mode, method", [("ar", None), ("ar", "ssr"), ("ssr-suffix", "ssr"), ("ssr-suffix", "suffix")])
def test_where_nothing_comes_between_cot_and_answer_the_parent_request_writes_both(mode, method):
    """A CoT that ends itself, nothing to force or ban, no draft verified in a request of its own:
    the parent's request goes on into the answer (stock vLLM's one request), children beside it;
    the tokens are those of a CoT request then an answer request (a budget the CoT never reaches)."""
    engine = FakeRequestsEngine()
    engine.speculative_method = method
    two, two_engine = run_native("ar", thinking_budget=100)
    one, engine = run_native(mode, engine)
    assert roles(two_engine) == ["parent", "answer"] and two.metrics.cot_end == "natural"
    assert roles(engine) == ["parent"] + ["draft"] * (mode != "ar")
    assert one.output_ids == two.output_ids and one.answer == two.answer and one.answer_ids
    assert (one.metrics.cot_tokens, one.metrics.answer_tokens) == (two.metrics.cot_tokens, two.metrics.answer_tokens)
    assert engine.opened[0][2].max_tokens == 150 and not engine.opened[0][2].allowed_token_ids


def test_ssr_suffix_on_vllm_needs_a_method_that_copies_the_draft():
    engine = FakeRequestsEngine()
    for method in (None, "ngram"):
        engine.speculative_method = method
        with pytest.raises(ConfigError, match="ssr-suffix on vLLM needs a speculative method"):
            run_native("ssr-suffix", engine)


def test_a_verified_draft_or_a_budget_keeps_the_answer_request():
    engine = FakeRequestsEngine()
    engine.speculative_method = "ssr"
    got, engine = run_native("ssr", engine)
    assert roles(engine) == ["parent", "draft", "verify", "answer"] and got.metrics.cot_end == "natural"
    _, engine = run_native("ar", thinking_budget=10)
    assert roles(engine) == ["parent", "answer"]


@pytest.mark.parametrize("mode", ["ar", "ssr"])
def test_a_thinking_budget_of_0_opens_no_cot_request(mode):
    """As the sequence walk: no CoT token decoded, no child; the end marker forced at once."""
    got, engine = run(mode, thinking_budget=0, draft_at=0)
    assert got.cot_ids == [] and got.metrics.cot_end == "budget" and "parent" not in roles(engine)
    assert "draft" not in roles(engine) and got.forced_ids and got.answer_ids
    expected, _ = run("ar", thinking_budget=0, draft_at=0)
    assert got.answer_ids == expected.answer_ids


def test_verify_reads_the_cache_but_not_into_the_draft():
    """vLLM's prompt-logprob rows under a cache hit are junk: a hit reaching into the draft
    (an earlier request wrote the same answer) must send the verify request again uncached.
    Without drift the draft is the answer, so the cache of ar's answer reaches into it."""
    engine = FakeRequestsEngine(drift=0.0)
    expected, _ = run("ar", engine=engine)  # caches prompt + CoT + answer
    got, _ = run("ssr", engine=engine, draft_at=30)
    assert got.answer_ids == expected.answer_ids
    assert got.metrics.engine["verify_cache_reaches_draft"] > len(PROMPT) + len(got.cot_ids)
    verifies = [params for request_id, _, params in engine.opened if request_id.endswith("verify")]
    assert [params.skip_reading_prefix_cache for params in verifies] == [False, True]
    fresh, fresh_engine = run("ssr", engine=FakeRequestsEngine(drift=0.0), draft_at=30)  # nothing cached beyond the CoT: one request
    assert "verify_cache_reaches_draft" not in fresh.metrics.engine
    assert fresh.metrics.engine["verify_cached_tokens"] > 0 and roles(fresh_engine).count("verify") == 1


def test_junk_rows_would_be_caught():
    """The identity test above can fail: reading junk rows accepts or rejects wrongly."""
    engine = FakeRequestsEngine(drift=0.0)
    run("ar", engine=engine)
    generation = VllmGeneration(engine, FMT, GenerationConfig(
        mode="ssr", thinking_budget=40, draft_at=30, draft_tokens=30, max_answer_tokens=60, policy="fixed"), PROMPT)
    ar = run("ar", engine=FakeRequestsEngine(drift=0.0))[0]
    context = PROMPT + ar.cot_ids + engine.tokenize(FMT.forced_end + FMT.answer_prefix)
    draft = ar.answer_ids[:20]
    generation.metrics.engine = {}
    generation._open = []
    output = generation._verify_request(context + draft, reads_cache=True)  # the unsafe read
    rows = output.prompt_logprobs
    junk = [min(t for t, lp in rows[len(context) + i].items() if lp.rank == 1) for i in range(len(draft))]
    assert junk != draft  # what a verifier reading them would have seen


def test_sampling_without_top_k_decodes_plainly_and_modes_are_checked():
    sampling = SamplingParams(temperature=0.8, seed=3)  # top_k 0: rows of 20 cannot be exact
    expected, _ = run("ar", sampling=sampling)
    got, engine = run("ssr", sampling=sampling)
    assert got.answer_ids == expected.answer_ids and "draft" not in roles(engine)
    assert "sampling on vLLM" in got.metrics.policy["explain"]["reason"]
    assert "max_logprobs (20)" in got.metrics.policy["explain"]["reason"]
    with pytest.raises(ConfigError, match="--speculative-method"):
        run("suffix")
    with pytest.raises(ConfigError, match="context-size"):  # the prompt and max_tokens do not fit
        run("ar", engine=FakeRequestsEngine(context_size=64), max_tokens=64)


def answer_prefixes(mode, seeds, length=1, **options):
    from collections import Counter

    counts = Counter()
    for seed in seeds:
        sampling = SamplingParams(temperature=1.3, top_k=6, top_p=0.95, seed=seed)
        settings = dict(thinking_budget=12, draft_at=2, draft_interval=4, draft_tokens=4, max_answer_tokens=length)
        engine = FakeRequestsEngine(drift=2.0)  # the whole context weighs: the child's q differs from p
        got, _ = run(mode, engine=engine, sampling=sampling, **{**settings, **options})
        counts[tuple(got.answer_ids[:length])] += 1
    return counts


def test_sampled_ssr_on_requests_keeps_ar_distribution():
    """Sampled requests draft, bootstrap and verify on top-k rows; the answer's distribution is
    ar's (two-sample chi-square over the first answer token)."""
    from test_decode_fake import contingency_p

    sampling = SamplingParams(temperature=1.3, top_k=6, seed=5)
    got, engine = run("ssr", sampling=sampling, draft_at=3, draft_interval=4, thinking_budget=12)
    assert got.metrics.stages and got.metrics.verify_passes == 1
    drafts = [params for request_id, _, params in engine.opened if request_id.endswith("draft")]
    assert all(params.logprobs == 6 and params.temperature == 1.3 for params in drafts)
    ar = answer_prefixes("ar", range(0, 700))
    ssr = answer_prefixes("ssr", range(5000, 5700))
    assert contingency_p(ar, ssr) > 1e-3


def test_sampled_distribution_test_catches_a_biased_verifier(monkeypatch):
    """The test above can fail: a verifier that accepts every draft token is caught."""
    import ssr.loop.vllm_walk as decode_vllm
    from ssr.verifying.verify import Verdict

    from test_decode_fake import contingency_p

    def accept_all(draft_ids, draft_rows, target_rows, bonus, params, rng, approx=False):
        return Verdict(len(draft_ids), bonus, False)

    ar = answer_prefixes("ar", range(0, 700))
    monkeypatch.setattr(decode_vllm, "verify_sampled_rows", accept_all)
    biased = answer_prefixes("ssr", range(5000, 5700), draft_interval=0)
    assert contingency_p(ar, biased) < 1e-3


def test_a_one_token_end_marker_stops_the_cot_as_a_stop_token():
    """A reasoning model's </think> is one token: the CoT request stops on it in vLLM's scheduler
    (which then reports its spec-decode metrics), not on a stop string; same output either way."""
    from dataclasses import replace

    one_token = replace(FMT, end="|", forced_end="\n|")
    engine = FakeRequestsEngine()
    config = GenerationConfig(mode="ssr", thinking_budget=40, draft_at=15, draft_tokens=30, max_answer_tokens=60,
                              policy="fixed")
    got = VllmGeneration(engine, one_token, config, PROMPT).run()
    params = engine.opened[0][2]
    assert ord("|") in params.stop_token_ids and not params.stop
    two_tokens = FakeRequestsEngine()
    VllmGeneration(two_tokens, replace(one_token, end="||", forced_end="\n||"), config, PROMPT).run()
    assert two_tokens.opened[0][2].stop == ["||"] and ord("|") not in two_tokens.opened[0][2].stop_token_ids
    assert got.metrics.cot_end in ("natural", "budget") and got.cot_ids == \
        VllmGeneration(FakeRequestsEngine(), one_token, replace(config, mode="ar"), PROMPT).run().cot_ids


@pytest.mark.parametrize("mode", ["ar", "ssr"])
def test_host_time_on_requests_leaves_out_the_waits_for_outputs(mode):
    """metrics.host_s on the request path: wall time less the time blocked on vLLM's outputs;
    engine_passes: the requests' outputs (one engine step each)."""
    import time

    start = time.perf_counter()
    got, _ = run(mode)
    wall = time.perf_counter() - start
    m = got.metrics
    assert m.engine_passes >= m.cot_tokens + m.answer_tokens - (m.accepted_prefix_tokens + 1) * (mode == "ssr")
    assert 0 < m.host_s < wall


@pytest.mark.parametrize("running, drafts", [(0, True), (31, False)])
def test_a_child_is_priced_at_the_batch_it_would_run_in(running, drafts):
    """A pass is one step up to 16 tokens, then grows with them (compute-bound): alone, a child
    rides free in the parent's step; among 31 other requests it doubles the step, and is not forked."""
    from ssr.pricing.costs import CostModel, CostTable

    table = CostTable(step_s={1: 1.0, 2: 1.0, 4: 1.0}, score_s={8: 1.0, 16: 1.0, 32: 2.0, 64: 4.0, 128: 8.0,
                                                                 256: 16.0, 512: 32.0}, prefill_token_s=0.01)
    engine = FakeRequestsEngine()
    engine.live_requests = lambda: running
    config = GenerationConfig(mode="ssr", max_tokens=150, policy="auto")
    walk = VllmGeneration(engine, NATIVE, config, PROMPT, costs=CostModel(table=table))
    assert walk.plan.explain["batch"] == running + 1 and walk.plan.draft is drafts


@pytest.mark.parametrize("mode", ["ar", "ssr-suffix", "ssr"])
def test_a_budget_is_vllms_own_where_the_engine_knows_the_models_markers(mode):
    """A model of its own format on an engine that knows its markers: the budget is vLLM's
    thinking_token_budget (counted from the prompt's start marker), its end marker what every mode
    forces; ar and ssr-suffix are one request, and every mode writes the tokens of the walk that
    stops the CoT at the budget and forces the same marker in an answer request."""
    def engine(markers):
        fake = FakeRequestsEngine()
        fake.speculative_method, fake.budget_markers = "ssr", markers
        return fake

    prompt = PROMPT + [ord("<"), ord("\n")]  # the start marker, then a token the budget counts
    native = replace(NATIVE, start="<", end="z")  # written at the 27th token: a budget of 5 ends the CoT
    plain = VllmGeneration(engine(None), replace(native, forced_end="z"),
                           GenerationConfig(mode="ar", max_tokens=150, thinking_budget=5, policy="fixed"), prompt).run()
    fake = engine(([ord("<")], [ord("z")]))
    walk = VllmGeneration(fake, native, GenerationConfig(mode=mode, max_tokens=150, thinking_budget=5, draft_at=2,
                                                         policy="fixed"), prompt)
    got = walk.run()
    assert plain.metrics.cot_end == got.metrics.cot_end == "budget" and got.forced_ids == [ord("z")]
    assert got.output_ids == plain.output_ids and got.answer_ids and len(got.cot_ids) == 5
    one = mode != "ssr"
    assert (roles(fake)[-1] == "answer") is not one and walk.vllm_budget == 5 + 1
    if one:
        assert fake.opened[0][2].thinking_token_budget == 6
