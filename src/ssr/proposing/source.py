"""What proposed a candidate span: a value the span policy keys its acceptance statistics by,
with the prior its first token starts from. Its string is for traces and tables only."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from .suffix_tree import MATCH_BUCKETS

SUFFIX_MATCHES = (1,) + MATCH_BUCKETS  # a suffix span's match-length bucket -> the shortest match in it
# sources whose spans follow no context match, and their first token's prior ([band]: one per
# band, below): "frequent" (one of the context's 8 commonest tokens, lookup.FrequentTokens): the 8
# together held the next token 22-28% of the time on the development traces, ~3.5% each; past
# the 8 commonest a token is right seldom (on the CRUXEval development traces, cold, where no other
# candidate was right: 0.5% each for ranks 9-16, 0.4% for 17-32), but on a token tree one node
# costs less than that is worth; "skip" (a token that came two after the second-to-last one,
# lookup.LookupProposer): as rare as the 8 commonest, given the same; a copy realigned after the
# model changed it (realign.py: "resume" past the changed token, "rejoin" past a token left out):
# below a 1-token match's 0.33 (each is learnt within a few dozen spans; 0.1 instead moved
# nemo-gym's median in deployment order by 0.0002); "markov" (markov.py: the context's commonest
# token, then its greedy path, where the last token occurred nowhere before): 0.1
UNMATCHED_PRIORS = {"frequent": (0.05, 0.02, 0.01), "skip": (0.05,), "resume": (0.3,), "rejoin": (0.3,),
                    "markov": (0.1,)}
FREQUENT_BANDS = (0, 8, 16)  # the context's commonest tokens in bands by rank, learnt apart: [band] its first rank
NAMED_NO_MATCH_PRIOR = 0.9  # the first token's prior for other sources that name no match
SUFFIX_KINDS = ("suffix", "escaped")  # sources whose match is a suffix tree's bucket


@dataclass(frozen=True)
class Source:
    """Proposers name their candidates with `Source.of` / `Source.suffix`: one object per value, so
    the span policy's per-pass dict lookups find their key by identity (a value built with
    `Source(...)` is equal and hashes alike, only slower to look up)."""

    kind: str  # "suffix" (the suffix tree), "escaped" (the suffix tree of the escaped views), "lookup" (an
    #            n-gram's earliest occurrence), "recent" (a later one), "other" (another way the n-gram
    #            went), "skip" (what came two after the second-to-last token), "frequent", "resume" /
    #            "rejoin" (a copy realigned after a change, realign.py), "markov" (the greedy path
    #            of a variable-order Markov model of the text, matched again every token: markov.py), or a peer's or the oracle's name
    match: int | None = None  # tokens of context its spans follow at least (None: it names no match)
    alternative: bool = False  # another branch of the suffix tree after the same match than its best
    band: int = 0  # "frequent": the band of the context's commonest tokens it starts with (FREQUENT_BANDS)
    _hash: int = field(init=False, repr=False, compare=False, default=0)  # hash of the four above, once

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.kind, self.match, self.alternative, self.band)))

    def __hash__(self) -> int:
        return self._hash

    @staticmethod
    @cache
    def of(kind: str, match: int | None = None, alternative: bool = False, band: int = 0) -> Source:
        """The one Source of these values."""
        return Source(kind, match, alternative, band)

    @staticmethod
    def suffix(bucket: int, alternative: bool = False, kind: str = "suffix") -> Source:
        """A suffix-tree span after a match in this bucket (suffix_tree.match_bucket); `kind`: whose
        tree ("escaped": the escaped views')."""
        return Source.of(kind, SUFFIX_MATCHES[min(bucket, len(SUFFIX_MATCHES) - 1)], alternative)

    @property
    def prior(self) -> float:
        """The prior chance that its first token is right, from the match its spans follow:
        m / (m + 2) for m tokens of context matched (a lookup of n tokens: m = n; a suffix span:
        its bucket's shortest match). Longer matches are right more often; on the development
        traces (this machine's costs, 12 traces per group) first tokens were accepted 16-37% after
        1-token matches, 40-45% after 2, 55-67% after 3, 62% after 4-7, 77% after 8-15, 93% after
        16+ — m / (m + 2) gives 33, 50, 60, 67, 80, 89%. A prior no higher than what a source
        delivers keeps it from being tried at a loss where a failed token costs half a step
        (CPUs); where verifying is cheap (GPUs) every source is tried anyway. Sources that follow
        no match at all (UNMATCHED_PRIORS, by band): their own; other sources that name no
        match: 0.9."""
        if self.match is None:
            priors = UNMATCHED_PRIORS.get(self.kind)
            return priors[self.band] if priors else NAMED_NO_MATCH_PRIOR
        return self.match / (self.match + 2)

    def __str__(self) -> str:
        """"lookup/3", "suffix/2" (the bucket), "suffix/2~" (an alternative), "frequent", "frequent@9"
        (a band: from the 9th commonest token), ..."""
        if self.match is None:
            return f"{self.kind}@{FREQUENT_BANDS[self.band] + 1}" if self.band else self.kind
        number = SUFFIX_MATCHES.index(self.match) if self.kind in SUFFIX_KINDS else self.match
        return f"{self.kind}/{number}{'~' if self.alternative else ''}"


NO_SOURCE = Source("")  # a plain step, or a span whose source is not said
