"""The parsers of `ssr simulate` and `ssr traces` (the replays), kept apart from cli.py."""
from __future__ import annotations

from ..flags import Renamed
from ..models import DEFAULT_MODEL

HOST_TIME = "the loop's host time on the modelled clock is --host-time (--host is ssr serve's listen address)"


def add_replay_commands(commands) -> None:
    """`simulate` (bench rows under a cost model) and `traces` (text traces in every mode)."""
    _add_simulate(commands)
    _add_traces(commands)


def _add_simulate(commands) -> None:
    sim = commands.add_parser("simulate", help="replay bench traces under a cost model; projected ratios to ar")
    sim.add_argument("--traces", nargs="+", required=True, help="bench folders or JSONL files")
    sim.add_argument("--cost-model", default="gpu",
                     help="a JSON from ssr calibrate, the preset 'gpu', gpu:MS (the preset with an MS-millisecond step) "
                          "or specdecode-h100 (Llama-3.1-8B on an H100, measured: docs/costs.md)")
    sim.add_argument("--spans", default="policy", choices=("policy", "recorded"),
                     help="policy: re-decide spans under the cost model (projection); recorded: the run's own "
                          "spans (checks the cost model against measured seconds)")
    sim.add_argument("--anchor-ar", action="store_true",
                     help="scale each item's modelled seconds so its ar run matches the measured one (removes "
                          "machine-speed drift between calibration and bench; checks the modes' differences)")
    sim.add_argument("--project-modes", default="",
                     help="comma-separated modes to replay from each item's ar row where the bench ran no row of "
                          "them (items run in ar only: long prompts); projected rows have no measured seconds and "
                          "no draft")
    sim.add_argument("--drafts", default="recorded", choices=("recorded", "planned"),
                     help="recorded: the runs' own drafting; planned: drafting re-planned under the cost model, "
                          "its drafts read from the rows (planned_drafts) or written by --record-drafts")
    sim.add_argument("--record-drafts", default=None, metavar="MODEL",
                     help="write the planned drafts the rows lack with this model (registry name or .gguf; "
                          "llama.cpp, greedy, untimed); implies --drafts planned")
    sim.add_argument("--context-size", type=int, default=8192,
                     help="with --record-drafts: KV cache tokens (default 8192)")
    sim.add_argument("--save-traces", default=None, metavar="JSONL",
                     help="write the rows (with the planned drafts) to this file")
    sim.add_argument("--host-time", dest="host", default="off", metavar="OFF|measured|MS",
                     help="the loop's host time on the modelled clock: off (default), measured (this machine's), "
                          "or milliseconds per pass")
    sim.add_argument("--host", dest="renamed_host", action=Renamed, now=HOST_TIME)
    sim.add_argument("--json", action="store_true", help="print the table as JSON")
    sim.add_argument("--markdown", action="store_true", help="print the table as markdown")


def _add_traces(commands) -> None:
    from ..config import MODE_TABLE, RECORDED_MODES, TRACE_MODES

    traces = commands.add_parser(
        "traces", help="replay what reasoning models wrote (trace files, chat-completions logs) in every mode",
        description="Replay text traces through the real decoding loop in every mode, under a cost model, and "
                    "print each mode's latency ratio to ar. Reads JSONL (gzip or not), one trace a line: "
                    '{"prompt", "cot", "answer", "model", "task_id"}; an OpenAI chat-completions pair '
                    '{"request": {"messages": [...]}, "response": {"choices": [{"message": {"content", '
                    '"reasoning_content"}}]}}; or a served request {"messages", "reasoning", "answer", "model"}.')
    traces.add_argument("files", nargs="+", help="trace files or logs (.jsonl, .jsonl.gz)")
    traces.add_argument("--modes", default=",".join(TRACE_MODES),
                        help="comma-separated, default all (a trace holds no draft child's text: ssr replays its "
                             "speculation alone): " + "; ".join(
                            f"{name}: {MODE_TABLE[name].summary}" for name in TRACE_MODES)
                        + "; and, on traces with a GPU run's acceptance, not by default: " + "; ".join(
                            f"{mode.name}: {mode.summary}" for mode in RECORDED_MODES))
    traces.add_argument("--orders", default="cold,deployment",
                        help="cold (each trace alone) and/or deployment (file order, earlier responses "
                             "cached, the last request's KV kept)")
    traces.add_argument("--cost-model", default="gpu",
                        help="comma-separated: the preset 'gpu', gpu:MS (its step MS milliseconds), specdecode-h100 "
                             "(Llama-3.1-8B on an H100, measured: docs/costs.md) and/or JSON files from ssr calibrate "
                             "(default gpu)")
    traces.add_argument("--tokenizer", default=DEFAULT_MODEL,
                        help=f"registry model or .gguf (its vocabulary), a tokenizer.json or a folder with one "
                             f"(default {DEFAULT_MODEL}: Qwen2's BPE, shared by Qwen3, QwQ and R1-Distill-Qwen)")
    traces.add_argument("--limit", type=int, default=None, help="traces per (set, model) group, the first in file order")
    traces.add_argument("--tasks", type=int, default=None,
                        help="per group, every trace of the first N tasks (their prompt variants and runs too)")
    traces.add_argument("--group", action="append", dest="groups", default=None,
                        help="only groups ('set / model') holding this text; repeatable")
    traces.add_argument("--host-time", dest="host", default="off", metavar="OFF|measured|MS",
                        help="the loop's host time on the modelled clock: off (measured beside it, default), "
                             "measured, or milliseconds per pass")
    traces.add_argument("--host", dest="renamed_host", action=Renamed, now=HOST_TIME)
    traces.add_argument("--ngram", default=None, metavar="MIN,MAX,K",
                        help="the ngram-v1 peer's prompt_lookup_min, prompt_lookup_max and num_speculative_tokens "
                             "(default vLLM's docs' example: 4,4,5; SpecDecode-Bench ran 3,7,3 and 3,7,5)")
    traces.add_argument("--drafts", default="plan", metavar="plan|all|none|BUDGET",
                        help="on traces that record draft children (`drafts`): plan (the drafting plan decides "
                             "whether and at which recorded budget a child forks; default), all (a child at every "
                             "recorded budget), none (no child), or one budget in tokens (e.g. 512)")
    traces.add_argument("--recorded-k", type=int, default=3, metavar="K",
                        help="draft tokens a step for the reference modes recorded-ngram and recorded-eagle, "
                             "which play back a GPU run's recorded acceptance (default 3, as SpecDecode-Bench)")
    traces.add_argument("--candidates", choices=("tree", "forks", "chain"), default="tree",
                        help="how the replayed engine verifies several candidate spans a pass: tree (one token tree, "
                             "tree attention: a pass costs its nodes; default), forks (each on its own fork, a pass "
                             "priced as a batch of them: ssr's llama.cpp and transformers adapters) or chain (one "
                             "candidate a pass: vLLM, which verifies one draft chain per request per step)")
    traces.add_argument("--batch", type=int, default=1,
                        help="price every pass among this many requests decoded together (vLLM's running batch; "
                             "costs.CostTable.at_batch: a pass costs the tokens of the whole batch; each step waits "
                             "for every request's host time, so the ratio with host time counts it that many times; "
                             "default 1)")
    traces.add_argument("--step-ms", type=float, default=6.0,
                        help="the step time for the ratio with host time added (default 6: an 8B model on an H200)")
    traces.add_argument("--out", default="results/traces", help="folder for rows.jsonl and report.md")
    traces.add_argument("--markdown", action="store_true", help="print the tables as markdown")
