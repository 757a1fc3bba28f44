"""proposing/source.py: what proposed a span, its name in traces and its first token's prior."""
import pytest

from ssr.pricing.costs import CostModel
from ssr.pricing.span_policy import SpanPolicy
from ssr.proposing.source import NO_SOURCE, SUFFIX_MATCHES, Source

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
    (Source.of("frequent", band=1), "frequent@9", 0.02),  # past the 8 commonest: its band's (UNMATCHED_PRIORS)
    (Source.of("frequent", band=2), "frequent@17", 0.01),
    (Source("skip"), "skip", 0.05),  # what came two after the second-to-last token: no match either
]


@pytest.mark.parametrize("source,name,prior", PRIORS, ids=[p[1] or "unnamed" for p in PRIORS])
def test_first_token_prior_follows_the_match_length(source, name, prior):
    assert source.prior == pytest.approx(prior) and str(source) == name
    stats = SpanPolicy(CPU_LIKE).stats[source]  # a new source starts from its own prior
    assert stats.prior_first == pytest.approx(prior) and stats.probs(1) == pytest.approx([prior])


@pytest.mark.parametrize("tree", ["arctic-inference", "ssr"])
def test_the_escaped_views_are_a_source_of_their_own(tree, monkeypatch):
    """Tools offered, ssr's proposer holds a suffix tree of the messages' escaped views apart from
    the prompt's: where the output runs on as a view does (a tool's file written into a call's
    JSON string), it proposes the view's continuation, named "escaped/<bucket>"; where no view
    matches, nothing."""
    import sys

    from ssr.config import GenerationConfig, SuffixParams
    from ssr.proposing.proposers import escaped_suffix, request_proposer

    if tree == "ssr":
        monkeypatch.setitem(sys.modules, "ssr.proposing.suffix_native", None)  # arctic-inference absent
    else:
        pytest.importorskip("arctic_inference.suffix_decoding")
    params = SuffixParams(max_depth=16, max_span=8)
    prompt, view = [1, 2, 3, 9, 4, 5], [1, 2, 3, 7, 8, 4, 5, 6]  # the view: 9 written as 7 8
    proposer = escaped_suffix(params, prompt, [view], 0.0)
    assert proposer.implementation == tree
    proposer.observe([30, 31])
    assert proposer.candidates(8) == []  # the context occurs in no view
    proposer.observe([1, 2, 3])
    ((source, span),) = proposer.candidates(8)
    assert str(source) == f"escaped/{SUFFIX_MATCHES.index(source.match)}" and source.kind == "escaped"
    assert span[:5] == [7, 8, 4, 5, 6]
    whole = request_proposer(GenerationConfig(mode="ssr"), 0.0, prompt, None, views=[view])
    assert "escaped" in whole.proposers
    assert "escaped" not in request_proposer(GenerationConfig(mode="ssr"), 0.0, prompt, None).proposers
