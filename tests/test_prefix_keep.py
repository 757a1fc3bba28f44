"""Turns that do not start over: llama.cpp and transformers keep the last request's KV, the next
prefill feeds only what is new, and the output is token for token what a cold prefill gives."""
from __future__ import annotations

import pytest

from ssr.config import GenerationConfig
from ssr.engines.prefix import PrefixKeeper
from ssr.verifying.verify import common_prefix

CONFIG = GenerationConfig(max_answer_tokens=24, thinking_budget=24, draft_at=8, draft_tokens=8)
TURN1 = [{"role": "user", "content": "Write a Python function that reverses a list. " * 6}]
TURN2 = TURN1 + [{"role": "assistant", "content": "def rev(xs):\n    return xs[::-1]"},
                 {"role": "user", "content": "Now make it reverse a string too."}]


def test_keeper_keeps_the_longest_and_takes_a_shared_prefix():
    keeper = PrefixKeeper(min_tokens=2)
    keeper.fed(0, [1, 2, 3, 4])
    keeper.forked(0, 1)
    keeper.fed(1, [5, 6])
    keeper.truncated(0, 3)
    assert keeper.released(1) is None and keeper.kept == (1, [1, 2, 3, 4, 5, 6])
    assert keeper.released(0) == 0  # shorter than the kept one: cleared
    assert keeper.take([9, 9, 9]) is None and keeper.reused == 0  # nothing shared: kept for later
    assert keeper.take([1, 2, 3, 7]) == (1, 3) and keeper.reused == 3 and keeper.kept is None
    assert keeper.evict() is None
    assert common_prefix([1, 2], [1, 2, 3]) == 2


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("engine", ["llama.cpp", "transformers"])
def test_turn_two_reuses_turn_one_and_decodes_what_a_cold_prefill_does(engine):
    from ssr.api import SSR

    if engine == "transformers":
        pytest.importorskip("transformers", reason="the transformers engine needs  pip install -e '.[torch]'")
    warm, cold = SSR("smollm2-135m", engine), SSR("smollm2-135m", engine)
    cold.engine.prefix = None
    for mode in ("ssr", "ar"):
        config = GenerationConfig(**{**CONFIG.__dict__, "mode": mode})
        warm.start(TURN1, config).run()
        reused = warm.start(TURN2, config)
        result = reused.run()
        assert reused.metrics.cached_prompt_tokens > 0.6 * len(reused.prompt_ids)
        fresh = cold.start(TURN2, config)
        assert fresh.run().output_ids == result.output_ids and fresh.metrics.cached_prompt_tokens == 0
    assert warm.engine.live_sequences() == 0
