"""Token identity between two decodes of the same prompt, with the logit gap where they part."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..loop import Result
from ..engines.base import Engine


@dataclass(frozen=True)
class Divergence:
    position: int  # index into the output (CoT + forced + answer) where the two differ
    phase: str  # "cot" or "answer"
    expected_token: int  # plain decoding's token
    got_token: int  # the other decode's token
    logit_gap: float | None  # |logit(expected) - logit(got)| there, recomputed in one pass (None: vLLM)

    def describe(self) -> str:
        return (f"diverged in the {self.phase} at output token {self.position}: "
                f"{self.expected_token} vs {self.got_token}, logit gap "
                + ("unknown (no sequence engine to rescore)" if self.logit_gap is None else f"{self.logit_gap:.4f}"))


def first_divergence(engine: Engine, prompt_ids: list[int], expected: Result, got: Result) -> Divergence | None:
    """None when the outputs are token-identical; else where and by how much they differ.

    A length difference with an identical common part counts as a divergence at the
    end of the shorter output (one stopped where the other did not).
    """
    expected_ids, got_ids = expected.output_ids, got.output_ids
    if expected_ids == got_ids:
        return None
    common = min(len(expected_ids), len(got_ids))
    position = next((i for i in range(common) if expected_ids[i] != got_ids[i]), common)
    phase = "cot" if position < len(expected.cot_ids) else "answer"
    end_id = min(engine.eos_ids)
    expected_token = expected_ids[position] if position < len(expected_ids) else end_id
    got_token = got_ids[position] if position < len(got_ids) else end_id
    if not hasattr(engine, "prefill"):  # vLLM: requests, no sequence to score
        return Divergence(position, phase, expected_token, got_token, None)
    seq = engine.prefill(prompt_ids[:-1])
    try:
        row = engine.score(seq, [prompt_ids[-1]] + expected_ids[:position])[-1]  # [vocab]
    finally:
        engine.release(seq)
    gap = float(np.abs(row[expected_token] - row[got_token]))
    return Divergence(position, phase, expected_token, got_token, gap)
