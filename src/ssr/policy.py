"""How many proposed tokens are worth a verify pass, from measured engine costs.

On a GPU, scoring k tokens costs about one decode step, so long spans pay off; on
a CPU every scored token costs a good fraction of a step, and a span that is
mostly rejected makes the request slower than plain decoding. The cost model
learns, from the engine calls the request makes anyway:

    cost(n tokens fed to one sequence in one pass) = step_s + token_s * (n - 1)

and a span is cut to the length k that maximises the expected tokens gained per
second, (1 + expected accepted(k)) / cost(k + 1), or dropped (k = 0, a plain
step) when nothing beats 1 / step_s.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class CostModel:
    step_s: float = 0.05  # one token for one sequence
    token_s: float = 0.02  # each further token in the same pass
    smoothing: float = 0.2  # weight of a new observation

    def observe_step(self, seconds: float) -> None:
        self.step_s += self.smoothing * (seconds - self.step_s)

    def observe_score(self, num_tokens: int, seconds: float) -> None:
        if num_tokens >= 2:
            per_token = max(0.0, (seconds - self.step_s) / (num_tokens - 1))
            self.token_s += self.smoothing * (per_token - self.token_s)

    def cost(self, num_tokens: int) -> float:
        return self.step_s + self.token_s * max(0, num_tokens - 1)


def best_span_length(accept_probs: Sequence[float], costs: CostModel) -> int:
    """Length of the span prefix to verify; 0 means decode one token plainly.

    accept_probs[i]: estimated probability that the first i + 1 proposed tokens
    are all accepted (non-increasing).
    """
    best_len, best_rate = 0, 1.0 / costs.cost(1)
    expected = 0.0
    for length, prob in enumerate(accept_probs, start=1):
        expected += prob
        rate = (1.0 + expected) / costs.cost(length + 1)  # pending token + span in one pass
        if rate > best_rate:
            best_len, best_rate = length, rate
    return best_len


@dataclass
class AcceptanceStats:
    """Running acceptance rate per proposed token, for proposers without probabilities."""

    accepted: float = 1.0  # prior: one accepted ...
    proposed: float = 2.0  # ... out of two

    def observe(self, num_proposed: int, num_accepted: int) -> None:
        # a token is "tried" when all before it were accepted
        self.proposed += min(num_proposed, num_accepted + 1)
        self.accepted += num_accepted

    def probs(self, length: int) -> list[float]:
        rate = self.accepted / self.proposed
        return [rate ** (i + 1) for i in range(length)]
