"""GPU check for the transformers engine: measured costs next to the GPU preset, and
greedy identity SSR vs ar on CUDA.

Run on a machine with a CUDA GPU, torch (CUDA build) and `pip install -e '.[torch]'`:

    python scripts/gpu_check.py [--model smollm2-135m] [--dtype bfloat16] [--out DIR]

Prints step times for 1/2/4 sequences, `score` times for k = 8/32/128/512 and prefill
per token, each also as a multiple of one decode step beside the preset's assumption
(`ssr simulate --cost-model gpu`), then ar vs ssr on three short prompts. With --out
(or $OUT) it writes costs.json there, usable as `ssr simulate --cost-model costs.json`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ssr import SSR, GenerationConfig
from ssr.costs import calibrate, gpu_preset
from ssr.engines import load_engine
from ssr.lossless import first_divergence

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python class Stack with push, pop and peek.",
    "Complete the following Python function.\ndef is_palindrome(text: str) -> bool:\n",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    engine = load_engine(args.model, "transformers", device=args.device, dtype=args.dtype, context_size=4096)
    print(f"device {torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device}, "
          f"model {args.model}, {args.dtype}")
    measured, preset = calibrate(engine, repeats=7, context_tokens=1024), gpu_preset()
    step = measured.step_s[1]
    print(f"{'probe':12s} {'seconds':>10s} {'x step':>8s} {'preset x step':>14s}")
    for sequences, seconds in sorted(measured.step_s.items()):
        print(f"{f'step {sequences}':12s} {seconds:10.5f} {seconds / step:8.2f} "
              f"{preset.step_s.get(sequences, float('nan')) / preset.step_s[1]:14.2f}")
    for size, seconds in sorted(measured.score_s.items()):
        print(f"{f'score {size}':12s} {seconds:10.5f} {seconds / step:8.2f} "
              f"{preset.score_s.get(size, float('nan')) / preset.step_s[1]:14.2f}")
    print(f"{'prefill/tok':12s} {measured.prefill_token_s:10.6f} {measured.prefill_token_s / step:8.4f} "
          f"{preset.prefill_token_s / preset.step_s[1]:14.4f}")

    model = SSR(args.model, engine=engine)
    budgets = dict(thinking_budget=128, draft_at=32, draft_tokens=96, max_tokens=128)
    identical = 0
    for prompt in PROMPTS:
        ar = model.generate(prompt, GenerationConfig(mode="ar", **budgets))
        got = model.generate(prompt, GenerationConfig(mode="ssr", **budgets))
        divergence = first_divergence(engine, model.prompt_ids(prompt), ar, got)
        identical += divergence is None
        print(f"ar {ar.metrics.total_s:.2f} s, ssr {got.metrics.total_s:.2f} s, "
              f"accepted prefix {got.metrics.accepted_prefix_tokens}: "
              f"{'identical' if divergence is None else divergence.describe()}")
    print(f"greedy identity: {identical}/{len(PROMPTS)}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "costs.json").write_text(measured.to_json() + "\n", encoding="utf-8")
        Path(args.out, "identity.json").write_text(json.dumps({"identical": identical, "of": len(PROMPTS)}))
    return 0 if identical == len(PROMPTS) else 1


if __name__ == "__main__":
    sys.exit(main())
