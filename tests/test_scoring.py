"""Task scorers: reference answers score 1.0, broken answers lower (table-driven)."""
from __future__ import annotations

import shutil

import pytest

from ssr.bench.scoring import code_block, score
from ssr.bench.suites import load_suite

pytestmark = pytest.mark.shared_data  # runs from a clone too, with no ../shared beside it

COUNTDOWN = {"item": {"nums": [44, 48, 35, 6], "target": 25}}
TOM = {"reference_output": "Carol's belief:\n- Step 0: {a: b}\n- Step 1: {a: c}\n- Step 2: {a: c}"}
TSV = {"item": {"gt": "name\tprice\nPhone A\t€ 5,00\nThe Phone B\t€ 7,00", "tsv_header": "name\tprice"}}


@pytest.mark.parametrize("record, answer, expected", [
    (COUNTDOWN, "<Solution>\n48 - 44 = 4\n35 - 6 = 29\n29 - 4 = 25\n</Solution>", 1.0),
    (COUNTDOWN, "search...\n<Solution>\n48-44=4\n35-6=29\n29-4=25</Solution>", 1.0),
    (COUNTDOWN, "<Solution>\n48 - 44 = 4\n35 - 6 = 29\n29 - 4 = 24\n</Solution>", 0.0),  # wrong arithmetic
    (COUNTDOWN, "<Solution>\n48 - 44 = 4\n4 - 6 = -2\n</Solution>", 0.0),  # negative intermediate
    (COUNTDOWN, "<Solution>\n44 + 44 = 88\n</Solution>", 0.0),  # a number used twice
    (COUNTDOWN, "<Solution>\n48 - 44 = 4\n35 - 4 = 31\n</Solution>", 0.0),  # 6 unused, target missed
    (COUNTDOWN, "48 - 44 = 4", 0.0),  # no tags
    (TOM, "Carol's belief:\n- Step 0: {a: b}\n- step 1:  {a: c}\n- Step 2: {a: c}.", 1.0),  # case, spaces
    (TOM, "- Step 0: {a: b}\n- Step 1: {a: x}\n- Step 2: {a: c}", 0.0),
    (TOM, "- Step 0: {a: b}\n- Step 1: {a: c}", 0.0),  # truncated
    (TSV, "```tsv\nname\tprice\nThe Phone B\t€ 7,00\nPhone A\t€ 5,00\n```", 1.0),  # order, article
    (TSV, "```tsv\nname\tprice\nPhone A\t€ 5,00\n```", 2 / 3),  # precision 1, recall 1/2
    (TSV, "nothing useful", 0.0),
])
def test_text_scorers(record, answer, expected):
    suite = {id(COUNTDOWN): "longproc:countdown", id(TOM): "longproc:tom_tracking",
             id(TSV): "longproc:html_to_tsv"}[id(record)]
    assert score(suite, record, answer).value == pytest.approx(expected)


def test_tom_partial_accuracy():
    result = score("longproc:tom_tracking", TOM, "- Step 0: {a: b}\n- Step 1: {a: x}")
    assert result.detail["partial_accuracy"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("text, languages, expected", [
    ("```python\nx = 1\n```\nmore", ("python",), "x = 1\n"),
    ("intro\n```\ny = 2\n```", ("python",), "y = 2\n"),
    ("```python\nunclosed = 3\n", ("python",), "unclosed = 3\n"),
    ("no fence", ("python",), "no fence"),
    ("```cpp\nint main(){}\n```", ("cpp",), "int main(){}\n"),
])
def test_code_block(text, languages, expected):
    assert code_block(text, languages) == expected


def _references(suite: str, count: int):
    try:
        return load_suite(suite, limit=count)
    except Exception as error:  # noqa: BLE001 - data missing on this machine
        pytest.skip(f"{suite} data unavailable: {error}")


def test_humaneval_reference_passes_and_broken_fails():
    for item in _references("humaneval", 3):
        problem = item.reference
        whole = f"```python\n{problem['prompt']}{problem['canonical_solution']}```"
        body_only = f"```python\n{problem['canonical_solution']}```"
        assert score("humaneval", problem, whole).value == 1.0
        assert score("humaneval", problem, body_only).value == 1.0
        assert score("humaneval", problem, "```python\n    return None\n```").value == 0.0


def test_classeval_reference_passes_and_broken_fails():
    pytest.importorskip("numpy")
    for item in _references("classeval", 2):
        task = item.reference
        result = score("classeval", task, f"```python\n{task['solution_code']}\n```")
        assert result.value == 1.0, result
        broken = task["solution_code"].replace("return ", "return None and ", 1)
        result = score("classeval", task, f"```python\n{broken}\n```")
        assert result.value == 0.0 and result.detail["test_classes_passed"] < result.detail["test_classes"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_pseudo_to_code_reference_passes_and_broken_fails():
    for item in _references("longproc:pseudo_to_code", 2):
        record = item.reference
        assert score("longproc:pseudo_to_code", record, f"```cpp\n{record['reference_output']}\n```").value == 1.0
        wrong = "int main() { cout << 42 << endl; return 0; }"
        result = score("longproc:pseudo_to_code", record, f"```cpp\n{wrong}\n```")
        assert result.value == 0.0 and result.detail["compiled"]
        assert not score("longproc:pseudo_to_code", record, "```cpp\nint main( {\n```").detail["compiled"]


@pytest.mark.parametrize("suite", ["longproc:tom_tracking", "longproc:countdown", "longproc:html_to_tsv"])
def test_longproc_references_score_one(suite):
    for item in _references(suite, 3):
        answer = item.reference["reference_output"]
        if suite.endswith("html_to_tsv"):
            answer = f"```tsv\n{answer}\n```"
        assert score(suite, item.reference, answer).value == 1.0
        assert score(suite, item.reference, answer[: len(answer) // 3]).value < 1.0
