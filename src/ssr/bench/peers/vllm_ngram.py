"""vLLM's `ngram` method on its default model runner, for the trace replay (`vllm-ngram`).

vLLM 0.32.0 (the version ssr pins) runs Model Runner V2 wherever Triton is present and no
feature it lacks is asked for (vllm/config/vllm.py, `use_v2_model_runner`); there `ngram` is
`NgramGPUSpeculator` (vllm/v1/worker/gpu/spec_decode/ngram/speculator.py), whose rule differs
from the V1 runner's (`ngram-v1`, lookup.vllm_ngram):

- the longest n in [prompt_lookup_min, prompt_lookup_max] whose n-gram ends the context
  (prompt + output, the token just sampled last) and occurs before, at its rightmost
  occurrence (`_ngram_scan_kernel`: the score n * (L + 1) + pos + 1, its maximum);
- the occurrence must leave a token after it (pos <= L - n - 1);
- always K tokens: the ones after the occurrence, and where the context ends (or nothing
  matched) the last sampled token (`_ngram_finalize_kernel`), verified as ordinary drafts.

Configured as vLLM's docs configure ngram, {"num_speculative_tokens": 5, "prompt_lookup_max": 4}:
prompt_lookup_min unset equals prompt_lookup_max (vllm/config/speculative.py), so n = 4 exactly.
"""
from __future__ import annotations

from collections.abc import Sequence

from ...proposing.proposers import OneSource
from ...proposing.source import Source


class VllmNgramProposer(OneSource):
    """The rule above, kept up to date token by token: per n, each n-gram's two latest starts
    (the latest is the context's own suffix once the n-gram ends it; the one before it is the
    rightmost occurrence vLLM's scan finds)."""

    source = Source("vllm-ngram")  # one chain of exactly K tokens a step (OneSource.shape)

    def __init__(self, prompt: Sequence[int], n_min: int = 4, n_max: int = 4, k: int = 5) -> None:
        self.n_min, self.n_max, self.k = n_min, n_max, k  # prompt_lookup_min / _max, num_speculative_tokens
        self.tokens: list[int] = []  # prompt + output
        self.starts: dict[tuple[int, ...], tuple[int, int]] = {}  # n-gram -> (latest start, the one before; -1)
        self.observe(prompt)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """vLLM's ngram reads the request's own tokens only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        for token in token_ids:
            self.tokens.append(int(token))
            end = len(self.tokens)
            for n in range(self.n_min, min(self.n_max, end) + 1):
                gram = tuple(self.tokens[end - n:])
                self.starts[gram] = (end - n, self.starts.get(gram, (-1, -1))[0])

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        tokens, end = self.tokens, len(self.tokens)
        if not tokens or max_tokens < 1:
            return [], None
        draft = []
        for n in range(min(self.n_max, end), self.n_min - 1, -1):  # the longest n first
            before = self.starts[tuple(tokens[end - n:])][1]  # the rightmost occurrence before the suffix
            if before >= 0:
                draft = tokens[before + n: before + n + self.k]
                break
        draft += [tokens[-1]] * (self.k - len(draft))  # K always: the last sampled token fills in
        return draft[:max_tokens], None
