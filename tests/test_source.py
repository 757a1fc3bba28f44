"""proposing/source.py: what proposed a span, its name in traces and its first token's prior."""
import pytest

from ssr.pricing.costs import CostModel
from ssr.pricing.span_policy import SpanPolicy
from ssr.proposing.source import NO_SOURCE, Source

pytestmark = pytest.mark.shared_data  # needs nothing from ../shared: runs from a clone too

CPU_LIKE = CostModel(step_s=0.050, token_s=0.020)  # every scored token costs 0.4 step

PRIORS = [  # (source, its name in traces, its first-token prior): m / (m + 2) for m tokens matched
    (Source("lookup", 1), "lookup/1", 1 / 3), (Source("recent", 2), "recent/2", 2 / 4),
    (Source("lookup", 3), "lookup/3", 3 / 5), (Source("other", 2), "other/2", 2 / 4),
    (Source.suffix(0), "suffix/0", 1 / 3), (Source.suffix(1), "suffix/1", 4 / 6),
    (Source.suffix(2, alternative=True), "suffix/2~", 8 / 10), (Source.suffix(3), "suffix/3", 16 / 18),
    (Source.suffix(9), "suffix/3", 16 / 18),  # past the last bucket: its shortest match
    (Source("suffix"), "suffix", 0.9), (Source("draft"), "draft", 0.9), (NO_SOURCE, "", 0.9),  # no match named
    (Source("frequent"), "frequent", 0.05),  # follows no match: its own measured prior (UNMATCHED_PRIORS)
]


@pytest.mark.parametrize("source,name,prior", PRIORS, ids=[p[1] or "unnamed" for p in PRIORS])
def test_first_token_prior_follows_the_match_length(source, name, prior):
    assert source.prior == pytest.approx(prior) and str(source) == name
    stats = SpanPolicy(CPU_LIKE).stats[source]  # a new source starts from its own prior
    assert stats.prior_first == pytest.approx(prior) and stats.probs(1) == pytest.approx([prior])
