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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..config import ConfigError

SCORE_SIZES = (8, 32, 128, 512)
STEP_SIZES = (1, 2, 4)
BATCH_SCORE_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)  # span passes priced at a batch (CostTable.at_batch)


@dataclass(frozen=True)
class DraftCost:
    """What a peer's proposer costs a step on the device, beside the verify pass (a trained
    drafter's forward passes, an n-gram search on the GPU's host): measured by whoever measured
    the table. ssr's own proposers run on the host; their time is measured, not priced here."""

    share_of_pass: float = 0.0  # of the verify pass it drafts for
    fixed_s: float = 0.0  # a step
    per_token_s: float = 0.0  # a token in the request's verify pass (its drafted tokens and the last one)
    per_kv_s: float = 0.0  # a token in the KV cache (the batch's)

    def seconds(self, pass_s: float, tokens: int, context: int) -> float:
        return self.share_of_pass * pass_s + self.fixed_s + self.per_token_s * tokens + self.per_kv_s * context


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
    drafting: dict[str, DraftCost] = field(default_factory=dict)  # a peer's drafter ("ngram", "eagle") -> its cost

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
        is taken to feed as many as this one at as long a context (the symmetric case), so a step
        costs score(batch) and a pass of k tokens score(batch * k), each request's KV is read
        (the context slopes, a drafter's KV term, times batch), and the prompts prefill together.
        On a GPU that keeps a verified token nearly free at batch 1 and makes it cost compute at
        batch 64 (the pass turns compute-bound)."""
        if batch <= 1:
            return self
        return replace(self, step_s={n: self.score(batch * n) for n in STEP_SIZES},
                       score_s={k: self.score(batch * k) for k in BATCH_SCORE_SIZES},
                       prefill_token_s=batch * self.prefill_token_s, prefill_context_s=batch * self.prefill_context_s,
                       step_context_s=batch * self.step_context_s, score_context_s=batch * self.score_context_s,
                       pass_context_s=batch * self.pass_context_s,
                       drafting={name: replace(cost, per_kv_s=batch * cost.per_kv_s)
                                 for name, cost in self.drafting.items()},
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
                       drafting={str(name): DraftCost(**{key: float(value) for key, value in cost.items()})
                                 for name, cost in data.get("drafting", {}).items()},
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
    """A GPU engine, relative to one decode step (only the ratios matter for ratios), shaped as
    an H100 measured it: SpecDecode-Bench's fit of Llama-3.1-8B on vLLM (specdecode_h100) prices
    every token a pass carries at H100_TOKEN_SHARE of a step alone (21.0 us against 7.11 ms), so a
    verify pass of 8 tokens costs 1.02 steps, of 128 1.38, of 512 2.51, a step of 2 sequences 1.003
    steps, and a prompt token the same share (338 prompt tokens a step). Context-free: the
    measured table's KV term (0.55% of a step per 1,000 cached tokens) is left out."""
    def pass_of(tokens: int) -> float:
        return step * (1 + H100_TOKEN_SHARE * (tokens - 1))

    return CostTable(
        step_s={n: pass_of(n) for n in STEP_SIZES},
        score_s={k: pass_of(k) for k in (*SCORE_SIZES, 256)},
        prefill_token_s=step * H100_TOKEN_SHARE,
        source=f"{GPU_PRESET_SOURCE} (a pass of k tokens 1 + {H100_TOKEN_SHARE:.5f} (k - 1) steps, as the H100 "
               "measurement: specdecode-h100)",
    )


# a token in a pass, as a share of a step alone: SpecDecode-Bench's H100 fit (specdecode_h100)
H100_TOKEN_SHARE = 2.10103129e-05 / (5.88590713e-03 + 1.20683946e-03 + 2.10103129e-05)
GPU_PRESET_SOURCE = "gpu preset"  # how gpu_preset's tables' source begins


def specdecode_h100() -> CostTable:
    """Llama-3.1-8B on one H100 with vLLM, as measured and fitted by SpecDecode-Bench (its
    simulator's predictor.py, class Llama8BH100, fitted on InstructCoder at batch 1-64): a pass
    costs 3.92645679e-08 s a KV token + 2.10103129e-05 s a token in it + 5.88590713e-03 s, plus
    1.20683946e-03 s of overhead a step. Tables at the sizes ssr prices (the fit is linear).
    Drafting, from the same class: vLLM's n-gram search 0.5875% of the verify pass; EAGLE's
    drafter 2.37768493e-09 s a KV token + 8.41429603e-07 s a token in the request's verify pass
    + 2.13526175e-03 s a step."""
    fixed, per_token, per_kv = 5.88590713e-03 + 1.20683946e-03, 2.10103129e-05, 3.92645679e-08
    return CostTable(step_s={n: fixed + per_token * n for n in (*STEP_SIZES, *BATCH_SCORE_SIZES)},
                     score_s={k: fixed + per_token * k for k in (*SCORE_SIZES, *BATCH_SCORE_SIZES)},
                     prefill_token_s=per_token, step_context_s=per_kv, pass_context_s=per_kv,
                     drafting={"ngram": DraftCost(share_of_pass=0.005875),
                               "eagle": DraftCost(fixed_s=2.13526175e-03, per_token_s=8.41429603e-07,
                                                  per_kv_s=2.37768493e-09)},
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
