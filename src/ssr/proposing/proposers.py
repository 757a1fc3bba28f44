"""Proposers: they guess the next output tokens (CoT and answer) for one verify pass.

One small protocol: `observe` committed output tokens, `add_source` text to copy from
(a draft), `propose` up to n tokens. One proposer serves a request's whole output.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config import SuffixParams
from .history import ResponseHistory
from .realign import Realigner
from .source import NO_SOURCE, Source
from .suffix_tree import SuffixTree, match_bucket

# the `suffix` peer: vLLM's suffix method, its defaults (tree depth 24 = tokens, spec factor 1, min prob 0.1)
PEER_SUFFIX = SuffixParams(max_depth=24, max_span=24, span_factor=1.0, min_prob=0.1)


@dataclass(frozen=True)
class Shape:
    """How a proposer's candidates are verified, declared by it: one chain a pass, or all of them
    as one token tree (a peer whose engine verifies its own: SGLang, arctic's tree mode)."""

    tree: bool = False  # every candidate a path of one tree, verified in one pass
    width: int | None = None  # tokens every pass feeds, a match or not, pending and padding included
    pad: int = 0  # the token padding feeds

    def padding(self, fed: int) -> int:
        return max(0, (self.width or 0) - fed)  # pad tokens a pass of `fed` tokens adds


CHAIN = Shape()  # one span a pass, fed as proposed: ssr's sources and the chain peers


class Proposer(Protocol):
    shape: Shape  # how its candidates are verified
    implementation: str | None  # whose suffix tree it runs on ("arctic-inference", "ssr"), for the metrics

    def observe(self, token_ids: Sequence[int]) -> None:
        """Tokens just committed to the output (CoT, forced tokens and answer)."""

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Another sequence spans may be copied from (a draft); proposers may ignore it."""

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        """At most max_tokens guesses for the tokens that follow ([] for none), and the
        estimated probability that each prefix of them is right (None: no estimate)."""

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        """(source, span) of every non-empty proposal, for a span policy to choose from."""

    def prepare(self) -> None:
        """Index now what it would index at its first proposal (the prompt): the loop calls it
        as it builds the proposer, beside the prefill where the engine allows."""


class OneSource:
    """`candidates` for a proposer that is a single source named `source`."""

    source = NO_SOURCE
    shape = CHAIN
    implementation = None

    def prepare(self) -> None:
        """Nothing deferred (by default)."""

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        span, _ = self.propose(max_tokens)
        return [(self.source, span)] if span else []


class CompetingProposers:
    """Several sources proposing at once (ssr: the suffix tree and n-gram lookup); the span
    policy picks one per pass by expected tokens gained per second."""

    shape = CHAIN
    implementation = None  # not said: its sources are several

    def __init__(self, proposers: dict[str, Proposer], realigner: Realigner | None = None,
                 borrowed: Sequence[tuple[ResponseHistory, str, object]] = ()) -> None:
        self.proposers = proposers  # name -> proposer (each names its candidates' sources)
        self.realigner = realigner  # realign.Realigner: copies realigned after the model changed them (None: not)
        self.borrowed = list(borrowed)  # (history, name, index) borrowed for this request, given back at its end

    def end(self) -> None:
        """The request is over: what it borrowed goes back to its history (once)."""
        for history, name, index in self.borrowed:
            history.give_back(name, index)
        self.borrowed = []

    def observe(self, token_ids: Sequence[int]) -> None:
        for proposer in self.proposers.values():
            proposer.observe(token_ids)
        if self.realigner is not None:
            self.realigner.observe(token_ids)

    def add_source(self, token_ids: Sequence[int]) -> None:
        for proposer in self.proposers.values():
            proposer.add_source(token_ids)

    def prepare(self) -> None:
        for proposer in self.proposers.values():
            proposer.prepare()

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        for proposer in self.proposers.values():
            span, probs = proposer.propose(max_tokens)
            if span:
                return span, probs
        return [], None

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        found = [candidate for proposer in self.proposers.values() for candidate in proposer.candidates(max_tokens)]
        if self.realigner is not None:
            found += self.realigner.candidates(max_tokens)
            self.realigner.follow(found)
        return found

    def one_span_view(self) -> CompetingProposers:
        """The candidates request_proposer's one-span-a-pass proposer drafted per step (without
        `several`, `wide` and `lookup`: Layout.ONE on vLLM's drafter) offers, read from this one's
        state: its suffix sources' best spans. vLLM's drafter offers them where one chain among every source's does not
        pay for its host time at the step's batch (speculation.per_step_layout), as the replay
        does; only this proposer is observed."""
        return CompetingProposers({name: self.proposers[name].best_only()
                                   for name in ONE_SPAN_PARTS if name in self.proposers})


class ArcticSuffixProposer(OneSource):
    """The `suffix` peer on arctic-inference's C++ suffix tree, the library vLLM's `suffix`
    method calls, driven as vLLM's SuffixDecodingProposer drives it: the prompt starts a request,
    committed tokens extend its response (in the cache's global tree as they are written), the
    last max_depth tokens of prompt + output are the pattern. Drafts are not added (vLLM's method
    has no such source). `suffix_peer` picks it when arctic-inference is installed."""

    source = Source("suffix")
    implementation = "arctic-inference"

    def __init__(self, params: SuffixParams, prompt: Sequence[int], history: ResponseHistory | None = None) -> None:
        self.params = params
        history = history if history is not None else ResponseHistory(0)
        self.cache, self.request_id = history.arctic(params.max_depth)
        self.cache.start_request(self.request_id, list(prompt))
        self.context = list(prompt[-params.max_depth:])  # the pattern's source: prompt + output, last tokens

    def add_source(self, token_ids: Sequence[int]) -> None:
        """vLLM's suffix method speculates from the request and earlier responses only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        if token_ids:
            self.cache.add_active_response(self.request_id, list(token_ids))
            self.context = (self.context + list(token_ids))[-self.params.max_depth:]

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        limit = min(max_tokens, self.params.max_span)
        if limit < 1:
            return [], None
        draft = self.cache.speculate(self.request_id, self.context, max_spec_tokens=limit,
                                     max_spec_factor=self.params.span_factor, min_token_prob=self.params.min_prob)
        return list(draft.token_ids), list(draft.probs)


def suffix_peer(prompt: Sequence[int], history: ResponseHistory | None) -> Proposer:
    """The `suffix` peer: arctic-inference's tree where installed, else ssr's Python tree (tested alike)."""
    try:
        return ArcticSuffixProposer(PEER_SUFFIX, prompt, history)
    except ImportError:
        return SuffixProposer(PEER_SUFFIX, [prompt], history)


class SuffixProposer(OneSource):
    """Suffix decoding over source sequences (prompt, drafts), the live output and earlier
    responses, as vLLM's `suffix` method does over the prompt, the output so far and its global
    tree. The context's suffix nodes are kept up to date token by token in both trees, so a
    proposal costs O(depth), not O(depth^2)."""

    source = Source("suffix")
    implementation = "ssr"

    def __init__(self, params: SuffixParams, seeds: Sequence[Sequence[int]],
                 history: ResponseHistory | None = None, extend_prob: float | None = None,
                 kind: str = "suffix") -> None:
        self.params = params
        self.kind = kind  # its candidates' source kind
        self.extend_prob = extend_prob  # not None: spans go on past the match length (SuffixTree.propose_from)
        self.tree = SuffixTree(params.max_depth)  # this request: seeds and the live output
        for seed in seeds:
            self.tree.add_sequence(seed)
        self._live = self.tree.add_sequence()  # the output as it is committed
        self.history = history.tree(params.max_depth) if history is not None else None  # earlier responses
        self._history_nodes = [self.history.root] if self.history is not None else []  # context's suffixes there

    def add_source(self, token_ids: Sequence[int]) -> None:
        self.tree.add_sequence(token_ids)

    def observe(self, token_ids: Sequence[int]) -> None:
        self.tree.extend(self._live, token_ids)
        for token in token_ids if self.history is not None else ():
            self._history_nodes = self.history.advance(self._history_nodes, token)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        span, probs, _ = self._best(max_tokens)
        return span, probs

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        """One candidate, its source named by its match length (long matches are trusted more:
        a span policy measures each bucket apart)."""
        return self._candidates(max_tokens, 0)

    def _candidates(self, max_tokens: int, alternatives: int) -> list[tuple[Source, list[int]]]:
        """candidates; `alternatives` for NativeSuffixProposer's interface (this tree offers none)."""
        span, _, match_len = self._best(max_tokens)
        return [(Source.suffix(match_bucket(match_len), kind=self.kind), span)] if span else []

    def best_only(self):
        """Its best span alone, read from this proposer's state (it has no other branch)."""
        from .suffix_native import BestSpan

        return BestSpan(self)

    def _best(self, max_tokens: int) -> tuple[list[int], list[float], int]:
        """(span, probabilities, match length) of the request tree, or of the earlier responses'
        tree when it expects more tokens."""
        limit = min(max_tokens, self.params.max_span)
        factor, min_prob = self.params.span_factor, self.params.min_prob
        best = self.tree.propose_from(self.tree.suffix_nodes(self._live), limit, factor, min_prob, self.extend_prob)
        if self.history is not None:
            other = self.history.propose_from(self._history_nodes, limit, factor, min_prob, self.extend_prob)
            if sum(other[1]) > sum(best[1]):
                best = other
        return best


# request_proposer's parts without `several`, `wide` and `lookup`, in its order: one span a pass drafted
# per step (vLLM's drafter at a batch where one chain among every source's does not pay for its host
# time), where n-gram lookup's host time across the batch costs more than its spans win: `ssr traces
# <the five non-agentic dev files> --limit 30 --candidates chain --batch 32 --cost-model gpu:6
# --orders cold`, ssr / ar with host time (`ssr @6 ms + host`) 0.817-1.026 with it, 0.761-0.975
# without, ssr's own (host time off) better on 8 of 10 (set, model) groups, worse on 2 (by 0.009 and 0.024)
ONE_SPAN_PARTS = ("suffix", "escaped")
# one chain a pass (vLLM's drafter, inside vLLM's step: the batch waits while a new request's
# sources index its prompt) indexes the prompt's last this many tokens for n-gram lookup; the
# suffix tree holds all of it. On a 95,249-token agent prompt lookup's index took 0.16-0.20 s.
# `ssr traces ../shared/traces/agentic-nemo-gym.dev.jsonl.gz --tasks 2 --orders cold --candidates
# chain --modes ar,ssr,suffix` (with the Markov source's 4,096, markov.PROMPT_TOKENS): by set
# 0.7331 -> 0.7334 of `ar`, policy_model's `ssr @6 ms + host` 0.987 -> 0.921; the five
# non-agentic files (`--limit 30`), whose prompts are shorter, the same to the last digit
CHAIN_LOOKUP_PROMPT = 16_384
ALTERNATIVES = 4  # the suffix tree's further branches offered as candidates where several are verified a pass
# n-gram lookup's further candidates on a token tree (`trie`; one chain with the Markov source did as
# well without them: cold 0.8976 -> 0.8975, deployment 0.9080 -> 0.9079, host 0.294 -> 0.256 ms a pass)
OTHER_WAYS = 8
# the context's most frequent tokens offered as candidates (FrequentTokens), only on a token tree
# (`trie`; one chain has the Markov source's commonest token instead: cold 0.8980 -> 0.8976 without
# lookup's 8 commonest, host 0.33 -> 0.29 ms a pass), where each is a few nodes: the 32 commonest, in bands learnt apart
# (source.FREQUENT_BANDS), and up to 2 tokens that came two after the second-to-last one
# (LookupProposer `skips`). GPU preset, cold, ssr / SGLang: 0.842 -> 0.817 with the bands and the
# span policy's pricing of a candidate that starts another way, 0.810 with the skips; in one chain
# they won as many picks as they lost (docs/traces.md) and cost host time
FREQUENT_TREE, SKIPS = 32, 2


def ssr_suffix(params: SuffixParams, prompt_ids: Sequence[int], history: ResponseHistory | None,
               extend_prob: float | None, alternatives: int = 0) -> Proposer:
    """ssr's suffix source: on arctic-inference's C++ tree where installed (suffix_native; with `alternatives`,
    the tree's other branches too), else on ssr's own Python tree (tests/test_suffix_native.py)."""
    try:
        from .suffix_native import NativeSuffixProposer

        return NativeSuffixProposer(params, prompt_ids, history, extend_prob, alternatives)
    except ImportError:
        return SuffixProposer(params, [prompt_ids], history, extend_prob)


def escaped_suffix(params: SuffixParams, prompt_ids: Sequence[int], views: Sequence[Sequence[int]],
                   extend_prob: float | None) -> Proposer:
    """ssr's source over the escaped views (tools offered: tools.escaped_views): a suffix tree of
    the views and the output, apart from the prompt's so that neither's counts skew the other's;
    its spans are named "escaped/<bucket>" and learnt apart (right inside a call's JSON strings,
    seldom elsewhere)."""
    try:
        from .suffix_native import NativeSuffixProposer

        proposer = NativeSuffixProposer(params, [], None, extend_prob, kind="escaped")
        proposer.context = list(prompt_ids[-params.max_depth:])
    except ImportError:
        proposer = SuffixProposer(params, [], None, extend_prob, kind="escaped")
    for view in views:
        proposer.add_source(view)
    return proposer


LOOKUP_INDEX = "ssr-lookup"  # the history's name for the n-gram index a request gives back
# the prompt's last tokens left out of the index kept for the next turn: turn N renders turn N - 1's
# generation prompt otherwise (on policy_model's conversations 3 tokens from the end; a turn that
# ended elsewhere indexes its whole prompt again)
KEPT_TAIL = 16


def prompt_lookup(prompt_ids: Sequence[int], settings: tuple, history: ResponseHistory | None):
    """n-gram lookup (LookupProposer with these settings) over the prompt. In a deployment the
    index is marked KEPT_TAIL tokens before the prompt's end and given back at the request's end;
    where the next prompt starts with the marked part (turn N of a conversation holds turn N - 1's
    prompt, its last tokens maybe rendered otherwise: the assistant turn's opening), that index
    is rewound to the mark and only the rest is indexed: the same maps as indexing the whole
    prompt (tests/test_lookup_kept.py), without re-reading a conversation of up to 100,000
    tokens at every turn."""
    from .lookup import LookupProposer  # (it imports this module)

    kept = history.borrow(LOOKUP_INDEX) if history is not None else None
    start = kept.rewound_for(prompt_ids) if kept is not None and kept.settings == settings else None
    if start is not None:
        return _marked(kept, prompt_ids, start)
    if history is None:
        return LookupProposer(prompt_ids, *settings)
    return _marked(LookupProposer((), *settings), prompt_ids, 0)


def _marked(lookup, prompt_ids: Sequence[int], start: int):
    """`lookup` (its tokens the prompt's first `start`) given the rest of the prompt, marked
    KEPT_TAIL tokens before its end."""
    mark = max(start, len(prompt_ids) - KEPT_TAIL)
    lookup.observe(prompt_ids[start:mark])
    lookup.mark()
    lookup.observe(prompt_ids[mark:])
    return lookup


def request_proposer(config, extend_prob: float | None, prompt_ids: Sequence[int],
                     history: ResponseHistory | None, several: bool = False, wide: bool = False,
                     trie: bool = False, views: Sequence[Sequence[int]] = (), lookup: bool = True) -> Proposer | None:
    """One proposer for a request's output, seeded with the prompt (drafts join at the close).
    ssr: its suffix tree (spans past the match length with `extend_prob`) and n-gram lookup
    compete; with `several` (several candidates a pass) the suffix tree's other branches too;
    with `wide` (a token tree or a chain picked among them) copies realigned after the model
    changed them (realign.py);
    with `trie` (a token tree; in a chain its paths cost more host time than they win, docs/traces.md)
    the recency trie's draft tree (trie.py), lookup's other ways, skips and the context's frequent tokens;
    without it, where wide (one chain), the variable-order Markov source (markov.py); with
    `views`, a suffix tree of them (escaped_suffix); without `lookup` (one span a pass drafted per
    step: ONE_SPAN_PARTS), no n-gram lookup.
    The peers as their users run them."""
    kind = config.proposer
    if kind == "suffix" and config.uses_draft:
        from .lookup import LookupProposer  # (they import this module)
        from .trie import TrieProposer
        params = config.suffix
        chain = wide and not trie  # one chain a pass (docs/chain.md)
        parts = {"suffix": ssr_suffix(params, prompt_ids, history, extend_prob, ALTERNATIVES if several else 0)}
        borrowed = []
        if lookup:
            settings = (3, params.max_span, OTHER_WAYS if trie else 0, FREQUENT_TREE if trie else 0,
                        SKIPS if trie else 0)
            if chain:  # a window of the prompt's end, which the next turn's does not start with
                parts["lookup"] = LookupProposer(prompt_ids[-CHAIN_LOOKUP_PROMPT:], *settings)
            else:
                parts["lookup"] = prompt_lookup(prompt_ids, settings, history)
                if history is not None:
                    borrowed.append((history, LOOKUP_INDEX, parts["lookup"]))
        if trie:
            parts["trie"] = TrieProposer(prompt_ids, history)
        if views:
            parts["escaped"] = escaped_suffix(params, prompt_ids, views, extend_prob)
        if chain:
            from .markov import MarkovProposer

            parts["markov"] = MarkovProposer(prompt_ids, history)
        return CompetingProposers(parts, Realigner() if wide else None, borrowed)
    if kind == "suffix":
        return suffix_peer(prompt_ids, history)
    if kind == "pld":
        from .lookup import PromptLookupProposer

        return PromptLookupProposer(prompt_ids)
    if kind == "ngram":
        from .lookup import vllm_ngram

        return vllm_ngram(prompt_ids)
    return None
