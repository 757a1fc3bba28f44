"""Report builder: paired ratios, bootstrap intervals, quality caching, report.md and plots."""
from __future__ import annotations

import json

import pytest

from ssr.bench.report import (attach_quality, bootstrap_median, format_table, item_ratios, load_rows,
                              summarise, write_report)
from ssr.metrics import STAGES


def row(suite, item, mode, total, repeat=0, answer="x", identical=True, accepted=0):
    seconds = dict.fromkeys(STAGES, 0.0)
    seconds["continuation"] = total
    return {"suite": suite, "item": item, "repeat": repeat, "mode": mode, "answer": answer, "identical": identical,
            "metrics": {"total_s": total, "first_answer_token_s": total / 2, "seconds": seconds,
                        "accepted_prefix_tokens": accepted, "answer_accepted_tokens": 0, "answer_tokens": 10}}


ROWS = [row("a", str(i), "ar", 10.0 + i) for i in range(5)] + \
       [row("a", str(i), "ssr", (10.0 + i) * r, accepted=7) for i, r in enumerate([0.8, 0.9, 1.0, 0.7, 0.85])] + \
       [row("b", "0", "ar", 4.0), row("b", "0", "ssr", 5.0, identical=False)]


def test_paired_ratios_and_median():
    ratios = item_ratios(ROWS)
    assert ratios[("a", "ssr")]["3"] == pytest.approx(0.7)
    table = {(t["suite"], t["mode"]): t for t in summarise(ROWS)}
    assert table[("a", "ssr")]["ratio_to_ar"] == pytest.approx(0.85)
    low, high = table[("a", "ssr")]["ratio_ci"]
    assert 0.7 <= low <= 0.85 <= high <= 1.0
    assert table[("b", "ssr")]["identical"] == 0 and table[("a", "ssr")]["identical"] == 5
    assert table[("a", "ssr")]["mean_accepted_prefix"] == 7


def test_engines_get_their_own_tables_and_pair_within_the_engine():
    rows = [row("a", "0", "ar", 10.0), row("a", "0", "ssr", 8.0),
            {**row("a", "0", "ar", 20.0), "engine": "transformers"},
            {**row("a", "0", "ssr", 19.0), "engine": "transformers"}]
    table = {(t["suite"], t["mode"]): t for t in summarise(rows)}
    assert table[("a", "ssr")]["ratio_to_ar"] == pytest.approx(0.8)
    assert table[("a [transformers]", "ssr")]["ratio_to_ar"] == pytest.approx(0.95)


def test_ratio_averages_repeats_before_the_median():
    rows = [row("a", "0", "ar", 10.0, repeat=0), row("a", "0", "ssr", 8.0, repeat=0),
            row("a", "0", "ar", 10.0, repeat=1), row("a", "0", "ssr", 12.0, repeat=1)]
    assert item_ratios(rows)[("a", "ssr")]["0"] == pytest.approx(1.0)


@pytest.mark.parametrize("values, inside", [([1.0], 1.0), ([0.8, 0.9, 1.0, 1.1, 1.2], 1.0)])
def test_bootstrap_interval_contains_median(values, inside):
    low, high = bootstrap_median(values)
    assert low <= inside <= high
    assert bootstrap_median(values) == (low, high)  # seeded: reproducible


def test_quality_is_cached_by_answer(tmp_path):
    calls = []

    def scorer(suite, item, answer):
        calls.append((suite, item))
        return {"value": 1.0 if answer == "good" else 0.0, "passed": answer == "good", "detail": {}, "note": ""}

    rows = [row("a", "0", "ar", 1, answer="good"), row("a", "0", "ssr", 1, answer="good"),
            row("a", "1", "ar", 1, answer="bad")]
    cache = tmp_path / "quality.json"
    attach_quality(rows, scorer, cache)
    assert len(calls) == 2 and [r["quality"]["value"] for r in rows] == [1.0, 1.0, 0.0]
    fresh = [dict(r) for r in rows]
    for r in fresh:
        del r["quality"]
    attach_quality(fresh, scorer, cache)
    assert len(calls) == 2  # read back from the cache


def test_report_files_and_tables(tmp_path):
    path = write_report([dict(r, quality={"value": 1.0, "passed": True, "detail": {}, "note": "env"}) for r in ROWS],
                        tmp_path, "note line")
    text = path.read_text()
    assert "## a" in text and "## b" in text and "note line" in text and "Environment-dependent" in text
    assert "| a | ssr | 5 |" in text
    assert (tmp_path / "stages.png").stat().st_size > 1000 and (tmp_path / "ratios.png").stat().st_size > 1000
    plain = format_table(summarise(ROWS))
    assert "0.850" in plain and "5/5" in plain


def test_load_rows_skips_a_torn_line(tmp_path):
    (tmp_path / "runs.jsonl").write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1])[:20])
    assert len(load_rows([tmp_path])) == 1


def test_rows_written_before_a_metric_rename_read_under_its_new_name(tmp_path):
    """Bench rows from before the rename (docs/peers/*.jsonl) still report and replay."""
    old = row("s", "1", "ssr", 1.0)
    old["metrics"]["suffix_accepted_tokens"] = old["metrics"].pop("answer_accepted_tokens")
    (tmp_path / "runs.jsonl").write_text(json.dumps(old) + "\n")
    (loaded,) = load_rows([tmp_path])
    assert loaded["metrics"]["answer_accepted_tokens"] == 0 and "suffix_accepted_tokens" not in loaded["metrics"]
