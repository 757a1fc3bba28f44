"""Earlier responses of a deployment: the cache its suffix trees copy from (ssr's own tree,
arctic-inference's C++ trees, vLLM's `suffix` method's global cache)."""
from __future__ import annotations

from collections.abc import Sequence

from .suffix_tree import SuffixTree


class ResponseHistory:
    """Earlier responses (whole outputs: CoT, forced tokens, answer), a bounded cache that suffix
    trees are built from, as vLLM's `suffix` method keeps a global tree of earlier requests.
    vLLM bounds it by requests (10,000, in C++); a Python tree costs ~depth nodes per token, so
    this one is bounded by tokens. One tree per depth, built on first use and grown with every
    response; when the cache overflows, the oldest responses are dropped down to half the bound
    and the trees are rebuilt."""

    def __init__(self, max_tokens: int = 20000) -> None:
        self.max_tokens = max_tokens  # tokens kept over all responses (0: none)
        self.responses: list[list[int]] = []  # oldest first
        self._tokens = 0  # tokens in self.responses
        self._trees: dict[int, SuffixTree] = {}  # max_depth -> tree over the responses
        self._arctic: dict[int, object] = {}  # max_depth -> arctic-inference cache (requests, not tokens)
        self._arctic_live: dict[int, str] = {}  # max_depth -> the request writing its response there now
        self._arctic_ids = 0  # request ids handed out to arctic caches
        self._native: dict[int, object] = {}  # max_depth -> C++ suffix tree over the responses (ssr's source)
        self._native_seqs: list[int] = []  # its sequence ids, oldest first (bounded by requests, as vLLM's)
        self._kept: dict[str, object] = {}  # a peer's own cache across requests (SGLang's trie, llama.cpp's pool)
        self._idle: dict[str, object] = {}  # a request's index given back at its end, for the next to borrow
        self._markov = None  # markov.EarlierResponses over the responses, made on first use

    def add(self, token_ids: Sequence[int]) -> None:
        for depth, cache in self._arctic.items():  # its live request wrote this response already
            live = self._arctic_live.pop(depth, None)
            if live is not None:
                cache.stop_request(live)
                if not self.max_tokens:  # kept while it was written (as vLLM's cache does), not after
                    cache.evict_cached_response(live)
            elif self.max_tokens and token_ids:
                self._arctic_response(cache, token_ids)
        if self.max_tokens and token_ids:
            self._native_add(token_ids)
            if self._markov is not None:
                self._markov.add(token_ids)
        if not self.max_tokens or not token_ids or len(token_ids) > self.max_tokens:
            return
        self.responses.append(list(token_ids))
        self._tokens += len(token_ids)
        if self._tokens > self.max_tokens:
            while self._tokens > self.max_tokens // 2:
                self._tokens -= len(self.responses.pop(0))
            self._trees.clear()
        for tree in self._trees.values():
            tree.add_sequence(token_ids)

    def tree(self, max_depth: int) -> SuffixTree | None:
        """The tree of the responses so far at this depth (None while there are none)."""
        if not self.responses:
            return None
        if max_depth not in self._trees:
            tree = self._trees[max_depth] = SuffixTree(max_depth)
            for response in self.responses:
                tree.add_sequence(response)
        return self._trees[max_depth]

    def kept(self, name: str, make):
        """A peer's own state kept across this deployment's requests, as its server keeps it
        (SGLang NGRAM's trie, llama.cpp ngram-mod's hash pool): made by make() on first use."""
        if name not in self._kept:
            self._kept[name] = make()
        return self._kept[name]

    def renew(self, name: str, make):
        """kept(name, make) made afresh (a cache that outgrew its bound)."""
        self._kept.pop(name, None)
        return self.kept(name, make)

    def borrow(self, name: str):
        """The index a finished request gave back under this name (a prompt's n-gram index), now
        the borrower's alone until it gives it back; None if there is none (another request holds
        it, or none was given)."""
        return self._idle.pop(name, None)

    def give_back(self, name: str, index) -> None:
        """A request's end: its index is free for the next request to borrow (the latest kept,
        as the engine keeps the latest request's KV)."""
        self._idle[name] = index

    def markov(self):
        """The responses as one Markov model (markov.EarlierResponses, bounded by its own token
        count), None when the history keeps none. Made on first use from the responses kept for
        the Python trees, then grown with every response."""
        if not self.max_tokens:
            return None
        if self._markov is None:
            from .markov import EarlierResponses

            self._markov = EarlierResponses()
            for response in self.responses:
                self._markov.add(response)
        return self._markov

    NATIVE_REQUESTS = 10000  # responses the C++ trees keep (vLLM's suffix cache: 10,000 requests)

    def native(self, max_depth: int):
        """The C++ suffix tree over the responses at this depth (suffix_native; ImportError without
        arctic-inference), None when the history keeps none. Made on first use from the responses
        kept for the Python trees, then grown with every response, bounded by requests."""
        if not self.max_tokens:
            return None
        if max_depth not in self._native:
            from .suffix_native import native_tree

            tree = self._native[max_depth] = native_tree(max_depth)
            for seq, response in zip(self._native_seqs[-len(self.responses):] if self.responses else [],
                                     self.responses):
                tree.extend(seq, response)
        return self._native[max_depth]

    def _native_add(self, token_ids: Sequence[int]) -> None:
        seq = self._native_seqs[-1] + 1 if self._native_seqs else 0
        self._native_seqs.append(seq)
        for tree in self._native.values():
            tree.extend(seq, list(token_ids))
        if len(self._native_seqs) > self.NATIVE_REQUESTS:
            oldest = self._native_seqs.pop(0)
            for tree in self._native.values():
                tree.remove(oldest)

    def arctic(self, max_depth: int):
        """(arctic-inference SuffixDecodingCache over the responses so far, a new request id), for
        one request that writes its response there as it goes (as vLLM's suffix method does: the
        global tree holds the live response too, so even a request alone speculates from both
        trees). The cache is bounded by requests, as in vLLM (10,000); with max_tokens 0 it holds
        no response past its request's end."""
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        if max_depth not in self._arctic:
            cache = self._arctic[max_depth] = SuffixDecodingCache(max_depth, 10000)
            for response in self.responses:
                self._arctic_response(cache, response)
        live = self._arctic_live.pop(max_depth, None)
        if live is not None:  # a request that never reached add(): its response stays cached
            self._arctic[max_depth].stop_request(live)
        self._arctic_ids += 1
        self._arctic_live[max_depth] = request_id = f"request-{self._arctic_ids}"
        return self._arctic[max_depth], request_id

    def _arctic_response(self, cache, token_ids: Sequence[int]) -> None:
        self._arctic_ids += 1
        request_id = f"earlier-{self._arctic_ids}"
        cache.start_request(request_id, [])
        cache.add_active_response(request_id, list(token_ids))
        cache.stop_request(request_id)
