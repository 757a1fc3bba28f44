"""llama.cpp engine through llama-cpp-python's low-level API.

Several sequences live in one context and `step` decodes one token of each in a
single llama_decode; `fork` copies the parent's KV stream (llama_memory_seq_cp),
no recompute.

Lossless needs batch-invariant kernels: the logits of a token must not depend on
what else is in the forward pass. Measured on the CPU backend, each of these
broke that, by up to ~1 logit, and is switched off here:
- a unified KV cache: a child's cells interleave with the parent's and shift them
  against the SIMD lanes of the attention reductions -> one stream per sequence;
- flash attention's split-KV path (one query, >= 512 cells) and tiled path
  (>= 64 queries), taken only with F16/F32 K -> K cache in q8_0, so every query
  takes the same one-chunk path;
- repacked weights (extra buffer types, a GEMM from 4 tokens) and the tiled
  K-quant matmul (from 8 tokens), which switch kernels with the number of tokens
  -> use_extra_bufts off, and GGML_CPU_TILED_MM=0 in the environment (set here
  unless the user set it; ggml reads it once per process).
With these, stepping alone, stepping batched with children, scoring k tokens in
one pass and truncating give bit-identical logits (tests/test_engine_contract.py).
"""
from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .base import Capabilities, EngineError, SequenceSlots, argmax_ids, split_rows


KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # ggml_type ids


@functools.cache
def _silent_log():
    """A do-nothing log callback, created once and kept alive (llama.cpp holds the pointer)."""
    import llama_cpp

    return llama_cpp.llama_log_callback(lambda level, text, user_data: None)


def token_piece(lib, vocab, token_id: int) -> bytes:
    """A token's bytes as llama.cpp writes them (special tokens as their text); a piece longer
    than the first buffer is asked for again at the size llama.cpp says it needs."""
    buffer = ctypes.create_string_buffer(256)
    size = lib.llama_token_to_piece(vocab, token_id, buffer, len(buffer), 0, True)
    if size < 0:
        buffer = ctypes.create_string_buffer(-size)
        size = lib.llama_token_to_piece(vocab, token_id, buffer, len(buffer), 0, True)
    return buffer.raw[: max(size, 0)]


class LlamaCppEngine(SequenceSlots):
    def __init__(self, model_path: str | Path, context_size: int = 8192, max_sequences: int = 4,
                 batch_size: int = 512, threads: int | None = None, verbose: bool = False,
                 flash_attention: bool = True, k_type: str = "q8_0", v_type: str = "f16",
                 kv_unified: bool = False, repack: bool = False, keep_prefix: bool = True,
                 n_gpu_layers: int | None = None) -> None:
        import llama_cpp

        self._lib = lib = llama_cpp
        os.environ.setdefault("GGML_CPU_TILED_MM", "0")  # see the module docstring
        if not verbose:  # llama.cpp logs to stderr at load; keep the CLI's output clean
            lib.llama_log_set(_silent_log(), ctypes.c_void_p(0))
        lib.llama_backend_init()
        model_params = lib.llama_model_default_params()
        model_params.use_extra_bufts = repack
        if n_gpu_layers is not None:  # else llama.cpp's own default; -1 offloads every layer, as in llama.cpp
            model_params.n_gpu_layers = n_gpu_layers
        self.n_gpu_layers = model_params.n_gpu_layers  # as the model was loaded
        self.offload = bool(lib.llama_supports_gpu_offload())  # a GPU build: the layers above run there
        self._model = lib.llama_model_load_from_file(str(model_path).encode(), model_params)
        if not self._model:
            raise EngineError(f"llama.cpp could not load {model_path}")
        threads = threads or os.cpu_count() or 1
        params = lib.llama_context_default_params()
        streams = 1 if kv_unified else max_sequences  # KV streams; context_size is per stream
        params.n_ctx = context_size * streams
        params.n_batch = params.n_ubatch = batch_size
        params.n_seq_max = max_sequences
        params.kv_unified = kv_unified
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        params.flash_attn_type = 1 if flash_attention else 0
        params.type_k, params.type_v = KV_TYPES[k_type], KV_TYPES[v_type]
        self._ctx = lib.llama_init_from_model(self._model, params)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise EngineError(f"llama.cpp could not create a context of {context_size} tokens")
        self._memory = lib.llama_get_memory(self._ctx)
        self._pieces: dict[int, bytes] = {}  # token id -> bytes, filled on first use
        self._vocab = lib.llama_model_get_vocab(self._model)
        self._batch = lib.llama_batch_init(batch_size, 0, max_sequences)
        self.model_path = Path(model_path)
        self.name = self.model_path.stem
        self.batch_size = batch_size
        self.threads = threads
        self.context_size = lib.llama_n_ctx(self._ctx) // streams
        self.vocab_size = lib.llama_vocab_n_tokens(self._vocab)
        self.eos_ids = frozenset(t for t in range(self.vocab_size) if lib.llama_vocab_is_eog(self._vocab, t))
        template = lib.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8", "replace") if template else None
        self.add_bos = bool(lib.llama_vocab_get_add_bos(self._vocab))
        self.bos_text = self.token_bytes(lib.llama_vocab_bos(self._vocab)).decode("utf-8", "replace")
        self.eos_text = self.token_bytes(lib.llama_vocab_eos(self._vocab)).decode("utf-8", "replace")
        # names this setup for the cached cost table (see probe.engine_costs)
        self.cost_key = f"llama.cpp-{self.name}-{self.model_path.stat().st_size}-{threads}t-{max_sequences}seq" + \
            (f"-{self.n_gpu_layers}gpu" if self.offload and self.n_gpu_layers else "")
        # handles are llama.cpp sequence ids; the last request's longest sequence is kept for the
        # next prefill (engines/prefix.py), except in one unified KV stream
        SequenceSlots.__init__(self, max_sequences, keep_prefix=keep_prefix and not kv_unified)

    # -- text -----------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (self._lib.llama_token * capacity)()
        count = self._lib.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_bos, True)
        if count < 0:
            raise EngineError(f"tokenizer needed {-count} slots")
        return list(buffer[:count])

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = token_piece(self._lib, self._vocab, token_id)
        return piece

    # -- sequences ------------------------------------------------------------------------

    # greedy: the argmax is read off llama.cpp's logits buffer, no rows copied (returns_ids)
    capabilities = Capabilities(returns_ids=True, shares_passes=True, keeps_prefix=True)

    def step(self, batch: Sequence[tuple[int, int]], ids: bool = False, banned=None) -> np.ndarray:
        return self._decode(batch, ids=ids, banned=banned)

    def score(self, seq: int, token_ids: Sequence[int], ids: bool = False, banned=None) -> np.ndarray:
        rows = [
            self._decode([(seq, token) for token in token_ids[start : start + self.batch_size]], ids=ids, banned=banned)
            for start in range(0, len(token_ids), self.batch_size)
        ]
        empty = np.zeros(0, np.int64) if ids else np.zeros((0, self.vocab_size), np.float32)
        return np.concatenate(rows) if rows else empty

    def score_batch(self, feeds: Sequence[tuple[int, Sequence[int]]], ids: bool = False,
                    banned=None) -> list[np.ndarray]:
        """Each (seq, tokens) fed in one llama_decode (separate passes where they exceed a batch)."""
        pairs = [(seq, token) for seq, tokens in feeds for token in tokens]
        if len(pairs) > self.batch_size or len({seq for seq, _ in feeds}) < len(feeds):
            return [self.score(seq, tokens, ids, banned) for seq, tokens in feeds]
        return split_rows(self._decode(pairs, ids=ids, banned=banned), feeds)

    def truncate(self, seq: int, length: int) -> None:
        if length < self._lengths[seq]:
            if not self._lib.llama_memory_seq_rm(self._memory, seq, length, -1):
                raise EngineError(f"llama.cpp could not truncate sequence {seq} to {length}")
            self._truncated(seq, length)

    def _clear(self, seq: int) -> None:
        self._lib.llama_memory_seq_rm(self._memory, seq, -1, -1)
        self._free.append(seq)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._lib.llama_batch_free(self._batch)
            self._lib.llama_free(self._ctx)
            self._lib.llama_model_free(self._model)
            self._ctx = None

    def __del__(self) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _feed(self, seq: int, tokens: list[int]) -> None:
        self._decode([(seq, token) for token in tokens], want_logits=False)

    def _copy_entries(self, source: int, target: int) -> None:
        self._lib.llama_memory_seq_cp(self._memory, source, target, -1, -1)  # shares cells, no recompute

    def _decode(self, batch: Sequence[tuple[int, int]], want_logits: bool = True, ids: bool = False,
                banned=None) -> np.ndarray:
        """One llama_decode over (seq, token) pairs -> logits [len(batch), vocab] (copied out of
        llama.cpp's buffer), or with ids the argmax of each [len(batch)] read in place."""
        llama_batch = self._batch
        positions = dict(self._lengths)
        for i, (seq, token) in enumerate(batch):
            llama_batch.token[i] = token
            llama_batch.pos[i] = positions[seq]
            llama_batch.n_seq_id[i] = 1
            llama_batch.seq_id[i][0] = seq
            llama_batch.logits[i] = want_logits
            positions[seq] += 1
        llama_batch.n_tokens = len(batch)
        status = self._lib.llama_decode(self._ctx, llama_batch)
        if status == 1:
            raise EngineError(f"the KV cache is full ({self.context_size} tokens); raise --context-size")
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status}")
        self._lengths.update(positions)
        self._fed((seq, (token,)) for seq, token in batch)
        if not want_logits:
            return np.zeros((0, self.vocab_size), np.float32)
        logits = np.ctypeslib.as_array(self._lib.llama_get_logits(self._ctx), shape=(len(batch), self.vocab_size))
        return argmax_ids(logits, banned) if ids else logits.copy()
