"""The weight-free GPU check (ssr.device_check) on the CPU, isolated as on the GPU machine."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from ssr.pricing.costs import load_costs
from ssr.device_check import ARCHITECTURES, SPECIAL_TOKENS, synthetic_tokenizer

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("device_bundle", ROOT / "scripts" / "device_bundle.py")
device_bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_bundle)


def test_synthetic_tokenizer_round_trips_text_and_keeps_markers_whole():
    tokenizer = synthetic_tokenizer(1024)
    assert len(tokenizer) == 1024
    text = "<|im_start|>user\nis_prime(4) → False ✓<|im_end|>\n<think>\nplan</think>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    for marker in SPECIAL_TOKENS:
        assert len(tokenizer(marker, add_special_tokens=False)["input_ids"]) == 1, marker
    assert "<think>" in tokenizer.chat_template  # the `think` format is detected


@pytest.mark.model
def test_benchmark_architecture_is_the_gguf_model():
    """The random model the GPU check times has the benchmark model's shape."""
    from transformers import AutoConfig

    from ssr.models import resolve_model

    gguf = resolve_model("qwen2.5-coder-0.5b")
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    for key, value in ARCHITECTURES["qwen2.5-coder-0.5b"].items():
        if key in ("rope_theta", "rms_norm_eps"):
            continue  # kept in rope_parameters / rounded in the GGUF
        assert getattr(config, key) == value, key


@pytest.mark.model
def test_what_travels_fits_and_the_check_runs_with_only_torch_transformers_numpy(tmp_path):
    files = device_bundle.travelling_files()
    assert sum(size for _, size in files) < 64 * 2**20
    assert not any(name.startswith((".venv", "results/")) for name, _ in files)
    run = device_bundle.isolated_run(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "check" / "summary.json").read_text())
    (result,) = summary
    assert result["architecture"] == "tiny"
    assert all(row["identical"] for row in result["identity"])
    assert any(row["stages"] == 3 and row["draft_tokens"] > 0 for row in result["identity"])
    costs = load_costs(str(tmp_path / "check" / "costs-cpu-tiny-float32.json"))  # as `ssr simulate --cost-model`
    assert costs.step_s[1] > 0 and 512 in costs.score_s and costs.meta["weights"].startswith("random")
    assert "| step, sequences 1 |" in (tmp_path / "check" / "summary.md").read_text()
    beside = result["beside"]  # the proposer beside a prefill: on a CPU it is built after it
    assert beside["beside"] is False and beside["tokens"] == 1500
    assert beside["both_s"] >= 0.5 * (beside["prefill_s"] + beside["build_s"]) > 0


@pytest.mark.model
def test_a_module_outside_the_image_fails_the_isolated_run(tmp_path, monkeypatch):
    """The isolation is real: a package the GPU machine lacks cannot be imported there."""
    monkeypatch.setattr(device_bundle, "IMAGE_PACKAGES", ("numpy",))  # no torch: the check must fail
    run = device_bundle.isolated_run(tmp_path)
    assert run.returncode != 0 and "torch" in run.stderr
