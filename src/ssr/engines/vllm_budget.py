"""A thinking budget on vLLM by vLLM's own `thinking_token_budget` (a SamplingParams field, on
an engine started with a ReasoningConfig): the request counts its thinking tokens, forces the
end marker when they reach the budget, and goes on into its answer, one request as a vLLM user
gets it. vLLM counts from the model's start marker, prompt tokens after it included
(vllm/v1/sample/thinking_budget_state.py, `_init_state_entry`, alike in 0.32.0 and 0.33.0); ssr's
budget counts the CoT the request writes, so `vllm_budget` adds the prompt's tokens after the marker."""
from __future__ import annotations

from collections.abc import Sequence


def budget_markers(tokenizer) -> tuple[list[int], list[int]] | None:
    """A model with a thinking format of its own (its chat template's markers): the ids of its
    start and end markers, with which vLLM counts a request's thinking and ends it; None for a
    model without one (ssr's thinking templates force their own text, in a request of their own)."""
    from ..formats.thinking import detect_format

    fmt = detect_format(getattr(tokenizer, "chat_template", None))
    if not fmt.native:
        return None
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731 - as vLLM encodes them
    return encode(fmt.start.strip()), encode(fmt.end)


def reasoning_config(tokenizer):
    """vLLM's ReasoningConfig for the model's own markers (budget_markers): the end marker both
    tells a CoT that ended itself and is what a budget forces."""
    from vllm.config import ReasoningConfig

    from ..formats.thinking import detect_format

    fmt = detect_format(getattr(tokenizer, "chat_template", None))
    return ReasoningConfig(reasoning_start_str=fmt.start.strip(), reasoning_end_str=fmt.end)


def vllm_budget(prompt_ids: Sequence[int], start_ids: Sequence[int], budget: int) -> int | None:
    """vLLM's thinking_token_budget for a request that may write `budget` CoT tokens: its count
    starts at the prompt's last start marker (None: the prompt opens no CoT, vLLM would count none)."""
    after = tokens_after(prompt_ids, start_ids)
    return None if after is None else budget + after


def tokens_after(token_ids: Sequence[int], marker: Sequence[int]) -> int | None:
    """Tokens after the last occurrence of marker (None: it does not occur, or is empty)."""
    size = len(marker)
    last = next((at for at in range(len(token_ids) - size, -1, -1) if list(token_ids[at:at + size]) == list(marker)),
                None) if size else None
    return None if last is None else len(token_ids) - (last + size)
