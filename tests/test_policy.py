"""Span length from engine costs: tables with hand-set costs."""
import pytest

from ssr.pricing.costs import CostModel
from ssr.pricing.acceptance import AcceptanceStats
from ssr.pricing.span_cut import best_span_length
from ssr.proposing.source import Source

BAD, GOOD = Source("bad"), Source("good")  # sources of spans always rejected, always accepted
SUFFIX, LOOKUP = Source("suffix"), Source("lookup")

GPU_LIKE = CostModel(step_s=0.020, token_s=0.0002)  # a pass of k tokens ~ one step
CPU_LIKE = CostModel(step_s=0.050, token_s=0.020)  # every scored token costs 0.4 step

CASES = [
    ("GPU: confident span taken whole", GPU_LIKE, [1.0] * 8, 8),
    ("GPU: even unlikely tokens are nearly free", GPU_LIKE, [0.5, 0.25, 0.12], 3),
    ("CPU: confident span taken whole", CPU_LIKE, [1.0] * 8, 8),
    ("CPU: unlikely span dropped", CPU_LIKE, [0.2, 0.04, 0.01], 0),
    ("CPU: cut where confidence falls", CPU_LIKE, [0.95, 0.9, 0.85, 0.1, 0.05], 3),
    ("empty proposal", CPU_LIKE, [], 0),
]


@pytest.mark.parametrize("name,costs,probs,expected", CASES, ids=[c[0] for c in CASES])
def test_best_span_length(name, costs, probs, expected):
    assert best_span_length(probs, costs) == expected


def test_cost_model_learns_from_observations():
    costs = CostModel(step_s=0.1, token_s=0.1, smoothing=0.5)
    for _ in range(30):
        costs.observe_step(0.04)
        costs.observe_score(11, 0.04 + 10 * 0.01)
    assert costs.step_s == pytest.approx(0.04, rel=1e-3)
    assert costs.token_s == pytest.approx(0.01, rel=1e-2)


def test_acceptance_stats_survival_curve():
    stats = AcceptanceStats(prior_weight=0.0, decay=1.0)
    stats.observe(num_proposed=4, num_accepted=4)  # tries 4, none fails
    stats.observe(num_proposed=4, num_accepted=1)  # tries 2, fails at the 2nd
    stats.observe(num_proposed=2, num_accepted=0)  # tries 1, fails at the 1st
    # Kaplan-Meier: position 1: 1 of 3 fail; position 2: 1 of 2; positions 3, 4: 0 of 1
    assert stats.probs(4) == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    copied = AcceptanceStats()  # copied text: spans accepted whole, or failing at once
    for _ in range(10):
        copied.observe(8, 8)
        copied.observe(8, 0)
    assert copied.probs(32)[-1] > 0.35  # past what was tried: the pooled later hazard (~0), not 0.65 ** 32
    assert AcceptanceStats().probs(3) == pytest.approx([0.9, 0.9 * 0.65, 0.9 * 0.65 ** 2])  # the prior alone
    turned = AcceptanceStats()
    for _ in range(20):
        turned.observe(8, 8)  # a copied region ...
    for _ in range(5):
        turned.observe(8, 0)  # ... ends: recent failures weigh more than old successes
    assert turned.probs(1)[0] < 0.6  # 20 successes then 5 failures: without decay 0.81


def _km_oracle(stats, risk, fail, length):
    """The class docstring's shrunk Kaplan-Meier, from counts decayed eagerly."""
    weight, pooled = stats.prior_weight, None
    pooled = (sum(fail[1:]) + weight * (1 - stats.prior_rate)) / (sum(risk[1:]) + weight)
    out, survival = [], 1.0
    for j in range(length):
        if j < len(risk):
            prior = weight * (1 - stats.prior_first) if j == 0 else weight * pooled
            survival *= 1 - (fail[j] + prior) / (risk[j] + weight)
        else:
            survival *= 1 - ((1 - stats.prior_first) if j == 0 else pooled)
        out.append(survival)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_acceptance_counts_decay_lazily_as_if_every_count_decayed_each_time(seed):
    """Counts kept in shrinking units (folded back now and then) are the counts decayed at every
    observation, and the curve is the Kaplan-Meier of those."""
    import random

    rng = random.Random(seed)
    stats = AcceptanceStats(decay=rng.choice([0.5, 0.9]), prior_first=rng.random())
    risk, fail = [], []
    for step in range(2500):  # 0.5 ** 2500: the units fold several times
        proposed = rng.randrange(1, 10)
        accepted = rng.randrange(0, proposed + 1) if rng.random() < 0.5 else 0
        stats.observe(proposed, accepted)
        tried = min(proposed, accepted + 1)
        risk = [count * stats.decay for count in risk] + [0.0] * max(0, tried - len(risk))
        fail = [count * stats.decay for count in fail] + [0.0] * max(0, tried - len(fail))
        for j in range(tried):
            risk[j] += 1
        if accepted < proposed:
            fail[accepted] += 1
        if step % 97 == 0 or step > 2490:
            assert stats.at_risk == pytest.approx(risk, rel=1e-9, abs=1e-300)
            assert stats.failed == pytest.approx(fail, rel=1e-9, abs=1e-300)
            assert stats.probs(12) == pytest.approx(_km_oracle(stats, risk, fail, 12), rel=1e-9)
    carried = stats.carried(0.75)
    assert carried.at_risk == pytest.approx([count * 0.75 for count in risk], rel=1e-9)
    carried.observe(3, 0)
    assert stats.at_risk == pytest.approx(risk, rel=1e-9)  # a copy: the original is untouched

# -- the drafting plan (--policy auto) ----------------------------------------------------

from ssr.config import GenerationConfig  # noqa: E402
from ssr.pricing.costs import CostTable, gpu_preset  # noqa: E402
from ssr.pricing.drafting import (PolicyStats, best_verify_chunk, expected_verify_s, found_in_draft,  # noqa: E402
                        plan_request, stage_budgets)

# engine cost tables measured here (ssr calibrate), and the GPU preset
QWEN_LLAMA_CPU = CostTable(step_s={1: 0.044, 2: 0.063, 4: 0.098}, score_s={8: 0.17, 32: 0.74, 128: 2.66, 512: 11.45},
                       prefill_token_s=0.0144)
SMOL_LLAMA_CPU = CostTable(step_s={1: 0.0147, 2: 0.0333}, score_s={8: 0.04, 32: 0.16, 128: 0.62, 512: 2.4},
                       prefill_token_s=0.002)
SMOL_TORCH_CPU = CostTable(step_s={1: 0.082, 2: 0.106, 4: 0.181}, score_s={8: 0.088, 32: 0.13, 128: 0.356, 512: 1.848},
                       prefill_token_s=0.0019)
CONFIG = GenerationConfig(mode="ssr", thinking_budget=1024, draft_at=64, draft_tokens=256, max_answer_tokens=1536)

PLANS = [
    ("GPU: drafting is nearly free", gpu_preset(), True),
    ("transformers on CPU: a 2nd sequence +29%, scoring cheap", SMOL_TORCH_CPU, True),
    ("llama.cpp qwen on CPU: a draft token 0.43 step + 0.5 step to verify", QWEN_LLAMA_CPU, False),
    ("llama.cpp smollm on CPU: a 2nd sequence costs more than the 1st", SMOL_LLAMA_CPU, False),
]


@pytest.mark.parametrize("name,table,drafts", PLANS, ids=[p[0] for p in PLANS])
def test_plan_drafts_only_where_it_pays(name, table, drafts):
    plan = plan_request(CONFIG, CostModel(table=table), PolicyStats())
    assert plan.draft is drafts
    explain = plan.explain
    assert explain["policy"] == "auto" and explain["run"] == ("batched" if drafts else "none")
    assert (explain["predicted_s"]["net_gain_per_draft"] > 0) is drafts
    assert explain["reason"].startswith("draft" if drafts else "no draft")
    assert plan.stages == ((CONFIG.draft_at,) if drafts else ())  # no statistics yet: the flag's b_d


def test_plan_learns_when_to_fork_and_how_long_to_draft():
    stats = PolicyStats()
    for cot, answer in [(400, 120), (500, 150), (600, 200)]:
        stats.cot_tokens.append(cot)
        stats.answer_tokens.append(answer)
    plan = plan_request(CONFIG, CostModel(table=gpu_preset()), stats)
    assert plan.draft_tokens == 150  # the typical answer, not the 256 allowed
    assert plan.stages == (500 - 150,)  # late enough to see most of the CoT, early enough to finish
    multi = plan_request(GenerationConfig(mode="ssr", draft_interval=100, thinking_budget=1024),
                         CostModel(table=gpu_preset()), stats)
    assert multi.stages == (350, 450, 550, 650, 750, 850, 950)
    # no budget: stages run to the request's own CoT cap (the walk's output limit)
    unbounded = plan_request(GenerationConfig(mode="ssr", draft_interval=100), CostModel(table=gpu_preset()), stats,
                             cot_cap=700)
    assert unbounded.stages == (350, 450, 550, 650)


def test_plan_prices_cot_spans_a_child_turns_off_unless_passes_are_shared():
    """Where CoT spans accept half the CoT, a child that turns them off for its life loses; an
    engine that verifies the spans and steps the child in one pass loses nothing, and forks
    earlier (the CoT takes fewer passes, the child writes one token per pass)."""
    stats = PolicyStats(cot_open_tokens=1000.0, cot_span_accepted=500.0)
    for cot, answer in [(400, 120), (500, 150), (600, 200)]:
        stats.cot_tokens.append(cot)
        stats.answer_tokens.append(answer)
    apart = plan_request(CONFIG, CostModel(table=gpu_preset()), stats)
    assert not apart.draft and apart.explain["predicted_s"]["cot_spans_lost"] > 0
    shared = plan_request(CONFIG, CostModel(table=gpu_preset()), stats, spans_beside_child=True)
    assert shared.draft and shared.explain["predicted_s"]["cot_spans_lost"] == 0
    assert shared.explain["cot_tokens_per_pass"] == pytest.approx(2.0)
    assert shared.stages == (max(500 // 4, 500 - 2 * 150),)
    observed = PolicyStats()
    metrics = type("M", (), dict(cot_tokens=300, answer_tokens=50, accepted_prefix_tokens=0, mode="ssr",
                                 seconds={"continuation": 1.0}, cot_accepted_tokens=90, spans_beside_child=True,
                                 stages=[{"written": 100}]))
    observed.observe(metrics, [], [], [])
    assert observed.cot_span_rate == pytest.approx(0.3)  # every CoT token had spans on
    metrics.spans_beside_child = False
    observed.observe(metrics, [], [], [])
    assert observed.cot_span_rate == pytest.approx(180 / 500)  # the child's 100 tokens had none


def test_plan_prices_draft_tokens_at_the_speed_earlier_requests_saw():
    """A cost table probed at a short context prices a long prompt's steps low, while the
    saving side (seconds per answer token) is measured on the requests themselves: priced
    at one speed the child looks worth it (LongProc countdown, 6.6k-token prompts, 3x slower
    steps), priced at the speed those requests saw it is not."""
    def long_prompt_stats(**drifts) -> PolicyStats:
        stats = PolicyStats(answer_s=0.13 * 100, answer_count=100, **drifts)  # 130 ms per answer token
        for cot, answer in [(400, 120), (450, 150)]:
            stats.cot_tokens.append(cot)
            stats.answer_tokens.append(answer)
        return stats

    optimistic = plan_request(CONFIG, CostModel(table=QWEN_LLAMA_CPU), long_prompt_stats())
    assert optimistic.draft
    priced = plan_request(CONFIG, CostModel(table=QWEN_LLAMA_CPU),
                          long_prompt_stats(step_drifts=[3.1, 2.9, 3.0], score_drifts=[2.5, 2.5, 2.6]))
    assert not priced.draft
    assert priced.explain["predicted_s"]["step_1"] == pytest.approx(3.0 * 0.044)
    learnt = PolicyStats()  # a request's own cost model tells the stats its drifts
    costs = CostModel(table=QWEN_LLAMA_CPU)
    for _ in range(30):
        costs.observe_step(3.0 * 0.044)
    metrics = type("M", (), dict(cot_tokens=300, answer_tokens=50, accepted_prefix_tokens=0, mode="ar",
                                 seconds={}, cot_accepted_tokens=0, spans_beside_child=False, stages=[]))
    learnt.observe(metrics, [], [], [], costs)
    assert learnt.step_drifts == [pytest.approx(3.0, rel=0.01)] and learnt.score_drifts == [1.0]
    assert learnt.priced(CostModel(table=QWEN_LLAMA_CPU)).step(2) == pytest.approx(3.0 * 0.063, rel=0.01)
    assert PolicyStats().priced(costs) is costs and learnt.priced(CostModel()).table is None


def test_fixed_policy_and_plain_modes_follow_the_flags():
    fixed = plan_request(GenerationConfig(mode="ssr", policy="fixed", draft_at=10, draft_interval=20,
                                          thinking_budget=60), CostModel(table=SMOL_LLAMA_CPU), PolicyStats())
    assert fixed.draft and fixed.stages == (10, 30, 50)
    for mode in ("ar", "suffix", "pld"):
        assert not plan_request(GenerationConfig(mode=mode), CostModel(), PolicyStats()).draft


def test_verify_chunk_follows_the_score_cost():
    gpu, cpu = CostModel(table=gpu_preset()), CostModel(table=QWEN_LLAMA_CPU)
    assert best_verify_chunk(256, 1.0, gpu) == 256  # all will match: one pass, ~ one step
    assert best_verify_chunk(256, 0.97, gpu) >= 64  # a pass costs ~ one step up to a few hundred tokens
    assert best_verify_chunk(256, 0.97, cpu) <= 32  # every scored token costs: stop early
    # a chunk that always reaches the end costs the same as one pass over all, on a linear engine
    assert expected_verify_s(64, 8, 1.0, cpu) >= expected_verify_s(64, 64, 1.0, cpu)
    assert expected_verify_s(64, 8, 0.0, cpu) < expected_verify_s(64, 64, 0.0, cpu)


def test_cost_model_scales_a_measured_table_by_drift():
    model = CostModel(table=QWEN_LLAMA_CPU, smoothing=0.5)
    assert model.cost(1) == pytest.approx(0.044) and model.cost(32) == pytest.approx(0.74)
    for _ in range(20):
        model.observe_step(0.088)  # the machine got twice as slow
    assert model.cost(1) == pytest.approx(0.088, rel=1e-3) and model.step(2) == pytest.approx(0.126, rel=1e-3)
    assert model.cost(32) == pytest.approx(0.74)  # score passes keep their own factor ...
    for _ in range(20):
        model.observe_score(32, 2.22)  # ... learnt from their own calls: 3x the table at a long context
    assert model.cost(32) == pytest.approx(2.22, rel=1e-3) and model.cost(1) == pytest.approx(0.088, rel=1e-3)


def test_stage_budgets():
    assert stage_budgets(64, 0, 1024) == (64,)
    assert stage_budgets(0, 500, 2000) == (0, 500, 1000, 1500)
    assert stage_budgets(1024, 100, 1024) == ()


def test_found_in_draft_counts_what_only_the_draft_knew():
    draft = [1, 2, 3, 4, 5, 6]
    known = [9, 9, 1, 2, 3, 4]  # the prompt already holds 1 2 3 4
    answer = [1, 2, 3, 4, 5, 6, 7]
    assert found_in_draft(answer, draft, known) == 2  # (2 3 4 5) and (3 4 5 6)


def test_policy_stats_learn_usage():
    from ssr.metrics import Metrics

    stats = PolicyStats(draft_tokens=0, used_tokens=0, accepted_prefix=0, drafts=0)
    metrics = Metrics(mode="ssr", cot_tokens=100, answer_tokens=20, accepted_prefix_tokens=5)
    metrics.seconds["continuation"] = 1.5
    stats.observe(metrics, draft_ids=list(range(10)), answer_ids=list(range(5)) + [50] * 15, known_ids=[])
    assert stats.used_fraction == pytest.approx(0.5) and stats.accept_rate == pytest.approx(5 / 6)
    assert stats.answer_s / stats.answer_count == pytest.approx(0.1)
    assert stats.expected_cot(64) == 64 and stats.expected_answer() == 20


def test_engine_costs_are_measured_once_then_rescaled(tmp_path, monkeypatch):
    """The start-up probe is cached per engine setup; later starts only time a few steps."""
    from ssr.pricing.probe import engine_costs
    from ssr.engines.fake import FakeEngine

    monkeypatch.setenv("SSR_CACHE", str(tmp_path))
    engine = FakeEngine()
    engine.cost_key = "fake-setup"
    lines = []
    first = engine_costs(engine, log=lines.append)
    assert len(lines) == 1 and (tmp_path / "costs" / "fake-setup.json").is_file()
    assert {1, 2} <= set(first.step_s) and {8, 32, 128} <= set(first.score_s)
    calls = engine.calls["score"]
    second = engine_costs(engine, log=lines.append)
    assert len(lines) == 1 and engine.calls["score"] == calls  # no probe: steps only
    assert "rescaled" in second.source
    assert second.score_s[32] / second.step_s[1] == pytest.approx(first.score_s[32] / first.step_s[1])
    assert engine.live_sequences() == 0


def test_span_cut_follows_each_sources_measured_acceptance():
    from ssr.pricing.span_policy import SpanPolicy

    policy = SpanPolicy(CPU_LIKE)
    assert len(policy.cut([1] * 20, Source("new"))) > 0  # a source naming no match: the optimistic prior, tried
    for _ in range(30):
        policy.observe(8, 0, source=BAD)  # first token always rejected
        policy.observe(8, 8, source=GOOD)
    assert policy.cut([1] * 20, BAD) == []
    assert len(policy.cut([1] * 20, GOOD)) >= 8


CHOICES = [  # (candidates, observations per source (proposed, accepted) x 8, expected source, expected length);
    # spans are priced by each source's measured acceptance
    ([(SUFFIX, [1, 2]), (LOOKUP, [5, 6, 7, 8])], {}, LOOKUP, 4),
    ([(SUFFIX, [1, 2, 3]), (LOOKUP, [5, 6, 7, 8])], {LOOKUP: (4, 0)}, SUFFIX, 3),
    ([(SUFFIX, [1, 2, 3]), (LOOKUP, [5, 6, 7, 8, 9, 10])], {LOOKUP: (6, 6)}, LOOKUP, 6),
]


@pytest.mark.parametrize("candidates,observed,source,length", CHOICES)
def test_span_policy_chooses_the_source_worth_most(candidates, observed, source, length):
    from ssr.pricing.span_policy import SpanPolicy

    policy = SpanPolicy(CostModel(step_s=0.010, token_s=0.001))  # GPU-like: long spans are cheap
    for name, (proposed, accepted) in observed.items():
        for _ in range(8):
            policy.observe(proposed, accepted, source=name)
    chosen, span = policy.choose(candidates)
    assert (chosen, len(span)) == (source, length)


def test_span_acceptance_carries_to_the_next_request_and_fades():
    """A source that failed in earlier requests is skipped from a new request's first proposal
    (no pass paid to learn it again), and tried again once its record has faded."""
    from ssr.pricing.span_policy import SpanPolicy

    first = SpanPolicy(CPU_LIKE)
    for _ in range(6):
        first.observe(8, 0, source=BAD)
        first.observe(8, 8, source=GOOD)
    learnt = dict(first.stats)
    second = SpanPolicy(CPU_LIKE, learnt)
    assert second.cut([1] * 20, BAD) == [] and len(second.cut([1] * 20, GOOD)) >= 8
    assert SpanPolicy(CPU_LIKE).cut([1] * 20, BAD) != []  # without the record: the optimistic prior
    assert learnt[BAD].at_risk == first.stats[BAD].at_risk  # carried as a copy, not shared
    later = learnt
    for request in range(12):  # requests that never try it: its failures weigh less and less
        later = dict(SpanPolicy(CPU_LIKE, later).stats)
        if SpanPolicy(CPU_LIKE, later).cut([1] * 20, BAD):
            break
    assert 0 < request < 11


def test_requests_hand_their_span_acceptance_to_the_next():
    from ssr.loop import Generation
    from ssr.engines.fake import FakeEngine
    from ssr.formats.thinking import FORMATS

    stats = PolicyStats()
    config = GenerationConfig(mode="ssr", thinking_budget=40, max_answer_tokens=60, policy="fixed", draft_at=0)
    prompt = [ord(c) for c in "Please complete the class Stack."]
    Generation(FakeEngine(), FORMATS["code"], config, prompt, stats=stats).run()
    assert set(stats.spans) == {"answer", "cot"} and stats.spans["answer"]
    plain = PolicyStats()
    Generation(FakeEngine(), FORMATS["code"], GenerationConfig(mode="suffix", thinking_budget=40, max_answer_tokens=60,
                                                               policy="fixed"), prompt, stats=plain).run()
    assert plain.spans == {}  # the peers cut nothing: nothing to learn


def test_short_matches_are_not_tried_on_the_prior_where_a_failed_token_costs_half_a_step():
    """On CPU-like costs a 1-token lookup (prior 1/3) is not verified until a source shows it
    pays, a 16+ token suffix match (prior 8/9) is; where a pass of k tokens costs a step
    (GPUs) both are tried."""
    from ssr.pricing.span_policy import SpanPolicy

    half_step = CostModel(step_s=0.040, token_s=0.020)
    assert SpanPolicy(half_step).cut([1] * 8, Source("lookup", 1)) == []
    assert SpanPolicy(half_step).cut([1] * 8, Source.suffix(3)) != []
    assert SpanPolicy(GPU_LIKE).cut([1] * 8, Source("lookup", 1)) != []
    one = Source("lookup", 1)
    carried = SpanPolicy(half_step, {one: SpanPolicy(half_step).stats[one]}).stats[one]
    assert carried.prior_first == pytest.approx(1 / 3)  # carried to the next request with its prior
