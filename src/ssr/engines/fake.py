"""A small deterministic engine for unit tests of the decoding loop.

Tokens are ASCII bytes (id 0 is EOS). The logits of a context are a fixed function
of its last `order` tokens plus a weak term of the whole context, so drafts from a
partial context mostly, but not always, agree with the full one. It is exactly
batch-invariant, so SSR must reproduce plain decoding token for token on it.
"""
from __future__ import annotations

import threading
import zlib
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .base import Capabilities, EngineError, TokenListTree


class FakeEngine:
    capabilities = Capabilities(shares_passes=True)  # rows always: it never returns ids
    vocab_size = 128
    eos_ids = frozenset({0})
    slots = 1  # a server runs one request at a time on it
    chat_template = None
    bos_text = ""
    eos_text = "<eos>"

    def __init__(self, order: int = 3, drift: float = 0.6, max_sequences: int = 4,
                 context_size: int = 1 << 16, eos_bias: float = 0.0) -> None:
        self.order = order  # tokens of context that set the logits
        self.drift = drift  # weight of the whole-context term (breaks exact repeats)
        self.eos_bias = eos_bias  # added to EOS logits in the answer, to end it sooner
        self.max_sequences = max_sequences
        self.context_size = context_size
        self.calls: Counter[str] = Counter()  # engine calls by name, for tests
        self._tokens: dict[int, list[int]] = {}
        self._next_id = 0

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        return [ord(ch) if 0 < ord(ch) < 128 else ord("?") for ch in text]

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id == 0 else bytes([token_id])

    def prefill(self, token_ids: Sequence[int]) -> int:
        self.calls["prefill"] += 1
        return self._new(list(token_ids))

    def fork(self, seq: int) -> int:
        self.calls["fork"] += 1
        return self._new(list(self._tokens[seq]))

    def step(self, batch: Sequence[tuple[int, int]]) -> np.ndarray:
        self.calls["step"] += 1
        self.calls[f"step_batch_{len(batch)}"] += 1
        rows = []
        for seq, token in batch:
            self._tokens[seq].append(token)
            rows.append(self._logits(self._tokens[seq]))
        return np.stack(rows)

    def score(self, seq: int, token_ids: Sequence[int]) -> np.ndarray:
        self.calls["score"] += 1
        return self._feed(seq, token_ids)

    def score_batch(self, feeds: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
        self.calls["score_batch"] += 1
        return [self._feed(seq, tokens) for seq, tokens in feeds]

    def truncate(self, seq: int, length: int) -> None:
        del self._tokens[seq][length:]

    def release(self, seq: int) -> None:
        del self._tokens[seq]

    def length(self, seq: int) -> int:
        return len(self._tokens[seq])

    def live_sequences(self) -> int:
        return len(self._tokens)

    def _new(self, tokens: list[int]) -> int:
        if len(self._tokens) >= self.max_sequences:
            raise EngineError(f"more than {self.max_sequences} sequences")
        self._next_id += 1
        self._tokens[self._next_id] = tokens
        return self._next_id

    def _feed(self, seq: int, token_ids: Sequence[int]) -> np.ndarray:
        tokens = self._tokens[seq]
        rows = []
        for token in token_ids:
            tokens.append(token)
            rows.append(self._logits(tokens))
        return np.stack(rows)

    def _logits(self, tokens: list[int]) -> np.ndarray:
        local = zlib.crc32(bytes(tokens[-self.order :]))
        rng = np.random.default_rng(local)
        logits = rng.normal(0.0, 3.0, self.vocab_size)  # [vocab]
        glob = np.random.default_rng(sum(tokens) % 5).normal(0.0, self.drift, self.vocab_size)
        logits += glob
        logits[0] += self.eos_bias - 4.0  # EOS rare unless biased
        return logits.astype(np.float32)


class FakeTreeEngine(TokenListTree, FakeEngine):
    """The fake model with tree attention (tree.py): `score_tree` feeds a token tree after a
    sequence's tokens, each node's logits those of the sequence + its ancestors + itself, and
    `keep_path` keeps one root-first path of it."""

    capabilities = Capabilities(shares_passes=True, tree_attention=True)

    def score_tree(self, seq: int, token_ids: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        self.calls["score_tree"] += 1
        rows, paths = [], []  # paths[i]: node i's tokens from the root
        for token, parent in zip(token_ids, parents):
            if not (-1 <= parent < len(paths)):
                raise EngineError(f"node parent {parent}: parents come before their children")
            paths.append((paths[parent] if parent >= 0 else []) + [token])
            rows.append(self._logits(self._tokens[seq] + paths[-1]))
        self._hold_tree(seq, token_ids)
        return np.stack(rows)  # [n, vocab]


class FakeRequestsEngine:
    """The fake model behind vLLM's request interface (engines/vllm.py), for unit tests of
    loop/vllm_walk.py without vLLM: each request runs to its end when opened (greedy, or seeded
    sampling), its cumulative outputs queued on a vllm.Request handle. The prefix cache is
    simulated in blocks of `block_size` over every sequence computed before; prompt-logprob
    rows under a cache hit hold junk, as vLLM's do."""

    capabilities = Capabilities(requests=True)
    slots = 4  # a server runs several walks at once on it, as on vLLM
    verify_reads_cache = True
    enable_prefix_caching = True
    max_logprobs = 20  # as vLLM's default
    vocab_size, eos_ids, chat_template, bos_text, eos_text = 128, frozenset({0}), None, "", "<eos>"
    budget_markers = None  # (start, end) ids: requests may set thinking_token_budget, as on vLLM

    def __init__(self, block_size: int = 4, context_size: int = 1 << 16, **fake_options) -> None:
        self.model = FakeEngine(**fake_options)
        self.block_size = block_size
        self.context_size = context_size
        self.max_sequences = 1 << 16
        self.cached: set[tuple[int, ...]] = set()  # block-aligned prefixes computed so far
        self.opened: list[tuple[str, list[int], object]] = []  # (id, prompt, params) per request
        self._next_id = 0
        self._lock = threading.Lock()

    tokenize = FakeEngine.tokenize
    token_bytes = FakeEngine.token_bytes

    def new_id(self, role: str) -> str:
        with self._lock:  # walks on several server workers take ids at once
            self._next_id += 1
            return f"fake-{self._next_id}-{role}"

    def sampling_params(self, **options):
        from types import SimpleNamespace

        return SimpleNamespace(**{"stop": None, "allowed_token_ids": None, "prompt_logprobs": None, "logprobs": None,
                                  "seed": 0, "top_p": 1.0, "top_k": 0, "skip_reading_prefix_cache": None, **options})

    def open(self, request_id: str, prompt_ids: Sequence[int], params):
        from types import SimpleNamespace

        from ..config import SamplingParams
        from ..verifying.sampling import target_probs
        from .vllm import _DONE, Request

        request = Request(self, request_id)
        self.opened.append((request_id, list(prompt_ids), params))
        tokens, rng, reason = list(prompt_ids), np.random.default_rng(params.seed), "length"
        skip = params.skip_reading_prefix_cache
        skip = params.prompt_logprobs is not None if skip is None else skip
        cached = 0 if skip else self._cached(tokens)
        rows = self._prompt_rows(tokens, cached, params.prompt_logprobs) if params.prompt_logprobs is not None \
            else None
        generated: list[int] = []
        sample_rows: list | None = [] if params.logprobs is not None else None
        forcing = _ThinkingBudget(self.budget_markers, tokens, getattr(params, "thinking_token_budget", None))
        while len(generated) < params.max_tokens:
            logits = self.model._logits(tokens).astype(np.float64)  # [vocab]
            forced = forcing.next()
            if forced is not None:  # vLLM's thinking budget: only the end marker's next token is allowed
                logits = np.where(np.arange(len(logits)) == forced, 0.0, -np.inf)
            raw = _log_softmax(logits)  # before the mask, as vLLM's raw logprobs
            if params.allowed_token_ids is not None:
                masked = np.full_like(logits, -np.inf)
                masked[params.allowed_token_ids] = logits[params.allowed_token_ids]
                logits = masked
            if params.temperature == 0:
                token = int(np.argmax(logits))
            else:  # vLLM's sampler: temperature, top-k, top-p (ssr.verifying.sampling does the same)
                probs = target_probs(logits, SamplingParams(params.temperature, params.top_p, params.top_k))
                token = int(rng.choice(len(probs), p=probs))
            if sample_rows is not None:
                sample_rows.append(_top_row(raw, params.logprobs, token))
            tokens.append(token)
            generated.append(token)
            forcing.saw(token)
            text = bytes(t for t in generated if t).decode("ascii", "replace")
            output = SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(generated), finish_reason=None,
                                                              logprobs=None if sample_rows is None else
                                                              list(sample_rows))],
                                     prompt_logprobs=rows, num_cached_tokens=cached, finished=False)
            request.steps.append(1)  # one new token per output, as the real adapter records them
            request.latest = output
            request.outputs.put(output)
            if token in params.stop_token_ids or any(stop in text for stop in params.stop or ()):
                reason = "stop"
                break
        self._remember(tokens[:-1])
        request.latest.outputs[0].finish_reason, request.latest.finished = reason, True
        request.outputs.put(_DONE)
        request.finished.set()
        return request

    def abort(self, request_ids) -> None:
        pass  # every fake request has ended when open returns

    def live_requests(self) -> int:
        return 0

    def live_sequences(self) -> int:  # the server's gauge, as on vLLM: requests stand for sequences
        return self.live_requests()

    def _cached(self, tokens: list[int]) -> int:
        """Longest block-aligned prefix computed before, at most len - 1 (vLLM recomputes the last)."""
        length = (len(tokens) - 1) // self.block_size * self.block_size
        while length and tuple(tokens[:length]) not in self.cached:
            length -= self.block_size
        return length

    def _remember(self, tokens: list[int]) -> None:
        for end in range(self.block_size, len(tokens) + 1, self.block_size):
            self.cached.add(tuple(tokens[:end]))

    def _prompt_rows(self, tokens: list[int], cached: int, size: int) -> list:
        """Row i: the top `size` raw logprobs and token i's (-1: all); rows up to the cache hit are junk."""
        from types import SimpleNamespace

        rows: list = [None]
        for position in range(1, len(tokens)):
            if position <= cached:
                rows.append({(position * 7) % 128: SimpleNamespace(rank=1, logprob=0.0)})  # not computed
                continue
            rows.append(_top_row(_log_softmax(self.model._logits(tokens[:position]).astype(np.float64)), size,
                                 tokens[position]))
        return rows


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def _top_row(raw: np.ndarray, size: int, token: int) -> dict:
    """{token: Logprob-like} for the top `size` tokens (-1: all) plus `token`, as vLLM returns rows."""
    from types import SimpleNamespace

    order = np.argsort(-raw, kind="stable")
    rank = {int(t): index + 1 for index, t in enumerate(order)}
    keep = order if size == -1 else order[: max(size, 1)]
    row = {int(t): SimpleNamespace(rank=rank[int(t)], logprob=float(raw[t])) for t in keep}
    row.setdefault(int(token), SimpleNamespace(rank=rank[int(token)], logprob=float(raw[token])))
    return row


class _ThinkingBudget:
    """vLLM's thinking_token_budget as vllm/v1/sample/thinking_budget_state.py counts it: thinking
    from the prompt's last start marker (prompt tokens after it count), until the end marker; at
    the budget the end marker is forced, one token a step."""

    def __init__(self, markers, prompt_ids: list[int], budget: int | None) -> None:
        from ..formats.markers import thinking_at_start, tokens_after

        self.start, self.end = markers or ((), ())
        thinking = budget is not None and thinking_at_start(prompt_ids, self.start, self.end)
        self.count = tokens_after(prompt_ids, self.start) if thinking else None  # thinking tokens so far
        self.budget, self.recent, self.forcing = budget, [], []

    def next(self) -> int | None:
        """The token vLLM forces next (None: the model's own)."""
        if self.count is not None and self.count >= self.budget and not self.forcing:
            self.forcing = list(self.end)
        return self.forcing[0] if self.forcing else None

    def saw(self, token: int) -> None:
        if self.forcing:
            self.forcing.pop(0)
        self.recent = (self.recent + [token])[-len(self.end):] if self.end else []
        if self.count is not None:
            self.count += 1
            if self.recent == list(self.end):
                self.count = None  # the thinking has ended
