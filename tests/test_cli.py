"""CLI: bad input gives one clear line and exit code 2; the happy path prints text + stats."""
import importlib.util
import json
import re
import subprocess
import sys

import pytest

from ssr.cli import main


FAST = ("--model", "smollm2-135m")  # the fast test model, where the default model is not the point


def run_cli(*args, stdin=None):
    proc = subprocess.run([sys.executable, "-m", "ssr.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


BAD_INPUT = [
    (["generate", ""], "prompt is empty"),
    (["generate", "   "], "prompt is empty"),
    (["generate", "hi", "--repetition-stop", "1"], "--repetition-stop must be 0 (off) or >= 2"),
    (["generate", "hi", "--draft-at", "100", "--thinking-budget", "100"], "--draft-at (100) must be smaller"),
    (["generate", "hi", "--draft-at", "-1"], "--draft-at must be >= 0"),
    (["generate", "hi", "--max-tokens", "-5"], "--max-tokens must be >= 1"),
    (["generate", "hi", "--thinking-budget", "-1"], "--thinking-budget must be >= 0"),
    (["generate", "hi", "--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
    (["generate", "hi", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (["generate", "hi", "--draft-tokens", "0"], "--draft-tokens must be >= 1"),
    (["generate", "hi", "--verify-chunk", "0"], "--verify-chunk must be >= 1"),
    (["bench", "--modes", "ar,turbo"], "--modes: unknown turbo"),
    (["bench", "--suite", "mmlu"], "unknown suite 'mmlu'"),
    (["bench", "--limit", "0"], "--limit and --repeats must be >= 1"),
    (["generate", "hi", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["generate", "hi", "--model", "/etc/hostname"], "is not a GGUF file"),
    (["generate", "hi", "--model", "/"], "is not a readable file"),
    (["generate", "--prompt-file", "/no/such/file"], "cannot read prompt file"),
    (["generate", "hi", "--prompt-file", "/etc/hostname"], "not both"),
    (["generate", "hi", "--max-tokens", "many"], "invalid int value"),
    (["generate", "hi", "--mode", "fast"], "invalid choice"),
    (["generate", "hi", "--context-size", "8"], "--context-size must be >= 64"),
    (["frobnicate"], "invalid choice"),
    (["bench", "--engine", "llama.cpp,tensorrt"], "--engine: give engines from llama.cpp, transformers, vllm"),
    (["generate", "hi", "--tensor-parallel-size", "2"], "--tensor-parallel-size: options of --engine vllm"),
    (["generate", "hi", "--eager"], "--eager: options of --engine vllm"),
    (["generate", "hi", "--engine", "vllm", "--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1"),
    (["generate", "hi", "--engine", "vllm", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in"),
    (["generate", "hi", "--engine", "vllm", "--device", "cuda"], "--device is an option of --engine transformers"),
    (["generate", "hi", "--dtype", "float16"], "--device and --dtype are options of --engine transformers"),
    (["generate", "hi", "--engine", "transformers", "--model", "no-such"], "unknown model 'no-such'"),
    (["generate", "hi", "--engine", "transformers", "--model", "/"], "model folder / has no config.json"),
    (["report", "/no/such/folder"], "no bench rows at /no/such/folder"),
    (["simulate", "--traces", "/no/such/folder"], "no bench rows at /no/such/folder"),
    (["simulate", "--traces", "/etc", "--cost-model", "/no/costs.json"], "cannot read cost model"),
    (["simulate"], "the following arguments are required: --traces"),
    (["simulate", "--traces", "/etc", "--project-modes", "ssr,fast"], "--project-modes: unknown fast"),
    (["calibrate", "--timings", "0"], "--timings must be >= 1"),
    (["calibrate", "--repeats", "3"], "--repeats is not an option here: timings per probe are --timings"),
    (["traces", "x.jsonl", "--host", "measured"], "--host is not an option here"),
    (["calibrate", "--context-tokens", "4"], "--context-tokens must be in 8.."),
    (["serve", "--port", "0"], "--port must be in 1..65535"),
    (["serve", "--max-queue", "-1"], "--max-queue must be >= 0"),
    (["serve", "--draft-at", "900", "--thinking-budget", "100"], "--draft-at (900) must be smaller"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUT, ids=[" ".join(a) or "empty" for a, _ in BAD_INPUT])
def test_bad_input_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_generate_without_prompt_prints_usage(capsys):
    assert main(["generate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ssr generate") and "example: ssr generate" in err and "Traceback" not in err


def test_vllm_not_installed_is_one_line(capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here (its own tests cover it)")
    assert main(["generate", "hi", "--engine", "vllm"]) == 2
    err = capsys.readouterr().err
    assert "--engine vllm is not installed" in err and "pip install -e '.[vllm]'" in err
    assert err.count("\n") == 1


@pytest.mark.model
def test_prompt_too_long_for_context(capsys):
    assert main(["generate", "word " * 3000, "--context-size", "1024", *FAST]) == 2
    assert "more than the context holds" in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_generate_json_end_to_end(policy):
    code, out, err = run_cli("generate", "Write a function is_even(n).", "--json", "--thinking-budget", "48",
                             "--draft-at", "16", "--draft-tokens", "32", "--max-answer-tokens", "48", "--policy", policy,
                             "--draft-interval", "12", *FAST)
    assert code == 0, err
    payload = json.loads(out)
    assert payload["answer"].startswith("```python")
    metrics = payload["metrics"]
    assert metrics["cot_tokens"] == len(payload["cot_ids"])
    plan = metrics["policy"]
    assert plan["explain"]["policy"] == policy and plan["explain"]["reason"]
    if policy == "auto":  # what it chose, from which predicted costs
        assert {"step_1", "step_2", "per_draft_token_batched", "net_gain_per_draft"} <= set(plan["explain"]["predicted_s"])
    if plan["draft"] and metrics["cot_tokens"] > plan["stages"][0]:  # reached b_d
        assert metrics["draft_tokens"] > 0 and metrics["stages"][0]["forked_at"] == plan["stages"][0]
    if policy == "fixed":
        assert plan["stages"] == [16, 28, 40]
        forked = [stage["forked_at"] for stage in metrics["stages"]]
        assert forked == [16, 28, 40][: len(forked)] and all(b <= metrics["cot_tokens"] for b in forked)
    assert set(metrics["seconds"]) == {"prefill", "cot", "draft", "verify", "continuation"}


@pytest.mark.model
def test_generate_stream_and_stdin():
    code, out, err = run_cli("generate", "-", "--stream", "--mode", "ar", "--thinking-budget", "24",
                             "--max-answer-tokens", "24", *FAST, stdin="Add two numbers in Python.")
    assert code == 0, err
    assert "```python" in out
    assert re.match(r"[\d.]+ s: thought \d+ tokens in [\d.]+ s.*, answered \d+ tokens in [\d.]+ s.*; "
                    r"plain decoding \(--mode ar\)", err), err
    assert err.count("\n") == 1


@pytest.mark.model
def test_bench_smoke_report_simulate_calibrate(tmp_path):
    """One HumanEval item, two modes, end to end: rows, quality, report, replay, costs."""
    out = tmp_path / "bench"
    code, stdout, err = run_cli("bench", "--suite", "humaneval", "--limit", "1", "--modes", "ar,ssr",
                                "--thinking-budget", "32", "--draft-at", "8", "--draft-tokens", "16",
                                "--max-tokens", "48", "--out", str(out), *FAST)
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in rows] == ["ar", "ssr"] and all(r["identical"] for r in rows)
    scores = json.loads((out / "quality.json").read_text()).values()  # pass@1 of the answers
    assert scores and all(entry["value"] in (0.0, 1.0) for entry in scores)
    report = (out / "report.md").read_text()
    assert "## humaneval" in report and "| humaneval | ssr | 1 |" in report
    assert (out / "stages.png").exists() and "ratio to ar" in stdout

    code, stdout, err = run_cli("report", str(out), "--out", str(tmp_path / "again"))
    assert code == 0 and (tmp_path / "again" / "report.md").exists(), err

    code, stdout, err = run_cli("calibrate", "--timings", "2", "--out", str(tmp_path / "costs.json"), *FAST)
    assert code == 0, err
    costs = json.loads((tmp_path / "costs.json").read_text())
    assert set(costs["step_s"]) >= {"1", "2"} and set(costs["score_s"]) == {"8", "32", "128", "512"}
    assert 0 < costs["step_s"]["1"] < costs["score_s"]["512"]

    for model in (str(tmp_path / "costs.json"), "gpu"):
        code, stdout, err = run_cli("simulate", "--traces", str(out), "--cost-model", model)
        assert code == 0, err
        assert re.search(r"humaneval\s+ssr\s+1\s", stdout), stdout
    # drafts the GPU plan forks, written by the rows' model (untimed) and kept; modes projected from ar
    saved = tmp_path / "with-drafts.jsonl"
    code, stdout, err = run_cli("simulate", "--traces", str(out), "--record-drafts", FAST[FAST.index("--model") + 1],
                                "--save-traces", str(saved), "--project-modes", "suffix,pld")
    assert code == 0 and "planned drafts:" in err, err
    assert re.search(r"humaneval\s+suffix\s+1\s+-\s", stdout), stdout  # projected: nothing measured
    assert [json.loads(line)["mode"] for line in saved.read_text().splitlines()] == ["ar", "ssr"]
    code, stdout, err = run_cli("simulate", "--traces", str(saved), "--drafts", "planned")
    assert code == 0 and "0 written by the model" in err, err


IGNORED = [  # (flags, what stderr must say; "" for nothing): a drafting flag the mode or the policy does not use is named
    (["--mode", "ar", "--draft-at", "8"], "--draft-at: mode ar forks no draft child; ignored"),
    (["--mode", "suffix", "--verify-chunk", "4", "--draft-tokens", "9"],
     "--draft-tokens, --verify-chunk: mode suffix forks no draft child"),
    (["--verify-chunk", "4"], "--verify-chunk: chosen by --policy auto"),
    (["--draft-at", "8"], "--draft-at: used by --policy auto only until"),
    (["--policy", "fixed", "--draft-at", "8", "--verify-chunk", "4"], ""),
    (["--thinking-budget", "64"], ""),
]


@pytest.mark.parametrize("flags,said", IGNORED)
def test_a_drafting_flag_the_mode_or_policy_ignores_is_named(flags, said, capsys):
    from ssr.cli import build_parser
    from ssr.flags import generation_config

    config = generation_config(build_parser().parse_args(["generate", "hi", *flags]))
    err = capsys.readouterr().err
    assert (said in err) if said else err == ""
    if "--draft-at" in flags:
        assert config.draft_at == 8  # used as given where the plan reads it
    if flags == ["--thinking-budget", "64"]:  # b_d not given, the budget no longer than its default: half of it
        assert config.draft_at == 32


def test_every_flag_of_every_command_has_help():
    import argparse

    from ssr.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [(name, action.option_strings) for name, parser in commands.choices.items()
               for action in parser._actions if action.option_strings and action.help is None]
    assert missing == []
