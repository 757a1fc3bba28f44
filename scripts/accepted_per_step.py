"""Accepted tokens per verify step in stock vLLM, `{"method": "ssr"}` or `{"method": "suffix"}`, on
scripts/load.py's chat prompts (greedy, 96 tokens, the test model, a fresh engine), read from
vLLM's own metrics (vllm:spec_decode_*). Hardware-independent under greedy.

    .venv-vllm/bin/python scripts/accepted_per_step.py suffix
    .venv-vllm/bin/python scripts/accepted_per_step.py ssr
"""
from __future__ import annotations

import json
import sys

from load import PROMPTS  # scripts/ is on the path: python scripts/accepted_per_step.py


def main(method: str) -> int:
    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import vllm_model_source

    spec = {"method": "suffix"} if method == "suffix" else {"method": "ssr", "num_speculative_tokens": 16}
    llm = vllm.LLM(vllm_model_source("smollm2-135m"), speculative_config=spec, max_model_len=2048,
                   enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32", disable_log_stats=False)
    try:
        llm.chat([[{"role": "user", "content": prompt}] for prompt in PROMPTS],
                 SamplingParams(temperature=0, max_tokens=96))
        metrics = {metric.name: metric.value for metric in llm.get_metrics() if hasattr(metric, "value")}
    finally:
        llm.llm_engine.engine_core.shutdown()
    steps, accepted = metrics["vllm:spec_decode_num_drafts"], metrics["vllm:spec_decode_num_accepted_tokens"]
    print(json.dumps({"method": method, "verify_steps": steps, "drafted": metrics["vllm:spec_decode_num_draft_tokens"],
                      "accepted": accepted, "accepted_per_step": accepted / max(steps, 1)}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("ssr", "suffix"):
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1]))
