"""A thinking budget on vLLM by vLLM's own `thinking_token_budget` (a SamplingParams field, on
an engine started with a ReasoningConfig): the request counts its thinking tokens, forces the
end marker when they reach the budget, and goes on into its answer, one request as a vLLM user
gets it. vLLM counts from the model's start marker, prompt tokens after it included
(vllm/v1/sample/thinking_budget_state.py, `_init_state_entry`, alike in 0.32.0 and 0.33.0); ssr's
budget counts the CoT the request writes, so `vllm_budget` adds the prompt's tokens after the marker."""
from __future__ import annotations

from collections.abc import Sequence

from ..formats.markers import marker_ids, tokens_after


def budget_markers(tokenizer, fmt) -> tuple[list[int], list[int]] | None:
    """For the model's own thinking format (ThinkingFormat `fmt`, read from its chat template): the
    ids of its start and end markers, with which vLLM counts a request's thinking and ends it;
    None for a model without one (ssr's thinking templates force their own text, in a request of
    their own)."""
    return marker_ids(tokenizer, fmt) if fmt.native else None


def reasoning_config(fmt):
    """vLLM's ReasoningConfig for the model's own markers (budget_markers): the end marker both
    tells a CoT that ended itself and is what a budget forces."""
    from vllm.config import ReasoningConfig

    return ReasoningConfig(reasoning_start_str=fmt.start.strip(), reasoning_end_str=fmt.end)


def vllm_budget(prompt_ids: Sequence[int], start_ids: Sequence[int], budget: int) -> int | None:
    """vLLM's thinking_token_budget for a request that may write `budget` CoT tokens: its count
    starts at the prompt's last start marker (None: the prompt opens no CoT, vLLM would count none)."""
    after = tokens_after(prompt_ids, start_ids)
    return None if after is None else budget + after
