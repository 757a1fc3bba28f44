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


class OneSource:
    """`candidates` for a proposer that is a single source named `source`."""

    source = NO_SOURCE
    shape = CHAIN
    implementation = None

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        span, _ = self.propose(max_tokens)
        return [(self.source, span)] if span else []


class CompetingProposers:
    """Several sources proposing at once (ssr: the suffix tree and n-gram lookup); the span
    policy picks one per pass by expected tokens gained per second."""

    shape = CHAIN
    implementation = None  # not said: its sources are several

    def __init__(self, proposers: dict[str, Proposer]) -> None:
        self.proposers = proposers  # name -> proposer (each names its candidates' sources)

    def observe(self, token_ids: Sequence[int]) -> None:
        for proposer in self.proposers.values():
            proposer.observe(token_ids)

    def add_source(self, token_ids: Sequence[int]) -> None:
        for proposer in self.proposers.values():
            proposer.add_source(token_ids)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        for proposer in self.proposers.values():
            span, probs = proposer.propose(max_tokens)
            if span:
                return span, probs
        return [], None

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        return [candidate for proposer in self.proposers.values() for candidate in proposer.candidates(max_tokens)]


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
        span, _, match_len = self._best(max_tokens)
        bucket = match_bucket(match_len)
        return [(Source.suffix(bucket, kind=self.kind), span)] if span else []

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


class PromptLookupProposer(OneSource):
    """Prompt-lookup decoding as transformers runs it (`prompt_lookup_num_tokens=10`, its
    default `max_matching_ngram_size=2`): the last n tokens (n = max_ngram down to min_ngram)
    are looked up in prompt + output, the earliest occurrence with a continuation wins, and the
    num_tokens tokens after it are proposed, every step, CoT included."""

    source = Source("lookup")

    def __init__(self, seed: Sequence[int], max_ngram: int = 2, num_tokens: int = 10, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram  # longest n-gram matched first
        self.min_ngram = min_ngram  # shortest n-gram matched
        self.num_tokens = num_tokens  # tokens proposed after the match
        self.tokens: list[int] = []  # everything the model has seen
        self._first: dict[tuple[int, ...], int] = {}  # n-gram -> start of its earliest occurrence
        self.observe(seed)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Prompt lookup reads the request's own tokens only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        tokens, first, low = self.tokens, self._first, self.min_ngram
        for token in token_ids:
            tokens.append(token)
            for size in range(low, min(self.max_ngram, len(tokens)) + 1):
                first.setdefault(tuple(tokens[-size:]), len(tokens) - size)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        limit = min(max_tokens, self.num_tokens)
        tokens = self.tokens
        for size in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = self._first.get(tuple(tokens[-size:]))
            if limit > 0 and start is not None and start < len(tokens) - size:  # not the suffix itself
                return tokens[start + size : start + size + limit], None
        return [], None


class LookupProposer(PromptLookupProposer):
    """ssr's n-gram lookup over prompt + output: prompt lookup's earliest occurrence of the last n
    tokens (n = max_ngram down to 1: text the prompt states; `propose` is prompt lookup's), and
    beside it their two latest occurrences before the context's end (what the CoT said the last
    times it reached here: real CoTs restate their own recent lines), the tokens after each
    proposed; then the latest occurrence of the longest shorter n-gram that goes another way.
    Candidates whose first token an earlier one already offers are left out (the earliest and
    latest are kept: the policy learns them apart). With `others` (several candidates a pass, as
    one token tree), up to that many more: for the longest n-gram down, every other token the
    context's last n tokens went on to, from the latest occurrence that went that way ("other/n";
    a token tree verifies them for about the price of their nodes); with `frequent`, then the
    context's that many commonest tokens no candidate starts with, each followed by what followed
    its latest occurrence ("frequent": no context matched — where the last token is new, the
    only candidates). Each candidate's source names its occurrence and n ("lookup/3",
    "recent/2", "other/1"). O(max_ngram) per token; a proposal O(max_ngram + candidates)."""

    def __init__(self, seed: Sequence[int], max_ngram: int = 3, num_tokens: int = 64, others: int = 0,
                 frequent: int = 0) -> None:
        self.frequent = FrequentTokens(frequent)  # 0-gram candidates: the context's most frequent tokens
        self._latest: dict[tuple[int, ...], tuple[int, int | None]] = {}  # n-gram -> starts of its latest two
        # [n]: starts of the latest two occurrences of the context's last n tokens before this one
        self._before: list[tuple[int | None, int | None]] = [(None, None)] * (max_ngram + 1)
        self.others = others  # further candidates: other tokens the n-gram went on to
        # n-gram -> {the token that followed it: the start of the latest occurrence followed so}, oldest first
        self._ways: dict[tuple[int, ...], dict[int, int]] = {}
        super().__init__(seed, max_ngram, num_tokens, min_ngram=1)

    def observe(self, token_ids: Sequence[int]) -> None:
        tokens, first, latest, before, ways = self.tokens, self._first, self._latest, self._before, self._ways
        for token in token_ids:
            tokens.append(token)
            end = len(tokens)
            for size in range(1, min(self.max_ngram, end) + 1):
                gram = tuple(tokens[end - size:])
                before[size] = seen = latest.get(gram, (None, None))
                latest[gram] = (end - size, seen[0])
                first.setdefault(gram, end - size)  # prompt lookup's map, kept in the same pass
                if self.others and end > size:  # the n-gram before this token went on to it
                    went = ways.setdefault(tuple(tokens[end - 1 - size: end - 1]), {})
                    went.pop(token, None)
                    went[token] = end - 1 - size
            self.frequent.count(token)

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        limit = min(max_tokens, self.num_tokens)
        tokens, end = self.tokens, len(self.tokens)
        if limit <= 0:
            return []
        sizes = [size for size in range(min(self.max_ngram, end - 1), 0, -1) if self._before[size][0] is not None]
        if not sizes:  # the last token occurs nowhere before: only the context's frequent tokens
            return self._frequent(set(), limit)
        size, after = sizes[0], lambda start, n: tokens[start + n: start + n + limit]
        earliest, (latest, second) = self._first[tuple(tokens[end - size:])], self._before[size]
        out = [(Source.of("lookup", size), after(earliest, size))]
        if latest != earliest:
            out.append((Source.of("recent", size), after(latest, size)))
        offered = {span[0] for _, span in out}
        if second is not None and second != earliest and (span := after(second, size))[0] not in offered:
            out.append((Source.of("recent", size), span))
            offered.add(span[0])
        for shorter in sizes[1:]:  # a shorter match whose latest occurrence goes another way
            span = after(self._before[shorter][0], shorter)
            if span[0] not in offered:
                out.append((Source.of("recent", shorter), span))
                offered.add(span[0])
                break
        return out + self._other_ways(sizes, offered, limit) + self._frequent(offered, limit)

    def _other_ways(self, sizes: list[int], offered: set[int], limit: int) -> list[tuple[Source, list[int]]]:
        """Up to `others` candidates: for the longest n-gram down, the tokens the context's last n
        tokens went on to that no candidate offers yet, the latest first, each from the latest
        occurrence that went that way."""
        tokens, end, out = self.tokens, len(self.tokens), []
        for size in sizes:
            for token, start in reversed(self._ways.get(tuple(tokens[end - size:]), {}).items()):
                if len(out) >= self.others:
                    return out
                if token not in offered:
                    offered.add(token)
                    out.append((Source.of("other", size), tokens[start + size: start + size + limit]))
        return out

    def _frequent(self, offered: set[int], limit: int) -> list[tuple[Source, list[int]]]:
        """The context's most frequent tokens no candidate offers yet, most frequent first, each
        followed by what followed its latest occurrence ("frequent": no context matched)."""
        tokens, latest = self.tokens, self._latest
        return [(Source.of("frequent"), tokens[start: start + limit]) for token in self.frequent.top
                if token not in offered and (start := latest[(token,)][0]) is not None]


class FrequentTokens:
    """The `size` most frequent tokens of a context, kept as tokens are counted: O(size) a token
    at worst, O(1) mostly (counts only grow, so a token enters the top only by passing its last).
    Where no n-gram matches (a word the text has not used yet), the next token is often one of the
    context's commonest: on the development traces among the 8 commonest 22-28% of the time."""

    def __init__(self, size: int) -> None:
        self.size = size  # tokens kept
        self.counts: dict[int, int] = {}  # token -> occurrences in the context (counted while size > 0)
        self.top: list[int] = []  # the `size` most counted tokens, most first (ties: the first to get there)

    def count(self, token: int) -> None:
        if not self.size:
            return
        counts, top = self.counts, self.top
        counts[token] = number = counts.get(token, 0) + 1
        if token in top:
            at = top.index(token)
        elif len(top) < self.size:
            top.append(token)
            at = len(top) - 1
        elif number > counts[top[-1]]:
            top[-1], at = token, len(top) - 1
        else:
            return
        while at and counts[top[at - 1]] < number:  # move up past those it now outnumbers
            top[at - 1], top[at] = top[at], top[at - 1]
            at -= 1


def vllm_ngram(prompt: Sequence[int]) -> PromptLookupProposer:
    """The `ngram` peer: vLLM's `ngram` method as vLLM's docs configure it,
    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}; prompt_lookup_min
    left unset then equals prompt_lookup_max (vllm/config/speculative.py). Its proposer
    (vllm/v1/spec_decode/ngram_proposer.py) takes the longest n-gram in [min, max] ending the
    context (prompt + output) that occurred before, at its earliest occurrence, and proposes the
    k tokens after it: prompt lookup with n = 4 exactly and 5 tokens."""
    proposer = PromptLookupProposer(prompt, max_ngram=4, num_tokens=5, min_ngram=4)
    proposer.source = Source("ngram")
    return proposer


ALTERNATIVES = 4  # the suffix tree's further branches offered as candidates where several are verified a pass
OTHER_WAYS = 8  # n-gram lookup's further candidates where weak ones are worth offering (`wide`)
FREQUENT = 8  # the context's most frequent tokens offered as candidates there too (FrequentTokens)


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


def request_proposer(config, extend_prob: float | None, prompt_ids: Sequence[int],
                     history: ResponseHistory | None, several: bool = False, wide: bool = False,
                     trie: bool = False, views: Sequence[Sequence[int]] = ()) -> Proposer | None:
    """One proposer for a request's output, seeded with the prompt (drafts join at the close).
    ssr: its suffix tree (spans past the match length with `extend_prob`) and n-gram lookup
    compete; with `several` (several candidates a pass) the suffix tree's other branches too;
    with `wide` (a token tree or a chain picked among them) lookup's other ways and frequent tokens;
    with `trie` (a token tree; a chain loses more picks to its paths than it wins, docs/traces.md)
    the recency trie's draft tree (trie.py); with `views`, a suffix tree of them (escaped_suffix).
    The peers as their users run them."""
    kind = config.proposer
    if kind == "suffix" and config.uses_draft:
        from .trie import TrieProposer  # (it imports this module)
        params = config.suffix
        parts = {"suffix": ssr_suffix(params, prompt_ids, history, extend_prob, ALTERNATIVES if several else 0),
                 "lookup": LookupProposer(prompt_ids, 3, params.max_span, OTHER_WAYS if wide else 0,
                                          FREQUENT if wide else 0)}
        if trie:
            parts["trie"] = TrieProposer(prompt_ids, history)
        if views:
            parts["escaped"] = escaped_suffix(params, prompt_ids, views, extend_prob)
        return CompetingProposers(parts)
    if kind == "suffix":
        return suffix_peer(prompt_ids, history)
    if kind == "pld":
        return PromptLookupProposer(prompt_ids)
    if kind == "ngram":
        return vllm_ngram(prompt_ids)
    return None
