"""vLLM's costs, measured through its requests: the table ssr's drafter prices spans with.

vLLM schedules its own batches, so the sequence probe of probe.calibrate (fork, step, score)
does not apply. The same quantities come from request timings instead, on a context that vLLM's
prefix cache holds (a first request writes it):

- step(n): n requests decode together from that context; the median gap between one request's
  outputs is a step of n sequences.
- score(k): a request whose prompt is the context and k new tokens; its time to the first output
  is one pass over k tokens, plus what admitting a request costs (measured with k = 1 beside a
  step: the difference is taken off every k).

On a GPU a step is a few milliseconds and a request's admission is of that order too, so the
figures are taken where they are steady (the CPU: tens of milliseconds a step); a GPU keeps the
preset (costs.gpu_preset) unless a table is given.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from ..pricing.costs import CostTable
from ..pricing.probe import filler_ids, read_table, write_table
from .vllm_drafter import UNDRAFTED  # the drafter leaves these requests plain

SCORE_TOKENS = (8, 32, 128, 512)  # tokens in one pass, as costs.SCORE_SIZES
STEP_SEQUENCES = (1, 2, 4)  # requests decoding together, as costs.STEP_SIZES
CONTEXT_TOKENS = 128  # cached before every probe (a whole number of KV blocks at 16, 32 or 128)
DECODE_TOKENS = 12  # tokens each step probe decodes


def measure(engine, repeats: int = 3, context_tokens: int = CONTEXT_TOKENS, progress=None) -> CostTable:
    """The cost table of a running VllmEngine (see the module docstring); a few seconds on a CPU."""
    tick = progress or (lambda: None)
    context = filler_ids(engine, context_tokens, 0)
    _time_to_first(engine, context)  # writes the context into the prefix cache (and warms up)
    step_s = {}
    for count in STEP_SEQUENCES:
        step_s[count] = statistics.median(_decode_gap(engine, context, count, trial) for trial in range(repeats))
        tick()
    admit = statistics.median(_time_to_first(engine, context + filler_ids(engine, 1, 1 + trial))
                              for trial in range(repeats)) - step_s[1]
    score_s = {}
    for size in SCORE_TOKENS:
        times = [_time_to_first(engine, context + filler_ids(engine, size, 7 + 31 * trial))
                 for trial in range(max(2, repeats // (1 + size // 128)))]
        score_s[size] = max(step_s[1], statistics.median(times) - max(0.0, admit))
        tick()
    return CostTable(step_s=step_s, score_s=score_s, prefill_token_s=score_s[512] / 512,
                 source="measured on vLLM by its request timings (engines/vllm_costs.py)",
                 meta={"date": time.strftime("%Y-%m-%d %H:%M"), "engine": "vllm", "model": engine.name,
                       "admit_s": round(admit, 6)},
                 context_tokens=context_tokens)


def table_path(model) -> Path:
    """Where the table of a model (its vLLM source: a folder or a hub id) on this machine is kept."""
    from ..models import cache_dir

    return cache_dir() / "costs" / f"vllm-{model_name(model)}-{_machine()}.json"


def model_name(model) -> str:
    """VllmEngine.name of a model source: its last path component."""
    return str(model).rstrip("/").split("/")[-1]


def cached(engine, log=None) -> CostTable:
    """measure(), once per model and machine: kept beside the other models (costs/), reread after."""
    path = table_path(engine.name)
    costs = read_table(path)
    if costs is None:
        if log is not None:
            log(f"measuring vLLM's costs once for {engine.name} on this machine (a few seconds): {path}")
        costs = measure(engine)
        write_table(path, costs)
    return costs


def _machine() -> str:
    import os
    import platform

    return f"{platform.machine()}-{os.cpu_count()}cpu"


def _params(engine, max_tokens: int):
    return engine.sampling_params(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)


def _time_to_first(engine, prompt: list[int]) -> float:
    """Seconds from submitting a one-token request to its output."""
    start = time.perf_counter()
    request = engine.open(engine.new_id(UNDRAFTED), prompt, _params(engine, 1))
    for _ in request.stream():
        break
    seconds = time.perf_counter() - start
    request.abort()
    return seconds


def _decode_gap(engine, context: list[int], count: int, trial: int) -> float:
    """Median seconds between the outputs of the first of `count` requests decoding together."""
    requests = [engine.open(engine.new_id(UNDRAFTED), context + filler_ids(engine, 1, 100 + 10 * trial + i),
                            _params(engine, DECODE_TOKENS)) for i in range(count)]
    stamps = [time.perf_counter() for _ in requests[0].stream()]
    for request in requests:
        request.result()
    gaps = [later - earlier for earlier, later in zip(stamps[1:], stamps[2:])]  # past the first (the prefills)
    return statistics.median(gaps) if gaps else 0.0
