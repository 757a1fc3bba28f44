"""transformers engine: any Hugging Face causal LM (folder, hub id, or a GGUF file
through transformers' GGUF loader), on CPU or CUDA.

The KV cache is ours: per layer one buffer [slots, kv_heads, capacity, head_dim],
one slot per live sequence, handed to the model as a transformers `Cache` whose
`update` writes each row's new entries at that row's own position. `step` feeds
one token of several sequences of different lengths in one forward pass
(per-row positions and a [rows, 1, queries, keys] mask); `fork` copies a slot's
entries (no recompute); `truncate` only shortens the length.

Lossless needs batch invariance: a token's logits must not depend on what else
is in the pass. Measured with torch's CPU kernels, two things broke it and are
avoided here:
- matmuls with fewer than ~10 rows take other kernels (their sums round
  differently) -> every pass feeds at least `min_rows` (16) queries per sequence,
  the real tokens first and throw-away tokens after them (causal, so the real
  ones never see them; their KV entries lie past the sequence's length and are
  overwritten later);
- attention kernels that tile queries and keys by the pass's shape -> attention
  is our own function (registered with transformers' AttentionInterface): two
  matmuls and a softmax over a key length rounded up to a multiple of 64; masked
  keys add exact zeros, and the sum over keys runs in blocks of 64 added one after
  another (one matmul over all keys reduces a longer key length in another order on
  AVX-512 CPUs: a prefill after a kept prefix differed from a cold one by 3e-5);
- matmuls with many rows take other kernels again (torch's CPU sgemm on this machine:
  112 rows and fewer agree with 16, 113 and more do not, for Qwen2.5-0.5B's 896-wide
  layers, 64 and more for SmolLM2's 1536-wide down projection) -> a pass feeds at most
  `max_rows` queries in all, measured at load for the model's own layer shapes
  (`invariant_rows`); a longer feed is split into passes of that size, which also makes
  a prefill's chunking (a cold one, or one after a kept prefix) change nothing.
tests/test_engine_contract.py checks the result bit for bit, as for llama.cpp.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .base import Capabilities, EngineError, SequenceSlots, split_rows
from .tokenizer import TokenizerText

ATTENTION_NAME = "ssr_invariant"
KEY_BLOCK = 64  # key lengths are rounded up to this (see the module docstring)
CAPACITY_BLOCK = 256  # KV buffers grow by multiples of this


def invariant_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention whose result for a query does not depend on the other queries or rows.

    query [rows, heads, q, dim]; key, value [rows, kv_heads, keys, dim];
    attention_mask [rows, 1, q, keys] bool (True = attend) -> ([rows, q, heads, dim], None).
    """
    import torch

    rows, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads  # query heads per kv head (grouped-query attention)
    scaling = dim ** -0.5 if scaling is None else scaling
    grouped = query.reshape(rows, kv_heads, group * queries, dim)  # head h = g * group + r -> kv head g
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * scaling  # [rows, kv_heads, group*q, keys]
    if kwargs.get("softcap"):  # attention logit soft-capping (Gemma-2)
        scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
    if kwargs.get("s_aux") is not None:
        raise EngineError("attention sinks are not supported by the transformers engine")
    mask = attention_mask[:, :, None].expand(rows, 1, group, queries, keys).reshape(rows, 1, group * queries, keys)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    # the sum over keys in blocks of KEY_BLOCK, the blocks added one after another: masked blocks
    # past a query's keys add exact zeros, so its result does not depend on how far the pass's key
    # length reaches (one matmul over all keys reduces a longer K in another order on AVX-512)
    if keys % KEY_BLOCK:
        pad = KEY_BLOCK - keys % KEY_BLOCK
        probs, value = torch.nn.functional.pad(probs, (0, pad)), torch.nn.functional.pad(value, (0, 0, 0, pad))
    blocks = probs.shape[-1] // KEY_BLOCK
    parts = torch.matmul(probs.reshape(rows, kv_heads, group * queries, blocks, KEY_BLOCK).transpose(2, 3),
                         value.reshape(rows, kv_heads, blocks, KEY_BLOCK, dim))  # [rows, kv_heads, blocks, g*q, dim]
    out = parts.sum(dim=2)  # [rows, kv_heads, group*q, dim]
    return out.reshape(rows, heads, queries, dim).transpose(1, 2).contiguous(), None


def _slot_cache_class():
    import torch
    from transformers.cache_utils import Cache

    class SlotCache(Cache):
        """Every live sequence's KV entries; one forward pass writes and reads the rows `begin` set."""

        def __init__(self, slots: int, capacity: int):
            super().__init__(layers=[])
            self.slots = slots  # sequences the buffers hold
            self.capacity = capacity  # positions per slot, a multiple of CAPACITY_BLOCK
            self.keys: list = []  # per layer [slots, kv_heads, capacity, dim], made on first use
            self.values: list = []
            self.rows: list[int] = []  # slot of each row of the current pass
            self.starts: list[int] = []  # position where each row's new entries go
            self.key_length = 0  # keys each row reads in the current pass

        def begin(self, rows: list[int], starts: list[int], key_length: int) -> None:
            self.rows, self.starts, self.key_length = rows, starts, key_length

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx == len(self.keys):
                shape = (self.slots, key_states.shape[1], self.capacity, key_states.shape[3])
                self.keys.append(key_states.new_zeros(shape))
                self.values.append(value_states.new_zeros(shape))
            keys, values = self.keys[layer_idx], self.values[layer_idx]
            count = key_states.shape[2]
            for row, (slot, start) in enumerate(zip(self.rows, self.starts)):
                keys[slot, :, start : start + count] = key_states[row]
                values[slot, :, start : start + count] = value_states[row]
            first = self.rows[0]
            if self.rows == list(range(first, first + len(self.rows))):  # a view, no copy
                return (keys[first : first + len(self.rows), :, : self.key_length],
                        values[first : first + len(self.rows), :, : self.key_length])
            index = torch.tensor(self.rows, device=keys.device)
            return keys[index, :, : self.key_length], values[index, :, : self.key_length]

        def grow(self, capacity: int) -> None:
            for buffers in (self.keys, self.values):
                for layer, old in enumerate(buffers):
                    new = old.new_zeros(old.shape[:2] + (capacity,) + old.shape[3:])
                    new[:, :, : self.capacity] = old
                    buffers[layer] = new
            self.capacity = capacity

        def copy_slot(self, source: int, target: int, length: int) -> None:
            for buffers in (self.keys, self.values):
                for layer in buffers:
                    layer[target, :, :length] = layer[source, :, :length]

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.key_length

    return SlotCache


def _check_attention_layers(config, context_size: int) -> None:
    """Only full attention (or sliding windows the context never exceeds) fits the slot cache:
    recurrent / linear-attention layers keep a state that cannot be forked or truncated here."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    other = layer_types - {"full_attention", "sliding_attention"}
    if other:
        raise EngineError(f"the transformers engine supports attention layers only; this model has {sorted(other)}")
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in layer_types and window and context_size > window:
        raise EngineError(f"this model's sliding-window layers ({window} tokens) need --context-size <= {window}")


def register_attention() -> None:
    """Make `invariant_attention` loadable as attn_implementation=ATTENTION_NAME."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, invariant_attention)


PROBE_ROWS = 256  # invariant_rows looks no further (a pass of more queries is split anyway)


def invariant_rows(model, min_rows: int) -> int:
    """The most rows a pass may feed so that every linear layer of `model` gives each row what
    a pass of min_rows gives it (module docstring): for each layer shape (outputs capped at 16384,
    e.g. the vocabulary head), random inputs of 16, 32, ... PROBE_ROWS rows against the same
    rows fed min_rows at a time; the largest count up to which all agree."""
    import torch

    weight = next(model.parameters())
    shapes = {(layer.in_features, min(layer.out_features, 16384))
              for layer in model.modules() if isinstance(layer, torch.nn.Linear)}
    generator = torch.Generator().manual_seed(0)
    best = PROBE_ROWS
    with torch.no_grad():
        for inputs, outputs in sorted(shapes):
            w = torch.randn(outputs, inputs, generator=generator).to(weight.device, weight.dtype)
            x = torch.randn(best, inputs, generator=generator).to(weight.device, weight.dtype)
            apart = torch.cat([torch.nn.functional.linear(x[start : start + min_rows], w)
                               for start in range(0, best, min_rows)])
            for rows in range(2 * min_rows, best + 1, min_rows):
                if not torch.equal(torch.nn.functional.linear(x[:rows], w), apart[:rows]):
                    best = rows - min_rows
                    break
    return max(best, min_rows)


def _check_dtype(dtype: str) -> str:
    if dtype not in ("float32", "bfloat16", "float16"):
        raise EngineError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
    return dtype


def model_source(path_or_id: str | Path) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name inside it or None) for from_pretrained."""
    path = Path(path_or_id).expanduser()
    if path.is_file():
        return str(path.parent), path.name
    return str(path_or_id), None


class TransformersEngine(SequenceSlots):
    def __init__(self, model: str | Path, context_size: int = 8192, max_sequences: int = 4,
                 batch_size: int = 512, threads: int | None = None, device: str | None = None,
                 dtype: str | None = None, min_rows: int = 16, verbose: bool = False,
                 keep_prefix: bool = True) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        if not verbose:
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        if threads:
            torch.set_num_threads(threads)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = _check_dtype(dtype or ("float32" if device == "cpu" else "bfloat16"))
        register_attention()
        source, gguf_file = model_source(model)
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
            hf_model = AutoModelForCausalLM.from_pretrained(
                source, gguf_file=gguf_file, dtype=getattr(torch, dtype), attn_implementation=ATTENTION_NAME
            ).to(device)
        except (OSError, ValueError, KeyError, RuntimeError) as error:
            raise EngineError(f"transformers could not load {model}: {str(error).splitlines()[0]}") from error
        name = Path(str(model)).stem if gguf_file else str(model).rstrip("/").split("/")[-1]
        self._adopt(hf_model, tokenizer, name, context_size, max_sequences, batch_size, min_rows, keep_prefix)

    @classmethod
    def adopt(cls, hf_model, tokenizer, name: str, context_size: int = 8192, max_sequences: int = 4,
              batch_size: int = 512, min_rows: int = 16, keep_prefix: bool = True) -> TransformersEngine:
        """An engine over a model already built (e.g. randomly initialised from a config, as the
        device check does); its attention must be ATTENTION_NAME (see `register_attention`)."""
        engine = cls.__new__(cls)
        engine._adopt(hf_model, tokenizer, name, context_size, max_sequences, batch_size, min_rows, keep_prefix)
        return engine

    def _adopt(self, hf_model, tokenizer, name: str, context_size: int, max_sequences: int,
               batch_size: int, min_rows: int, keep_prefix: bool) -> None:
        import torch

        self._torch = torch
        self._model = hf_model.eval()
        self._tokenizer = tokenizer
        self.device = str(next(hf_model.parameters()).device)
        # on a GPU the host waits out a prefill, so the loop indexes the prompt meanwhile
        self.capabilities = replace(self.capabilities, prefill_frees_host=self.device.startswith("cuda"))
        self.dtype = str(next(hf_model.parameters()).dtype).removeprefix("torch.")
        _check_attention_layers(self._model.config, context_size)
        self.name = name
        self.threads = torch.get_num_threads()
        self.batch_size = batch_size
        self.min_rows = min_rows
        self.max_rows = invariant_rows(self._model, min_rows)  # queries one pass feeds at most (module docstring)
        self.context_size = context_size
        self.vocab_size = self._model.get_output_embeddings().weight.shape[0]
        self.text = TokenizerText(tokenizer, getattr(self._model.generation_config, "eos_token_id", None))
        self.chat_template, self.bos_text, self.eos_text = self.text.chat_template, self.text.bos_text, self.text.eos_text
        self.add_bos, self.eos_ids = self.text.add_bos, self.text.eos_ids
        self._pad_id = tokenizer.pad_token_id or 0  # fed as throw-away queries
        # names this setup for the cached cost table (see probe.engine_costs)
        self.cost_key = f"transformers-{self.name}-{self.device.split(':')[0]}-{self.dtype}-{self.threads}t"
        self._cache = _slot_cache_class()(max_sequences, CAPACITY_BLOCK)
        # a sequence is its slot in the KV buffers; the last request's longest sequence stays in
        # its slot for the next prefill (engines/prefix.py)
        SequenceSlots.__init__(self, max_sequences, keep_prefix=keep_prefix)

    # -- text -----------------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        return self.text.tokenize(text, add_bos)

    def token_bytes(self, token_id: int) -> bytes:
        return self.text.token_bytes(token_id)

    # -- sequences ------------------------------------------------------------------------

    # greedy: the argmax is taken on the device, token ids come back (returns_ids)
    capabilities = Capabilities(returns_ids=True, shares_passes=True, keeps_prefix=True)

    def step(self, batch: Sequence[tuple[int, int]], ids: bool = False, banned=None) -> np.ndarray:
        return self._forward([(seq, [token]) for seq, token in batch], ids=ids, banned=banned)

    def score(self, seq: int, token_ids: Sequence[int], ids: bool = False, banned=None) -> np.ndarray:
        rows = [self._forward([(seq, list(token_ids[start : start + self.batch_size]))], ids=ids, banned=banned)
                for start in range(0, len(token_ids), self.batch_size)]
        empty = np.zeros(0, np.int64) if ids else np.zeros((0, self.vocab_size), np.float32)
        return np.concatenate(rows) if rows else empty

    def score_batch(self, feeds: Sequence[tuple[int, Sequence[int]]], ids: bool = False,
                    banned=None) -> list[np.ndarray]:
        """Each (seq, tokens) a row of one forward pass (separate passes where one exceeds a batch)."""
        if any(len(tokens) > self.batch_size for _, tokens in feeds) or len({s for s, _ in feeds}) < len(feeds):
            return [self.score(seq, tokens, ids, banned) for seq, tokens in feeds]
        return split_rows(self._forward([(seq, list(tokens)) for seq, tokens in feeds], ids=ids, banned=banned),
                          feeds)

    def truncate(self, seq: int, length: int) -> None:
        self._truncated(seq, length)  # entries past it are masked, then overwritten

    def close(self) -> None:
        self._cache = _slot_cache_class()(self.max_sequences, CAPACITY_BLOCK)  # frees the KV buffers
        if self.prefix is not None and self.prefix.kept is not None:
            self._clear(self.prefix.evict())  # its entries went with the buffers

    # -- internals ------------------------------------------------------------------------

    def _feed(self, seq: int, tokens: list[int]) -> None:
        self._forward([(seq, tokens)], want_logits=False)

    def _copy_entries(self, source: int, target: int) -> None:
        self._cache.copy_slot(source, target, self._lengths[source])

    def _forward(self, rows: Sequence[tuple[int, list[int]]], want_logits: bool = True, ids: bool = False,
                 banned=None) -> np.ndarray:
        """Feeding each (seq, tokens) row -> logits [total tokens, vocab], or with ids the argmax of
        each [total tokens]: one forward pass, or several where it would feed more than max_rows
        queries (rows apart, a long row's tokens in order; the results as one pass's)."""
        queries = max(self.min_rows, max(len(tokens) for _, tokens in rows))
        if len(rows) * queries <= self.max_rows:
            return self._pass(rows, want_logits, ids, banned)
        if len(rows) > 1:
            parts = [self._forward([row], want_logits, ids, banned) for row in rows]
        else:
            (seq, tokens), size = rows[0], self.max_rows
            parts = [self._pass([(seq, tokens[start : start + size])], want_logits, ids, banned)
                     for start in range(0, len(tokens), size)]
        return np.concatenate(parts) if want_logits else parts[-1]

    def _pass(self, rows: Sequence[tuple[int, list[int]]], want_logits: bool, ids: bool,
              banned) -> np.ndarray:
        """One forward pass feeding each (seq, tokens) row -> logits [total tokens, vocab], or with
        ids the argmax of each [total tokens], taken on the device (banned ids never chosen)."""
        torch = self._torch
        starts = [self._lengths[seq] for seq, _ in rows]
        for (seq, tokens), start in zip(rows, starts):
            if start + len(tokens) > self.context_size:
                raise EngineError(f"the KV cache is full ({self.context_size} tokens); raise --context-size")
        queries = max(self.min_rows, max(len(tokens) for _, tokens in rows))  # padded with throw-away tokens
        key_length = -(-(max(starts) + queries) // KEY_BLOCK) * KEY_BLOCK
        if key_length > self._cache.capacity:  # doubling: copies stay linear in the length reached
            self._cache.grow(max(2 * self._cache.capacity, -(-key_length // CAPACITY_BLOCK) * CAPACITY_BLOCK))
        input_ids = torch.full((len(rows), queries), self._pad_id, dtype=torch.long)
        for row, (_, tokens) in enumerate(rows):
            input_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        positions = torch.tensor(starts)[:, None] + torch.arange(queries)[None, :]  # [rows, q]
        mask = torch.arange(key_length)[None, None, :] <= positions[:, :, None]  # [rows, q, keys]
        self._cache.begin([seq for seq, _ in rows], starts, key_length)
        with torch.no_grad():  # (not inference_mode: fork and grow write the buffers outside the pass)
            out = self._model(
                input_ids=input_ids.to(self.device), position_ids=positions.to(self.device),
                attention_mask=mask[:, None].to(self.device), past_key_values=self._cache, use_cache=True,
                logits_to_keep=0 if want_logits else 1,
            )
        for (seq, tokens), start in zip(rows, starts):
            self._lengths[seq] = start + len(tokens)
        self._fed(rows)
        if not want_logits:
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()  # a pass is over when it returns (prefill timings, errors)
            return np.zeros((0, self.vocab_size), np.float32)
        logits = out.logits.float()  # [rows, q, vocab]
        kept = torch.cat([logits[row, : len(tokens)] for row, (_, tokens) in enumerate(rows)])  # [n, vocab]
        if not ids:
            return kept.cpu().numpy()
        if banned is not None and len(banned):
            kept[:, torch.as_tensor(banned, device=kept.device)] = -torch.inf
        return kept.argmax(dim=-1).cpu().numpy().astype(np.int64)
