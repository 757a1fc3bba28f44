"""The request's proposer built beside the prefill (Capabilities.prefill_frees_host): on an engine
whose prefill leaves the host free the loop indexes the prompt on another thread meanwhile, the
same proposer and the same tokens; a replay with an accelerator's costs takes what the prefill's
modelled seconds cover off the host time; a CPU's costs and vLLM's drafter cover nothing."""
import threading
from dataclasses import replace

import pytest

import ssr.loop.generation as generation
from ssr.bench.replay import ChainReplayEngine, ReplayEngine, RowModel, TreeReplayEngine
from ssr.config import GenerationConfig
from ssr.engines.fake import FakeEngine
from ssr.formats.thinking import FORMATS
from ssr.loop import Generation
from ssr.pricing.costs import CostTable, gpu_preset

FMT = FORMATS["code"]
PROMPT = [ord(c) for c in "Please complete the class Stack. class Stack: def push(self, item): self.items.append(item)"]
CONFIG = GenerationConfig(mode="ssr", thinking_budget=40, draft_at=15, draft_tokens=30, max_answer_tokens=60, policy="fixed")
CPU = CostTable(step_s={1: 0.04, 2: 0.07}, score_s={8: 0.16, 32: 0.6, 128: 2.3}, prefill_token_s=0.015)


class AcceleratedFake(FakeEngine):
    """The fake engine declaring a prefill off the host; its prefill waits (up to 5 s) for the
    proposer's build to start, and notes whether it did."""

    capabilities = replace(FakeEngine.capabilities, prefill_frees_host=True)

    def __init__(self, started: threading.Event, **kwargs) -> None:
        super().__init__(**kwargs)
        self.started = started
        self.saw_build = False  # the build started while a prefill was under way
        self.fail = False  # the prefill raises (after waiting)

    def prefill(self, token_ids):
        self.saw_build = self.started.wait(5.0)
        if self.fail:
            raise RuntimeError("the device went away")
        return super().prefill(token_ids)


def watched_build(monkeypatch, fail: bool = False):
    """request_proposer wrapped: it sets an event and notes its thread (or raises)."""
    made, started, threads = generation.request_proposer, threading.Event(), []

    def build(*args, **kwargs):
        threads.append(threading.current_thread())
        started.set()
        if fail:
            raise ValueError("an index that cannot be built")
        return made(*args, **kwargs)

    monkeypatch.setattr(generation, "request_proposer", build)
    return started, threads


def test_the_proposer_is_built_beside_the_prefill_and_the_tokens_are_the_same(monkeypatch):
    expected = Generation(FakeEngine(), FMT, CONFIG, PROMPT).run()
    started, threads = watched_build(monkeypatch)
    engine = AcceleratedFake(started)
    got = Generation(engine, FMT, CONFIG, PROMPT).run()
    assert engine.saw_build and threads and threads[0] is not threading.main_thread()
    assert (got.cot_ids, got.answer_ids) == (expected.cot_ids, expected.answer_ids)
    spans = [[(e["kind"], e.get("source"), e.get("proposed"), e.get("accepted")) for e in r.trace if "source" in e]
             for r in (got, expected)]
    assert spans[0] and spans[0] == spans[1]  # the proposer built beside proposed the same spans


def test_a_cpu_engine_builds_after_its_prefill(monkeypatch):
    started, threads = watched_build(monkeypatch)
    Generation(FakeEngine(), FMT, CONFIG, PROMPT).run()
    assert threads == [threading.main_thread()]


@pytest.mark.parametrize("fail_build,fail_prefill,error", [
    (True, False, ValueError),  # the build's error reaches the caller
    (False, True, RuntimeError),  # the prefill's too, once the build is done (no thread left running)
])
def test_errors_on_either_side_reach_the_caller(monkeypatch, fail_build, fail_prefill, error):
    started, threads = watched_build(monkeypatch, fail=fail_build)
    engine = AcceleratedFake(started)
    engine.fail = fail_prefill
    with pytest.raises(error):
        Generation(engine, FMT, CONFIG, PROMPT).run()
    assert not any(t.is_alive() for t in threads if t is not threading.main_thread())


def replay_engine(cls, costs):
    model = RowModel(prompt_ids=list(range(1, 401)), cot_ids=[500, 501], answer_ids=[502], forced_end_ids=[501],
                     answer_prefix_ids=[], draft_ids=[], draft_forked_at=None)
    return cls(model, costs)


COVERED = [  # (engine class, costs, host work beside the prefill) -> the part covered
    (ReplayEngine, gpu_preset(), 0.001, 0.001),  # within the prefill's modelled 400 x 44 us = 0.018 s
    (ReplayEngine, gpu_preset(), 0.5, 400 * gpu_preset().prefill_token_s),  # the prefill's seconds at most
    (TreeReplayEngine, gpu_preset().at_batch(4), 0.001, 0.001),  # a preset priced among 4 is a GPU's still
    (ReplayEngine, CPU, None, 0.0),  # a CPU's costs: built after the prefill, nothing covered
    (ChainReplayEngine, gpu_preset(), None, 0.0),  # vLLM's drafter meets a request after its prefill
]


@pytest.mark.parametrize("cls,costs,beside,covered", COVERED)
def test_a_replay_covers_what_its_prefill_seconds_hold(cls, costs, beside, covered):
    engine = replay_engine(cls, costs)
    assert engine.capabilities.prefill_frees_host is (beside is not None)
    engine.prefill(engine.model.prompt_ids)
    if beside is None:
        return
    assert engine.beside_prefill(beside) == pytest.approx(covered)
    assert engine.beside == pytest.approx([beside, engine.costs.prefill(400), covered])
    engine._since -= 1.0  # a second of host time since the prefill returned ...
    engine.clock()
    assert engine.host_s == pytest.approx(1.0 - covered, abs=0.01)  # ... less what the prefill covered


def test_which_costs_are_an_accelerators():
    gpu = CostTable(step_s={1: 0.006}, score_s={8: 0.006}, prefill_token_s=3e-5, meta={"device": "NVIDIA H100 80GB HBM3"})
    assert gpu_preset().prefill_off_host and gpu_preset(0.006).at_batch(32).prefill_off_host and gpu.prefill_off_host
    assert not CPU.prefill_off_host and not replace(gpu, meta={"device": "cpu"}).prefill_off_host


class OffHostFake(FakeEngine):
    capabilities = replace(FakeEngine.capabilities, prefill_frees_host=True)
    device = "cuda:0"


def test_a_table_calibrated_where_the_prefill_frees_the_host_says_so():
    from ssr.pricing.probe import calibrate

    assert calibrate(OffHostFake(), repeats=1, context_tokens=32, score_sizes=(8, 32, 128)).prefill_off_host
    assert not calibrate(FakeEngine(), repeats=1, context_tokens=32, score_sizes=(8, 32, 128)).prefill_off_host
