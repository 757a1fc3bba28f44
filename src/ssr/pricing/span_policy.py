"""Span policy: how long a speculated span is worth verifying, and which candidate spans.

Every span is verified in one pass with the pending token; its worth is expected tokens per
second on this engine's cost curve (CostModel), from each source's measured acceptance
(AcceptanceStats). Used by the decoding loop and, through the replay engine, by the simulator.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .acceptance import AcceptanceStats
from .costs import CostModel
from .span_cut import best_length, best_spans, pass_floors
from ..proposing.source import NO_SOURCE, Source
from ..verifying.verify import common_prefix


MAX_BRANCHES = 6  # candidate spans verified in one pass at most, each on its own fork (cheap verification)
MAX_TREE_CANDIDATES = 48  # the same as one token tree on one sequence (engines with tree attention: the span
#                           policy prices every node; 16 bound the recency trie's paths, GPU preset: 1% slower)
# passes over up to this many tokens a token tree's choice prices from one list (SpanPolicy._prices,
# kept while the cost model stands): its nodes beside the first span reach ~170 on agent turns
TREE_PRICES = 256
CHEAP_SPAN_STEPS = 1.5  # a verify pass over the longest span costing at most this many steps is "cheap"


def span_extension(costs: CostModel, max_span: int) -> float | None:
    """Where verifying max_span tokens costs about one step (GPUs: a pass is memory-bound up to
    hundreds of tokens), suffix spans go on past their match length along the tree's most
    frequent continuation (the probability floor it returns, 0.0; SuffixTree.propose_from), and
    best_span cuts each to what its source's measured acceptance is worth. Elsewhere (a CPU,
    where a scored token costs up to half a step) None: spans stop at the match length."""
    return 0.0 if costs.cost(max_span + 1) <= CHEAP_SPAN_STEPS * costs.cost(1) else None


def left_out(found: Sequence[tuple[Source, list[int]]],
             chosen: Sequence[tuple[Source, list[int]]]) -> tuple[tuple[Source, list[int]], ...]:
    """The candidates found that the span policy did not choose (a chosen one is a found one cut)."""
    return tuple(candidate for candidate in found if not any(
        source is candidate[0] and candidate[1][:len(span)] == span for source, span in chosen))


def judge(candidates: Sequence[tuple[Source, list[int]]], committed: Sequence[int]) -> list[tuple[Source, int, int]]:
    """(source, tokens judged, of them right) per candidate: its span against the tokens a pass
    committed, as far as they go (past them it is not judged yet), for SpanPolicy.observe_judged."""
    return [(source, min(len(span), len(committed)), common_prefix(span, committed))
            for source, span in candidates]


def pooled_probs(probs: Sequence[float], sharing: Sequence[Sequence[float]]) -> list[float]:
    """A candidate's chance that each prefix of it is right, pooled with the other candidates that
    propose the same tokens: probs[i], its own chance for its first i + 1 tokens (S(i + 1)); each
    of `sharing`, another candidate's S(1) .. S(k) over the k first tokens it shares with this one.
    A prefix is right when any candidate that proposes it is, the candidates taken as independent
    witnesses: 1 - the product of their misses. Non-increasing, as each S is and fewer candidates
    share the longer prefixes."""
    miss = [1.0 - prob for prob in probs]
    for other in sharing:
        for i, prob in enumerate(other[: len(miss)]):
            miss[i] *= 1.0 - prob
    return [1.0 - each for each in miss]


def _priced(priced: list[float], costs: CostModel, num_tokens: int) -> float:
    """costs.cost(num_tokens), from the pass's price list where it reaches (priced[k - 1]: k tokens)."""
    return priced[num_tokens - 1] if 0 < num_tokens <= len(priced) else costs.cost(num_tokens)


class _BySource(dict):
    """Source -> AcceptanceStats; a source seen first starts from its own prior (Source.prior),
    its older spans weighing `decay` less a span."""

    def __init__(self, stats: dict[Source, AcceptanceStats], decay: float) -> None:
        super().__init__(stats)
        self.decay = decay

    def __missing__(self, source: Source) -> AcceptanceStats:
        stats = self[source] = AcceptanceStats(prior_first=source.prior, decay=self.decay)
        return stats


# a chain policy's memory (SpanPolicy `one_chain`): it learns from every candidate every pass, ten
# times as many spans a source as from the one it verifies, so its spans weigh 0.99 less each
# rather than 0.9: about the same stretch of text. GPU preset, `--candidates chain`, cold, ssr /
# suffix (geometric mean of the medians): 0.9218 as verified only, 0.9178 judged at 0.9, 0.9128
# at 0.99, 0.9141 at 0.999; 0.99 without judging 0.9280
JUDGED_DECAY = 0.99


class SpanPolicy:
    """Chooses, among the proposers' candidate spans, the one (cut to the best length) with the
    most expected tokens per second on this engine's cost curve (best_span), from each source's
    measured acceptance curve (AcceptanceStats; a suffix span's source names its match-length bucket);
    learns from every verdict, per source. Used by the decoding loop and (through the replay
    engine) by the simulator alike. In one chain a pass (`one_chain`) a candidate's tokens that
    other candidates propose too are priced with their chance pooled in (pooled_probs): the chain
    is verified alone, so what it shares with the rest is all their witness counts for. GPU
    preset, `--candidates chain`, ssr / suffix (geometric mean of the medians): cold 0.9128 ->
    0.9083, deployment 0.9343 -> 0.9268. A token tree, which verifies the others beside it, gains
    nothing from it (0.8027 -> 0.8028 cold) and does not pool.

    Guard (never slower than plain decoding): the loop also reports each pass's seconds;
    the realised gain, sum over passes of (tokens committed x a plain step's cost - the pass's
    seconds), is kept. Once `min_passes` passes have lost more than `tolerance` plain steps
    overall, spans stop and one in `explore_every` proposals is still verified, so the gain can
    recover."""

    min_passes = 8  # passes before the guard judges
    explore_every = 8  # while off: verify one proposal in this many
    # plain steps' worth of time spans may have lost before they stop (what the guard lets a request
    # lose). At 0 a GPU request's first passes, whose spans cost a percent of a step more when
    # nothing is accepted, turned spans off at a loss of 0.01 steps and the explored passes took
    # dozens of passes to win it back: in one chain (`ssr traces --candidates chain`, GPU preset,
    # cold) 5% of CRUXEval's passes went plain where vLLM's suffix would have accepted 0.5 tokens
    # a pass; at 1 every group's ssr / suffix was the same or lower (geometric mean of the
    # medians 0.924 -> 0.922), the token tree's by at most 0.002, this CPU's by at most 0.011 either
    # way, all still <= 1.00 of `ar`
    tolerance = 1.0

    carry = 0.75  # weight of earlier requests' spans in a new request's acceptance curves

    def __init__(self, costs: CostModel, learnt: dict[Source, AcceptanceStats] | None = None,
                 one_chain: bool = False) -> None:
        self.costs = costs
        # one chain a pass (vLLM's drafter, `--candidates chain`): the candidates it leaves out learn
        # from the tokens each pass commits too (observe_judged), as if verified; and a candidate
        # whose tokens others propose too is priced with their chance pooled in (pooled_probs)
        self.one_chain = one_chain
        decay = JUDGED_DECAY if one_chain else AcceptanceStats.decay
        # per source; starts from what earlier requests learnt (PolicyStats.spans), carried at 3/4 weight
        self.stats: dict[Source, AcceptanceStats] = _BySource(
            {source: replace(stats.carried(self.carry), decay=decay) for source, stats in (learnt or {}).items()},
            decay)
        self.gain_s = 0.0  # realised seconds saved by span passes against plain steps
        # host seconds a drafted pass adds to its step, where requests are drafted for one after
        # another (vLLM's drafter: speculation.host_seconds), counted against the gain too
        self.host_s = 0.0
        self.timed_passes = 0  # passes whose seconds were reported
        self.skipped = 0  # proposals dropped by the guard since the last one verified
        self._priced: tuple | None = None  # (cost model, its table, its prices' key, pass costs, floors): _prices

    def choose(self, candidates: Sequence[tuple[Source, list[int]]]) -> tuple[Source, list[int]]:
        """(source, span cut to its best length) of the candidate worth most; (NO_SOURCE, []) for a plain step."""
        chosen = self.choose_many(candidates, 1)
        return chosen[0] if chosen else (NO_SOURCE, [])

    def choose_many(self, candidates: Sequence[tuple[Source, list[int]]], max_count: int,
                    tree: bool = False, guard: bool = True) -> list[tuple[Source, list[int]]]:
        """The candidate worth most (cut to its best length), then up to max_count - 1 others
        worth verifying beside it in the same pass: one is added when the tokens it is expected
        to add where the chosen ones fail (the chance that the chosen ones fail by where they
        part from this one — in a token tree only those that share its start, _add_beside — x
        this one's expected accepted tokens past that, at a plain step's cost each) outweigh
        what it adds to the pass — each on its own sequence, its pending token and span; with
        `tree` (one token tree, tree.build_tree), the nodes it does not share with the chosen
        ones, cut where a node no longer pays for itself (_paying: on the development traces,
        GPU preset, 0.4-2.2% less time than adding whole spans). [] for a plain step. `guard`:
        the guard may skip it here (not where the caller asked `skips` before proposing)."""
        if len(candidates) == 1:  # one source's span (Layout.ONE drafted per step): the same choice, less host time
            return self._choose_one(*candidates[0], guard)
        ranked = []  # (tokens per second, source, cut span) of every span worth a pass alone
        longest_span = max(len(span) for _, span in candidates) + 1 if candidates else 0
        # a tree's passes grow node by node past any one span (_paying prices each): priced in the list
        priced, floors = self._prices(max(longest_span, TREE_PRICES if tree else 0)) if candidates else ([], [])
        longest: dict[Source, int] = {}  # source -> its longest span here (sources repeat)
        for source, span in candidates:
            longest[source] = max(longest.get(source, 0), len(span))
        best = {source: best_spans(self.stats[source].probs(length), self.costs, priced, floors)
                for source, length in longest.items()}  # source -> [span length] -> best_span
        starting = self._starting(candidates) if self.one_chain else {}
        for source, span in candidates:
            length, rate = best[source][len(span)]
            if length and len(starting.get(span[0], ())) > 1:  # one chain: others propose its tokens too
                rate = self._pooled_rate(source, span, length, starting[span[0]], priced)
            if length:
                ranked.append((rate, source, span[:length]))
        ranked.sort(key=lambda each: -each[0])  # stable: the first of equals stays first
        if ranked and guard and self.skips():
            return []
        chosen = [(source, span) for _, source, span in ranked[:1]]
        return self._add_beside(chosen, ranked[1:], max_count, tree, priced) if chosen else []

    def _choose_one(self, source: Source, span: list[int], guard: bool) -> list[tuple[Source, list[int]]]:
        """choose_many of one candidate: it cut to its best length, or [] (a plain step, or the guard's skip)."""
        priced, floors = self._prices(len(span) + 1)
        length = best_length(self.stats[source].survivals(), len(span), priced, floors)
        if not length or (guard and self.skips()):
            return []
        return [(source, span[:length])]

    def _prices(self, length: int) -> tuple[list[float], list[float]]:
        """(the costs of passes over 1 .. length tokens or more, pass_floors of them), kept while
        the cost model prices as it did (the same model and table, no drift learnt since: drafted
        per step a request's every pass, and each step of a batch's requests, reuses them). A
        longer list than asked for serves too: its first prices are the same, and its floors,
        never above a shorter list's, still bound every longer pass (best_spans stops no sooner
        than the span's best is known). At 32 requests in the batch, one span a pass, 2 in 3 calls
        asked for a length other than the last one's."""
        costs = self.costs
        key = (costs.drift, costs.score_drift, costs.step_s, costs.token_s)
        kept = self._priced
        if kept is None or kept[0] is not costs or kept[1] is not costs.table or kept[2] != key \
                or len(kept[3]) < length:
            longest = max(length, len(kept[3])) if kept is not None and kept[2] == key else length
            priced = costs.costs(longest)
            kept = self._priced = (costs, costs.table, key, priced, pass_floors(priced))
        return kept[3], kept[4]

    @staticmethod
    def _starting(candidates: Sequence[tuple[Source, list[int]]]) -> dict[int, list[tuple[Source, list[int]]]]:
        """The candidates by their first token."""
        starting: dict[int, list[tuple[Source, list[int]]]] = {}
        for candidate in candidates:
            starting.setdefault(candidate[1][0], []).append(candidate)
        return starting

    def _pooled_rate(self, source: Source, span: list[int], length: int,
                     starting: list[tuple[Source, list[int]]], priced: list[float]) -> float:
        """Tokens per second of a chain's span, cut to `length`, whose first tokens other candidates
        (`starting`: those that start as it does, itself among them) propose too: its chance for
        each prefix pooled with theirs (pooled_probs)."""
        sharing, cut = [], span[:length]
        for other_source, other in starting:
            common = 0 if other is span else common_prefix(cut, other)
            if common:
                sharing.append(self.stats[other_source].probs(common))
        return (1.0 + sum(pooled_probs(self.stats[source].probs(length), sharing))) / priced[length]

    def _add_beside(self, chosen: list[tuple[Source, list[int]]], ranked: list[tuple[float, Source, list[int]]],
                    max_count: int, tree: bool, priced: list[float]) -> list[tuple[Source, list[int]]]:
        """choose_many's further candidates, best first, each kept when worth its tokens beside the
        chosen ones (priced: the costs of passes over 1, 2, ... tokens).

        In a token tree the chosen ones that start with another token cannot be right together
        with a candidate (the target writes one token there): where it is right they are all
        wrong. Its worth is its own, discounted only by the chance that the policy's first
        choice is right (a confident first choice says the text here is predictable, and the
        candidate's rate, learnt over every pass, does not); the chosen ones it shares a start
        with cover it where they are right, so it gains where they fail by where they part.
        Pricing it by the chance that every chosen one misses, as if they could be right
        together, was 0.9% slower on the development traces (GPU preset, cold; docs/traces.md)
        and kept the context's less common tokens out of the tree; not discounting it at all,
        0.3% slower (0.7% in deployment order).
        On forks the candidate is priced by that chance still: a fork costs a sequence, and a
        learnt rate its prior props up (a source never right keeps ~12% after 20 spans) would
        add forks that never pay; the development traces' forks replays are the same either way."""
        step_s, fed = priced[0], len(chosen[0][1]) + 1  # a plain step; tokens in the pass so far
        misses = [1.0 - self.stats[chosen[0][0]].curve(1)[0]]  # each chosen one's first-token miss chance
        all_miss = misses[0]  # forks: the product of misses, every chosen one fails at its first token
        starting = {chosen[0][1][0]: [0]}  # a first token -> the chosen ones that start with it, in order
        for _, source, span in ranked:
            if len(chosen) >= max_count:
                break
            first = span[0]
            most, miss = 0, misses[0] if tree else all_miss  # no chosen one starts with its first token
            sharing = starting.get(first)
            if sharing is not None:
                shared = [common_prefix(chosen[i][1], span) for i in sharing]  # each at least 1
                most = max(shared)
                if most == len(span):  # nothing a chosen one does not try
                    continue
                miss = 1.0  # every chosen one fails where this one parts from it (forks: at its first token)
                if tree:  # (the chosen ones that start otherwise are wrong where it is right)
                    for i, common in zip(sharing, shared):
                        miss *= self._parting_miss(chosen[i][0], common)
                else:
                    for first_miss in misses:
                        miss *= first_miss
            curve = self.stats[source].curve(len(span))  # S(1) .. S(len(span)), maybe more
            if tree:  # its nodes past the shared prefix, as many as pay for themselves (so they pay together)
                added = self._paying(curve, most, len(span), miss * step_s, priced, fed)
                span = span[: most + added]
            else:  # its pending token and span on a fork, kept when they pay together
                added = len(span) + 1
                gain = miss * sum(curve[: len(span)]) * step_s
                if gain <= _priced(priced, self.costs, fed + added) - _priced(priced, self.costs, fed):
                    added = 0
            if added:
                starting.setdefault(first, []).append(len(chosen))
                chosen.append((source, span))
                misses.append(1.0 - curve[0])
                all_miss *= misses[-1]
                fed += added
        return chosen

    def _paying(self, curve: list[float], start: int, end: int, worth: float, priced: list[float], fed: int) -> int:
        """How many of a candidate's new nodes (curve[start:end]: S of its tokens past the shared
        prefix) pay for themselves beside the chosen ones: each adds its acceptance chance x
        `worth` (the chance every chosen one misses x a step's seconds) and costs what one more
        token adds to the pass; the first that does not pay ends it."""
        cost = _priced(priced, self.costs, fed)
        for count in range(end - start):
            more = _priced(priced, self.costs, fed + count + 1)
            if curve[start + count] * worth <= more - cost:
                return count
            cost = more
        return end - start

    def _parting_miss(self, source: Source, common: int) -> float:
        """The chance that a span of this source fails at token common + 1, given the first common
        were right: 1 - S(common + 1) / S(common)."""
        curve = self.stats[source].curve(common + 1)
        return 1.0 - curve[common] / curve[common - 1] if curve[common - 1] > 0 else 1.0

    def cut(self, span: list[int], source: Source = NO_SOURCE) -> list[int]:
        """One source's span cut to its best length ([] for a plain step)."""
        return self.choose([(source, span)])[1]

    def skips(self) -> bool:
        """The guard's word on a proposal: while spans are losing, all but one in `explore_every`
        are skipped."""
        if not self.losing:
            return False
        self.skipped += 1
        return bool(self.skipped % self.explore_every)

    @property
    def losing(self) -> bool:
        return self.timed_passes >= self.min_passes and self.gain_s < 0.0 \
            and self.gain_s < -self.tolerance * self.costs.cost(1)  # (priced only when spans lose at all)

    def observe(self, num_proposed: int, num_accepted: int, seconds: float | None = None,
                source: Source = NO_SOURCE) -> None:
        """A verified span: its length, the verdict, the pass's seconds when measured, and its source."""
        self.observe_pass([(source, num_proposed, num_accepted)], seconds)

    def observe_judged(self, judged: Sequence[tuple[Source, int, int]]) -> None:
        """Candidates the pass did not verify, judged against the tokens it committed: (source,
        tokens judged, of them right) each; with `one_chain`, every source learns from them as from
        its verified spans. In one chain a pass the pick is all there is, and a source the policy
        does not pick would otherwise never learn it had become right (docs/chain.md)."""
        if not self.one_chain:
            return
        for source, num_judged, num_right in judged:
            if num_judged:
                self.stats[source].observe(num_judged, num_right)

    def observe_pass(self, verified: Sequence[tuple[Source, int, int]], seconds: float | None = None) -> None:
        """A pass that verified one or more candidate spans, (source, proposed, accepted) each,
        and its seconds when measured: every source learns its own verdict; the guard counts the
        pass once, with the tokens the best of them committed."""
        for source, num_proposed, num_accepted in verified:
            self.stats[source].observe(num_proposed, num_accepted)
        if seconds is not None:
            self.timed_passes += 1
            self.gain_s += (max(accepted for _, _, accepted in verified) + 1) * self.costs.cost(1) - seconds - self.host_s
