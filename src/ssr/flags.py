"""The flags shared by the commands that load a model (generate, bench, calibrate, serve): the
model and its engine, vLLM's own, and the generation config. One meaning per flag name across
commands; a flag the mode or the policy would not use is named, never dropped silently."""
from __future__ import annotations

import argparse
import sys

from .config import DRAFT_MODES, MODE_TABLE, MODES, POLICIES, VERIFY_MODES, ConfigError, GenerationConfig, SamplingParams
from .engines import ENGINES
from .formats.thinking import TEMPLATE_BUDGET, TEMPLATE_CHOICES
from .models import DEFAULT_MODEL, REGISTRY

class Renamed(argparse.Action):
    """A flag name that means something else in another command: refused here with the name to use
    (one meaning per flag name across commands). Hidden from help."""

    def __init__(self, option_strings, dest, now: str, **kwargs) -> None:
        self.now = now  # what to say instead
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is not an option here: {self.now}")


def add_model_arguments(parser: argparse.ArgumentParser, several_engines: bool = False) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"registry name ({', '.join(REGISTRY)}) or a .gguf path; with --engine transformers or vllm "
                             f"also a model folder or hub id (default {DEFAULT_MODEL})")
    if several_engines:  # bench: the same items and modes on each engine, side by side
        parser.add_argument("--engine", default="llama.cpp",
                            help=f"comma-separated engines from {', '.join(ENGINES)} (default llama.cpp)")
    else:
        parser.add_argument("--engine", default="llama.cpp", choices=ENGINES,
                            help="inference engine (default llama.cpp; transformers needs  pip install -e '.[torch]', "
                             "vllm  pip install -e '.[vllm]', in ssr's checkout)")
    parser.add_argument("--device", default=None,
                        help="transformers engine: cpu, cuda, cuda:1 … (default: cuda when available)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="transformers and vllm engines: weights (default float32 on CPU, bfloat16 on CUDA)")
    vllm = parser.add_argument_group("--engine vllm only (passed to vLLM; refused with another engine)")
    vllm.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per model replica (default 1)")
    vllm.add_argument("--pipeline-parallel-size", type=int, default=1, help="pipeline stages (default 1)")
    vllm.add_argument("--gpu-memory-utilization", type=float, default=None,
                      help="fraction of GPU memory vLLM may take (default 0.9; 0.3 on CPUs)")
    vllm.add_argument("--no-prefix-caching", action="store_true",
                      help="turn vLLM's prefix cache off (children then recompute the parent's prompt and CoT)")
    vllm.add_argument("--distributed-executor-backend", default=None, choices=("mp", "ray"),
                      help="vLLM's executor: mp (one node) or ray (several nodes; start the Ray cluster first)")
    vllm.add_argument("--speculative-method", default=None, choices=("ssr", "suffix", "ngram", "none"),
                      help="speculation of every output token inside vLLM's step, composed with the drafts: ssr "
                           "(ssr's drafter: suffix tree, n-gram lookup, span policy priced at the batch; the default "
                           "in the modes that speculate), or vLLM's own as peers: suffix (needs arctic-inference, "
                           "see docs/engines.md), ngram; none: plain decoding steps")
    vllm.add_argument("--num-speculative-tokens", type=int, default=None, help="with --speculative-method")
    vllm.add_argument("--max-logprobs", type=int, default=20,
                      help="logprobs per row vLLM may return (default 20): sampled SSR verifies exactly when top_k is "
                           "at most this; -1 returns whole vocabularies (exact for any top_k, slower)")
    vllm.add_argument("--eager", action="store_true",
                      help="run the model as plain PyTorch, no torch.compile nor CUDA graphs: loads in about a "
                           "minute on a CPU instead of several, decodes slower (vLLM's --enforce-eager -O0)")
    parser.add_argument("--template", default="auto", choices=TEMPLATE_CHOICES,
                        help="thinking format: auto (model's own markers, else code), code, cpp, trace (answers in "
                             "a line format shown by examples) or plain")
    parser.add_argument("--context-size", type=int, default=8192, help="KV cache tokens (default 8192)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    parser.add_argument("--n-gpu-layers", type=int, default=None,
                        help="llama.cpp engine: layers offloaded to a GPU (Metal, CUDA, Vulkan builds of llama.cpp; "
                             "-1: all). Default: llama.cpp's own (llama_model_default_params). A CPU build runs "
                             "every layer on the CPU whatever this says")


def add_generation_arguments(parser: argparse.ArgumentParser, with_mode: bool = True) -> None:
    defaults = GenerationConfig()
    if with_mode:
        parser.add_argument("--mode", default=defaults.mode, choices=MODES,
                            help="; ".join(f"{name}: {MODE_TABLE[name].summary}" for name in MODES))
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass kept, (0, 1] (default 1)")
    parser.add_argument("--top-k", type=int, default=0, help="sampling: most likely tokens kept (default 0: all)")
    parser.add_argument("--seed", type=int, default=0, help="sampling: the request's random seed (default 0)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens,
                        help="output tokens at most, reasoning included, as vLLM's max_tokens (default: until the "
                             "model ends or the context is full)")
    parser.add_argument("--max-answer-tokens", type=int, default=defaults.max_answer_tokens,
                        help="answer tokens at most, the reasoning not counted (default: no cap)")
    parser.add_argument("--thinking-budget", type=int, default=defaults.thinking_budget,
                        help="b_v: CoT tokens before the end of thinking is forced (default: a reasoning model "
                             f"thinks until it ends its thinking itself; a thinking template stops it at "
                             f"{TEMPLATE_BUDGET})")
    parser.add_argument("--policy", default=defaults.policy, choices=POLICIES,
                        help="auto (default): draft only where measured costs say it pays, and choose b_d, m and "
                             "the verify chunk (--json shows why); fixed: use --draft-at/--draft-tokens/--verify-chunk")
    parser.add_argument("--draft-at", type=int, default=None,
                        help=f"b_d: CoT tokens before the draft child forks (default {defaults.draft_at}; auto: "
                             "until earlier requests' CoT lengths are known)")
    parser.add_argument("--draft-tokens", type=int, default=None,
                        help=f"m: answer tokens the draft may write (default {defaults.draft_tokens}; auto: at most this)")
    parser.add_argument("--draft-interval", type=int, default=None,
                        help="i: multi-stage, a new bootstrapped draft every i CoT tokens after b_d (default 0: one "
                             "stage)")
    parser.add_argument("--verify", default=defaults.verify, choices=VERIFY_MODES,
                        help="sampling: exact rejection sampling or approx (resample from target)")
    parser.add_argument("--verify-chunk", type=int, default=None,
                        help=f"draft tokens in the first verify pass, doubling while all are accepted (default "
                             f"{defaults.verify_chunk}; auto chooses it)")
    parser.add_argument("--repetition-stop", type=int, default=defaults.repetition_stop,
                        help="end the reasoning or the answer when its last N lines repeat a block of up to 4 "
                             "lines (digits ignored), which changes what the model would have written; the same in "
                             "every mode (default 0: off)")
    parser.add_argument("--all-spans", action="store_true",
                        help="verify every proposed span whole (default: cut spans to what measured costs justify)")


DRAFTING_FLAGS = ("draft_at", "draft_tokens", "draft_interval", "verify_chunk")  # default None: given or not


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    """The config the flags ask for; a drafting flag the mode or the policy would not use is named
    on stderr (ignored_flags), never dropped silently."""
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    given = {name: getattr(args, name) for name in DRAFTING_FLAGS if getattr(args, name) is not None}
    unset_at = GenerationConfig.draft_at  # b_d not given: within a shorter thinking budget, half of it
    budget = args.thinking_budget
    at = {} if "draft_at" in given or budget is None or not 0 < budget <= unset_at else {"draft_at": budget // 2}
    config = GenerationConfig(
        mode=getattr(args, "mode", "ar"), sampling=sampling, thinking_budget=budget,
        max_tokens=args.max_tokens, max_answer_tokens=args.max_answer_tokens, policy=args.policy,
        verify=args.verify, adaptive_spans=not args.all_spans, repetition_stop=args.repetition_stop, **given, **at)
    for note in ignored_flags(config, given, several_modes=not hasattr(args, "mode")):
        print(f"ssr: note: {note}", file=sys.stderr)
    return config


def ignored_flags(config: GenerationConfig, given: dict, several_modes: bool = False) -> list[str]:
    """What the mode or `--policy auto` does with the drafting flags given (names as flags)."""
    flags = [f"--{name.replace('_', '-')}" for name in DRAFTING_FLAGS if name in given]
    if not flags:
        return []
    if not several_modes and not config.uses_draft:
        return [f"{', '.join(flags)}: mode {config.mode} forks no draft child; ignored"]
    if config.policy != "auto":
        return []
    said = {"--verify-chunk": "chosen by --policy auto from measured costs; used as given with --policy fixed",
            "--draft-at": "used by --policy auto only until earlier requests' CoT lengths are known; --policy fixed "
                          "keeps it",
            "--draft-tokens": "an upper bound under --policy auto, which drafts the typical answer's length"}
    return [f"{flag}: {said[flag]}" for flag in flags if flag in said]


VLLM_DEFAULTS = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "gpu_memory_utilization": None,
                 "no_prefix_caching": False, "distributed_executor_backend": None, "speculative_method": None,
                 "num_speculative_tokens": None, "max_logprobs": 20, "eager": False}  # the vllm engine's flags, unset


def vllm_options(args: argparse.Namespace, only_changed: bool = False) -> dict:
    """The vllm engine's options from the flags (only_changed: the flags given, by name)."""
    if only_changed:
        return {"--" + name.replace("_", "-"): True for name, default in VLLM_DEFAULTS.items()
                if getattr(args, name) != default}
    if args.device:
        raise ConfigError("--device is an option of --engine transformers (vLLM picks its platform)")
    for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size),
                        ("--pipeline-parallel-size", args.pipeline_parallel_size)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.max_logprobs < -1:
        raise ConfigError(f"--max-logprobs must be -1 (all) or >= 0, got {args.max_logprobs}")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    return {"tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
            "gpu_memory_utilization": args.gpu_memory_utilization, "enable_prefix_caching": not args.no_prefix_caching,
            "distributed_executor_backend": args.distributed_executor_backend, "dtype": args.dtype,
            "speculative_method": speculative_method(args), "num_speculative_tokens": args.num_speculative_tokens,
            "max_logprobs": args.max_logprobs, "eager": args.eager}


def speculative_method(args: argparse.Namespace) -> str | None:
    """vLLM's speculation: as given (none: off), else ssr's drafter where the command's one mode
    speculates (generate, serve) and none where it does not, or where several modes share the
    engine (bench: `ar` must decode plainly)."""
    if args.speculative_method is not None:
        return None if args.speculative_method == "none" else args.speculative_method
    return "ssr" if getattr(args, "mode", None) in DRAFT_MODES else None
