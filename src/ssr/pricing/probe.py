"""Measuring an engine's cost table: `ssr calibrate`'s probe, the start-up probe the span policy
prices with (measured once per engine setup, cached on disk, rescaled to the machine's speed
now), and the cache's files. What a table holds and how it prices a pass: costs.py."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..config import ConfigError
from .costs import SCORE_SIZES, STEP_SIZES, CostTable


def calibrate(engine, repeats: int = 5, context_tokens: int = 1024, progress=None,
              score_sizes: tuple[int, ...] = SCORE_SIZES) -> CostTable:
    """Median wall seconds of step (1, 2, 4 sequences), score (8..512 tokens) and prefill,
    measured on this engine at a context of `context_tokens` tokens; step(1), score(128)
    and prefill again at twice that context give the context slopes."""
    tick = progress or (lambda: None)
    prefill_s, step_s, score_s = _probe(engine, context_tokens, repeats, STEP_SIZES, score_sizes, tick)
    longer = 2 * context_tokens
    prefill_long, step_long, score_long = _probe(engine, longer, repeats, (1,), (128,), tick)
    grown = longer - context_tokens
    return CostTable(step_s=step_s, score_s=score_s, prefill_token_s=prefill_s,
                 source="measured by ssr calibrate",
                 # an engine whose prefill frees the host names its device: the replay builds beside it too
                 meta={"date": time.strftime("%Y-%m-%d %H:%M"),
                       **({"device": engine.device} if engine.capabilities.prefill_frees_host else {})},
                 context_tokens=context_tokens,
                 step_context_s=max(0.0, (step_long[1] - step_s[1]) / grown),
                 score_context_s=max(0.0, (score_long[128] - score_s[128]) / (128 * grown)),
                 prefill_context_s=max(0.0, 2 * (prefill_long - prefill_s) / grown))


QUICK_CONTEXT = 128  # tokens cached for the start-up probe


def engine_costs(engine, log=None) -> CostTable:
    """The engine's cost table for the policy: a quick probe (step 1 and 2 sequences, score
    8/32/128 at a short context) measured once per engine setup and cached on disk when the
    engine names its setup (`cost_key`); a cached table is refreshed by timing a few steps,
    which scales it to the machine's speed now."""
    from ..models import cache_dir

    key = getattr(engine, "cost_key", None)
    path = cache_dir() / "costs" / f"{key}.json" if key else None
    cached = read_table(path) if path is not None else None
    if cached is not None:
        return _rescaled(cached, _step_seconds(engine))
    if log is not None:
        log(f"measuring engine costs once for {key or 'this engine'} (a few seconds)")
    prefill_s, step_s, score_s = _probe(engine, QUICK_CONTEXT, 3, (1, 2), (8, 32, 128), lambda: None)
    costs = CostTable(step_s=step_s, score_s=score_s, prefill_token_s=prefill_s, context_tokens=QUICK_CONTEXT,
                  source="quick probe at start-up", meta={"date": time.strftime("%Y-%m-%d %H:%M"), "key": key})
    if path is not None:
        write_table(path, costs)
    return costs


def read_table(path: Path) -> CostTable | None:
    """A cost table cached on disk; None when there is none or it is unreadable (measure again)."""
    if not path.is_file():
        return None
    try:
        return CostTable.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ConfigError):
        return None


def write_table(path: Path, costs: CostTable) -> None:
    """Cache a cost table on disk; a read-only cache only costs the probe next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(costs.to_json(), encoding="utf-8")
    except OSError:
        pass


def filler_ids(engine, count: int, offset: int = 0) -> list[int]:
    """Ordinary tokens to fill a context (the content does not matter to the timing); another
    offset gives other tokens (probes that must not read each other's prefix cache)."""
    start = min(1000, engine.vocab_size // 2)
    return [start + (offset * 7919 + i) % (engine.vocab_size - start) for i in range(count)]


def _step_seconds(engine, steps: int = 4) -> float:
    """Median seconds of a one-sequence step at the quick probe's context."""
    filler = filler_ids(engine, QUICK_CONTEXT)
    seq = engine.prefill(filler)
    try:
        return _median_step_s(engine, [(seq, filler[0])], steps)
    finally:
        engine.release(seq)


def _median_step_s(engine, batch: list[tuple[int, int]], repeats: int) -> float:
    """Median seconds of `repeats` steps of this batch, after one that warms up (each step
    feeds one more token to every sequence)."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        engine.step(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _rescaled(costs: CostTable, step_s: float) -> CostTable:
    """costs with every time scaled so that a one-sequence step takes step_s."""
    scale = step_s / costs.step_s[1] if costs.step_s[1] > 0 else 1.0
    return CostTable(step_s={k: v * scale for k, v in costs.step_s.items()},
                 score_s={k: v * scale for k, v in costs.score_s.items()},
                 prefill_token_s=costs.prefill_token_s * scale, source=costs.source + f", rescaled x{scale:.2f}",
                 meta=costs.meta, context_tokens=costs.context_tokens)


def _probe(engine, context_tokens: int, repeats: int, step_sizes, score_sizes, tick):
    """(prefill seconds per token, {sequences: step s}, {tokens: score s}) at this context."""
    filler = filler_ids(engine, context_tokens)
    parent = engine.prefill(filler)
    prefill_s = []
    for _ in range(max(1, repeats // 2)):
        start = time.perf_counter()
        engine.release(engine.prefill(filler))
        prefill_s.append((time.perf_counter() - start) / len(filler))
        tick()
    step_s = {}
    for size in step_sizes:
        if size > engine.max_sequences:
            continue
        seqs = [parent] + [engine.fork(parent) for _ in range(size - 1)]
        step_s[size] = _median_step_s(engine, [(seq, filler[0]) for seq in seqs], repeats)
        for seq in seqs:
            engine.truncate(seq, context_tokens)
        for seq in seqs[1:]:
            engine.release(seq)
        tick()
    if 2 in step_sizes and 2 not in step_s:  # an engine limited to one sequence: no batching
        step_s[2] = 2 * step_s[1]
    score_s = {}
    for size in score_sizes:
        probe = (filler * (size // len(filler) + 1))[:size]
        times = []
        for _ in range(max(2, repeats // (1 + size // 64))):
            start = time.perf_counter()
            engine.score(parent, probe)
            times.append(time.perf_counter() - start)
            engine.truncate(parent, context_tokens)
        score_s[size] = statistics.median(times)
        tick()
    engine.release(parent)
    return statistics.median(prefill_s), step_s, score_s
