"""Multi-stage SSR on the fake engine: drafts at b1 < b2 < ..., each bootstrapped from the
previous one; the output stays exactly plain decoding's."""
import pytest

from ssr.config import GenerationConfig, SamplingParams, SuffixParams
from ssr.loop import Generation
from ssr.engines.fake import FakeEngine
from ssr.formats.thinking import FORMATS

from test_decode_fake import FMT, PROMPT, answer_prefix_counts, contingency_p, run


@pytest.mark.parametrize("mode", ["ssr", "ssr-prefix", "ssr-suffix"])
@pytest.mark.parametrize("draft_at, interval", [(0, 5), (4, 9), (10, 30), (20, 1)])
def test_multistage_greedy_identity(mode, draft_at, interval):
    expected, _ = run("ar")
    got, engine = run(mode, draft_at=draft_at, draft_interval=interval)
    assert got.cot_ids == expected.cot_ids and got.answer_ids == expected.answer_ids
    assert engine.live_sequences() == 0  # every child released with the parent
    stages = got.metrics.stages
    assert [stage["forked_at"] for stage in stages] == list(range(draft_at, 40, interval))


def test_only_the_latest_child_is_alive():
    """An engine with room for two sequences: parent + one child, stage after stage."""
    expected, _ = run("ar", engine=FakeEngine(max_sequences=2))
    got, _ = run("ssr", engine=FakeEngine(max_sequences=2), draft_at=5, draft_interval=7)
    assert got.answer_ids == expected.answer_ids and len(got.metrics.stages) == 5


def test_bootstrap_takes_over_the_previous_draft():
    """With the local context deciding the logits (no drift), a later child agrees with the
    earlier draft, so it starts from it instead of decoding it again."""
    engine = FakeEngine(drift=0.0)
    single, _ = run("ssr", engine=FakeEngine(drift=0.0), draft_at=10, draft_tokens=30)
    multi, _ = run("ssr", engine=engine, draft_at=10, draft_interval=10, draft_tokens=30)
    assert multi.answer_ids == single.answer_ids
    first, second, third = multi.metrics.stages
    assert first["tokens"] == first["written"] + 1  # the fork's token + one per batched step
    assert second["bootstrapped"] > 0 and second["bootstrapped"] == first["accepted"]
    assert second["tokens"] == second["bootstrapped"] + 1 + second["written"]
    assert third["accepted"] == multi.metrics.accepted_prefix_tokens
    assert multi.metrics.draft_tokens == third["tokens"]
    # the bootstrapped child needed fewer batched steps for the same draft
    assert second["seconds_without_bootstrap"] >= second["seconds"] - second["bootstrap_s"]


def test_stage_beyond_the_cot_never_forks():
    got, _ = run("ssr", thinking_budget=12, draft_at=4, draft_interval=20)
    assert [stage["forked_at"] for stage in got.metrics.stages] == [4]


def test_multistage_sampling_distribution_matches_plain_decoding():
    """Bootstrapping re-verifies the old draft on the new child by rejection sampling, so the
    draft the parent verifies is a sample of the newest child: the answers keep ar's law."""
    ar = answer_prefix_counts("ar", "exact", range(0, 1500))
    counts, multistage = {}, 0
    for seed in range(20000, 21500):
        config = GenerationConfig(
            mode="ssr", thinking_budget=6, draft_at=1, draft_interval=2, draft_tokens=4, max_answer_tokens=2,
            policy="fixed", sampling=SamplingParams(temperature=1.0, seed=seed),
            suffix=SuffixParams(max_depth=8, max_span=4),
        )
        result = Generation(FakeEngine(order=2, drift=1.5), FMT, config, PROMPT).run()
        multistage += len(result.metrics.stages) >= 2
        assert all(stage["tokens"] <= 2 for stage in result.metrics.stages)
        key = tuple(result.answer_ids)
        counts[key] = counts.get(key, 0) + 1
    from collections import Counter

    assert multistage > 1000  # most CoTs run past the second fork
    assert contingency_p(ar, Counter(counts)) > 1e-3


def test_draft_interval_is_validated():
    from ssr.config import ConfigError

    with pytest.raises(ConfigError, match="--draft-interval"):
        GenerationConfig(draft_interval=-1)
    with pytest.raises(ConfigError, match="--policy"):
        GenerationConfig(policy="sometimes")
    assert FORMATS["code"].answer_prefix  # the fixture's format opens a code block


class EndsAfterThree(FakeEngine):
    """Answers end with EOS three tokens after the answer prefix; the CoT never ends early."""

    def _logits(self, tokens):
        logits = super()._logits(tokens)
        prefix = [ord(c) for c in FMT.answer_prefix]
        starts = [i for i in range(len(tokens) - len(prefix), -1, -1) if tokens[i : i + len(prefix)] == prefix]
        logits[0] = 100.0 if starts and len(tokens) - (starts[0] + len(prefix)) >= 3 else -100.0
        return logits


def test_a_bootstrapped_draft_that_ends_with_eos_is_complete():
    """The earlier child wrote the whole answer (EOS included): the next stage takes it over
    and writes nothing after the EOS."""
    expected, _ = run("ar", engine=EndsAfterThree(drift=0.0))
    got, _ = run("ssr", engine=EndsAfterThree(drift=0.0), draft_at=5, draft_interval=10)
    assert got.answer_ids == expected.answer_ids and len(got.answer_ids) == 3
    first, *later = got.metrics.stages
    assert first["tokens"] == 4 and len(later) == 3  # 3 answer tokens + EOS; forks at 15, 25, 35
    for stage in later:
        assert stage["bootstrapped"] == 4 and stage["written"] == 0 and stage["tokens"] == 4
    assert got.metrics.accepted_prefix_tokens == 4
