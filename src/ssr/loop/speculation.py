"""How one request's spans are verified, decided once from the engine's declared capabilities,
the mode and the engine's costs: a value every part of the loop reads instead of re-deriving it."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config import GenerationConfig
from ..pricing.costs import CostModel
from ..engines.base import shares_passes, tree_passes
from ..pricing.span_policy import MAX_BRANCHES, MAX_TREE_CANDIDATES, span_extension


class Layout(Enum):
    """How the candidate spans of one verify pass are laid out on the engine."""

    ONE = "one"  # one span a pass (plain steps and the peers' chains, or verification is not cheap)
    TREE = "tree"  # several spans as one token tree on the parent (tree attention, no forks)
    FORKS = "forks"  # several spans, the first on the parent and each other on its own fork
    CHAIN = "chain"  # one span a pass, picked among every source's candidates (vLLM's drafter: one chain)


@dataclass(frozen=True)
class Speculation:
    beside_child: bool  # CoT spans are verified while a draft child lives, its step in the same pass
    extend: float | None  # spans go past the match (verifying is cheap): the suffix tree's extension probability
    layout: Layout  # how a pass's candidates are laid out
    candidates: int  # candidate spans verified in one pass at most

    @property
    def several(self) -> bool:
        """The span policy chooses among several sources' candidates each pass."""
        return self.layout is not Layout.ONE

    @property
    def wide(self) -> bool:
        """Weak candidates are worth offering too (a tree node, or the chain's pick among them)."""
        return self.layout in (Layout.TREE, Layout.CHAIN)

    @property
    def trie(self) -> bool:
        """The recency trie's many paths are offered: only to a token tree (a chain, picking one,
        lost more picks to them than it won; since it pools what its candidates share they win it
        0.15% at 24 nodes for 0.14 ms more host time a pass: docs/traces.md, "One chain a pass")."""
        return self.layout is Layout.TREE


def decide(engine, config: GenerationConfig, costs: CostModel) -> Speculation:
    """Several candidates a pass only where one pass holds several sequences and verifying costs
    about a step (GPUs): as one token tree where the engine has tree attention, as forks where it
    feeds several sequences, as one chain picked among them where it holds one sequence a request."""
    beside = shares_passes(engine) and config.proposer is not None
    extend = span_extension(costs, config.suffix.max_span)  # not None: verification is cheap
    if not (beside and extend is not None and config.chooses_spans):
        return Speculation(beside, extend, Layout.ONE, 1)
    if tree_passes(engine):
        return Speculation(beside, extend, Layout.TREE, MAX_TREE_CANDIDATES)
    if engine.max_sequences < 2:
        return Speculation(beside, extend, Layout.CHAIN, 1)
    return Speculation(beside, extend, Layout.FORKS, MAX_BRANCHES)
