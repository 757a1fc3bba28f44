"""Text traces as a workload (`ssr traces`): reading every shape, tokenizing, replaying every mode
through the real loop (identity to the trace), host time, the peers' proposers, the CLI."""
from __future__ import annotations

import gzip
import json
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest

from ssr.bench.replay import ReplayEngine, RowModel
from ssr.bench.trace_replay import TRACE_MODES, CostSetting, pass_table, replay_all, replay_trace, seconds_at_step
from ssr.bench.traces import load_traces, parse_trace, read_traces, tokenize_trace
from ssr.cli import main
from ssr.config import ConfigError
from ssr.pricing.costs import gpu_preset

pytestmark = pytest.mark.shared_data  # runs from a clone too, with no ../shared beside it

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
GPU = CostSetting("gpu", gpu_preset())


class WordVocab:
    """A deterministic tokenizer for tests: words, punctuation and runs of spaces."""

    vocab_size = 1 << 20
    name = "words"

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self.token_starts(text)[0]

    def token_starts(self, text: str) -> tuple[list[int], list[int]]:
        words = list(re.finditer(r"\w+|[^\w\s]|\s+", text))
        return [self.ids.setdefault(w.group(), len(self.ids)) for w in words], [w.start() for w in words]


def reasoning(seed: int, steps: int = 12) -> tuple[str, str, str]:
    """A prompt, a CoT that restates the prompt and repeats itself (as real CoTs do), an answer."""
    rng = random.Random(seed)
    names = [f"value_{rng.randrange(100)}" for _ in range(4)]
    prompt = f"Write a function that adds {names[0]} and {names[1]}, then checks {names[2]} against {names[3]}."
    lines = [f"Wait, the function adds {names[rng.randrange(4)]} and {names[rng.randrange(4)]}, so step {i} "
             f"checks {names[rng.randrange(4)]} again." for i in range(steps)]
    cot = "Okay, I need to write a function that adds " + f"{names[0]} and {names[1]}. " + " ".join(lines)
    answer = f"def f({names[0]}, {names[1]}):\n    return {names[0]} + {names[1]}  # checks {names[2]}\n"
    return prompt, cot, answer


def write_traces(path: Path, count: int = 4, gz: bool = True) -> Path:
    rows = []
    for seed in range(count):
        prompt, cot, answer = reasoning(seed)
        rows.append({"prompt": prompt, "cot": cot, "answer": answer, "model": "Test/Model-1B (thinking)",
                     "task_id": f"task-{seed % 2}", "setting": "Base" if seed < 2 else "GUIDE"})
    text = "".join(json.dumps(row) + "\n" for row in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_every_shape_reads_as_one_trace():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    pair = {"request": {"model": "m", "messages": messages},
            "response": {"id": "c1", "model": "Qwen/Qwen3-8B", "choices": [{"message": {
                "content": "Hello.", "reasoning_content": "They greet me."}}]}}
    served = {"messages": messages, "reasoning": "They greet me.", "answer": "Hello.", "model": "Qwen/Qwen3-8B", "id": 7}
    trace = {"prompt": "Hi", "cot": "They greet me.", "answer": "Hello.", "model": "Qwen/Qwen3-8B (thinking)",
             "task_id": "t", "run": "run2"}
    got = [parse_trace(pair, "log"), parse_trace(served, "log"), parse_trace(trace, "set")]
    assert [t.model for t in got] == ["Qwen/Qwen3-8B"] * 3
    assert got[0].messages == got[1].messages == (("system", "Be brief."), ("user", "Hi"))
    assert {(t.cot, t.answer) for t in got} == {("They greet me.", "Hello.")}
    assert got[2].item == "t/run2" and got[2].group == "set / Qwen/Qwen3-8B"


@pytest.mark.parametrize("line, says", [("not json", "not a trace"), ('{"prompt": "p"}', "missing field"),
                                         ('[1, 2]', "JSON object"), ('{"prompt": 1, "cot": "", "answer": ""}', "text")])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "p", "cot": "c", "answer": "a"}) + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=rf"bad.jsonl:2: .*{says}"):
        list(read_traces(path))


def test_repeated_items_are_told_apart_and_limit_counts_per_group(tmp_path):
    path = write_traces(tmp_path / "set.dev.jsonl.gz", count=4)
    traces = load_traces([path])
    assert [t.item for t in traces] == ["task-0/Base", "task-1/Base", "task-0/GUIDE", "task-1/GUIDE"]
    assert traces[0].set == "set.dev" and traces[0].model == "Test/Model-1B"
    assert len(load_traces([path], limit=3)) == 3
    assert [t.item for t in load_traces([path], tasks=1)] == ["task-0/Base", "task-0/GUIDE"]  # its variants too
    with pytest.raises(ConfigError, match="no traces"):
        load_traces([path], groups=["nothing like it"])


def test_tokenized_trace_ends_its_cot_with_one_marker_outside_the_vocabulary():
    vocab = WordVocab()
    tokens = tokenize_trace(parse_trace({"prompt": "a b", "cot": "c d", "answer": "e"}, "s"), vocab)
    assert tokens.cot_ids[-1] == vocab.vocab_size and tokens.cot_ids[:-1] == vocab.tokenize("c d")
    start = vocab.tokenize("<|im_start|>user\n")
    assert tokens.answer_ids == vocab.tokenize("e") and tokens.prompt_ids[: len(start) + 3] == start + vocab.tokenize("a b")


def test_every_mode_and_order_replays_the_trace_token_for_token(tmp_path):
    vocab = WordVocab()
    tokens = [tokenize_trace(t, vocab) for t in load_traces([write_traces(tmp_path / "s.jsonl.gz", count=4)])]
    rows = replay_all(tokens, TRACE_MODES, [GPU])
    assert len(rows) == 4 * len(TRACE_MODES) * 2 and all(row["identical"] for row in rows)
    by = {(r["order"], r["mode"], r["item"]): r for r in rows}
    for row in rows:
        ar = by[(row["order"], "ar", row["item"])]["metrics"]
        assert row["metrics"]["cot_tokens"] == ar["cot_tokens"] and row["metrics"]["answer_tokens"] == ar["answer_tokens"]
        if row["mode"] == "paper":  # the paper's regime: the CoT decoded plainly, one token a pass
            assert row["metrics"]["cot_passes"] == 0 and row["metrics"]["cot_steps"] == ar["cot_steps"]
    ssr = [by[("cold", "ssr", t.trace.item)]["metrics"]["total_s"] / by[("cold", "ar", t.trace.item)]["metrics"]["total_s"]
           for t in tokens]
    assert max(ssr) < 0.8  # a CoT that repeats itself is copied
    table = {(t["suite"].split(" (")[-1], t["mode"]): t for t in pass_table(rows)}
    assert table[("cold)", "ar")]["cot_per_pass"] == 1.0 and table[("cold)", "ssr")]["cot_per_pass"] > 1.5
    assert table[("cold)", "ar")]["ratio_at_step"] == 1.0



AT_STEP = [  # (host on the clock, total s, host s, step s, batch) -> seconds at a 6 ms step
    (None, 1.5, 0.3, 0.015, 1, 1.5 * 0.4 + 0.3),  # off: the modelled clock scaled, host added
    ("measured", 1.5, 0.3, 0.015, 1, 1.2 * 0.4 + 0.3),  # on the clock: taken out, scaled, added once
    (0.002, 1.5, 0.3, 0.006, 1, 1.5),  # a fixed figure a pass at a 6 ms step: as it stands
    (None, 1.5, 0.3, 0.015, 4, 1.5 * 0.4 + 4 * 0.3),  # among 4 requests a step waits for every one's host time
    ("measured", 2.4, 0.3, 0.015, 4, 1.2 * 0.4 + 4 * 0.3),  # the replay put it on the clock 4 times
]


@pytest.mark.parametrize("on_clock,total_s,host_s,step_s,batch,expected", AT_STEP)
def test_host_time_is_added_once_at_the_step(on_clock, total_s, host_s, step_s, batch, expected):
    row = {"metrics": {"total_s": total_s}, "step_s": step_s, "host": {"s": host_s, "on_clock": on_clock},
           "batch": batch}
    assert seconds_at_step(row, 6.0) == pytest.approx(expected)


BESIDE = [  # (host work beside the prefill, its modelled seconds, covered there) -> seconds at a 6 ms step
    ((0.2, 1.0, 0.2), 1.5 * 0.4 + 0.3),  # all of it beside a long prefill: covered at 6 ms too (0.4 s)
    ((0.5, 1.0, 0.5), 1.5 * 0.4 + 0.3 + 0.1),  # at 6 ms the prefill's 0.4 s cover 0.4 of the 0.5
    ((0.5, 0.1, 0.1), 1.5 * 0.4 + 0.3 + 0.1 - 0.04),  # a short prefill: its 0.04 s at 6 ms cover less
    ((0.0, 1.0, 0.0), 1.5 * 0.4 + 0.3),  # nothing beside it (a CPU table, vLLM's drafter)
]


@pytest.mark.parametrize("beside,expected", BESIDE)
def test_host_work_beside_the_prefill_is_covered_again_at_the_step(beside, expected):
    """The row's host time is net of what the preset's prefill covered; at another step time
    the prefill's seconds scale, and cover that much of the work instead."""
    row = {"metrics": {"total_s": 1.5}, "step_s": 0.015, "batch": 1,
           "host": {"s": 0.3, "on_clock": None, "beside_prefill": list(beside)}}
    assert seconds_at_step(row, 6.0) == pytest.approx(expected)


def test_a_batch_puts_every_requests_host_time_on_the_clock(tmp_path):
    """--host-time with --batch: each pass's host time goes on the modelled clock once per request
    in the step (a fixed figure a pass makes it exact)."""
    vocab = WordVocab()
    tokens = [tokenize_trace(t, vocab) for t in load_traces([write_traces(tmp_path / "s.jsonl", count=1, gz=False)])]
    costs = gpu_preset().at_batch(4)
    rows = {batch: replay_all(tokens, ["ar"], [CostSetting("gpu", costs, batch)], ["cold"], host=0.001)[0]
            for batch in (1, 4)}
    passes = rows[1]["host"]["passes"]
    assert rows[4]["host"]["passes"] == passes and rows[4]["batch"] == 4
    assert rows[4]["metrics"]["total_s"] - rows[1]["metrics"]["total_s"] == pytest.approx(3 * 0.001 * passes)

def test_deployment_order_copies_from_earlier_responses(tmp_path):
    vocab = WordVocab()
    trace = load_traces([write_traces(tmp_path / "s.jsonl", count=1, gz=False)])[0]
    tokens = [tokenize_trace(trace, vocab)] * 2  # the same request twice: the second copies the first
    rows = replay_all(tokens, ["ar", "suffix"], [GPU], orders=["cold", "deployment"])
    cold = [r for r in rows if r["order"] == "cold" and r["mode"] == "suffix"]
    deployed = [r for r in rows if r["order"] == "deployment" and r["mode"] == "suffix"]
    assert cold[0]["metrics"]["total_s"] == cold[1]["metrics"]["total_s"]
    assert deployed[1]["metrics"]["total_s"] < 0.5 * deployed[0]["metrics"]["total_s"]
    assert all(r["identical"] for r in rows)


def test_host_time_per_pass_goes_on_the_clock(tmp_path):
    vocab = WordVocab()
    tokens = tokenize_trace(load_traces([write_traces(tmp_path / "s.jsonl.gz", count=1)])[0], vocab)
    off = replay_trace(tokens, "ssr", GPU, "cold")
    on = replay_trace(tokens, "ssr", GPU, "cold", host=0.002)
    assert off["host"]["s"] > 0 and on["host"]["s"] == pytest.approx(0.002 * on["host"]["passes"])
    assert on["metrics"]["total_s"] > off["metrics"]["total_s"] and on["identical"]
    measured = replay_trace(tokens, "ssr", GPU, "cold", host="measured")
    assert measured["metrics"]["total_s"] >= off["metrics"]["total_s"] and measured["identical"]


def test_a_requests_setup_is_host_time_too(tmp_path, monkeypatch):
    """Between the prefill and the first pass the loop makes the request's proposer, whose
    sources index the prompt (on a long agent prompt, tenths of a second): host time, as between
    two passes, on the clock with --host-time measured."""
    import ssr.loop.generation as generation

    tokens = tokenize_trace(load_traces([write_traces(tmp_path / "s.jsonl.gz", count=1)])[0], WordVocab())
    plain = replay_trace(tokens, "ssr", GPU, "cold", host="measured")
    made = generation.request_proposer
    pause = 1.0  # far above the whole replay's own host time (~0.05 s), so noise cannot fake it

    def slow(*args, **kwargs):
        time.sleep(pause)
        return made(*args, **kwargs)

    monkeypatch.setattr(generation, "request_proposer", slow)
    slowed = replay_trace(tokens, "ssr", GPU, "cold", host="measured")
    # The pause is on the host clock (before, only the time between passes was), less what the
    # prefill's modelled seconds cover (the GPU preset's prefill leaves the host free: the loop
    # indexes the prompt beside it) ...
    beside, prefill_s, covered = slowed["host"]["beside_prefill"]
    assert beside >= pause and 0 < prefill_s < 0.01 and covered == pytest.approx(prefill_s)
    assert slowed["host"]["s"] >= pause - prefill_s and slowed["identical"]
    # ... and in the request's time: the rest, the modelled part (~1.2 s), is what it was (the cost
    # model times the passes alone, so the loop chooses as before); off the clock it would lose the pause.
    modelled = [r["metrics"]["total_s"] - r["host"]["s"] for r in (plain, slowed)]
    assert modelled[1] == pytest.approx(modelled[0], rel=1e-9)


def test_replay_engine_ids_are_the_argmax_of_its_rows():
    model = RowModel(prompt_ids=[1, 2], cot_ids=[3, 4, 5], answer_ids=[6, 7], forced_end_ids=[5], answer_prefix_ids=[],
                     draft_ids=[], draft_forked_at=None)
    engines = [ReplayEngine(model, gpu_preset()) for _ in range(2)]
    seqs = [engine.prefill([1]) for engine in engines]
    rows = engines[0].score(seqs[0], [2, 3, 4, 5, 6])
    ids = engines[1].score(seqs[1], [2, 3, 4, 5, 6], ids=True)
    assert rows.shape == (5, engines[0].vocab_size) and ids.shape == (5,)
    assert np.array_equal(np.argmax(rows, axis=1), ids)
    assert engines[0].seconds == engines[1].seconds


def test_cli_replays_a_log_and_refuses_bad_flags_before_reading(tmp_path, capsys):
    path = write_traces(tmp_path / "log.jsonl", count=2, gz=False)
    assert main(["traces", str(tmp_path / "missing.jsonl"), "--modes", "ar,bogus"]) == 2
    assert "--modes: unknown 'bogus'" in capsys.readouterr().err
    assert main(["traces", str(path), "--orders", "sideways"]) == 2
    assert main(["traces", str(path), "--host-time", "-3"]) == 2
    assert main(["traces", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such traces file" in capsys.readouterr().err
    assert main(["traces", str(tmp_path / "missing.jsonl"), "--ngram", "7,3,3"]) == 2
    assert "--ngram: give MIN,MAX,K" in capsys.readouterr().err


def test_the_ngram_peer_at_given_settings_accepts_what_vllms_steps_would(tmp_path):
    """`--ngram 3,7,3` (SpecDecode-Bench's vLLM runs): the replayed `ngram-v1` peer's passes accept,
    step for step, what vLLM's steps at k = 3 accept over the same output (bench/acceptance.py's
    walk, which holds the recorded acceptance); vLLM's docs' example (n = 4, k = 5) takes others."""
    from ssr.bench.acceptance import replayed_acc_len
    from ssr.proposing.lookup import NgramSettings

    rng = random.Random(1)
    prompt = [rng.randrange(1000) for _ in range(60)]
    output = prompt[3:20] + [rng.randrange(1000) for _ in range(8)] + prompt[30:45] + prompt[3:12] + [5]
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"id": "a", "prompt_token_ids": prompt, "generated_token_ids": output}) + "\n")
    tokens = [tokenize_trace(t, None) for t in load_traces([path])]
    settings = NgramSettings.parse("3,7,3")
    (row,) = replay_all(tokens, ["ngram-v1"], [GPU], ["cold"], ngram=settings)
    accepted = {event["at"]: event["accepted"] for event in row["trace"] if event["kind"] == "span" and event["accepted"]}
    found, position, expected = replayed_acc_len(prompt, output, 3, 7, 3), 1, {}
    while position < len(output):  # vLLM's steps at k = 3 from the prefill's token on
        taken = found[position - 1] - 1
        if taken:
            expected[position] = taken
        position += taken + 1
    assert row["identical"] and accepted == expected and max(accepted.values()) == 3
    (docs,) = replay_all(tokens, ["ngram-v1"], [GPU], ["cold"])
    assert {e["at"]: e["accepted"] for e in docs["trace"] if e["kind"] == "span" and e["accepted"]} != expected


@pytest.mark.slow
def test_cli_on_a_chat_completions_log_with_a_gguf_vocabulary(tmp_path, capsys):
    log = tmp_path / "chat.jsonl"
    with open(log, "w") as out:
        for seed in range(2):
            prompt, cot, answer = reasoning(seed)
            out.write(json.dumps({"request": {"messages": [{"role": "user", "content": prompt}]},
                                  "response": {"model": "Qwen/Qwen3-8B", "choices": [{"message": {
                                      "content": answer, "reasoning_content": cot}}]}}) + "\n")
    assert main(["traces", str(log), "--tokenizer", "smollm2-135m", "--out", str(tmp_path / "out"),
                 "--modes", "ar,ssr,suffix"]) == 0
    printed = capsys.readouterr().out
    assert "chat / Qwen/Qwen3-8B (cold)" in printed and "ratio @6 ms + host" in printed
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 3 * 2 and all(row["identical"] for row in rows)
    assert (tmp_path / "out" / "report.md").is_file()


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces (real reasoning traces) is not beside "
                                                       "this checkout")
@pytest.mark.slow
def test_real_traces_replay_token_for_token_in_every_mode():
    from ssr.engines.vocab import load_vocab

    vocab = load_vocab("smollm2-135m")  # any vocabulary: identity does not depend on it
    traces = [t for path in sorted(SHARED_TRACES.glob("*.jsonl.gz")) for t in load_traces([path], limit=1)]
    rows = replay_all([tokenize_trace(t, vocab) for t in traces], TRACE_MODES, [GPU], orders=["cold"])
    assert rows and all(row["identical"] for row in rows)


def test_gpu_preset_with_a_step():
    from ssr.pricing.costs import load_costs

    six = load_costs("gpu:6")
    assert six.step_s[1] == pytest.approx(0.006) and six.score_s[128] / six.step_s[1] == pytest.approx(1.375, abs=1e-3)
    with pytest.raises(ConfigError, match="gpu:MS"):
        load_costs("gpu:fast")


@pytest.mark.parametrize("sequences, tokens, kv, seconds", [
    # SpecDecode-Bench's fit (predictor.py Llama8BH100): 3.92645679e-08 kv + 2.10103129e-05 tokens
    # + 5.88590713e-03, plus 1.20683946e-03 a step: their formula evaluated
    (1, 1, 0, 0.0071137569),  # a step alone, nothing cached
    (1, 1, 2000, 0.0071922860),  # its KV read once
    (16, 1, 1000, 0.0080571447),  # 16 sequences with 1,000 cached tokens each: 16,000 KV tokens
    (1, 129, 1000, 0.0098423415),  # a pass of 129 tokens over 1,000 cached: the KV read once, not per token
])
def test_the_measured_h100_table_prices_passes_as_its_fit(sequences, tokens, kv, seconds):
    from ssr.pricing.costs import load_costs

    table = load_costs("specdecode-h100")
    priced = table.step(sequences, kv) if tokens == 1 else table.score(tokens, kv)
    assert priced == pytest.approx(seconds, rel=1e-4) and table.prefill_off_host


@pytest.mark.parametrize("mode, bound_ms", [("ssr", 5.0), ("suffix", 2.0), ("pld", 2.0), ("ar", 1.0)])
def test_host_time_per_pass_stays_bounded(mode, bound_ms):
    """Regression guard on the loop's own cost, not a timing of its speed: the host time per
    pass replaying a fixed long trace, against a bound ~15x what `ssr traces` measures here
    (ssr ~0.3 ms, suffix / pld ~0.06, ar ~0.02 on real traces)."""
    vocab = WordVocab()
    prompt, cot, answer = reasoning(7, steps=150)
    tokens = tokenize_trace(parse_trace({"prompt": prompt, "cot": cot, "answer": answer}, "fixed"), vocab)
    replay_trace(tokens, mode, GPU, "cold")  # warm: imports, first allocations
    row = replay_trace(tokens, mode, GPU, "cold")
    assert row["identical"] and row["host"]["passes"] > 300
    assert 1e3 * row["host"]["s"] / row["host"]["passes"] < bound_ms


def test_token_id_records_replay_as_they_are_all_answer(tmp_path):
    """A benchmark's records of token ids (any vocabulary, no text, no tokenizer): the output is
    all answer, replayed token for token in every mode; copies of the prompt are taken."""
    rng = random.Random(0)
    prompt = [rng.randrange(128_000) for _ in range(40)]
    output = prompt[5:25] + [rng.randrange(128_000) for _ in range(10)] + prompt[10:30] + [7]
    path = tmp_path / "bench-8b-gsm8k.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        for number in range(2):
            out.write(json.dumps({"id": f"r{number}", "prompt_token_ids": prompt, "generated_token_ids": output,
                                  "acc_ngram": {"acc_len": [1] * len(output)}}) + "\n")
    traces = load_traces([path])
    assert [t.item for t in traces] == ["r0", "r1"] and traces[0].group == "bench-8b-gsm8k / unknown"
    tokens = [tokenize_trace(t, vocab=None) for t in traces]
    assert tokens[0].prompt_ids == prompt and tokens[0].cot_ids == [] and tokens[0].answer_ids == output
    rows = replay_all(tokens, TRACE_MODES, [GPU], ["cold"])
    assert all(row["identical"] and row["answer_ids"] == output and row["metrics"]["cot_tokens"] == 0 for row in rows)
    by = {(row["mode"], row["item"]): row["metrics"] for row in rows}
    assert by[("ssr", "r0")]["total_s"] < 0.8 * by[("ar", "r0")]["total_s"]  # the prompt's copies


@pytest.mark.parametrize("ids", [[], [1, -2], "1 2", [1.5]])
def test_token_ids_that_are_not_ids_are_refused_by_line(tmp_path, ids):
    path = tmp_path / "ids.jsonl"
    path.write_text(json.dumps({"prompt_token_ids": [1, 2], "generated_token_ids": ids}) + "\n")
    with pytest.raises(ConfigError, match="ids.jsonl:1: not a trace .*token ids"):
        list(read_traces(path))
