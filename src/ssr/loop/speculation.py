"""How one request's spans are verified, decided once from the engine's declared capabilities,
the mode and the engine's costs: a value every part of the loop reads instead of re-deriving it."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config import GenerationConfig
from ..pricing.costs import CostModel
from ..engines.base import shares_passes, tree_passes
from ..pricing.span_policy import MAX_BRANCHES, MAX_TREE_CANDIDATES, span_extension

# HostCosts' figures: the drafter's milliseconds a request-step, 0.176 as one chain and 0.027 as one
# span a pass from the suffix tree alone (scripts/drafter_host.py <the five non-agentic dev files>
# --limit 5: medians over 50 traces, three runs: 0.173-0.184 and 0.025-0.027); ssr / suffix,
# geometric mean of the 10 medians, 0.8977 as one chain and 0.9254 as one span a pass (`ssr traces
# ... --orders cold`, GPU preset, that layout forced): 0.9254 / 0.8977 = 1.031
CHAIN_HOST_S, ONE_HOST_S, CHAIN_GAIN = 0.176e-3, 0.027e-3, 1.031


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
    per_step: bool = False  # drafted as vLLM's drafter drafts (Capabilities.drafts_per_step)

    @property
    def several(self) -> bool:
        """The span policy chooses among several sources' candidates each pass."""
        return self.layout is not Layout.ONE

    @property
    def wide(self) -> bool:
        """Weak candidates are worth offering too (a tree node, or the chain's pick among them)."""
        return self.layout in (Layout.TREE, Layout.CHAIN)

    @property
    def lookup(self) -> bool:
        """n-gram lookup is a source: everywhere but one span a pass drafted per step (vLLM's drafter
        where one chain does not pay for its host time), where its host time across the batch costs
        more than it wins (proposers.ONE_SPAN_PARTS)."""
        return not (self.per_step and self.layout is Layout.ONE)

    @property
    def trie(self) -> bool:
        """The recency trie's many paths are offered: only to a token tree (a chain, picking one,
        lost more picks to them than it won; since it pools what its candidates share they win it
        0.15% at 24 nodes for 0.14 ms more host time a pass: docs/chain.md)."""
        return self.layout is Layout.TREE


@dataclass(frozen=True)
class HostCosts:
    """Host seconds one request's drafting adds to a step where requests are drafted for one after
    another, as vLLM's model runner drafts for its batch (SuffixDecodingProposer.propose and ssr's
    drafter loop over the requests), so that every request of the step waits for all of them; and
    what one chain among every source's candidates wins over one span a pass from fewer sources.
    Measured on this 2-core machine (docs/vllm-drafter.md, "Host time under load"): the drafter's
    own time a request-step in each layout (scripts/drafter_host.py), and `ssr traces <the five
    non-agentic dev files> --limit 30 --candidates chain --modes ar,ssr,suffix --orders cold`, GPU
    preset, ssr's time against suffix's in each layout (one span a pass forced for it)."""

    chain: float = CHAIN_HOST_S  # one chain picked among every source's candidates (Layout.CHAIN)
    one: float = ONE_HOST_S  # one span a pass from the suffix tree alone (Layout.ONE drafted per step)
    chain_gain: float = CHAIN_GAIN  # tokens a step one chain commits over one span a pass's


def per_step_layout(costs: CostModel, batch: int, host: HostCosts = HostCosts()) -> Layout:
    """How a request drafted for per step (vLLM's drafter) lays out its candidates at a step of
    `batch` requests: one chain among every source's where its tokens a second, its host time
    across the batch on the step (costs.cost(1): a step at this batch), beat one span a pass's."""
    step = costs.cost(1)
    chain = host.chain_gain / (step + batch * host.chain) > 1.0 / (step + batch * host.one)
    return Layout.CHAIN if chain else Layout.ONE


def host_seconds(layout: Layout, batch: int, host: HostCosts = HostCosts()) -> float:
    """What a pass drafted in `layout` adds to a step of `batch` requests drafted for the same way."""
    return batch * (host.chain if layout is Layout.CHAIN else host.one)


def decide(engine, config: GenerationConfig, costs: CostModel) -> Speculation:
    """Several candidates a pass only where one pass holds several sequences and verifying costs
    about a step (GPUs): as one token tree where the engine has tree attention, as forks where it
    feeds several sequences, as one chain picked among them where it holds one sequence a request.
    Drafted for per step (vLLM's drafter, Capabilities.drafts_per_step) one chain or one span a
    pass, as its host time at the engine's batch prices them (per_step_layout)."""
    beside = shares_passes(engine) and config.proposer is not None
    extend = span_extension(costs, config.suffix.max_span)  # not None: verification is cheap
    per_step = engine.capabilities.drafts_per_step
    if per_step and beside and config.chooses_spans:
        return Speculation(beside, extend, per_step_layout(costs, engine.batch), 1, per_step)
    if not (beside and extend is not None and config.chooses_spans):
        return Speculation(beside, extend, Layout.ONE, 1, per_step)
    if tree_passes(engine):
        return Speculation(beside, extend, Layout.TREE, MAX_TREE_CANDIDATES)
    if engine.max_sequences < 2:
        return Speculation(beside, extend, Layout.CHAIN, 1)
    return Speculation(beside, extend, Layout.FORKS, MAX_BRANCHES)
