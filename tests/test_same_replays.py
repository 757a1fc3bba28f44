"""scripts/same_replays.py: two replay folders compared row for row, host time aside."""
import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.shared_data  # needs nothing from ../shared: runs from a clone too

SPEC = importlib.util.spec_from_file_location("same_replays", Path(__file__).parents[1] / "scripts" / "same_replays.py")
same_replays = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(same_replays)


def write(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir()
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


ROW = {"mode": "ssr", "answer_ids": [1, 2], "metrics": {"verify_passes": 3, "host_s": 0.1}, "host": {"s": 0.1}}


@pytest.mark.parametrize("change,same", [
    ({"host": {"s": 9.0}}, True),  # host time differs from run to run
    ({"metrics": {"verify_passes": 3, "host_s": 7.0}}, True),
    ({"metrics": {"verify_passes": 4, "host_s": 0.1}}, False),  # a pass more
    ({"answer_ids": [1, 3]}, False),  # another token
])
def test_rows_are_the_same_but_for_host_time(tmp_path, change, same):
    before = write(tmp_path / "a", [ROW, ROW])
    after = write(tmp_path / "b", [ROW, {**ROW, **change}])
    assert same_replays.main([str(before), str(after)]) == (0 if same else 1)


def test_a_missing_row_is_a_difference(tmp_path):
    assert same_replays.main([str(write(tmp_path / "a", [ROW, ROW])), str(write(tmp_path / "b", [ROW]))]) == 1


def test_a_renamed_metric_compares_under_its_new_name(tmp_path):
    old = {**ROW, "metrics": {"suffix_accepted_tokens": 3}}  # written before the rename
    new = {**ROW, "metrics": {"answer_accepted_tokens": 3}}
    assert same_replays.main([str(write(tmp_path / "a", [old])), str(write(tmp_path / "b", [new]))]) == 0
