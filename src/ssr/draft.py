"""A draft child: the answer it wrote from a partial chain of thought, and its stage metrics."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Draft:
    seq: int | None  # engine handle while the child is alive
    token_ids: list[int] = field(default_factory=list)  # answer tokens (EOS kept): bootstrapped + written
    probs: list[np.ndarray] = field(default_factory=list)  # sampling: the child's q, [vocab] per token
    forked_at: int = 0  # CoT tokens the child saw
    started_s: float = 0.0  # request clock when it forked
    bootstrapped: int = 0  # tokens taken over from the previous stage's draft (accepted on this child)
    bootstrap_s: float = 0.0  # seconds of that verify pass
    written: int = 0  # tokens this child decoded itself, one per batched step
    seconds: float = 0.0  # the child's lifetime

    def stage(self, accepted: int | None) -> dict:
        """Per-stage metrics; accepted: how many of its tokens the next stage (or the parent) kept."""
        per_token = (self.seconds - self.bootstrap_s) / self.written if self.written else 0.0
        without = self.seconds - self.bootstrap_s + self.bootstrapped * per_token  # decoding them instead
        return {"forked_at": self.forked_at, "tokens": len(self.token_ids), "bootstrapped": self.bootstrapped,
                "written": self.written, "accepted": accepted, "seconds": self.seconds,
                "bootstrap_s": self.bootstrap_s, "seconds_without_bootstrap": without}
