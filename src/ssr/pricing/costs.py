"""Engine cost tables: measured by `ssr calibrate`, or a preset, for `ssr simulate`.

    step_s[n]      one decode step carrying n sequences (one token each)
    score_s[k]     feeding k tokens to one sequence in one pass (verify, fork, close)
    prefill_token_s  prompt prefill, per token

all measured with `context_tokens` tokens cached. Attention makes every fed token
dearer the more tokens are cached, linearly; calibrate measures that at a second
context and keeps the slopes:

    step(n, c)  = step_s[n]  + n * step_context_s  * (c - context_tokens)
    score(k, c) = score_s[k] + (k * score_context_s + pass_context_s) * (c - context_tokens)
    prefill(n)  = n * (prefill_token_s + prefill_context_s * (n - context_tokens) / 2)

Below context_tokens a cost keeps at least MIN_CONTEXT_SHARE of the measured one (a slope
measured on a busy machine must not make short-context calls free).
Between measured points, costs are interpolated linearly (score: from step_s[1] at
k = 1; beyond the last point: extrapolated along the last segment). Cost models
without slopes (older files, the GPU preset) ignore the context.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..config import ConfigError

SCORE_SIZES = (8, 32, 128, 512)
STEP_SIZES = (1, 2, 4)
BATCH_SCORE_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)  # span passes priced at a batch (CostTable.at_batch)


@dataclass(frozen=True)
class CostTable:
    """What an engine's passes cost, measured (ssr calibrate, the start-up probe) or assumed (the
    GPU preset): a frozen table. CostModel prices passes from it and learns a drift."""

    step_s: dict[int, float]  # sequences in the batch -> seconds per step
    score_s: dict[int, float]  # tokens fed to one sequence -> seconds per pass
    prefill_token_s: float  # seconds per prompt token
    source: str = ""  # where the numbers come from
    meta: dict = field(default_factory=dict)  # engine, model, threads, date
    context_tokens: int = 0  # tokens cached when step_s / score_s were measured
    step_context_s: float = 0.0  # per sequence in a step, per cached token beyond context_tokens
    score_context_s: float = 0.0  # per scored token, per cached token beyond context_tokens
    pass_context_s: float = 0.0  # per score pass, per cached token beyond context_tokens (the KV read once)
    prefill_context_s: float = 0.0  # per prompt token, per token before it (see the module docstring)

    def step(self, num_sequences: int, context: int | None = None) -> float:
        extra = 0 if context is None else num_sequences * self.step_context_s * (context - self.context_tokens)
        return _floored(_interpolate(self.step_s, num_sequences), extra)

    def score(self, num_tokens: int, context: int | None = None) -> float:
        extra = 0 if context is None else \
            (num_tokens * self.score_context_s + self.pass_context_s) * (context - self.context_tokens)
        return _floored(_interpolate({1: self.step_s[1], **self.score_s}, num_tokens), extra)

    def prefill(self, num_tokens: int, cached: int = 0) -> float:
        """num_tokens prompt tokens fed after `cached` tokens already in the KV cache (a kept prefix)."""
        return num_tokens * _floored(self.prefill_token_s,
                                     self.prefill_context_s * (2 * cached + num_tokens - self.context_tokens) / 2)

    @property
    def prefill_off_host(self) -> bool:
        """Whether these are an accelerator's costs (the GPU preset, or a table the device check
        measured on one), whose prefill leaves the host free (Capabilities.prefill_frees_host)."""
        return self.source.startswith(GPU_PRESET_SOURCE) or self.meta.get("device", "cpu") != "cpu"

    def at_batch(self, batch: int) -> CostTable:
        """The costs one request sees among `batch` requests decoded together (vLLM's running
        batch): a pass is priced by the tokens it carries in all, and every request in the batch
        is taken to feed as many as this one (the symmetric case), so a step costs score(batch)
        and a pass of k tokens score(batch * k). On a GPU that keeps a verified token nearly free
        at batch 1 and makes it cost compute at batch 64 (the pass turns compute-bound)."""
        if batch <= 1:
            return self
        return replace(self, step_s={n: self.score(batch * n) for n in STEP_SIZES},
                       score_s={k: self.score(batch * k) for k in BATCH_SCORE_SIZES},
                       source=f"{self.source}; at a batch of {batch}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> CostTable:
        try:
            slopes = {name: float(data.get(name, 0.0))
                      for name in ("step_context_s", "score_context_s", "pass_context_s", "prefill_context_s")}
            return cls(step_s={int(k): float(v) for k, v in data["step_s"].items()},
                       score_s={int(k): float(v) for k, v in data["score_s"].items()},
                       prefill_token_s=float(data["prefill_token_s"]),
                       source=data.get("source", ""), meta=data.get("meta", {}),
                       context_tokens=int(data.get("context_tokens", 0)),
                       **slopes)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ConfigError(f"not a cost model (need step_s, score_s, prefill_token_s): {error}") from error


MIN_CONTEXT_SHARE = 0.25  # a call at a short context costs at least this share of its cost at the measured one


def _floored(measured: float, context_extra: float) -> float:
    """A cost at another context: the measured one plus the context slope's term, never below
    MIN_CONTEXT_SHARE of the measured one. The slope is measured above `context_tokens`; carried
    below it, a slope inflated by a busy machine would price short-context calls at nothing (for
    this machine's calibration the term takes at most ~25% off, at an empty context)."""
    return max(MIN_CONTEXT_SHARE * max(0.0, measured), measured + context_extra)


def _interpolate(table: dict[int, float], x: int) -> float:
    points = sorted(table.items())
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def gpu_preset(step: float = 0.015) -> CostTable:
    """A GPU-like engine, relative to one decode step (only the ratios matter for ratios).

    Decode at batch 1 is memory-bound: every step reads all weights, so a second or
    fourth sequence adds little (here +2% / +5%; vLLM batch-1 vs batch-4 decode on an
    A100/H100 for 1-8B models is within ~10%). A verify pass of k tokens is one step
    until the GPU turns compute-bound, at roughly (peak FLOP/s) / (memory bandwidth)
    ~ 300 tokens on an H100 (989 TFLOP/s bf16 / 3.35 TB/s); beyond that time grows
    with k. Prefill is compute-bound: ~200 prompt tokens per step time (a 4B model
    prefills ~15k tokens/s on an H100 while a decode step takes ~15 ms).
    These are the assumptions the paper's setting implies, not measurements here.
    """
    return CostTable(
        step_s={1: step, 2: step * 1.02, 4: step * 1.05},
        score_s={8: step, 32: step * 1.02, 128: step * 1.1, 256: step * 1.25, 512: step * 2.0},
        prefill_token_s=step / 200,
        source=f"{GPU_PRESET_SOURCE} (assumed: batch of 2 ~ 1.02 steps, verify <= 256 tokens ~ 1-1.25 steps)",
    )


GPU_PRESET_SOURCE = "gpu preset"  # how gpu_preset's tables' source begins


def specdecode_h100() -> CostTable:
    """Llama-3.1-8B on one H100 with vLLM, as measured and fitted by SpecDecode-Bench (its
    simulator's predictor.py, class Llama8BH100, fitted on InstructCoder at batch 1-64): a pass
    costs 3.92645679e-08 s a KV token + 2.10103129e-05 s a token in it + 5.88590713e-03 s, plus
    1.20683946e-03 s of overhead a step. Tables at the sizes ssr prices (the fit is linear)."""
    fixed, per_token, per_kv = 5.88590713e-03 + 1.20683946e-03, 2.10103129e-05, 3.92645679e-08
    return CostTable(step_s={n: fixed + per_token * n for n in (*STEP_SIZES, *BATCH_SCORE_SIZES)},
                     score_s={k: fixed + per_token * k for k in (*SCORE_SIZES, *BATCH_SCORE_SIZES)},
                     prefill_token_s=per_token, step_context_s=per_kv, pass_context_s=per_kv,
                     source="measured on an H100: SpecDecode-Bench's fit of Llama-3.1-8B on vLLM 0.10.1.1 "
                            "(their simulator's predictor.py, Llama8BH100)",
                     meta={"device": "cuda", "model": "Llama-3.1-8B-Instruct"})


def load_costs(spec: str) -> CostTable:
    """A JSON file from `ssr calibrate`, the preset `gpu`, `gpu:MS` (the preset with a step of MS
    milliseconds: host time, which is absolute, then weighs as on that GPU) or `specdecode-h100`."""
    if spec == "gpu":
        return gpu_preset()
    if spec == "specdecode-h100":
        return specdecode_h100()
    if spec.startswith("gpu:"):
        try:
            step_ms = float(spec[4:])
        except ValueError:
            step_ms = -1.0
        if not step_ms > 0:
            raise ConfigError(f"cost model {spec!r}: give gpu:MS with a step of MS > 0 milliseconds, e.g. gpu:6")
        return replace(gpu_preset(step_ms / 1e3), source=gpu_preset().source + f", step {step_ms:g} ms")
    path = Path(spec)
    try:
        return CostTable.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"cannot read cost model {spec!r}: {error} (give a calibrate JSON or 'gpu')") from error


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


@dataclass
class CostModel:
    """Seconds per engine call. With a measured `table`: the table times drift factors learnt
    from observed calls, one for steps and one for score passes (a pass over k tokens slows
    with the cached length more than a step does, so their ratio, which prices every span,
    is learnt too); without: a line learnt online, step_s + token_s * (n - 1)."""

    step_s: float = 0.05  # no table: one token for one sequence
    token_s: float = 0.02  # no table: each further token in the same pass
    smoothing: float = 0.2  # weight of a new observation
    table: CostTable | None = None  # measured step / score costs per size
    drift: float = 1.0  # observed / table for steps, smoothed
    score_drift: float = 1.0  # observed / table for score passes, smoothed
    learns: bool = True  # False: the costs as given, no call observed (vLLM's drafter times no pass)

    def at_batch(self, batch: int) -> CostModel:
        """These costs as one request sees them among `batch` decoded together (CostTable.at_batch);
        without a table, as they are (nothing measured says how a batch shares a pass)."""
        if self.table is None or batch <= 1:
            return self
        return replace(self, table=self.table.at_batch(batch))

    def observe_step(self, seconds: float) -> None:
        if not self.learns:
            return
        if self.table is not None:
            self.drift = self._smoothed(self.drift, seconds / max(self.table.step(1), 1e-9))
        else:
            self.step_s += self.smoothing * (seconds - self.step_s)

    def observe_score(self, num_tokens: int, seconds: float) -> None:
        if not self.learns:
            return
        if self.table is not None:
            self.score_drift = self._smoothed(self.score_drift, seconds / max(self.table.score(num_tokens), 1e-9))
        elif num_tokens >= 2:
            per_token = max(0.0, (seconds - self.step_s) / (num_tokens - 1))
            self.token_s += self.smoothing * (per_token - self.token_s)

    def _smoothed(self, current: float, ratio: float) -> float:
        ratio = min(max(ratio, 0.2), 5.0)  # one stall must not swing the model
        return current + self.smoothing * (ratio - current)

    def cost(self, num_tokens: int) -> float:
        """num_tokens fed to one sequence in one pass."""
        if self.table is not None:
            return self.drift * self._score_table(1) if num_tokens <= 1 else \
                self.score_drift * self._score_table(num_tokens)
        return self.step_s + self.token_s * max(0, num_tokens - 1)

    def costs(self, max_tokens: int) -> list[float]:
        """[cost(1), ..., cost(max_tokens)]: every span length priced in one call (span pricing)."""
        if self.table is None:
            return [self.cost(k) for k in range(1, max_tokens + 1)]
        self._score_table(max_tokens)
        return [self.drift * self._scores[0]] + [self.score_drift * s for s in self._scores[1:max_tokens]]

    def _score_table(self, num_tokens: int) -> float:
        """The table's pass over num_tokens, context-free (1: table.step, a step; more: table.score),
        from a list built once per table and length."""
        scores = getattr(self, "_scores", None) if getattr(self, "_scores_of", None) is self.table else None
        if scores is None or len(scores) < num_tokens:
            longest = max(num_tokens, 2 * len(scores or ()), 128)  # doubled: trees ask one more at a time
            self._scores = scores = [self.table.step(1)] + [self.table.score(k) for k in range(2, longest + 1)]
            self._scores_of = self.table
        return scores[num_tokens - 1]

    def step(self, num_sequences: int) -> float:
        """One token for each of num_sequences in one pass (no table: no batching gain)."""
        if self.table is not None:
            return self.drift * self.table.step(num_sequences)
        return self.step_s * num_sequences
