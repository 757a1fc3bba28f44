"""The span policy's guard (never slower than plain decoding): passes that lose time against the
plain steps they replace turn spans off, one proposal in explore_every still verified; a pass's
host time counted; and the pass prices a policy keeps between choices."""
from ssr.pricing.costs import CostModel
from ssr.proposing.source import Source


def test_span_guard_stops_spans_that_lose_time_and_keeps_exploring():
    """Passes that cost more than the plain steps they replace, by more than `tolerance` steps
    in all, turn spans off (one proposal in explore_every still verified); passes that gain, or
    lose less, keep them on."""
    from ssr.pricing.span_policy import SpanPolicy

    costs = CostModel(step_s=0.010, token_s=0.001)  # spans look cheap to the model ...
    losing = SpanPolicy(costs)
    assert losing.cut([1, 2, 3, 4]) == [1, 2, 3, 4]
    for _ in range(SpanPolicy.min_passes):
        losing.observe(4, 0, seconds=0.050)  # ... but each pass took 50 ms for one token
    assert losing.losing
    kept = [losing.cut([1, 2, 3, 4]) for _ in range(2 * SpanPolicy.explore_every)]
    assert sum(bool(span) for span in kept) == 2  # exploration only
    winning = SpanPolicy(costs)
    for _ in range(SpanPolicy.min_passes):
        winning.observe(4, 4, seconds=0.015)  # five tokens in 15 ms
    assert not winning.losing and winning.cut([1, 2, 3, 4]) == [1, 2, 3, 4]
    nearly = SpanPolicy(costs)
    for _ in range(SpanPolicy.min_passes):
        nearly.observe(4, 0, seconds=0.0101)  # a hundredth of a step lost a pass: within the tolerance
    assert not nearly.losing and all(nearly.cut([1, 2, 3, 4]) for _ in range(SpanPolicy.explore_every))
    nearly.observe(4, 0, seconds=0.010 * (1 + SpanPolicy.tolerance))  # past it
    assert nearly.losing
    untimed = SpanPolicy(costs)  # without seconds (older callers) the guard never judges
    for _ in range(SpanPolicy.min_passes):
        untimed.observe(4, 0)
    assert not untimed.losing


def test_the_guard_counts_host_time_and_skips_before_a_proposal():
    """Where a pass also costs host time (`host_s`: vLLM's drafter, every request of the batch
    drafted for on the step), passes that win a little per pass lose once it is counted; `skips`
    says so before anything is proposed: all but one in explore_every."""
    from ssr.pricing.span_policy import SpanPolicy

    costs = CostModel(step_s=0.010, token_s=0.0)
    for host_s, losing in ((0.0, False), (0.003, True)):
        policy = SpanPolicy(costs)
        policy.host_s = host_s
        for _ in range(4 * SpanPolicy.min_passes):
            policy.observe(4, 0 if _ % 5 else 1, seconds=0.010)  # one token in five passes: 2 ms a pass won
        assert policy.losing is losing
        asked = [policy.skips() for _ in range(2 * SpanPolicy.explore_every)]
        assert sum(not skip for skip in asked) == (2 if losing else 2 * SpanPolicy.explore_every)
        assert policy.choose_many([(Source("a"), [1, 2])], 1, guard=False)  # asked already: not again


def test_pass_prices_are_kept_only_while_the_cost_model_prices_as_it_did():
    """SpanPolicy keeps a pass's prices between choices; a drift learnt, another table or another
    cost model prices anew."""
    from dataclasses import replace as copy

    from ssr.pricing.costs import gpu_preset
    from ssr.pricing.span_policy import SpanPolicy

    costs = CostModel(table=gpu_preset())
    policy = SpanPolicy(costs)
    first = policy._prices(8)
    assert policy._prices(8)[0] is first[0]  # kept, not priced again
    assert policy._prices(5)[0] is first[0]  # a shorter span: the longer list serves
    longer = policy._prices(20)
    assert longer[0] == costs.costs(20) and longer[0][:8] == first[0]  # a longer one: priced anew
    costs.observe_step(2 * costs.table.step(1))  # a slower step learnt: drift
    assert policy._prices(8)[0] == costs.costs(8) != first[0]
    policy.costs = copy(costs, table=gpu_preset(0.03))
    assert policy._prices(8)[0] == policy.costs.costs(8)


def test_a_lone_candidate_is_cut_as_best_span_cuts_it():
    """choose_many of one candidate (its fast path) cuts it where best_span does, on random
    acceptance curves and costs; [] where no length pays; the guard's skip only where one does."""
    import random

    from ssr.pricing.acceptance import AcceptanceStats
    from ssr.pricing.span_cut import best_span
    from ssr.pricing.span_policy import SpanPolicy

    from ssr.pricing.costs import gpu_preset

    rng, source = random.Random(7), Source.of("lookup", 2)
    tables = (None, gpu_preset(), gpu_preset(0.03))
    for _ in range(200):
        table = rng.choice(tables)
        costs = CostModel(step_s=0.01, token_s=rng.choice((0.0001, 0.002, 0.006)), table=table)
        policy = SpanPolicy(costs)
        for _ in range(rng.randrange(12)):
            proposed = rng.randrange(1, 9)
            policy.observe(proposed, rng.randrange(proposed + 1), source=source)
        for _ in range(4):  # spans of several lengths in a row: the pass prices kept, longer than asked
            span = [rng.randrange(50) for _ in range(rng.randrange(1, 40))]
            length = best_span(policy.stats[source].probs(len(span)), costs)[0]
            assert policy.choose_many([(source, span)], 1) == ([(source, span[:length])] if length else [])
    never = SpanPolicy(CostModel(step_s=0.01, token_s=0.0))  # every length ties with a plain step
    never.stats[source] = AcceptanceStats(prior_first=0.0)  # S(k) = 0: the first of equals, a plain step
    assert never.choose_many([(source, [1, 2, 3])], 1) == []
    losing = SpanPolicy(CostModel(step_s=0.01, token_s=0.0001))
    losing.gain_s, losing.timed_passes = -1.0, SpanPolicy.min_passes
    kept = [losing.choose_many([(source, [1, 2, 3])], 1) for _ in range(SpanPolicy.explore_every)]
    assert sum(bool(each) for each in kept) == 1 and losing.skipped == SpanPolicy.explore_every
