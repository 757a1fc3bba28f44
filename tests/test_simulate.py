"""The trace simulator mirrors the decoding loop: same acceptance, and its seconds match
an engine whose costs are known (a fake engine that sleeps per call)."""
from __future__ import annotations

import time
from pathlib import Path
from dataclasses import asdict

import pytest

from ssr.pricing.costs import CostTable, gpu_preset, load_costs
from ssr.bench.drafts import DraftBook
from ssr.bench.simulate import (anchor_to_ar, config_from_dict, format_projection, project_modes, replay, simulate,
                                summarise_projection)
from ssr.config import ConfigError, GenerationConfig
from ssr.loop import Generation
from ssr.pricing.costs import CostModel
from ssr.engines.fake import FakeEngine
from ssr.formats.thinking import FORMATS

FMT = FORMATS["code"]
PROMPTS = [[ord(c) for c in text] for text in ("Please complete the class Stack.", "Write a queue in Python.")]
MODES = ("ar", "ssr", "ssr-prefix", "ssr-suffix", "suffix", "pld")


class SleepyEngine(FakeEngine):
    """FakeEngine whose calls take the time a cost table says, padded by sleep. A loaded
    machine oversleeps: what a call overslept the next calls sleep less, so the seconds
    spent in calls add up to the table's."""

    def __init__(self, costs: CostTable, **options) -> None:
        super().__init__(**options)
        self.costs = costs
        self.due_s = 0.0  # the table's seconds for the calls so far
        self.busy_s = 0.0  # wall seconds spent inside prefill / step / score / score_batch

    def _padded(self, seconds: float, call, *args):
        start = time.perf_counter()
        out = call(*args)
        self.due_s += seconds
        time.sleep(max(0.0, self.due_s - self.busy_s - (time.perf_counter() - start)))
        self.busy_s += time.perf_counter() - start
        return out

    def prefill(self, token_ids):
        return self._padded(self.costs.prefill(len(token_ids)), super().prefill, token_ids)

    def step(self, batch):
        return self._padded(self.costs.step(len(batch)), super().step, batch)

    def score(self, seq, token_ids):
        return self._padded(self.costs.score(len(token_ids)), super().score, seq, token_ids)

    def score_batch(self, feeds):
        """One pass over every feed (a CoT span beside a draft child's step): a score pass over
        all their tokens, at least a batched step of that many sequences."""
        seconds = max(self.costs.score(sum(len(tokens) for _, tokens in feeds)), self.costs.step(len(feeds)))
        return self._padded(seconds, super().score_batch, feeds)


def bench_row(engine, prompt, mode, item, costs: CostTable | None = None, **overrides) -> dict:
    options = dict(mode=mode, thinking_budget=40, draft_at=12, draft_tokens=30, max_answer_tokens=60, policy="fixed")
    options.update(overrides)
    generation = Generation(engine, FMT, GenerationConfig(**options), prompt,
                            # smoothing 0: the table as is, no drift learnt from this machine's
                            # timing, so the run decides its spans as a replay on the table does
                            costs=CostModel(table=costs, smoothing=0.0) if costs is not None else None)
    result = generation.run()
    return {"suite": "fake", "item": item, "repeat": 0, "mode": mode, "prompt_ids": list(prompt),
            "cot_ids": result.cot_ids, "forced_ids": result.forced_ids, "answer_ids": result.answer_ids,
            "draft_ids": result.draft_ids, "metrics": result.metrics.as_dict(),
            "config": asdict(generation.config), "answer_prefix_ids": generation.answer_prefix_ids,
            "forced_end_ids": generation.forced_end_ids,
            "trace": result.trace}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("draft_at", [0, 12, 39])
@pytest.mark.parametrize("order", [1, 3])  # order 1 repeats itself: many CoT and answer spans
def test_replay_reproduces_acceptance(mode, draft_at, order):
    """Without span cutting (it depends on learnt costs) acceptance is replayed exactly: the
    replay runs the decoding loop itself. The run sees the same cost table as the replay (on
    it ssr's spans go on past the match length)."""
    for item, prompt in enumerate(PROMPTS):
        row = bench_row(FakeEngine(order=order), prompt, mode, str(item), gpu_preset(), draft_at=draft_at,
                        adaptive_spans=False)
        replayed = replay(row, gpu_preset(), config_from_dict(row["config"]), row["answer_prefix_ids"])
        metrics = row["metrics"]
        assert replayed.accepted_prefix_tokens == metrics["accepted_prefix_tokens"]
        assert replayed.answer_accepted_tokens == metrics["answer_accepted_tokens"]
        assert replayed.answer_tokens == metrics["answer_tokens"]
        assert replayed.cot_accepted_tokens == metrics["cot_accepted_tokens"]


@pytest.mark.parametrize("spans, adaptive", [("policy", False), ("recorded", True)])
def test_replay_seconds_match_an_engine_with_known_costs(spans, adaptive):
    """policy: spans re-decided (exact when the run decided them on the same table and
    without the learnt span cut); recorded: the run's own spans, whatever decided them
    (here the costs it learnt while running)."""
    # engine calls long next to the loop's own Python time (which is not modelled)
    costs = CostTable(step_s={1: 0.03, 2: 0.05, 4: 0.09}, score_s={8: 0.04, 32: 0.07, 128: 0.2, 512: 0.7},
                  prefill_token_s=0.001)
    budgets = dict(thinking_budget=24, draft_at=8, draft_tokens=20, max_answer_tokens=30, adaptive_spans=adaptive, policy="fixed")
    rows, busy = [], []
    for mode in MODES:
        engine = SleepyEngine(costs)
        rows.append(bench_row(engine, PROMPTS[0], mode, "0", costs if spans == "policy" else None, **budgets))
        busy.append(engine.busy_s)
    projected = simulate(rows, costs, GenerationConfig(), spans)
    for line, row, engine_s in zip(projected, rows, busy):
        # the model against the engine's own seconds (its last sleep's overshoot aside)
        assert abs(line["modelled_s"] / engine_s - 1) < 0.05, (line["mode"], line["modelled_s"], engine_s)
        # against the wall, with the loop's own Python time (measured by the loop: it grows on
        # a loaded machine, and the model leaves it out)
        wall, host = row["metrics"]["total_s"], row["metrics"]["host_s"]
        assert abs((line["modelled_s"] + host) / wall - 1) < 0.1, (line["mode"], line["modelled_s"], host, wall)


def test_modes_projected_from_ar_rows_replay_as_their_own_rows():
    """Items run in ar only (long prompts): each other mode is replayed on the ar row's tokens.
    The peers' projections equal the replays of their real rows (greedy: the same tokens, the
    same spans); projected rows carry no measured seconds and no draft."""
    ar_rows, real = [], []
    for item, prompt in enumerate(PROMPTS):
        ar_rows.append(bench_row(FakeEngine(order=1), prompt, "ar", str(item)))
        real += [ar_rows[-1]] + [bench_row(FakeEngine(order=1), prompt, mode, str(item)) for mode in ("suffix", "pld")]
    projected_rows = project_modes(ar_rows, ["ar", "ssr", "suffix", "pld"])
    assert [(row["item"], row["mode"]) for row in projected_rows] == \
        [(str(item), mode) for item in range(len(PROMPTS)) for mode in ("ar", "ssr", "suffix", "pld")]
    assert all(row["draft_ids"] == [] and row["metrics"]["policy"]["draft"] is False
               for row in projected_rows if row["mode"] == "ssr")
    assert project_modes(real, ["suffix"]) == real  # items with their own rows keep them
    projected = {(p["item"], p["mode"]): p for p in simulate(projected_rows, gpu_preset(), GenerationConfig())}
    measured = {(p["item"], p["mode"]): p for p in simulate(real, gpu_preset(), GenerationConfig())}
    for key, line in measured.items():
        assert projected[key]["modelled_s"] == pytest.approx(line["modelled_s"])
        assert projected[key]["measured_s"] is None or key[1] == "ar"
    book = DraftBook(FakeEngine(order=1))  # drafts planned for projected rows are kept in their ar rows
    simulate(projected_rows, gpu_preset(), GenerationConfig(), drafts=book)
    assert book.written == sum(len(row["planned_drafts"]) for row in ar_rows) >= 1
    table = summarise_projection(list(projected.values()))
    ssr = next(line for line in table if line["mode"] == "ssr")
    assert ssr["measured_s"] is None and ssr["abs_error"] is None and ssr["modelled_ratio"] < 1.0
    assert "| ssr | 2 | - |" in format_projection(table, markdown=True)


# llama.cpp on 2 cores: a second sequence costs most of a step, a scored token half a step
CPU = CostTable(step_s={1: 0.04, 2: 0.075}, score_s={8: 0.16, 32: 0.6, 128: 2.3}, prefill_token_s=0.015)


def test_planned_drafts_are_written_by_the_model_and_replayed():
    """Rows whose policy declined to draft (CPU costs), projected on GPU costs with drafting
    re-planned: each planned draft is the model's own greedy child, written once into the row,
    and replayed (its prefix accepted where the model agrees)."""
    rows = [bench_row(FakeEngine(order=1), prompt, mode, str(item), CPU, policy="auto", thinking_budget=120)
            for item, prompt in enumerate(PROMPTS) for mode in ("ar", "ssr")]
    assert not any(row["metrics"]["stages"] for row in rows)  # no child on the CPU
    with pytest.raises(ConfigError, match="--record-drafts"):
        simulate(rows, gpu_preset(), GenerationConfig(), drafts=DraftBook())
    book = DraftBook(FakeEngine(order=1))
    first = simulate(rows, gpu_preset(), GenerationConfig(), drafts=book)
    forked = [line["mode"] for line in first if line["draft_forked"]]
    assert book.written == len(forked) >= 1 and set(forked) == {"ssr"}
    for row in rows:
        for key, draft in row.get("planned_drafts", {}).items():
            forked_at, num_tokens = map(int, key.split(":"))
            child = bench_row(FakeEngine(order=1), row["prompt_ids"], "ssr", row["item"], policy="fixed",
                              draft_at=forked_at, draft_tokens=num_tokens, thinking_budget=120, adaptive_spans=False)
            assert child["metrics"]["stages"][0]["forked_at"] == forked_at
            assert 0 < len(child["draft_ids"]) and draft[: len(child["draft_ids"])] == child["draft_ids"]
    assert sum(line["accepted_prefix"][0] for line in first) > 0
    again = DraftBook()  # the rows hold their drafts now: nothing to write, the same projection
    assert simulate(rows, gpu_preset(), GenerationConfig(), drafts=again) == first
    assert again.read == book.written and again.written == 0
    recorded = simulate(rows, gpu_preset(), GenerationConfig())  # the runs' own plans: no child
    assert not any(line["draft_forked"] for line in recorded)


def test_gpu_preset_makes_drafting_cheap():
    """Under a GPU-like cost model the batched child costs ~nothing: ssr <= ar."""
    rows = [bench_row(FakeEngine(), prompt, mode, str(item)) for item, prompt in enumerate(PROMPTS)
            for mode in ("ar", "ssr")]
    table = {line["mode"]: line for line in summarise_projection(simulate(rows, gpu_preset(), GenerationConfig()))}
    assert table["ssr"]["modelled_ratio"] <= 1.0


def test_ar_replay_is_prefill_plus_steps():
    row = bench_row(FakeEngine(), PROMPTS[0], "ar", "0")
    costs = CostTable(step_s={1: 1.0, 2: 2.0}, score_s={8: 3.0, 32: 9.0}, prefill_token_s=0.5)
    replayed = replay(row, costs, config_from_dict(row["config"]), row["answer_prefix_ids"])
    metrics = row["metrics"]
    fed = 1 + len(row["forced_ids"])  # pending CoT token + forced tokens, scored at the close
    assert replayed.seconds["prefill"] == pytest.approx(0.5 * (len(PROMPTS[0]) - 1))
    assert replayed.seconds["verify"] == pytest.approx(costs.score(fed))
    assert replayed.seconds["cot"] + replayed.seconds["continuation"] == pytest.approx(metrics["decode_steps"])


@pytest.mark.parametrize("x, expected", [(1, 1.0), (8, 3.0), (20, 6.0), (32, 9.0), (40, 11.0)])
def test_cost_interpolation(x, expected):
    costs = CostTable(step_s={1: 1.0, 2: 2.0}, score_s={8: 3.0, 32: 9.0}, prefill_token_s=0.5)
    assert costs.score(x) == pytest.approx(expected if x > 1 else 1.0)


def test_costs_grow_linearly_with_the_cached_length(tmp_path):
    costs = CostTable(step_s={1: 1.0, 2: 1.5}, score_s={8: 3.0}, prefill_token_s=0.5, context_tokens=100,
                  step_context_s=0.01, score_context_s=0.001, prefill_context_s=0.002)
    assert costs.step(1) == costs.step(1, 100) == 1.0
    assert costs.step(2, 300) == pytest.approx(1.5 + 2 * 0.01 * 200)
    assert costs.score(8, 50) == pytest.approx(3.0 - 8 * 0.001 * 50)
    # per-token prefill cost a + b*p: the mean over 100 tokens is 0.5, over 300 tokens 0.5 + b*100
    assert costs.prefill(300) == pytest.approx(300 * (0.5 + 0.002 * 100))
    # after a kept prefix: 100 tokens fed after 200 cached ones sit where tokens 200-300 of a cold prefill do
    assert costs.prefill(100, 200) == pytest.approx(costs.prefill(300) - costs.prefill(200))
    path = tmp_path / "costs.json"
    path.write_text(costs.to_json())
    assert load_costs(str(path)) == costs


def test_anchor_to_ar_scales_each_item_by_its_ar_run():
    def projected(item, mode, measured, modelled):
        return {"suite": "s", "item": item, "repeat": 0, "mode": mode, "measured_s": measured,
                "modelled_s": modelled, "modelled_stages": {"cot": modelled}}
    rows = [projected("0", "ar", 12.0, 10.0), projected("0", "ssr", 9.0, 8.0),
            projected("1", "ar", 5.0, 10.0), projected("1", "ssr", 4.0, 9.0)]
    anchored = {(p["item"], p["mode"]): p for p in anchor_to_ar(rows)}
    assert anchored[("0", "ar")]["modelled_s"] == pytest.approx(12.0)
    assert anchored[("0", "ssr")]["modelled_s"] == pytest.approx(9.6)
    assert anchored[("1", "ssr")]["modelled_stages"]["cot"] == pytest.approx(4.5)


def test_load_costs_errors(tmp_path):
    with pytest.raises(ConfigError):
        load_costs(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"step_s": 3}')
    with pytest.raises(ConfigError):
        load_costs(str(bad))
    good = tmp_path / "good.json"
    good.write_text(gpu_preset().to_json())
    assert load_costs(str(good)).step(2) == pytest.approx(gpu_preset().step(2))


def test_host_time_on_the_simulator_clock():
    """--host-time: a figure per pass adds exactly passes x figure; measured adds this machine's own."""
    costs = gpu_preset()
    rows = [bench_row(FakeEngine(order=1), PROMPTS[0], mode, "0") for mode in ("ar", "ssr")]
    off = simulate(rows, costs, GenerationConfig())
    fixed = simulate(rows, costs, GenerationConfig(), host=0.001)
    measured = simulate(rows, costs, GenerationConfig(), host="measured")
    for a, b, c, row in zip(off, fixed, measured, rows):
        m = row["metrics"]
        assert b["modelled_s"] > a["modelled_s"] and c["modelled_s"] >= a["modelled_s"]
        if row["mode"] == "ar":  # one pass per token: the figure once for each step and the closing pass
            assert b["modelled_s"] - a["modelled_s"] == pytest.approx(0.001 * (m["decode_steps"] + 1))


def test_a_steep_context_slope_never_prices_a_short_context_call_at_nothing():
    """A calibration taken on a busy machine can measure a context slope so steep that carried
    below the measured context it would make steps, score passes and prefill free (and the
    replay's ratios divide by zero); costs there keep a share of the measured cost instead."""
    from ssr.pricing.costs import MIN_CONTEXT_SHARE, CostTable, load_costs

    steep = CostTable(step_s={1: 0.02, 2: 0.03}, score_s={8: 0.05, 32: 0.1}, prefill_token_s=0.01,
                  context_tokens=1024, step_context_s=1e-4, score_context_s=1e-4, prefill_context_s=1e-4)
    assert steep.step(1, 0) == pytest.approx(MIN_CONTEXT_SHARE * 0.02)
    assert steep.score(8, 0) == pytest.approx(MIN_CONTEXT_SHARE * 0.05)
    assert steep.prefill(10) == pytest.approx(10 * MIN_CONTEXT_SHARE * 0.01)
    assert steep.step(1, 2048) == pytest.approx(0.02 + 1e-4 * 1024)  # above the measured context: the slope
    measured = load_costs(str(Path(__file__).resolve().parents[1] / "docs/peers/llama.cpp-qwen2.5-coder-0.5b-2t.json"))  # this machine's: the floor never binds
    for context in (0, 100, 1024, 4000):
        assert measured.step(1, context) > MIN_CONTEXT_SHARE * measured.step(1)
        assert measured.score(32, context) > MIN_CONTEXT_SHARE * measured.score(32)
