"""Accepted tokens per verify step in stock vLLM, `{"method": "ssr"}` against `{"method": "suffix"}`,
on scripts/load.py's chat prompts (greedy, 96 tokens, the test model), read from vLLM's own
metrics (vllm:spec_decode_*), side by side in one run: each method on a fresh engine (a child
process), then the ratio. Hardware-independent under greedy, but ssr's drafter prices its
chains on a cost table: $SSR_DRAFTER_COSTS where set, else on a CPU the table measured for the
model on this machine (`ssr calibrate --engine vllm`), else the GPU preset.

    .venv-vllm/bin/python scripts/accepted_per_step.py            # suffix, then ssr
    .venv-vllm/bin/python scripts/accepted_per_step.py ssr        # one method
"""
from __future__ import annotations

import json
import subprocess
import sys

from load import PROMPTS  # scripts/ is on the path: python scripts/accepted_per_step.py

METHODS = ("suffix", "ssr")
MODEL = "smollm2-135m"


def measure(method: str) -> dict:
    """One method on a fresh engine, in this process."""
    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import vllm_model_source

    spec = {"method": "suffix"} if method == "suffix" else {"method": "ssr", "num_speculative_tokens": 16}
    llm = vllm.LLM(vllm_model_source(MODEL), speculative_config=spec, max_model_len=2048,
                   enforce_eager=True, gpu_memory_utilization=0.3, dtype="float32", disable_log_stats=False)
    try:
        llm.chat([[{"role": "user", "content": prompt}] for prompt in PROMPTS],
                 SamplingParams(temperature=0, max_tokens=96))
        metrics = {metric.name: metric.value for metric in llm.get_metrics() if hasattr(metric, "value")}
    finally:
        llm.llm_engine.engine_core.shutdown()
    steps, accepted = metrics["vllm:spec_decode_num_drafts"], metrics["vllm:spec_decode_num_accepted_tokens"]
    return {"method": method, "verify_steps": steps, "drafted": metrics["vllm:spec_decode_num_draft_tokens"],
            "accepted": accepted, "accepted_per_step": accepted / max(steps, 1)}


def main(methods: list[str]) -> int:
    from types import SimpleNamespace

    from ssr.engines.vllm import vllm_model_source
    from ssr.engines.vllm_drafter import _engine_costs  # the table the drafter will read, by its own rule

    table = _engine_costs(SimpleNamespace(model=vllm_model_source(MODEL)))
    print(f"ssr's drafter prices its chains with: {table.source}", flush=True)
    rows = []
    for method in methods:
        out = subprocess.run([sys.executable, __file__, "--one", method], capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print("| method | verify steps | drafted | accepted | accepted per step |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['method']} | {row['verify_steps']} | {row['drafted']} | {row['accepted']} | "
              f"{row['accepted_per_step']:.2f} |")
    by = {row["method"]: row for row in rows}
    if "ssr" in by and "suffix" in by:
        print(f"ssr / suffix, accepted per step: {by['ssr']['accepted_per_step'] / max(by['suffix']['accepted_per_step'], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--one"] and len(args) == 2 and args[1] in METHODS:
        print(json.dumps(measure(args[1])))
        sys.exit(0)
    if not all(arg in METHODS for arg in args):
        raise SystemExit(__doc__)
    sys.exit(main(args or list(METHODS)))
