"""Peers replayed as their users run them, each with its own defaults (one module each, its
source named there): proposers for the trace replay's loop, with the shape their engine
verifies (proposers.Shape: a chain, or a token tree of their own, padded where the engine pads).

`suffix`, `ngram-v1` and `pld` run on ssr's engines too and live in proposing/proposers.py; the ones here
exist only where this project has no such engine (SGLang, llama-server's n-gram modes) or no
serving path turns them on (arctic's tree mode)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ...proposing.history import ResponseHistory
from ...proposing.proposers import Proposer


class TreeSource:
    """`propose` for a peer whose `candidates` are the paths of its own token tree: the first
    path (the protocol's one-span view; the loop verifies the whole tree, Shape.tree)."""

    implementation = None

    def prepare(self) -> None:
        """Nothing deferred."""

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        found = self.candidates(max_tokens)
        return (found[0][1], None) if found else ([], None)


def _vllm_ngram(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    from .vllm_ngram import VllmNgramProposer

    return VllmNgramProposer(prompt)


def _arctic_tree(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    from .arctic_tree import ArcticTreeProposer

    return ArcticTreeProposer(prompt, history)


def _sglang_ngram(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    from .sglang_ngram import SglangNgramProposer

    return SglangNgramProposer(prompt, history)


def _sglang_ngram_prob(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    from .sglang_ngram import SglangNgramProposer

    return SglangNgramProposer(prompt, history, prob=True)


def _llamacpp_simple(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    from .llamacpp_ngram import NgramSimpleProposer

    return NgramSimpleProposer(prompt)


def _llamacpp_mod(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    from .llamacpp_ngram import NgramModProposer

    return NgramModProposer(prompt, history)


# replay mode -> its proposer for one request (the prompt; earlier responses in deployment order)
REPLAY_PEERS: dict[str, Callable[[Sequence[int], ResponseHistory | None], Proposer]] = {
    "vllm-ngram": _vllm_ngram,
    "arctic-tree": _arctic_tree,
    "sglang-ngram": _sglang_ngram,
    "sglang-ngram-prob": _sglang_ngram_prob,
    "llamacpp-ngram-simple": _llamacpp_simple,
    "llamacpp-ngram-mod": _llamacpp_mod,
}
