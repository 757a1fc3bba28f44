"""A replay engine: the model of one greedy bench row, behind the engine protocol, so that
`ssr simulate` runs the real decoding loop (`loop.Generation`) instead of a copy of it.

Under greedy decoding the row holds every decision the model made: its CoT, its answer and
the draft its last child wrote. The engine answers each context with logits whose argmax is
the token the model wrote there; its clock advances by the cost model instead of by
computing. Where the row says nothing (a child forked where no child of the run forked, text
after a stop), the engine predicts EOS: a stage the run did not record ends there.

Text is not replayed: tokens decode to nothing, except the token that ended a stage in the
run, which the engine writes as a token of its own whose text ends the stage the same way
(the end marker, the answer's stop text, a loop). Budgets and max_tokens apply as in the run.

Greedy loops get token ids instead of rows (`returns_ids`), as from an engine that picks the
argmax where its logits live. The loop's own host time (everything between two passes:
proposing, pricing, verifying, committing; and between the prefill and the first pass, where
its proposers index the prompt) is measured, and with `host` it goes on the clock:
"measured" adds this machine's own, a number adds that many seconds per pass. With an
accelerator's costs the proposers index the prompt beside its prefill, as the loop does on such
an engine (Capabilities.prefill_frees_host): what the prefill's modelled seconds cover of that
is no host time (`beside_prefill`).

A deployment's server keeps the KV of its last request (`KeptKV`): a prompt that starts as
that request's prompt and output did (turn N of a conversation) prefills only the rest, as
vLLM's and SGLang's prefix caches and ssr's own engines (engines/prefix.py) do by default.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import time

import numpy as np

from ..pricing.costs import CostTable, DraftCost
from ..engines.base import Capabilities, TokenListTree
from ..engines.prefix import MIN_SHARED_TOKENS
from ..verifying.verify import common_prefix
from ..formats.thinking import ThinkingFormat

# placeholders the loop tokenizes; the engine maps them to the row's forced token ids
REPLAY_FORMAT = ThinkingFormat("replay", start="", end="\x00end", forced_end="\x00forced-end",
                               answer_prefix="\x00answer-prefix", answer_stop="\x00stop")


@dataclass
class KeptKV:
    """What a deployment's server still holds in KV from its last request (its prompt and
    output), and how much of the next prompt it served; empty for a cold server."""

    tokens: Sequence[int] = ()  # the last request's prompt and output
    reused: int = 0  # prompt tokens the last prefill took from them (0: a cold prefill)
    min_tokens: int = MIN_SHARED_TOKENS  # a shorter common prefix is not taken (as PrefixKeeper's)

    def take(self, prompt: Sequence[int]) -> int:
        """How many of the prompt's first tokens are in the kept KV (recorded as `reused`)."""
        common = common_prefix(self.tokens, prompt)
        self.reused = common if common >= self.min_tokens else 0
        return self.reused


@dataclass(frozen=True)
class RowModel:
    """What one row's model wrote (token ids)."""

    prompt_ids: list[int]
    cot_ids: list[int]
    answer_ids: list[int]
    forced_end_ids: list[int]  # forced when the CoT does not end itself (also on every child)
    answer_prefix_ids: list[int]  # forced after the end marker
    draft_ids: list[int]  # the last child's draft
    draft_forked_at: int | None  # CoT tokens when that child forked (None: no child)
    # (forked at, draft) of children forked before the last (a trace's recorded drafts, multi-stage)
    earlier_drafts: tuple[tuple[int, tuple[int, ...]], ...] = ()
    cot_end: str = "natural"  # how the run's CoT ended (natural, budget, eos, repetition)
    stop: str = "eos"  # how the run's answer ended (eos, max_tokens, answer_stop, repetition)
    repetition_stop: int = 16  # the run's LoopGuard lines


class ReplayEngine:
    context_size = 1 << 20
    slots = 1
    chat_template = None
    bos_text, eos_text = "", ""
    # greedy loops ask for the argmax ids (ids=True), never built as rows; its clock models seconds
    # (prefill_frees_host: where its cost table is an accelerator's)
    capabilities = Capabilities(returns_ids=True, shares_passes=True, modelled_clock=True, keeps_prefix=True,
                                prefill_frees_host=True)
    prefix: KeptKV  # KeepsPrefix: what a deployment's server kept from its last request

    def __init__(self, model: RowModel, costs: CostTable, host: str | float | None = None,
                 max_sequences: int = 4, kept: KeptKV | None = None, batch: int = 1,
                 drafting: DraftCost | None = None) -> None:
        self.model = model
        self.prefix = kept if kept is not None else KeptKV()  # the KV a deployment kept from its last request
        self.max_sequences = max_sequences  # as the run's engine (the engines' default: 4)
        self.costs = costs  # seconds of each call
        self.host = host  # the loop's host time on the clock: None (off), "measured", or seconds per pass
        self.host_s = 0.0  # the loop's host time between passes, measured (or the figure per pass)
        # requests in each step (the costs are priced among them: CostTable.at_batch); a step waits
        # for every one's host time, so it goes on the clock this many times
        self.batch = batch
        self.drafting = drafting  # a peer's drafter's device cost, priced beside each pass that verifies a draft
        self.drafting_s = 0.0  # the modelled seconds it added
        # an accelerator's costs: the loop builds its proposer beside the prefill (beside_prefill)
        self.capabilities = replace(self.capabilities, prefill_frees_host=self.capabilities.prefill_frees_host
                                    and costs.prefill_off_host)
        self._prefill_s = 0.0  # the modelled seconds of the last prefill
        self._hidden_s = 0.0  # host time beside the prefill it covered, not yet taken off the next gap
        # [seconds of host work beside prefills, their modelled seconds, the part of the work they
        # covered]: trace_replay.seconds_at_step covers it again at another step time
        self.beside = [0.0, 0.0, 0.0]
        self.passes = 0  # forward passes: steps, score passes, shared passes
        self._since: float | None = None  # wall clock when the last pass returned
        ids = model.prompt_ids + model.cot_ids + model.answer_ids + model.draft_ids + model.forced_end_ids \
            + [token for _, draft in model.earlier_drafts for token in draft]
        self.eos_id = max(ids + model.answer_prefix_ids + [0]) + 1  # a token the row never holds
        self.never_id = self.eos_id + 1  # a token the model never predicts (wrong span tokens)
        self.vocab_size = self.never_id + 4
        self.eos_ids = frozenset({self.eos_id})
        # tokens of the replay's own whose text ends a stage as the run's last token of it did
        end_text = {"natural": REPLAY_FORMAT.end, "answer_stop": REPLAY_FORMAT.answer_stop,
                    "repetition": "\n" * (model.repetition_stop + 1)}
        self._text = {self.never_id + 1: end_text["natural"], self.never_id + 2: end_text["answer_stop"],
                      self.never_id + 3: end_text["repetition"]}
        # a natural end marker keeps its own id where it is the CoT's only one (what the proposers see
        # and the earlier responses hold is the text's, as on vLLM): its text ends the CoT
        end_id = model.cot_ids[-1] if model.cot_end == "natural" and model.cot_ids \
            and model.cot_ids.count(model.cot_ids[-1]) == 1 else self.never_id + 1
        self._text[end_id] = end_text["natural"]
        self.cot = _with_last(model.cot_ids, {"natural": end_id, "repetition": self.never_id + 3}.get(model.cot_end))
        self.answer = _with_last(model.answer_ids, {"answer_stop": self.never_id + 2, "repetition": self.never_id + 3}
                                 .get(model.stop))
        # fork point -> what the child forked there writes (a token equal to the answer's at its place
        # stands as the answer's own: the same end-of-stage token where the answer's last one is replaced)
        written = [*model.earlier_drafts, *([(model.draft_forked_at, model.draft_ids)]
                                            if model.draft_forked_at is not None else [])]
        self.drafts = {forked_at: [self.answer[i] if i < len(self.answer) and token == model.answer_ids[i] else token
                                   for i, token in enumerate(draft)] for forked_at, draft in written}
        self.seconds = 0.0  # the modelled clock
        self._prompt_len = len(model.prompt_ids)
        self._forced = model.forced_end_ids + model.answer_prefix_ids  # fed after a forced end
        self._tokens: dict[int, list[int]] = {}  # sequence -> tokens held
        self._forked_at: dict[int, int] = {}  # child -> CoT tokens of the parent when it forked
        self._next = 0

    # -- the clock and the text side --------------------------------------------------------

    def clock(self) -> float:
        self._catch_up()
        return self.seconds

    def pass_clock(self) -> float:
        """The clock less the loop's host time on it: what a stopwatch around each engine call
        sees (a figure per pass goes on the clock inside the next call, which a real call never holds)."""
        return self.seconds - (self.host_s * self.batch if self.host is not None else 0.0)

    def tokenize(self, text: str, add_bos: bool = False) -> list[int]:
        known = {REPLAY_FORMAT.forced_end: self.model.forced_end_ids,
                 REPLAY_FORMAT.answer_prefix: self.model.answer_prefix_ids}
        return list(known.get(text, []))

    def token_bytes(self, token_id: int) -> bytes:
        return self._text.get(token_id, "").encode()

    # -- sequences ----------------------------------------------------------------------------

    def prefill(self, token_ids: Sequence[int]) -> int:
        reused = self.prefix.take(token_ids)  # fed already, by the deployment's last request
        self._prefill_s = self.costs.prefill(len(token_ids) - reused, reused)
        self.seconds += self._prefill_s
        seq = self._new(list(token_ids), None)
        self._since = time.perf_counter()  # the request's setup till its first pass is host time too
        return seq

    def beside_prefill(self, seconds: float) -> float:
        """The loop's `seconds` of host work ran beside the last prefill: the part its modelled
        seconds cover (returned) comes off the host time measured till the next call."""
        covered = min(seconds, self._prefill_s)
        self._hidden_s += covered
        self.beside = [self.beside[0] + seconds, self.beside[1] + self._prefill_s, self.beside[2] + covered]
        return covered

    def fork(self, seq: int) -> int:
        self._begin(is_pass=False)  # an engine call (a KV-cache operation), not the loop's host time
        cot_tokens = len(self._tokens[seq]) + 1 - len(self.model.prompt_ids)  # the pending token counts
        forked = self._new(list(self._tokens[seq]), cot_tokens)
        self._since = time.perf_counter()
        return forked

    def step(self, batch: Sequence[tuple[int, int]], ids: bool = False, banned=None) -> np.ndarray:
        """Rows [n, vocab], or with ids the predicted tokens [n] (the row's model writes no
        banned token: `banned` changes nothing)."""
        self._begin()
        context = sum(len(self._tokens[seq]) for seq, _ in batch) // len(batch)
        self.seconds += self.costs.step(len(batch), context)
        out = [self._feed(seq, [token])[0] for seq, token in batch]
        self._since = time.perf_counter()
        return self._as(out, ids)

    def score(self, seq: int, token_ids: Sequence[int], ids: bool = False, banned=None) -> np.ndarray:
        self._begin()
        self._priced(self.costs.score(len(token_ids), len(self._tokens[seq])), len(token_ids), len(self._tokens[seq]))
        out = self._feed(seq, token_ids)
        self._since = time.perf_counter()
        return self._as(out, ids)

    def score_batch(self, feeds: Sequence[tuple[int, Sequence[int]]], ids: bool = False,
                    banned=None) -> list[np.ndarray]:
        """One pass over every feed: priced as a score pass over all their tokens, at least a
        batched step of that many sequences (the cost tables measure one sequence's passes)."""
        self._begin()
        context = sum(len(self._tokens[seq]) for seq, _ in feeds) // len(feeds)
        total = sum(len(tokens) for _, tokens in feeds)
        self.seconds += max(self.costs.score(total, context), self.costs.step(len(feeds), context))
        out = [self._as(self._feed(seq, token_ids), ids) for seq, token_ids in feeds]
        self._since = time.perf_counter()
        return out

    def _priced(self, pass_s: float, tokens: int, context: int) -> None:
        """A pass of `tokens` for one sequence on the clock, with the peer's drafting where it
        verifies a draft (more than the one token a plain step feeds)."""
        drafted = self.drafting.seconds(pass_s, tokens, context) if self.drafting is not None and tokens > 1 else 0.0
        self.drafting_s += drafted
        self.seconds += pass_s + drafted

    def _begin(self, is_pass: bool = True) -> None:
        """A pass (or another engine call) starts: the loop's time since the engine last returned
        is host time (on the clock with `host`)."""
        self.passes += is_pass
        if isinstance(self.host, (int, float)):
            if is_pass:
                self.host_s += self.host
                self.seconds += self.host * self.batch
        else:
            self._catch_up()

    def _catch_up(self) -> None:
        """The loop's time since the engine last returned (or the clock was last read) counted as
        host time, so that a time the loop reads from the clock holds its own host time so far."""
        if self._since is None or isinstance(self.host, (int, float)):
            return
        now = time.perf_counter()
        gap, self._since = now - self._since, now
        gap, self._hidden_s = gap - min(gap, self._hidden_s), 0.0  # (the loop built after the prefill returned)
        self.host_s += gap
        if self.host == "measured":
            self.seconds += gap * self.batch

    def _feed(self, seq: int, token_ids: Sequence[int]) -> list[int]:
        """Append tokens to seq; the token predicted after each."""
        tokens, out = self._tokens[seq], []
        for token in token_ids:
            tokens.append(token)
            out.append(self._predict(seq))
        return out

    def _as(self, predicted: list[int], ids: bool) -> np.ndarray:
        """Predicted tokens as ids [n], or as rows [n, vocab] putting each first."""
        if ids:
            return np.asarray(predicted, dtype=np.int64)
        rows = np.full((len(predicted), self.vocab_size), -30.0, dtype=np.float32)  # [n, vocab]
        rows[np.arange(len(predicted)), predicted] = 30.0
        return rows

    def truncate(self, seq: int, length: int) -> None:
        del self._tokens[seq][length:]

    def release(self, seq: int) -> None:
        self._begin(is_pass=False)
        del self._tokens[seq]
        self._forked_at.pop(seq, None)
        self._since = time.perf_counter()

    def length(self, seq: int) -> int:
        return len(self._tokens[seq])

    def live_sequences(self) -> int:
        return len(self._tokens)

    def _new(self, tokens: list[int], forked_at: int | None) -> int:
        self._next += 1
        self._tokens[self._next] = tokens
        if forked_at is not None:
            self._forked_at[self._next] = forked_at
        return self._next

    # -- the model ------------------------------------------------------------------------------

    def _predict(self, seq: int) -> int:
        """The token the row's model wrote after this sequence's tokens (EOS where unknown)."""
        model, tokens = self.model, self._tokens[seq]
        output_len = len(tokens) - self._prompt_len
        if seq in self._forked_at and self._is_child(seq):  # a child: CoT[:b] + forced end + answer prefix + draft
            draft = self.drafts.get(self._forked_at[seq])
            if draft is None:  # a child where no recorded child forked: it ends at once
                return self.eos_id
            written = output_len - self._forked_at[seq] - len(self._forced)
            return _at(draft, written, self.eos_id)
        if output_len < len(self.cot) or (output_len == len(self.cot) and model.cot_end == "eos"):
            return _at(self.cot, output_len, self.eos_id)  # past the CoT: the EOS that ended it
        after = self._prompt_len + len(self.cot)  # where the forced tokens start
        for forced in (self._forced, model.answer_prefix_ids):
            if output_len - len(self.cot) >= len(forced) and tokens[after: after + len(forced)] == forced:
                return _at(self.answer, output_len - len(self.cot) - len(forced), self.eos_id)
        return self.eos_id  # inside the forced tokens: not read by the loop

    def _is_child(self, seq: int) -> bool:
        """A fork is a draft child when the forced end follows its fork point (the loop feeds a
        child pending + forced end + answer prefix first) where the CoT does not go on so itself;
        else a branch of the parent (several candidate spans verified in one pass), whose tokens
        follow the parent's path: a span that copies the end marker where the CoT ends with it is
        the parent's own end, and the answer follows it."""
        at, forced = self._forked_at[seq], self._forced
        start = self._prompt_len + at
        return self._tokens[seq][start: start + len(forced)] == forced and self.cot[at: at + len(forced)] != forced


class ChainReplayEngine(ReplayEngine):
    """What vLLM runs (`ssr traces --candidates chain`): one sequence a request, its spans drafted
    as vLLM's drafter drafts them (Capabilities.drafts_per_step; the parity test:
    tests/test_chain_parity.py)."""

    # vLLM's drafter meets a request after its prefill's step (the request's proposer is built then,
    # engines/vllm_drafter.py), so nothing runs beside a prefill
    capabilities = replace(ReplayEngine.capabilities, drafts_per_step=True, prefill_frees_host=False)

    def __init__(self, model: RowModel, costs: CostTable, **kwargs) -> None:
        super().__init__(model, costs, **{"max_sequences": 1, **kwargs})


class TreeReplayEngine(TokenListTree, ReplayEngine):
    """The replay engine with tree attention (tree.py): several candidate spans verified as one
    token tree on the parent in one pass, priced as a score pass over the tree's nodes (no fork
    each, nor a batched step of that many sequences)."""

    capabilities = replace(ReplayEngine.capabilities, tree_attention=True)

    def score_tree(self, seq: int, token_ids: Sequence[int], parents: Sequence[int], ids: bool = False,
                   banned=None) -> np.ndarray:
        """A token tree after seq's tokens in one pass (tree attention, tree.TokenTree): priced as a
        score pass over its nodes; the prediction after each node [n] (or rows [n, vocab])."""
        self._begin()
        tokens = self._tokens[seq]
        base = len(tokens)
        self._priced(self.costs.score(len(token_ids), base), len(token_ids), base)
        out = []
        for node, (token, parent) in enumerate(zip(token_ids, parents)):
            if parent != node - 1:  # a new branch: the sequence, then the node's ancestors
                del tokens[base:]
                while parent >= 0:
                    tokens.insert(base, token_ids[parent])
                    parent = parents[parent]
            tokens.append(token)  # (a child of the node before: its path goes on)
            out.append(self._predict(seq))
        del tokens[base:]
        self._hold_tree(seq, token_ids)
        self._since = time.perf_counter()
        return self._as(out, ids)


def _with_last(tokens: list[int], last: int | None) -> list[int]:
    return tokens[:-1] + [last] if tokens and last is not None else list(tokens)


def _at(tokens: list[int], index: int, default: int) -> int:
    return tokens[index] if 0 <= index < len(tokens) else default
