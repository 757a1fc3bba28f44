"""Methods mixed into vLLM's worker (its `worker_extension_cls`) when the suffix or ssr method
runs: VllmEngine calls them by name through collective_rpc, in vLLM's worker process."""
from __future__ import annotations

from dataclasses import asdict


class SuffixCacheWorker:
    """Mixed into vLLM's worker (worker_extension_cls) when the suffix or ssr method runs: methods
    the adapter calls by name through collective_rpc, in vLLM's worker process."""

    def _ssr_suffix_cache(self):
        """vLLM's SuffixDecodingProposer's cache (arctic-inference), None without the method."""
        return getattr(getattr(self.model_runner, "drafter", None), "suffix_cache", None)

    def _ssr_drafter(self):
        """ssr's drafter (vllm_drafter.SsrDrafter) on the worker whose drafts vLLM schedules; None
        without the ssr method and on the other tensor-parallel ranks (theirs propose nothing), so
        counts summed over workers are counted once."""
        from .vllm_drafter import SsrDrafter

        drafter = getattr(self.model_runner, "drafter", None)
        return drafter if isinstance(drafter, SsrDrafter) and drafter.used else None

    def ssr_drafter_stats(self) -> dict | None:
        drafter = self._ssr_drafter()
        return None if drafter is None else drafter.stats_dict()

    def ssr_drafter_table(self) -> dict | None:
        drafter = self._ssr_drafter()
        return None if drafter is None else asdict(drafter.costs)

    def ssr_drafter_costs(self, table: dict) -> bool:
        drafter = self._ssr_drafter()
        if drafter is not None:
            drafter.set_costs(table)
        return drafter is not None

    def ssr_drafter_log(self) -> dict:
        drafter = self._ssr_drafter()
        return {} if drafter is None else drafter.steps_log()

    def ssr_drafter_forget(self) -> int:
        drafter = self._ssr_drafter()
        return 0 if drafter is None else drafter.forget_responses()

    def ssr_cached_requests(self) -> list[str]:
        cache = self._ssr_suffix_cache()
        return [] if cache is None else [str(request_id) for request_id in cache.cached_requests
                                         if str(request_id).startswith("ssr-")]

    def ssr_evict_responses(self, since: int) -> int:
        """Evict from the suffix method's global cache the responses of this adapter's requests
        numbered `since` or later (vLLM's ids for them: ssr-N-role-xxxxxxxx); returns how many."""
        cache = self._ssr_suffix_cache()
        if cache is None:
            return 0
        evicted = 0
        for request_id in list(cache.cached_requests):
            parts = str(request_id).split("-")
            if len(parts) > 2 and parts[0] == "ssr" and parts[1].isdigit() and int(parts[1]) >= since:
                cache.evict_cached_response(request_id)
                evicted += 1
        return evicted
