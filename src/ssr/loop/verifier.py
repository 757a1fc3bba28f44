"""Verdicts on proposed tokens for one request: greedy (the argmax) or exact rejection sampling
against the request's sampling distribution (its own random stream); a draft verified on a
sequence in chunks that double while every token is accepted. The rules themselves are pure
functions of arrays (verifying/verify.py)."""
from __future__ import annotations

import numpy as np

from ..config import GenerationConfig
from ..verifying.sampling import target_probs
from ..verifying.verify import Verdict, verify_greedy, verify_sampled
from .sequences import Sequences


class Verifier:
    def __init__(self, config: GenerationConfig) -> None:
        self.sampling = config.sampling  # greedy, or the distribution sampled from
        self.approx = config.verify == "approx"  # sampling: resample from the target instead of the residual
        self.rng = np.random.default_rng(config.sampling.seed)  # the request's coins and samples

    def verdict(self, draft_ids: list[int], target: np.ndarray, draft_probs: np.ndarray | None = None) -> Verdict:
        """Draft tokens against the target's scores [k + 1, vocab] (or ids [k + 1]): greedy argmax
        match, or rejection sampling with the draft's distributions [k, vocab]."""
        if self.sampling.greedy:
            return verify_greedy(draft_ids, target)
        return verify_sampled(np.asarray(draft_ids, dtype=np.int64), draft_probs,
                              target_probs(target, self.sampling), self.rng, approx=self.approx)

    def chunked(self, seqs: Sequences, seq: int, fed: list[int], draft_ids: list[int],
                draft_probs: list[np.ndarray], first_chunk: int,
                keep_rows: bool = False) -> tuple[int, Verdict, list[np.ndarray]]:
        """Feed `fed`, then draft_ids in chunks that double while every token is accepted (the
        first chunk rides with `fed`; an early mismatch wastes at most one chunk); seq keeps
        fed + the accepted tokens. Returns (num_accepted, verdict, and with keep_rows the target
        rows of positions 0 .. num_accepted)."""
        base = seqs.length(seq)
        chunk = first_chunk
        rows = seqs.score(seq, fed + draft_ids[:chunk])  # [len(fed) + chunk, vocab]
        target = rows[len(fed) - 1 :]  # [chunk + 1, vocab]: row i predicts draft position i
        kept: list[np.ndarray] = []
        num_accepted = 0
        while True:
            chunk_ids = draft_ids[num_accepted : num_accepted + len(target) - 1]
            probs = np.stack(draft_probs[num_accepted : num_accepted + len(chunk_ids)]) \
                if draft_probs and chunk_ids else None  # [len(chunk_ids), vocab]
            verdict = self.verdict(chunk_ids, target, probs)
            num_accepted += verdict.num_accepted
            if verdict.recovered or num_accepted == len(draft_ids):
                break
            if keep_rows:
                kept.extend(target[:-1])
            chunk *= 2
            rows = seqs.score(seq, draft_ids[num_accepted : num_accepted + chunk])
            target = np.concatenate([target[-1:], rows])  # [chunk + 1, vocab]
        if keep_rows:
            kept.extend(target[: verdict.num_accepted + 1])
        seqs.truncate(seq, base + len(fed) + num_accepted)
        return num_accepted, verdict, kept
