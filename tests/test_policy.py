"""Span length from engine costs: tables with hand-set costs."""
import pytest

from ssr.policy import AcceptanceStats, CostModel, best_span_length

GPU_LIKE = CostModel(step_s=0.020, token_s=0.0002)  # a pass of k tokens ~ one step
CPU_LIKE = CostModel(step_s=0.050, token_s=0.020)  # every scored token costs 0.4 step

CASES = [
    ("GPU: confident span taken whole", GPU_LIKE, [1.0] * 8, 8),
    ("GPU: even unlikely tokens are nearly free", GPU_LIKE, [0.5, 0.25, 0.12], 3),
    ("CPU: confident span taken whole", CPU_LIKE, [1.0] * 8, 8),
    ("CPU: unlikely span dropped", CPU_LIKE, [0.2, 0.04, 0.01], 0),
    ("CPU: cut where confidence falls", CPU_LIKE, [0.95, 0.9, 0.85, 0.1, 0.05], 3),
    ("empty proposal", CPU_LIKE, [], 0),
]


@pytest.mark.parametrize("name,costs,probs,expected", CASES, ids=[c[0] for c in CASES])
def test_best_span_length(name, costs, probs, expected):
    assert best_span_length(probs, costs) == expected


def test_cost_model_learns_from_observations():
    costs = CostModel(step_s=0.1, token_s=0.1, smoothing=0.5)
    for _ in range(30):
        costs.observe_step(0.04)
        costs.observe_score(11, 0.04 + 10 * 0.01)
    assert costs.step_s == pytest.approx(0.04, rel=1e-3)
    assert costs.token_s == pytest.approx(0.01, rel=1e-2)


def test_acceptance_stats():
    stats = AcceptanceStats(accepted=0, proposed=0)
    stats.observe(num_proposed=4, num_accepted=4)  # 4 tried, 4 accepted
    stats.observe(num_proposed=4, num_accepted=1)  # 2 tried (the 2nd rejected), 1 accepted
    assert stats.probs(2) == pytest.approx([5 / 6, (5 / 6) ** 2])
