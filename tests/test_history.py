"""Earlier responses as a suffix-tree source (vLLM's global tree): bounded, copied from, lossless,
and in the bench never the same item's answer."""
from ssr.api import SSR
from ssr.bench.runner import run_bench
from ssr.bench.suites import Item
from ssr.config import GenerationConfig, SuffixParams
from ssr.loop import Generation
from ssr.engines.fake import FakeEngine
from ssr.proposing.history import ResponseHistory
from ssr.proposing.proposers import SuffixProposer
from ssr.formats.thinking import FORMATS

PROMPT = [ord(c) for c in "Please complete the class Stack."]


def test_history_is_bounded_and_its_trees_follow_it():
    history = ResponseHistory(max_tokens=12)
    assert history.tree(8) is None
    for response in range(6):
        history.add([response, response + 1, response + 2])
    assert sum(map(len, history.responses)) <= 12 and history.responses[-1] == [5, 6, 7]
    tree = history.tree(8)
    assert tree.find([5, 6, 7]).count == 1 and tree.find([0, 1]) is None  # the oldest were dropped
    history.add([9, 9, 9])
    assert history.tree(8) is tree and tree.find([9, 9]).count == 2  # grown in place


def test_suffix_proposer_copies_an_earlier_response():
    history = ResponseHistory()
    history.add([1, 2, 3, 4, 5, 6, 7, 8])
    proposer = SuffixProposer(SuffixParams(max_depth=8, max_span=8, span_factor=2.0), [[40, 41]], history)
    proposer.observe([2, 3, 4])
    assert proposer.propose(8)[0][:4] == [5, 6, 7, 8]
    assert SuffixProposer(SuffixParams(max_depth=8, max_span=8), [[40, 41]]).propose(8)[0] == []


def test_a_repeated_request_copies_from_the_first_and_stays_identical():
    config = GenerationConfig(mode="suffix", thinking_budget=40, max_answer_tokens=60, policy="fixed")
    history = ResponseHistory()
    first = Generation(FakeEngine(), FORMATS["code"], config, PROMPT, history=history).run()
    second = Generation(FakeEngine(), FORMATS["code"], config, PROMPT, history=history).run()
    alone = Generation(FakeEngine(), FORMATS["code"], config, PROMPT).run()
    assert second.output_ids == first.output_ids == alone.output_ids
    assert history.responses == [first.output_ids, second.output_ids]
    copied = second.metrics.cot_accepted_tokens + second.metrics.answer_accepted_tokens
    assert copied > 2 * (alone.metrics.cot_accepted_tokens + alone.metrics.answer_accepted_tokens)


def test_bench_histories_hold_earlier_items_only(tmp_path):
    model = SSR("fake", engine=FakeEngine(max_sequences=8), template="code")
    seen: list[tuple[str, str, int, list]] = []  # (item, mode, repeat, responses it could copy from)
    start = model.start

    def spy(prompt, config, template=None, history=None):
        seen.append((prompt, config.mode, len(history.responses), [list(r) for r in history.responses]))
        return start(prompt, config, template, history)

    model.start = spy
    items = [Item("fake", str(i), f"Write thing number {i}.") for i in range(3)]
    config = GenerationConfig(thinking_budget=16, max_answer_tokens=16, policy="fixed", draft_at=4)
    rows = run_bench({"llama.cpp": model}, items, ["ar", "suffix"], config, repeats=2,
                     out_path=tmp_path / "runs.jsonl", progress=False)
    outputs = {(row["item"], row["mode"], row["repeat"]): row["cot_ids"] for row in rows}
    for prompt, mode, count, responses in seen:
        item = prompt.split()[-1].rstrip(".")
        assert count == int(item)  # the earlier items of this pass, one response each
        for response in responses:  # never this item's own output, from any mode or repeat
            assert not any(response[: len(cot)] == cot for (other, _, _), cot in outputs.items() if other == item)
    assert [row["history_responses"] for row in rows if row["mode"] == "suffix"] == [0, 1, 2, 0, 1, 2]
