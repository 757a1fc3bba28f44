"""ssr's speculation as vLLM's drafter: one chain per request per step, what vLLM verifies.

vLLM owns the batch: every step it asks its drafter for draft tokens for each running request
(the model runner's `propose_draft_token_ids`), verifies them in the next forward pass with its
own rejection sampler, and hands the drafter what was sampled. `SsrDrafter` is that drafter for
the speculative method "ssr" (engines/vllm_plugin.py registers it; the pinned vLLM's hook is
its `custom_class` method, vllm/v1/spec_decode/custom_class_proposer.py). Per request a
`ChainDrafter` runs the proposer the replay measures:

  1. propose  - ssr's proposer over the request's prompt and output so far (the suffix tree,
                with its other branches, and n-gram lookup at its several occurrences) and the
                earlier responses of every request (one ResponseHistory shared by the batch,
                bounded and evicted oldest first, as vLLM's global tree)
  2. price    - the span policy cuts each candidate to what it is worth on this engine's costs
                at the batch the step runs at (costs.CostTable.at_batch: a verified token is nearly
                free at batch 1 on a GPU and costs compute at batch 64), and keeps the best one:
                one chain (vLLM verifies one chain per request)
  3. verify   - vLLM's (greedy: argmax; sampled: its rejection sampler, a one-hot draft)
  4. observe  - the next step's sampled tokens say how many were accepted: the source's
                acceptance curve learns it, the proposer takes the tokens

The CoT and the answer price spans apart (their acceptance differs), split at the thinking
format's end marker. A drafter error never fails a request: that request gets no draft this
step (it decodes plainly), the error is counted and logged once.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..config import GenerationConfig, SuffixParams
from ..pricing.costs import CostModel, CostTable, gpu_preset, load_costs
from ..proposing.history import ResponseHistory
from ..pricing.drafting import PolicyStats
from ..proposing.proposers import request_proposer
from ..proposing.source import NO_SOURCE, Source
from ..pricing.span_policy import SpanPolicy, judge, left_out, span_extension
from ..loop.speculation import Layout, host_seconds, per_step_layout
from ..formats.markers import last_at, marker_ids, thinking_at_start
from .vllm_plugin import DEFAULT_TOKENS, flag, refuse_hybrid  # DEFAULT_TOKENS: num_speculative_tokens when unset

log = logging.getLogger("ssr.drafter")

COSTS_ENV = "SSR_DRAFTER_COSTS"  # a cost table for the span policy: `gpu`, `gpu:MS` or a calibrate JSON
UNDRAFTED = "undrafted"  # the role in an adapter's request id (ssr-N-role) that the drafter leaves plain
HISTORY_TOKENS = 200_000  # earlier responses kept for every request to copy from (oldest evicted first)


@dataclass
class Step:
    """One drafting decision of one request, for parity checks (`SsrDrafter.log`)."""

    at: int  # the request's tokens (prompt + output) when the chain was proposed
    source: Source  # the chain's source (NO_SOURCE for none)
    proposed: list[int]  # the chain (empty: no draft this step)
    accepted: int | None = None  # of it, what vLLM accepted (known at the next step)


@dataclass
class ChainDrafter:
    """One request: its proposer and span policies; `step` takes what vLLM sampled since the
    last call and returns the next chain."""

    prompt_ids: Sequence[int]
    history: ResponseHistory | None
    costs: CostModel  # the engine's, at batch 1; `at_batch` prices each step where it runs
    end_ids: Sequence[int] = ()  # the thinking format's end marker (the CoT and answer split there)
    thinking: bool = False  # the request is in its CoT
    max_span: int = DEFAULT_TOKENS
    stats: PolicyStats | None = None  # what earlier requests learnt (cold: None)
    steps: list[Step] | None = None  # its decisions, kept when a log is wanted
    _last: tuple[Source, list[int]] | None = field(default=None, repr=False)  # the chain vLLM is verifying
    _policy: SpanPolicy | None = field(default=None, repr=False)  # the span policy that chose it
    _priced_at: tuple = field(default=(None, 0), repr=False)  # (costs, batch, extend_prob, layout) of the last step
    _left: tuple[tuple[Source, list[int]], ...] = field(default=(), repr=False)  # the candidates it left out
    _output: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        config = GenerationConfig(mode="ssr", suffix=SuffixParams(max_span=self.max_span))
        extend = span_extension(self.costs, self.max_span)
        self.proposer = request_proposer(config, extend, list(self.prompt_ids), self.history,
                                         several=True, wide=True)
        # where one chain among every source's does not pay for its host time at the step's batch
        # (speculation.per_step_layout): one span a pass, as the loop lays it out there (Layout.ONE),
        # from the same sources' state (fewer of them: less host time)
        self.one_span = self.proposer.one_span_view()
        self.suffix = self.proposer.proposers["suffix"]  # its spans go past the match where verifying is cheap
        learnt = self.stats.spans if self.stats is not None else {}
        self.spans = SpanPolicy(self.costs, learnt.get("answer"), one_chain=True)  # one chain a step:
        self.cot_spans = SpanPolicy(self.costs, learnt.get("cot"), one_chain=True)  # the others judged
        self.one_span_policies = (SpanPolicy(self.costs, learnt.get("answer")), SpanPolicy(self.costs, learnt.get("cot")))
        self._end = list(self.end_ids)
        # a request whose prompt closes a CoT (a draft child: CoT[:b] + end marker) answers it: its
        # response is kept from the marker on, so a request that writes the marker next copies it
        closed_at = -1 if self.thinking else last_at(self.prompt_ids, self._end)
        self._closing = [int(token) for token in self.prompt_ids[closed_at:]] if closed_at >= 0 else []

    def step(self, sampled: Sequence[int], room: int, costs: CostModel | None = None, batch: int = 1) -> list[int]:
        """sampled: tokens vLLM committed for this request since the last step (the accepted
        part of the last chain and the target's own token); room: most draft tokens the request
        may take; costs: the engine's at the step's batch of `batch` requests. Returns the chain
        to verify next ([] for a plain step)."""
        self._learn(sampled, max(0, len(sampled) - 1))  # 4. observe the verdict on the last chain
        self._take(sampled)
        costs = costs or self.costs
        if self._priced_at[0] is not costs or self._priced_at[1] != batch:  # else decided at the last step
            # past the match where verifying is cheap; one chain among every source's where it pays for its host time
            self._priced_at = (costs, batch, span_extension(costs, self.max_span), per_step_layout(costs, batch))
        self.suffix.extend_prob, layout = self._priced_at[2:]
        answer, cot = (self.spans, self.cot_spans) if layout is Layout.CHAIN else self.one_span_policies
        policy = cot if self.thinking else answer
        policy.costs, policy.host_s = costs, host_seconds(layout, batch)  # priced at the step's batch
        room = min(room, self.max_span)
        skipped = room <= 0 or policy.skips()  # spans losing (host time too): no proposal, no host time spent
        found = [] if skipped else (self.proposer if layout is Layout.CHAIN else self.one_span).candidates(room)  # 1.
        chosen = policy.choose_many(found, 1, guard=False) if found else []  # 2. price
        source, span = chosen[0] if chosen else (NO_SOURCE, [])
        if self.steps is not None:
            self.steps.append(Step(self.length, source, list(span)))
        if span:
            self._last, self._policy = (source, list(span)), policy
            self._left = left_out(found, chosen) if policy.one_chain else ()
        return list(span)

    def end(self, accepted: Sequence[int]) -> None:
        """The request's last step: of the last chain vLLM accepted these tokens, then sampled the
        token that ended the request (EOS, no candidate's: -1 here). The verdict is learnt, the
        text's tokens taken; no chain follows. (On vLLM that step's sampled tokens come to `step`,
        EOS among them, and the chain it returns is never verified.)"""
        self._learn(list(accepted) + [-1], len(accepted))
        self._take(accepted)

    def _learn(self, committed: Sequence[int], accepted: int) -> None:
        """The last chain's verdict (`accepted` of its tokens, `committed` the step's tokens), learnt
        by the policy that chose it; the candidates it left out are judged on the same tokens."""
        if self._last is not None:
            (source, span), policy = self._last, self._policy
            accepted = min(len(span), accepted)
            policy.observe_pass([(source, len(span), accepted)], policy.costs.cost(len(span) + 1))
            policy.observe_judged(judge(self._left, list(committed[:accepted + 1])))  # the others, on what it committed
            if self.steps:
                self.steps[-1].accepted = accepted
        self._last = None

    @property
    def length(self) -> int:
        """Prompt + output tokens the drafter has seen."""
        return len(self.prompt_ids) + len(self._output)

    def finish(self) -> list[int]:
        """The request left the batch: its response for the shared history (its output, after
        the CoT end marker its prompt closed with, if any), stats learnt."""
        if self.stats is not None:  # of each part's two policies, the one that ran more passes
            answer, cot = (max(pair, key=lambda policy: policy.timed_passes) for pair in
                           zip((self.spans, self.cot_spans), self.one_span_policies))
            self.stats.spans.update(answer=dict(answer.stats), cot=dict(cot.stats))
        self.proposer.end()  # what it borrowed from the history goes back
        return self._closing + self._output if self._output else []

    def _take(self, sampled: Sequence[int]) -> None:
        """The step's tokens, to the output and the proposer; the CoT ends where the end marker does."""
        if not sampled:
            return
        output, start = self._output, len(self._output)
        output.extend(int(token) for token in sampled)
        self.proposer.observe(output[start:])
        if self.thinking and last_at(output[max(0, start + 1 - len(self._end)):], self._end) >= 0:
            self.thinking = False  # the marker ends at one of the new tokens


def replay_chains(prompt_ids: Sequence[int], output_ids: Sequence[int], costs: CostModel,
                  end_ids: Sequence[int] = (), thinking: bool = False, max_span: int = DEFAULT_TOKENS,
                  batch_costs: CostModel | None = None, history: ResponseHistory | None = None,
                  stats: PolicyStats | None = None, batch: int = 1) -> list[Step]:
    """A request's drafting replayed from its own text, as greedy vLLM verifies it: each chain is
    accepted up to where it parts from the output, the output's next token is the bonus. The
    steps a generation on vLLM logged (SSR_DRAFTER_LOG) must be these (the parity test); and
    `ssr traces --candidates chain`'s passes (tests/test_chain_parity.py). A deployment's
    `history` and learnt `stats`, where given, take the request's output and statistics after it
    (SsrDrafter's requests share them so); `batch`: the requests of each step (`batch_costs` priced
    among them)."""
    steps: list[Step] = []
    drafter = ChainDrafter(list(prompt_ids), history, costs, end_ids, thinking, max_span, stats, steps=steps)
    position, sampled = 1, list(output_ids[:1])  # the prefill's token comes first
    while sampled:
        chain = drafter.step(sampled, max_span, batch_costs, batch)  # vLLM's room: the text's end is not known ahead
        accepted = 0
        while accepted < len(chain) and position + accepted < len(output_ids) \
                and chain[accepted] == output_ids[position + accepted]:
            accepted += 1
        if position + accepted == len(output_ids):  # the bonus ends the text (EOS): the request's last step
            drafter.end(output_ids[position:])
            break
        sampled = list(output_ids[position:position + accepted + 1])
        position += len(sampled)
    output = drafter.finish()
    if history is not None and output:
        history.add(output)
    return steps


class SsrDrafter:
    """vLLM's drafter for `{"method": "ssr"}`: built by vLLM with its VllmConfig, `propose`
    called by its model runner every step (the plugin hands it the runner's input batch, which
    names the requests: the pinned hook passes token arrays only)."""

    def __init__(self, vllm_config, costs: CostTable | None = None, markers: tuple | None = None) -> None:
        from .vllm_plugin import register

        register()  # the runner hook, in this (the worker's) process, whether or not vLLM loaded the plugin
        refuse_hybrid(bool(getattr(vllm_config.model_config, "is_hybrid", False)))
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = spec.num_speculative_tokens or DEFAULT_TOKENS
        self.max_model_len = vllm_config.model_config.max_model_len
        self.costs = costs or _engine_costs(vllm_config.model_config)  # at batch 1; per batch size in _at
        self._batch_costs: dict[int, CostModel] = {}  # batch (a power of 2) -> its cost model
        self.start_ids, self.end_ids = markers if markers is not None else _markers(vllm_config.model_config)
        self.history = ResponseHistory(HISTORY_TOKENS)  # every finished request's output
        self.forgotten: set[str] = set()  # requests older than the last forget_responses: kept out of it
        self.stats = PolicyStats()  # span acceptance carried from request to request, as ssr serve's
        self.requests: dict[str, ChainDrafter] = {}  # running request id -> its drafter
        self.input_batch = None  # vLLM's InputBatch of the step (set by the plugin before propose)
        self.keep_log = flag("SSR_DRAFTER_LOG")
        # SSR_DRAFTER_ISOLATED=1: each request drafts from its own text alone (no earlier responses,
        # no carried statistics), so that its steps replay from its text (the parity test)
        self.isolated = flag("SSR_DRAFTER_ISOLATED")
        self.log: dict[str, list[Step]] = {}  # request id -> its steps (SSR_DRAFTER_LOG=1: parity tests)
        # vLLM runs a drafter on every worker and schedules the drafts of one, its output rank
        # (the first tensor-parallel rank of the last pipeline stage: MultiprocExecutor's
        # take_draft_token_ids, unique_reply_rank): the others propose nothing and keep no state
        self.used = _output_rank()
        self.errors = 0  # propose calls that failed for a request (it decoded plainly that step)
        self.proposed = self.steps = 0  # draft tokens proposed; (request, step) pairs drafted for

    def load_model(self, *args, **kwargs) -> None:  # vLLM asks every drafter; there is none
        pass

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        """One chain per request in the batch (row i: sampled_token_ids[i], the row's tokens in
        token_ids_cpu[i, :num_tokens_no_spec[i]])."""
        if not self.used:  # a rank whose drafts vLLM does not read
            return [[] for _ in sampled_token_ids]
        batch = self.input_batch
        if batch is None:  # no request names (the plugin's runner hook did not run): no drafts
            self._fail("vLLM's model runner gave the drafter no input batch; decoding plainly")
            return [[] for _ in sampled_token_ids]
        size = sum(1 for sampled in sampled_token_ids if sampled)  # requests decoding this step
        costs = self._at(size)
        drafts = []
        for row, sampled in enumerate(sampled_token_ids):
            try:
                drafts.append(self._propose_row(row, sampled, int(num_tokens_no_spec[row]), token_ids_cpu, costs, size))
            except Exception as error:  # noqa: BLE001 - a drafter error must never fail a request
                self._fail(f"drafting for a request failed ({type(error).__name__}: {error}); it decodes plainly")
                drafts.append([])
        for request_id in set(self.requests) - set(batch.req_id_to_index):
            self._finish(request_id)
        return drafts

    def _propose_row(self, row: int, sampled: list[int], num_tokens: int, token_ids_cpu, costs,
                     size: int) -> list[int]:
        if not sampled:  # a partial prefill: nothing to draft yet
            return []
        batch = self.input_batch
        request_id = batch.req_ids[row]
        if request_id.split("-")[2:3] == [UNDRAFTED]:  # the engine's own probes (vllm_costs.py)
            return []
        drafter = self.requests.get(request_id)
        if drafter is None:
            prompt = [int(t) for t in token_ids_cpu[row, :batch.num_prompt_tokens[row]]]
            drafter = self.requests[request_id] = ChainDrafter(
                prompt, None if self.isolated else self.history, self.costs_model, self.end_ids,
                thinking_at_start(prompt, self.start_ids, self.end_ids), self.num_speculative_tokens,
                None if self.isolated else self.stats,
                self.log.setdefault(request_id, []) if self.keep_log else None)
            sampled = [int(t) for t in token_ids_cpu[row, len(prompt):num_tokens]]  # output so far (a resumed request)
        room = min(self.num_speculative_tokens, self.max_model_len - num_tokens - 1)
        chain = drafter.step(sampled, room, costs, size)
        self.steps += 1
        self.proposed += len(chain)
        return chain

    def _finish(self, request_id: str) -> None:
        drafter = self.requests.pop(request_id)
        output = drafter.finish()
        if output and not self.isolated and request_id not in self.forgotten:
            self.history.add(output)
        self.forgotten.discard(request_id)

    @property
    def costs_model(self) -> CostModel:
        return self._at(1)

    def _at(self, batch: int) -> CostModel:
        """The cost model at a batch of `batch` requests (rounded up to a power of two)."""
        size = 1 << max(0, batch - 1).bit_length()
        model = self._batch_costs.get(size)
        if model is None:
            model = self._batch_costs[size] = CostModel(table=self.costs.at_batch(size))
        return model

    def _fail(self, message: str) -> None:
        self.errors += 1
        if self.errors == 1:
            log.warning("ssr drafter: %s (logged once; counted in ssr_drafter_errors)", message)

    def set_costs(self, table: dict) -> None:
        """Price from now on with this cost table (CostTable as a dict: the engine measured it on this
        machine, engines/vllm_costs.py); the running requests price their next step with it too."""
        self.costs = CostTable.from_dict(table)
        self._batch_costs = {}

    def steps_log(self) -> dict[str, list[dict]]:
        """SSR_DRAFTER_LOG=1: every request's drafting steps (request id -> [Step as a dict])."""
        from dataclasses import asdict

        return {request_id: [asdict(step) for step in steps] for request_id, steps in self.log.items()}

    def forget_responses(self) -> int:
        """Drop the earlier responses (the bench, between runs of one item); returns how many.
        Requests still running keep the history they started with (their proposers hold it)."""
        count = len(self.history.responses)
        self.history = ResponseHistory(HISTORY_TOKENS)
        # the requests it knows of are earlier too: those that have left the batch are only seen to
        # have gone at the next step, and their responses must not join the new history then
        self.forgotten.update(self.requests)
        return count

    def stats_dict(self) -> dict:
        return {"errors": self.errors, "proposed": self.proposed, "steps": self.steps,
                "running": len(self.requests), "history_responses": len(self.history.responses)}


def _output_rank() -> bool:
    """Whether this worker's drafts are the ones vLLM schedules (True where vLLM's parallel groups
    are not set up: one process, or a drafter built outside vLLM)."""
    try:
        from vllm.distributed.parallel_state import get_pcp_group, get_pp_group, get_tp_group

        return get_tp_group().rank_in_group == 0 and get_pp_group().is_last_rank and get_pcp_group().rank_in_group == 0
    except (ImportError, AssertionError):
        return True


def _engine_costs(model_config) -> CostTable:
    """The span policy's cost table: $SSR_DRAFTER_COSTS (`gpu`, `gpu:MS`, a calibrate JSON); else on
    a CPU the table measured for this model on this machine (`ssr calibrate --engine vllm`, or
    `ssr serve --engine vllm` once), where there is one; else the GPU preset (only the ratios
    matter: a verify pass of tens of tokens ~ a step at batch 1)."""
    from ..pricing.probe import read_table
    from .vllm_costs import table_path

    spec = os.environ.get(COSTS_ENV, "").strip()
    if spec:
        return load_costs(spec)
    return (_on_cpu() and read_table(table_path(model_config.model))) or gpu_preset()


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _markers(model_config) -> tuple[list[int], list[int]]:
    """(start, end) token ids of the model's thinking format (the chat template's native markers,
    else ssr's code template's), read with the model's own tokenizer."""
    from transformers import AutoTokenizer

    from ..formats.thinking import detect_format

    tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer, trust_remote_code=model_config.trust_remote_code)
    return marker_ids(tokenizer, detect_format(getattr(tokenizer, "chat_template", None)))
