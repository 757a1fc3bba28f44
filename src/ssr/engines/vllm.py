"""vLLM engine: SSR as ordinary requests to vLLM's public async API (no patches).

vLLM owns the KV cache, the batch and the scheduler, so this adapter does not offer the
sequence protocol of base.Engine (fork, step, score, truncate). It offers requests:
`open(request_id, prompt_ids, params)` submits one to `AsyncLLM.generate` and returns a
`Request` handle whose outputs arrive on a queue; `abort` ends it. loop/vllm_walk.py
builds SSR from those: a streaming parent, draft children whose prompts extend the
parent's (prefix-cache hits), a verify request with `prompt_logprobs`, a continuation.

AsyncLLM runs on an asyncio loop in a daemon thread of its own; the adapter's methods
are synchronous, so the CLI and the server's worker thread call it like any engine.
Tensor / pipeline parallelism and the distributed executor (Ray, for several nodes)
are vLLM's: their options pass through.
"""
from __future__ import annotations

import asyncio
import atexit
import itertools
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

from ..formats.thinking import detect_format
from .base import Capabilities, EngineError
from .tokenizer import TokenizerText
from .vllm_budget import budget_markers, reasoning_config
from .vllm_costs import model_name
from .vllm_worker import SuffixCacheWorker

WORKER_EXTENSION = f"{SuffixCacheWorker.__module__}.{SuffixCacheWorker.__qualname__}"  # vLLM imports it by name

_DONE = object()  # queue sentinel: the request ended


class Request:
    """One vLLM request: its cumulative outputs on a queue, the latest kept."""

    def __init__(self, engine: VllmEngine, request_id: str) -> None:
        self.engine = engine
        self.request_id = request_id
        self.outputs: queue.Queue = queue.Queue()  # RequestOutput (cumulative), then _DONE or an exception
        self.latest = None  # the last RequestOutput seen
        self.steps: list[int] = []  # new tokens per output: one engine step each, unless vLLM merged
        #                             outputs a slow reader had not taken yet
        self.finished = threading.Event()
        self.waited_s = 0.0  # wall seconds the reader spent blocked on this request's outputs
        self.drained = False  # the reader took the end: a later stream() or result() has nothing to wait for

    @property
    def speculation(self):
        """vLLM's per-request spec-decode metrics (RequestSpecDecodeMetrics: per step drafted and
        accepted), set on the final output when the engine runs a speculative method; else None."""
        if self.latest is None or not self.latest.outputs:
            return None
        return getattr(self.latest.outputs[0], "spec_decode_metrics", None)

    @property
    def token_ids(self) -> list[int]:
        """Tokens generated so far."""
        return list(self.latest.outputs[0].token_ids) if self.latest is not None else []

    def stream(self) -> Iterator:
        """Blocking iterator over the outputs (cumulative) until the request ends."""
        while not self.drained:
            start = time.perf_counter()
            item = self.outputs.get()
            self.waited_s += time.perf_counter() - start
            if item is _DONE:
                self.drained = True
                return
            if isinstance(item, BaseException):
                raise EngineError(f"vLLM request {self.request_id} failed: {item}") from item
            yield item

    def result(self, timeout: float | None = 600.0):
        """The final output (waits for the end)."""
        start = time.perf_counter()
        finished = self.finished.wait(timeout)
        self.waited_s += time.perf_counter() - start
        if not finished:
            raise EngineError(f"vLLM request {self.request_id} did not finish in {timeout} s")
        for _ in self.stream():  # drain; raises the request's error, if any
            pass
        return self.latest

    def abort(self) -> None:
        """End the request now (no-op once finished); waits until vLLM has let it go."""
        if not self.finished.is_set():
            self.engine.abort([self.request_id])
        self.finished.wait(30.0)


SPECULATIVE_METHODS = (None, "ssr", "suffix", "ngram")  # vLLM's speculation inside its step (None: none)


def speculative_config_of(method: str | None, num_tokens: int | None) -> dict | None:
    """vLLM's speculative_config for --speculative-method (None: no speculation in vLLM's step);
    "ssr" is ssr's drafter through vLLM's custom_class hook (vllm_drafter.py, vllm_plugin.py)."""
    if method not in SPECULATIVE_METHODS:
        raise EngineError(f"--speculative-method must be one of {', '.join(SPECULATIVE_METHODS[1:])}, "
                          f"got {method!r}")
    spec = {"method": method, **({"num_speculative_tokens": num_tokens} if num_tokens else {})} if method else None
    if method == "ssr":
        from .vllm_plugin import SsrConfigError, has_custom_class, speculative_config

        try:
            return speculative_config(spec, has_custom_class())
        except SsrConfigError as error:
            raise EngineError(str(error)) from error
    return spec


class VllmEngine:
    # driven by loop/vllm_walk.py, not loop/generation.py; vLLM's own metrics stay on
    capabilities = Capabilities(requests=True, serves_metrics=True)

    def __init__(self, model: str, context_size: int = 4096, threads: int | None = None,
                 tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1,
                 gpu_memory_utilization: float | None = None, enable_prefix_caching: bool = True,
                 distributed_executor_backend: str | None = None, dtype: str | None = None,
                 speculative_method: str | None = None, num_speculative_tokens: int | None = None,
                 verify_reads_cache: bool = True, max_logprobs: int = 20, eager: bool = False,
                 block_size: int | None = None, verbose: bool = False) -> None:
        if threads is not None:
            raise EngineError("--threads is not an option of --engine vllm (vLLM sets its own; on CPUs "
                              "VLLM_CPU_OMP_THREADS_BIND chooses the cores)")
        if not verbose:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # read when vllm is imported
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        model = vllm_model_source(model)
        self.on_cpu = current_platform.is_cpu()
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.3 if self.on_cpu else 0.9
        self.speculative_method = speculative_method  # vLLM's own speculation for the answer, if any
        self.verify_reads_cache = verify_reads_cache  # prompt_logprobs requests read the prefix cache
        self.enable_prefix_caching = enable_prefix_caching
        self.max_logprobs = max_logprobs  # logprobs per row vLLM may return (-1: the whole vocabulary)
        # KV block size: a walk's later requests (child, verify, answer) extend the parent's tokens
        # and read its blocks from the prefix cache, whole blocks only. vLLM's CPU default of 128
        # (vllm/platforms/cpu.py, check_and_update_config) re-prefills up to 127 tokens of each;
        # 32 is the smallest the CPU backend runs unslowed ("prefers multiples of 32", same place)
        if block_size is None and self.on_cpu:
            block_size = 32
        speculative = speculative_config_of(speculative_method, num_speculative_tokens)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model)
        except Exception as error:  # noqa: BLE001 - transformers raises many kinds
            raise EngineError(f"vLLM could not load {model}'s tokenizer: {str(error).splitlines()[0]}") from error
        own_format = detect_format(getattr(tokenizer, "chat_template", None))
        self.budget_markers = budget_markers(tokenizer, own_format)  # (start, end) ids of vLLM's budget, or None
        args = AsyncEngineArgs(
            model=model, max_model_len=context_size, tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size, gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching, distributed_executor_backend=distributed_executor_backend,
            dtype=dtype or ("float32" if self.on_cpu else "auto"), speculative_config=speculative,
            max_logprobs=max_logprobs, disable_log_stats=False, **({"block_size": block_size} if block_size else {}),
            # eager: plain PyTorch, no torch.compile nor CUDA graphs (starts in seconds, steps slower)
            **({"enforce_eager": True, "compilation_config": {"mode": 0}} if eager else {}),
            per_request_spec_decode_metrics="detailed" if speculative_method else "none",
            **({"reasoning_config": reasoning_config(own_format)} if self.budget_markers else {}),
            worker_extension_cls=WORKER_EXTENSION if speculative_method in ("suffix", "ssr") else "")
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="ssr-vllm-loop", daemon=True).start()
        try:
            self._llm = self._call(_create(AsyncLLM, args))
        except Exception as error:  # vLLM raises many kinds; the person needs the first line
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise EngineError(f"vLLM could not load {model}: {str(error).splitlines()[0] if str(error) else error!r}") \
                from error
        self._adopt(model, tokenizer)
        self._loop.call_soon_threadsafe(self._log_stats)
        self._ids = itertools.count(1)
        self.last_number = 0  # of the latest request id handed out
        atexit.register(self.close)  # shut vLLM down before the interpreter tears its modules down (a traceback else)
        if speculative_method == "ssr" and self.on_cpu and not os.environ.get("SSR_DRAFTER_COSTS"):
            self._price_drafter()

    def _adopt(self, model: str, tokenizer) -> None:
        """What the loaded engine says of itself: its name, lengths, text side and slots."""
        config = self._llm.model_config
        self.name = model_name(model)
        self.context_size = config.max_model_len
        self.vocab_size = config.get_vocab_size()
        self.text = TokenizerText(tokenizer, getattr(config.hf_config, "eos_token_id", None))
        self.chat_template, self.bos_text, self.eos_text = self.text.chat_template, self.text.bos_text, self.text.eos_text
        self.add_bos, self.eos_ids = self.text.add_bos, self.text.eos_ids
        self.max_sequences = 1 << 16  # requests, not KV slots: vLLM queues what does not fit
        # walks a server runs at once: vLLM's running-request limit over the requests one walk
        # holds at once (a parent and a draft child); vLLM's KV limit queues what does not fit
        self.slots = max(1, int(self._llm.vllm_config.scheduler_config.max_num_seqs) // 2)

    def _price_drafter(self) -> None:
        """On a CPU, ssr's drafter prices spans with this machine's vLLM costs (measured once per
        model and machine, engines/vllm_costs.py), not the GPU preset: a verified token costs
        compute here. $SSR_DRAFTER_COSTS, where set, is what the drafter reads instead."""
        from . import vllm_costs

        costs = vllm_costs.cached(self, log=lambda text: print(f"ssr: {text}", file=sys.stderr))
        if not any(self._call(self._llm.collective_rpc("ssr_drafter_costs", args=(asdict(costs),)))):
            raise EngineError("vLLM started without ssr's drafter (--speculative-method ssr): its plugin did not load")

    # -- text -------------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        return self.text.tokenize(text, add_bos)

    def token_bytes(self, token_id: int) -> bytes:
        return self.text.token_bytes(token_id)

    # -- requests ---------------------------------------------------------------------------

    def new_id(self, role: str) -> str:
        self.last_number = number = next(self._ids)  # itertools.count: atomic under the GIL (threads share it)
        return f"ssr-{number}-{role}"

    def forget_responses(self, since: int) -> int:
        """Drop from vLLM's suffix cache (the global tree of earlier responses its `suffix` method
        speculates from) the responses of requests numbered `since` or later (new_id's numbers);
        returns how many. The bench calls it between the runs of one item, so that no run copies
        the same item's answer from another mode or repeat. 0 without the suffix method."""
        if self.speculative_method == "ssr":  # the drafter's history keeps no request ids: all of it
            return sum(self._call(self._llm.collective_rpc("ssr_drafter_forget")))
        if self.speculative_method != "suffix":
            return 0
        return sum(self._call(self._llm.collective_rpc("ssr_evict_responses", args=(since,))))

    def drafter_stats(self) -> dict | None:
        """ssr's drafter in vLLM's worker (--speculative-method ssr): errors (requests that decoded
        plainly for a step), draft tokens proposed, steps drafted for; None without it."""
        if self.speculative_method != "ssr":
            return None
        found = [stats for stats in self._call(self._llm.collective_rpc("ssr_drafter_stats")) if stats]
        return {key: sum(stats[key] for stats in found) for key in found[0]} if found else None

    def drafter_table(self):
        """The cost table ssr's drafter prices its chains with (costs.CostTable), None without it."""
        from ..pricing.costs import CostTable

        if self.speculative_method != "ssr":
            return None
        found = [table for table in self._call(self._llm.collective_rpc("ssr_drafter_table")) if table]
        return CostTable.from_dict(found[0]) if found else None

    def drafter_log(self) -> dict[str, list[dict]]:
        """ssr's drafter's steps per vLLM request id (the worker ran with SSR_DRAFTER_LOG=1)."""
        if self.speculative_method != "ssr":
            return {}
        merged: dict[str, list[dict]] = {}
        for log in self._call(self._llm.collective_rpc("ssr_drafter_log")):
            merged.update(log or {})
        return merged

    def cached_responses(self) -> list[str]:
        """vLLM's ids of this adapter's requests whose responses the suffix method's global tree
        holds (a draft child's is there once it has written: the parent's answer speculates from
        it). [] without the suffix method."""
        if self.speculative_method != "suffix":
            return []
        return sorted({name for names in self._call(self._llm.collective_rpc("ssr_cached_requests"))
                       for name in names})

    def sampling_params(self, **options):
        from vllm import SamplingParams

        return SamplingParams(**options)

    def open(self, request_id: str, prompt_ids: Sequence[int], params) -> Request:
        """Submit a request (vllm.SamplingParams); outputs arrive on the handle's queue."""
        request = Request(self, request_id)
        asyncio.run_coroutine_threadsafe(self._pump(request, list(prompt_ids), params), self._loop)
        return request

    def abort(self, request_ids: Sequence[str]) -> None:
        self._call(self._llm.abort(list(request_ids)))

    def live_requests(self) -> int:
        """Requests vLLM still holds (running or waiting): 0 once SSR let every child go."""
        return self._llm.output_processor.get_num_unfinished_requests()

    def live_sequences(self) -> int:  # the server's gauge: requests stand for sequences here
        return self.live_requests()

    def metrics_text(self) -> bytes:
        """vLLM's own Prometheus metrics (vllm:*, its KV cache, preemptions, queue, spec decode), as
        `vllm serve` serves them: its stat loggers record into this process's default registry. They
        count vLLM's requests, several per ssr request (loop/vllm_walk.py)."""
        from types import SimpleNamespace

        from prometheus_client import REGISTRY, generate_latest

        vllm_only = SimpleNamespace(collect=lambda: (f for f in REGISTRY.collect() if f.name.startswith("vllm:")))
        return generate_latest(vllm_only)  # generate_latest reads collect()

    def _log_stats(self) -> None:
        """vLLM's periodic stats line, as `vllm serve` logs it (every VLLM_LOG_STATS_INTERVAL seconds,
        at INFO: shown with --verbose or VLLM_LOGGING_LEVEL=INFO)."""
        from vllm import envs

        if self._llm is not None:
            self._loop.create_task(self._llm.do_log_stats())
            self._loop.call_later(envs.VLLM_LOG_STATS_INTERVAL, self._log_stats)

    def close(self) -> None:
        """Shut vLLM down (its engine process too); the engine is unusable afterwards. Twice is once."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        self._call(_shutdown(llm))
        del llm  # its __del__ shuts down again: now, not at interpreter exit with modules half gone
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _pump(self, request: Request, prompt_ids: list[int], params) -> None:
        seen = 0
        try:
            async for output in self._llm.generate({"prompt_token_ids": prompt_ids}, params, request.request_id):
                count = len(output.outputs[0].token_ids) if output.outputs else 0
                request.steps.append(count - seen)
                seen = count
                request.latest = output
                request.outputs.put(output)
        except BaseException as error:  # noqa: BLE001 - handed to the consumer thread
            request.outputs.put(error)
        finally:
            request.outputs.put(_DONE)
            request.finished.set()

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


async def _create(async_llm, args):
    return async_llm.from_engine_args(args)  # on the adapter's loop: vLLM binds its tasks to it


async def _shutdown(llm) -> None:
    llm.shutdown()


def vllm_model_source(name_or_path: str) -> str:
    """A model vLLM can load: a folder or hub id as given; a registry name or .gguf file
    -> a float32 Hugging Face folder dequantized from it once (vLLM reads no GGUF here),
    cached beside the other models."""
    from ..models import REGISTRY, cache_dir, resolve_model, resolve_source

    path = Path(name_or_path).expanduser()
    if name_or_path not in REGISTRY and not path.is_file():
        return resolve_source(name_or_path)
    gguf = resolve_model(name_or_path)
    target = cache_dir() / "hf" / f"{gguf.stem}-float32"
    if not (target / "config.json").is_file():
        print(f"ssr: vLLM reads no GGUF here: dequantizing {gguf.name} to {target} (once)", file=sys.stderr)
        try:
            dequantize_gguf(gguf, target)
        except (ImportError, ValueError, OSError) as error:
            raise EngineError(f"could not dequantize {gguf.name} for vLLM: {str(error).splitlines()[0]}") from error
    return str(target)


def dequantize_gguf(gguf: Path, target: Path) -> None:
    """GGUF -> float32 safetensors folder with config and tokenizer (written atomically)."""
    import shutil

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    partial = target.with_name(target.name + f".partial.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(partial)
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(partial)
        weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
        if getattr(config, "tie_word_embeddings", False):
            weights.pop("lm_head.weight", None)  # tied: vLLM takes it from the embeddings
        save_file(weights, str(partial / "model.safetensors"), metadata={"format": "pt"})
        partial.replace(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
