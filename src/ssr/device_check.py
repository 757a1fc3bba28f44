"""The GPU check that needs no weights: engine costs and greedy identity on random models.

Speed does not depend on the weights' values, so the models here are built from their
configs with random weights (nothing but this checkout travels to the GPU machine):

    qwen2.5-coder-0.5b  the benchmark model's architecture, as its GGUF declares it
    qwen3-4b            paper-size: Qwen3-4B's published config (36 layers, full attention;
                        the paper's Qwen3.5-4B mixes in linear-attention layers, which the
                        transformers engine's slot cache cannot fork)
    tiny                2 narrow layers, the same vocabulary: the CPU run in CI

For each architecture it measures the transformers engine's cost table (step for 1/2/4
sequences, score for k up to 512, prefill per token, the context slopes), step and
score(128) at a few context lengths, and the share of a step that is Python and kernel
launches (a *skeleton*: the same layers at width 64 does almost no GPU work, so its step
is that overhead). Then greedy identity: `ssr` (drafting forced, three bootstrapped stages)
and `suffix` against `ar`, token for token. Batch invariance is a property of kernels,
not of trained weights: random logits have tiny gaps, which makes the check stricter.

    PYTHONPATH=src python3 -m ssr.device_check --out DIR [--quick] [--arch NAME ...]

writes `costs-<device>-<arch>-<dtype>.json` per architecture (`ssr simulate --cost-model
FILE`), summary.json and summary.md. It imports only numpy, torch and transformers
(scripts/device_bundle.py checks that, and what would travel).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

VOCAB = 151936  # Qwen2.5 / Qwen3 embedding rows
ARCHITECTURES = {
    "qwen2.5-coder-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, vocab_size=VOCAB,
                               tie_word_embeddings=False, rope_theta=1e6, rms_norm_eps=1e-6,
                               max_position_embeddings=32768),
    "qwen3-4b": dict(model_type="qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=VOCAB,
                     tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960),
    "tiny": dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB, tie_word_embeddings=False,
                 rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=32768),
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# ChatML with native thinking markers (the `think` format), as Qwen3's template renders a turn
CHAT_TEMPLATE = ("{#- the answer follows a chain of thought between <think> and </think> -#}"
                 "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python class Stack with push, pop and peek.",
    "Complete the following Python function.\ndef is_palindrome(text: str) -> bool:\n",
)
SCORE_SIZES = (8, 32, 64, 128, 256, 512)


def synthetic_tokenizer(vocab_size: int = VOCAB):
    """A byte-level tokenizer over `vocab_size` ids built in memory: the 256 bytes, the chat and
    thinking markers, then filler tokens (`w<id>`) up to the model's vocabulary. Any text
    round-trips (one token per byte), so prompts, markers and stops work as with a real one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 byte characters
    vocab = {char: index for index, char in enumerate(sorted(alphabet))}
    first_filler = len(vocab) + len(SPECIAL_TOKENS)
    vocab.update({f"w{index}": index for index in range(first_filler, vocab_size)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS[1:])})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def random_engine(arch: str | dict, device: str, dtype: str, seed: int = 0, context_size: int = 8192):
    """A transformers engine over a randomly initialised model of this architecture."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .engines.hf import ATTENTION_NAME, TransformersEngine, register_attention

    spec = ARCHITECTURES[arch] if isinstance(arch, str) else arch
    fields = {key: value for key, value in spec.items() if key != "model_type"}
    config = AutoConfig.for_model(spec["model_type"], **fields)
    tokenizer = synthetic_tokenizer(spec["vocab_size"])
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    register_attention()
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype),
                                                 attn_implementation=ATTENTION_NAME)
    name = arch if isinstance(arch, str) else "skeleton"
    return TransformersEngine.adopt(model, tokenizer, f"random-{name}", context_size=context_size)


def skeleton(arch: str) -> dict:
    """The same layers at width 64 and a small vocabulary: a step that does almost no GPU work."""
    spec = dict(ARCHITECTURES[arch])
    spec.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    spec.pop("head_dim", None)
    return spec


def context_curve(engine, contexts: tuple[int, ...], repeats: int) -> dict[int, dict[str, float]]:
    """Median seconds of a one-sequence step and a 128-token score, and prefill per token, at
    each context length (calibrate's own probe)."""
    from .pricing.probe import _probe

    curve = {}
    for context in contexts:
        if context + 256 > engine.context_size:
            continue
        prefill_s, step_s, score_s = _probe(engine, context, repeats, (1,), (128,), lambda: None)
        curve[context] = {"step_1": step_s[1], "score_128": score_s[128], "prefill_token_s": prefill_s}
    return curve


def pass_probe(engine, context: int, repeats: int) -> dict[str, float]:
    """Median seconds, at `context` cached tokens, of what the loop does where verifying is cheap:
    a fork (a branch or a child: the KV slot copied), a parent's 17-token span pass with a child's
    step in one pass (2 sequences), three 17-token candidate spans with a child's step (4
    sequences). `ssr simulate` prices such a pass as a score over all its tokens, a fork as free."""
    from .pricing.probe import filler_ids as _filler

    filler = _filler(engine, context)
    span = filler[:17]
    parent = engine.prefill(filler)
    child = engine.fork(parent)
    timed = partial(_median_seconds, engine=engine, repeats=repeats)

    def one_pass(feeds) -> None:
        engine.score_batch(feeds)
        for seq, _ in feeds:
            engine.truncate(seq, context)

    out = {"fork_s": timed(lambda: engine.release(engine.fork(parent))),
           "span_17_with_child_s": timed(lambda: one_pass([(parent, span), (child, span[:1])]))}
    branches = [engine.fork(parent), engine.fork(parent)]
    out["three_spans_17_with_child_s"] = timed(
        lambda: one_pass([(parent, span)] + [(seq, span) for seq in branches] + [(child, span[:1])]))
    for seq in [parent, child] + branches:
        engine.release(seq)
    return out


def beside_probe(engine, tokens: int, repeats: int) -> dict[str, float]:
    """Median seconds of a prefill of `tokens` alone, of ssr's proposer built over them alone (as
    on a token tree, prepared), and of the two as the loop runs them (Sequences.prefill_beside:
    the build on another thread where the engine's prefill frees the host, after it elsewhere).
    On a GPU the last should be the prefill's: the build hidden, the prefill not slowed by it."""
    import random

    from .config import GenerationConfig
    from .loop.sequences import Sequences
    from .metrics import Metrics
    from .pricing.costs import CostModel
    from .proposing.proposers import request_proposer

    start, rng = min(1000, engine.vocab_size // 2), random.Random(0)
    ids = min(2000, engine.vocab_size - start)  # text with repeats, as a prompt has: 2,000 distinct ids
    # a prompt of its own for every call, so that none finds the last one's kept KV (engines/prefix.py)
    prompts = [[start + rng.randrange(ids) for _ in range(tokens)] for _ in range(3 * (repeats + 1))]
    config = GenerationConfig(mode="ssr")

    def build(prompt=None):
        proposer = request_proposer(config, 0.1, prompt or prompts.pop(), None, several=True, wide=True, trie=True)
        proposer.prepare()
        return proposer

    def prefill() -> None:
        engine.release(engine.prefill(prompts.pop()))

    def both() -> None:
        seqs, prompt = Sequences(engine, CostModel(), Metrics(mode="ssr"), (), False), prompts.pop()
        seqs.prefill_beside(prompt, lambda: build(prompt))
        seqs.drop_all()

    timed = partial(_median_seconds, engine=engine, repeats=repeats)
    return {"tokens": tokens, "prefill_s": timed(prefill), "build_s": timed(build), "both_s": timed(both),
            "beside": engine.capabilities.prefill_frees_host}


def _median_seconds(call, engine, repeats: int) -> float:
    """Median wall seconds of call() over `repeats` runs after one that warms up, the engine's
    device synchronised around each."""
    import statistics

    import torch

    sync = torch.cuda.synchronize if engine.device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(repeats + 1):
        sync()
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def identity(engine, arch: str, prompts: tuple[str, ...], budget: int) -> list[dict]:
    """ar vs ssr (drafting forced, three stages) and suffix on each prompt, greedy."""
    from . import SSR, GenerationConfig
    from .verifying.lossless import first_divergence

    model = SSR(f"random-{arch}", engine=engine)
    base = GenerationConfig(mode="ar", thinking_budget=budget, max_answer_tokens=budget, draft_at=budget // 4,
                            draft_interval=budget // 4, draft_tokens=budget // 2, policy="fixed")
    rows = []
    for prompt in prompts:
        ids = model.prompt_ids(prompt)
        expected = model.generate(prompt, base)
        for mode in ("ssr", "suffix"):
            got = model.generate(prompt, replace(base, mode=mode))
            divergence = first_divergence(engine, ids, expected, got)
            m = got.metrics
            rows.append({"prompt": prompt[:40], "mode": mode, "tokens": len(expected.output_ids),
                         "identical": divergence is None,
                         "divergence": None if divergence is None else divergence.describe(),
                         "stages": len(m.stages), "draft_tokens": m.draft_tokens,
                         "accepted_prefix": m.accepted_prefix_tokens,
                         "spans_accepted": m.answer_accepted_tokens + m.cot_accepted_tokens,
                         "shared_passes": m.shared_passes, "branch_passes": m.branch_passes,
                         "ar_s": expected.metrics.total_s, "mode_s": m.total_s})
    return rows


def check_architecture(arch: str, args, log) -> dict:
    """Cost table, context curve, launch overhead and identity for one architecture."""
    import torch

    from .pricing.costs import gpu_preset
    from .pricing.probe import _median_step_s, calibrate
    from .pricing.probe import filler_ids as _filler

    started = time.perf_counter()
    engine = random_engine(arch, args.device, args.dtype, context_size=args.context_size)
    built_s = time.perf_counter() - started
    log(f"{arch}: built in {built_s:.1f} s ({sum(p.numel() for p in engine._model.parameters()) / 1e9:.2f} B params)")
    costs = calibrate(engine, repeats=args.repeats, context_tokens=args.context, score_sizes=SCORE_SIZES)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    costs = replace(costs, source=f"measured by ssr.device_check ({device_name}, random {arch}, {args.dtype})",
                    meta={**costs.meta, "device": device_name, "architecture": arch, "dtype": args.dtype,
                          "torch": torch.__version__, "weights": "random (speed does not depend on them)"})
    curve = context_curve(engine, args.contexts, args.repeats)
    passes = pass_probe(engine, args.context, args.repeats)
    beside = beside_probe(engine, args.beside_tokens, args.repeats)
    rows = identity(engine, arch, PROMPTS[: args.prompts], args.budget)
    engine.close()
    del engine
    light = random_engine(skeleton(arch), args.device, args.dtype, context_size=args.context_size)
    filler = _filler(light, args.context)
    seq = light.prefill(filler)
    overhead_s = _median_step_s(light, [(seq, filler[0])], args.repeats)
    light.close()
    return {"architecture": arch, "config": ARCHITECTURES[arch], "device": device_name, "dtype": args.dtype,
            "build_s": built_s, "costs": json.loads(costs.to_json()), "preset": json.loads(gpu_preset().to_json()),
            "context_curve": curve, "passes": passes, "beside": beside, "skeleton_step_s": overhead_s,
            "launch_share": overhead_s / costs.step_s[1], "identity": rows,
            "seconds": time.perf_counter() - started}


def table(result: dict) -> str:
    """Markdown: each probe in seconds and in decode steps, beside the preset's assumption."""
    from .pricing.costs import CostTable

    costs, preset = result["costs"], result["preset"]
    step, preset_step = costs["step_s"]["1"], preset["step_s"]["1"]
    assumed = CostTable.from_dict(preset)

    def preset_ratio(kind: str, size: str) -> str:
        value = assumed.step(int(size)) if kind == "step_s" else assumed.score(int(size))
        return f"{value / preset_step:.2f}"

    lines = [f"### {result['architecture']} on {result['device']}, {result['dtype']} (random weights)", "",
             "| probe | seconds | × step | preset × step |", "|---|---|---|---|"]
    for kind, label in (("step_s", "step, sequences"), ("score_s", "score, tokens")):
        for size, seconds in sorted(costs[kind].items(), key=lambda item: int(item[0])):
            lines.append(f"| {label} {size} | {seconds:.5f} | {seconds / step:.2f} | {preset_ratio(kind, size)} |")
    lines.append(f"| prefill per token | {costs['prefill_token_s']:.6f} | {costs['prefill_token_s'] / step:.4f} "
                 f"| {preset['prefill_token_s'] / preset_step:.4f} |")
    lines += ["", f"Context {costs['context_tokens']}; per extra cached token: step "
              f"{costs['step_context_s']:.2e} s, score {costs['score_context_s']:.2e} s/token.",
              "", "| context | step 1 (s) | score 128 (s) | prefill per token (s) |", "|---|---|---|---|"]
    lines += [f"| {context} | {row['step_1']:.5f} | {row['score_128']:.5f} | {row['prefill_token_s']:.6f} |"
              for context, row in sorted(result["context_curve"].items(), key=lambda item: int(item[0]))]
    passes = result["passes"]
    lines += ["", f"Passes the loop makes where verifying is cheap (context {costs['context_tokens']}; "
              f"`ssr simulate` assumes a fork is free and a pass costs a score over all its tokens):",
              "", "| probe | seconds | × step | simulator's × step |", "|---|---|---|---|",
              f"| fork (KV slot copy) | {passes['fork_s']:.5f} | {passes['fork_s'] / step:.2f} | 0.00 |"]
    measured = CostTable.from_dict(costs)
    for key, label, tokens in (("span_17_with_child_s", "span of 17 + a child's step (2 sequences)", 18),
                               ("three_spans_17_with_child_s", "3 spans of 17 + a child's step (4 sequences)", 52)):
        modelled = measured.score(tokens) / step
        lines.append(f"| {label} | {passes[key]:.5f} | {passes[key] / step:.2f} | {modelled:.2f} |")
    beside = result["beside"]
    lines += ["", f"A {beside['tokens']}-token prompt's prefill and ssr's proposer built over it "
              f"({'beside it, on another thread' if beside['beside'] else 'after it: this engine builds after'}): "
              f"prefill {beside['prefill_s']:.4f} s, build {beside['build_s']:.4f} s, "
              f"both {beside['both_s']:.4f} s = {beside['both_s'] / beside['prefill_s']:.2f} x the prefill."]
    identical = sum(row["identical"] for row in result["identity"])
    lines += ["", f"Python + launch overhead: a width-64 skeleton of the same layers steps in "
              f"{result['skeleton_step_s']:.5f} s = {result['launch_share']:.0%} of a step.",
              f"Greedy identity to ar: {identical}/{len(result['identity'])} "
              f"(ssr with 3 forced stages, suffix); built in {result['build_s']:.1f} s, "
              f"checked in {result['seconds']:.0f} s.", ""]
    for row in result["identity"]:
        lines.append(f"- {row['mode']} `{row['prompt']}`: {row['tokens']} tokens, "
                     f"{'identical' if row['identical'] else row['divergence']}; stages {row['stages']}, "
                     f"draft {row['draft_tokens']}, accepted prefix {row['accepted_prefix']}, "
                     f"spans accepted {row['spans_accepted']}, shared passes {row.get('shared_passes', 0)}, "
                     f"branch passes {row.get('branch_passes', 0)}")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m ssr.device_check", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", choices=sorted(ARCHITECTURES),
                        help="architecture to check (repeatable; default: qwen2.5-coder-0.5b and qwen3-4b)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="default: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--out", default=os.environ.get("OUT") or "device-check")
    parser.add_argument("--quick", action="store_true", help="the benchmark architecture only, fewer repeats")
    args = parser.parse_args(argv)
    args.arch = args.arch or (["qwen2.5-coder-0.5b"] if args.quick else ["qwen2.5-coder-0.5b", "qwen3-4b"])
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    tiny = args.arch == ["tiny"]
    args.repeats = 3 if args.quick or tiny else 7
    args.context = 256 if tiny else 1024
    args.contexts = (256, 1024) if tiny else ((1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192))
    args.context_size = 2048 if tiny else 8448
    args.prompts = 1 if args.quick else len(PROMPTS)
    args.budget = 48 if tiny else 128
    args.beside_tokens = 1500 if tiny else 8000  # a prompt under the context size
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch (use --device cpu --arch tiny on a CPU)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    results, markdown = [], []
    for arch in args.arch:
        result = check_architecture(arch, args, log)
        results.append(result)
        markdown.append(table(result))
        device = "cpu" if result["device"] == "cpu" else result["device"].lower().replace(" ", "-")
        (out / f"costs-{device}-{arch}-{args.dtype}.json").write_text(json.dumps(result["costs"], indent=2) + "\n")
        print(markdown[-1], flush=True)
    (out / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "summary.md").write_text("\n".join(markdown))
    identical = all(row["identical"] for result in results for row in result["identity"])
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
