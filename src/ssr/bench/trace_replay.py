"""Real reasoning traces replayed through the real decoding loop in every mode (`ssr traces`).

A text trace is what a model wrote; the output is the trace whatever the mode (identity is
the check). Each (trace, mode) runs `loop.Generation` on the replay engine (bench/replay.py):
its clock is a cost model (the GPU preset, a calibrate JSON), the loop's own host time between
passes is measured beside it, and the row it leaves has the shape of an `ssr bench` row, so
the bench's report (ratios with bootstrap intervals, CoT and answer ratios, accepted tokens by
source) reads it as it is.

Modes: `ar` (plain decoding), `ssr` (the whole output speculated), `paper` (the paper's
regime: ssr with the CoT decoded plainly; a trace has no draft, so its answer spans only),
`oracle` (the limit of copy-based speculation: with hindsight, each pass the longest next stretch
of the trace that the prompt, the output so far or an earlier response holds; bench/oracle.py),
`oracle-anchored` (the same, each copy following an occurrence of the context's last token),
and the peers as their users configure them: `suffix` (vLLM's suffix method, on
arctic-inference's tree, vLLM's defaults and its global tree of earlier responses), `ngram`
(vLLM's ngram method as its docs configure it) and `pld` (transformers' prompt lookup, its
defaults). No draft is forked: a trace holds no draft child's text.

Several candidates a pass: by default the replayed engine has tree attention (replay's
TreeReplayEngine: the candidates as one token tree on the parent, a pass priced by its nodes);
`candidates="forks"` replays what ssr's llama.cpp and transformers adapters do (each candidate
on its own fork, a pass priced as a batch of them); `candidates="chain"` what vLLM verifies (one
draft chain per request per step: the span policy picks one candidate among every source's).

Orders: `cold` (each trace alone: no earlier responses, nothing learnt) and `deployment` (the
file's order within each (set, model) group, the earlier responses cached, the span
statistics carried and the last request's KV kept (a prompt prefills only what it does not
hold: replay.KeptKV), as a server would hold them).
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..config import MODE_TABLE, TRACE_MODES, ConfigError, GenerationConfig
from ..engines.vllm_plugin import DEFAULT_TOKENS
from ..pricing.costs import CostModel, CostTable
from ..loop import Generation
from ..pricing.drafting import PolicyStats
from ..proposing.history import ResponseHistory
from ..proposing.lookup import NgramSettings, vllm_ngram
from .oracle import ORACLES, OracleProposer
from .recorded import DEFAULT_K, RECORDED, RecordedProposer
from .trace_drafts import NO_DRAFT, DraftChoice, draft_plan  # noqa: F401 (NO_DRAFT: the loop tests' plan)
from .peers import REPLAY_PEERS
from .replay import REPLAY_FORMAT, ChainReplayEngine, KeptKV, ReplayEngine, RowModel, TreeReplayEngine
from .traces import TokenTrace
from .turns import part_runs

RENAMED = {"ngram": "ngram-v1 (vLLM's V1 runner; vllm-ngram is its default runner's rule)"}
ORDERS = ("cold", "deployment")
ON_REQUEST = ("ssr-prefix", "ssr-suffix")  # draft modes replayed when asked (no default: a trace rarely holds drafts)
_BIG = 1 << 16  # budgets no trace reaches: the trace decides where its CoT and answer end
SEQUENCES = 8  # sequences a replayed engine holds at once: a parent and its candidate branches


@dataclass(frozen=True)
class CostSetting:
    name: str  # the row's engine label ("gpu", a calibrate file's stem)
    costs: CostTable
    # requests in each step (`--batch`): the host time of a step is every one's, as vLLM's model
    # runner drafts for the batch's requests one after another (SuffixDecodingProposer.propose and
    # ssr's drafter loop over them), so each pass's host time counts this many times
    batch: int = 1


def mode_config(mode: str) -> GenerationConfig:
    """The generation config a trace is replayed under in `mode` (TRACE_MODES)."""
    if mode in RENAMED:
        raise ConfigError(f"--modes: {mode!r} is now {RENAMED[mode]}")
    if mode not in TRACE_MODES and mode not in RECORDED and mode not in ON_REQUEST:
        raise ConfigError(f"--modes: unknown {mode!r}; choose from {', '.join((*TRACE_MODES, *ON_REQUEST, *RECORDED))}")
    row = MODE_TABLE[mode]  # the oracle and the replay-only peers: a peer's loop (no child), their own proposer
    base = GenerationConfig(mode=row.replays_as or mode, thinking_budget=_BIG, max_answer_tokens=_BIG // 2)
    return base if row.cot_spans else replace(base, cot_spans=False)


CANDIDATES = ("tree", "forks", "chain")  # how the replayed engine verifies several candidates a pass


def replay_trace(tokens: TokenTrace, mode: str, setting: CostSetting, order: str,
                 history: ResponseHistory | None = None, stats: PolicyStats | None = None,
                 host: str | float | None = None, candidates: str = "tree", kept: KeptKV | None = None,
                 ngram: NgramSettings | None = None, recorded_k: int = DEFAULT_K,
                 drafts: DraftChoice = DraftChoice(), budgets: tuple[int, ...] = (),
                 draft_tokens: int | None = None) -> dict:
    """One trace in one mode -> a bench-shaped row (metrics on the modelled clock, the loop's
    host time measured apart under "host", identity to the trace). candidates: "tree" (an
    engine with tree attention: several candidates as one token tree, a pass priced by its
    nodes), "forks" (each candidate on its own fork, a pass priced as a batch of them: how
    ssr's llama.cpp and transformers adapters verify them) or "chain" (one candidate a pass, as
    vLLM verifies one draft chain per request per step: ssr's drafter there). kept: the KV the
    deployment's server holds from its last request (prefix caching; None: a cold server); it
    holds this request's prompt and output afterwards. ngram: the `ngram-v1` peer's settings
    (None: vLLM's docs' example); recorded_k: the recorded modes' draft tokens a step. drafts: which
    recorded draft children fork (bench/trace_drafts.py); budgets: the budgets the trace's set records;
    draft_tokens: m, the tokens a child writes at most (None: the mode's)."""
    trace = tokens.trace
    end = tokens.cot_ids[-1:]  # the end-of-thinking token, forced where a CoT would not end
    config = mode_config(mode)
    if draft_tokens is not None:
        config = replace(config, draft_tokens=draft_tokens)
    if candidates == "chain" and tokens.drafts and MODE_TABLE[mode].drafts and drafts.how != "none":
        raise ConfigError("--candidates chain replays vLLM's drafter, whose draft children are requests of their "
                          "own the replay does not run: give --drafts none, or --candidates tree or forks")
    plan, draft_fields = draft_plan(tokens, mode, config, drafts, CostModel(table=setting.costs),
                                    stats if stats is not None else PolicyStats(), budgets, candidates != "chain")
    model = RowModel(prompt_ids=tokens.prompt_ids, cot_ids=tokens.cot_ids, answer_ids=tokens.answer_ids,
                     forced_end_ids=end, answer_prefix_ids=[], **{"draft_ids": [], "draft_forked_at": None,
                                                                  **draft_fields})
    if not tokens.cot_ids:  # an output with no CoT (a model that does not reason): all answer
        config = replace(config, thinking_budget=0, draft_at=0)
    if candidates == "chain" and mode not in REPLAY_PEERS:  # ssr's drafter's longest chain (the oracles' too)
        config = replace(config, suffix=replace(config.suffix, max_span=DEFAULT_TOKENS))
    proposer = _proposer(tokens, mode, config, history, ngram, recorded_k)
    tree = candidates == "tree" or (proposer is not None and proposer.shape.tree)  # a peer's engine verifies its tree
    engine_class = TreeReplayEngine if tree else ChainReplayEngine if candidates == "chain" else ReplayEngine
    drafter = RECORDED[mode].drafter if mode in RECORDED else "ngram" if mode == "ngram-v1" else None
    engine = engine_class(model, setting.costs, host=host, max_sequences=1 if candidates == "chain" else SEQUENCES,
                          kept=kept, batch=setting.batch, drafting=setting.costs.drafting.get(drafter))
    if isinstance(proposer, RecordedProposer):
        proposer.wrong = engine.never_id  # a rejected draft token: one the replayed model never writes
    started = time.perf_counter()
    generation = Generation(engine, REPLAY_FORMAT, config, tokens.prompt_ids, costs=CostModel(table=setting.costs),
                            stats=stats, plan=plan, history=history, proposer=proposer, views=tokens.views)
    result = generation.run()
    wall_s = time.perf_counter() - started
    identical = result.cot_ids == engine.cot and result.answer_ids == engine.answer
    if kept is not None:
        kept.tokens = tokens.prompt_ids + tokens.cot_ids + tokens.answer_ids
    return {"suite": f"{trace.group} ({order})", "item": trace.item, "repeat": 0, "mode": mode,
            "engine": setting.name, "order": order, "metrics": result.metrics.as_dict(),
            "prompt_ids": tokens.prompt_ids, "cot_ids": engine.cot, "answer_ids": engine.answer,
            "draft_ids": result.draft_ids, "forced_ids": result.forced_ids, "trace": result.trace, "identical": identical,
            "drafts": drafts.label, "plan": plan.as_dict(),
            "host": {"s": engine.host_s, "passes": engine.passes, "wall_s": wall_s, "on_clock": host,
                     "beside_prefill": engine.beside},
            **({"drafting_s": engine.drafting_s} if engine.drafting is not None else {}),
            "step_s": setting.costs.step(1), "candidates": candidates, "batch": setting.batch,
            **({"turn": trace.turn, "parts": part_runs(tokens.answer_parts)} if trace.turn or tokens.answer_parts
               else {})}


def _proposer(tokens: TokenTrace, mode: str, config: GenerationConfig, history: ResponseHistory | None,
              ngram: NgramSettings | None, recorded_k: int):
    """The proposer a replay-only mode brings (None: the loop's own for the mode)."""
    if mode in ORACLES:
        return OracleProposer(tokens.prompt_ids, tokens.cot_ids + tokens.answer_ids,
                              history.responses if history is not None else (), config.suffix.max_span,
                              ORACLES[mode], len(tokens.cot_ids))
    if mode in REPLAY_PEERS:
        return REPLAY_PEERS[mode](tokens.prompt_ids, history)
    if mode in RECORDED:
        kind = RECORDED[mode]
        acc_len = dict(tokens.trace.acceptance).get(kind.record)
        if acc_len is None:
            raise ConfigError(f"--modes {mode}: trace {tokens.trace.item!r} of {tokens.trace.set} holds no "
                              f"acc_{kind.record} (a GPU run's recorded acceptance)")
        return RecordedProposer(tokens.cot_ids + tokens.answer_ids, acc_len, recorded_k, wrong=-1,
                                drafts_always=kind.drafts_always, name=mode)
    if mode == "ngram-v1" and ngram is not None:
        return vllm_ngram(tokens.prompt_ids, ngram)
    return None


def replay_all(traces: Sequence[TokenTrace], modes: Sequence[str], settings: Sequence[CostSetting],
               orders: Sequence[str] = ORDERS, host: str | float | None = None, progress: bool = False,
               candidates: str = "tree", ngram: NgramSettings | None = None,
               recorded_k: int = DEFAULT_K, drafts: DraftChoice = DraftChoice(),
               draft_tokens: int | None = None) -> list[dict]:
    """Every trace in every mode, order and cost setting. Deployment order keeps one response
    history, one set of learnt span statistics and one server's kept KV (prefix caching) per
    (group, mode, setting), in file order."""
    from tqdm import tqdm

    for mode in modes:
        mode_config(mode)  # unknown modes fail before any replay
    histories: dict[tuple, ResponseHistory] = defaultdict(ResponseHistory)
    learnt: dict[tuple, PolicyStats] = defaultdict(PolicyStats)
    kept: dict[tuple, KeptKV] = defaultdict(KeptKV)
    budgets: dict[str, set[int]] = defaultdict(set)  # per group: the draft budgets its traces record
    for tokens in traces:
        budgets[tokens.trace.group].update(draft.budget_tokens for draft in tokens.trace.drafts)
    jobs = [(order, setting, tokens, mode) for order in orders for setting in settings
            for tokens in traces for mode in modes]
    rows = []
    for order, setting, tokens, mode in tqdm(jobs, unit="replay", disable=not progress, dynamic_ncols=True):
        key = (tokens.trace.group, mode, setting.name)
        deployed = order == "deployment"
        rows.append(replay_trace(tokens, mode, setting, order, histories[key] if deployed else None,
                                 learnt[key] if deployed else PolicyStats(), host, candidates,
                                 kept[key] if deployed else None, ngram, recorded_k, drafts,
                                 tuple(sorted(budgets[tokens.trace.group])), draft_tokens))
    return rows


def seconds_at_step(row: dict, step_ms: float) -> float:
    """A row's seconds with the cost table scaled so a step takes step_ms, and the loop's host
    time added once: where the replay put it on the modelled clock (`--host-time`) it is taken out
    before the scaling (host time is absolute) and added back after. Among `batch` requests a step
    waits for every one's host time (CostSetting.batch): the row's counts that many times. Host
    work that ran beside the prefill is covered again by the prefill's seconds at step_ms."""
    batch, scale = row.get("batch", 1), (step_ms / 1e3) / row["step_s"]
    host_s = row["host"]["s"] * batch
    modelled_s = row["metrics"]["total_s"] - (host_s if row["host"].get("on_clock") is not None else 0.0)
    beside, prefill_s, covered = row["host"].get("beside_prefill", (0.0, 0.0, 0.0))
    return modelled_s * scale + host_s + (covered - min(beside, prefill_s * scale, covered)) * batch


def pass_table(rows: list[dict], step_ms: float = 6.0) -> list[dict]:
    """Per (suite, engine, mode): output tokens per forward pass in the CoT and the answer, the
    loop's host milliseconds per pass, and the median ratio to `ar` with the host time added at
    a step of `step_ms` (the cost table scaled so a step takes step_ms)."""
    import statistics

    ar = {(r["suite"], r["engine"], r["item"]): r for r in rows if r["mode"] == "ar"}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["suite"], row["engine"], row["mode"])].append(row)
    table = []
    for (suite, engine, mode), group in sorted(groups.items()):
        cot_passes = sum(r["metrics"]["cot_steps"] + r["metrics"]["cot_passes"] for r in group)
        # + the pass that closes the CoT and gives the first answer token (one chain a pass after a
        # CoT that ended itself, as vLLM drafts: an answer pass of its own, counted, or the CoT's last)
        answer_passes = sum(r["metrics"]["decode_steps"] - r["metrics"]["cot_steps"] + r["metrics"]["verify_passes"]
                            + (r.get("candidates") != "chain" or r["metrics"]["forced_tokens"] > 0) for r in group)
        ratios = [seconds_at_step(r, step_ms) / seconds_at_step(ar[(suite, engine, r["item"])], step_ms) for r in group
                  if (suite, engine, r["item"]) in ar]
        table.append({
            "suite": suite, "engine": engine, "mode": mode, "runs": len(group),
            "cot_per_pass": sum(r["metrics"]["cot_tokens"] for r in group) / max(1, cot_passes),
            "answer_per_pass": sum(r["metrics"]["answer_tokens"] for r in group) / max(1, answer_passes),
            "host_ms_per_pass": 1e3 * sum(r["host"]["s"] for r in group) / max(1, sum(r["host"]["passes"] for r in group)),
            "wall_s": sum(r["host"]["wall_s"] for r in group),
            "ratio_at_step": statistics.median(ratios) if ratios else None,
            "worst_at_step": max(ratios) if ratios else None,
            "identical": sum(bool(r["identical"]) for r in group),
        })
    return table


def format_pass_table(table: list[dict], step_ms: float, markdown: bool = False) -> str:
    from .report import render_table

    columns = ["suite", "mode", "engine", "runs", "CoT tok/pass", "answer tok/pass", "host ms/pass",
               f"ratio @{step_ms:g} ms + host", "worst", "replay s", "identical"]
    lines = [[t["suite"], t["mode"], t["engine"], str(t["runs"]), f"{t['cot_per_pass']:.2f}",
              f"{t['answer_per_pass']:.2f}", f"{t['host_ms_per_pass']:.3f}",
              "-" if t["ratio_at_step"] is None else f"{t['ratio_at_step']:.3f}",
              "-" if t["worst_at_step"] is None else f"{t['worst_at_step']:.3f}",
              f"{t['wall_s']:.1f}", f"{t['identical']}/{t['runs']}"] for t in table]
    return render_table(columns, lines, markdown)


PEERS = ("suffix", "ngram-v1", "pld", *REPLAY_PEERS)  # the peers, as their users run them; `paper` is a reference row


def headline_table(rows: list[dict], step_ms: float = 6.0) -> list[dict]:
    """Per (suite, engine): each mode's median ratio to `ar` on the modelled clock, `ssr` against
    the best peer, `ssr`'s worst trace, and `ssr` and the best peer with host time at step_ms."""
    import statistics

    from .report import item_ratios

    ratios = item_ratios(rows)  # (suite [engine], mode) -> {item: ratio}
    passes = {(t["suite"], t["engine"], t["mode"]): t for t in pass_table(rows, step_ms)}
    table = []
    for suite, engine in sorted({(r["suite"], r["engine"]) for r in rows}):
        group = f"{suite} [{engine}]" if engine != "llama.cpp" else suite
        median = {mode: statistics.median(items.values()) for (name, mode), items in ratios.items() if name == group}
        peers = [mode for mode in PEERS if mode in median]
        best = min(peers, key=median.get) if peers else None
        ssr = ratios.get((group, "ssr"), {})
        table.append({"suite": suite, "engine": engine, "ratios": median, "best_peer": best,
                      "ssr_vs_best": median["ssr"] / median[best] if best and "ssr" in median else None,
                      **{f"ssr_vs_{oracle}": median["ssr"] / median[oracle] if "ssr" in median and oracle in median
                         else None for oracle in ORACLES},
                      "ssr_worst": max(ssr.values()) if ssr else None,
                      "at_step": {mode: passes[(suite, engine, mode)]["ratio_at_step"]
                                  for mode in median if (suite, engine, mode) in passes}})
    return table


def format_headline(table: list[dict], step_ms: float, markdown: bool = False) -> str:
    from .report import MODE_ORDER, render_table

    modes = [m for m in MODE_ORDER if m != "ar" and any(m in t["ratios"] for t in table)]
    oracles = [oracle for oracle in ORACLES if any(t[f"ssr_vs_{oracle}"] is not None for t in table)]

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    columns = ["suite", "engine"] + modes + ["ssr / best peer"] + [f"ssr / {oracle}" for oracle in oracles] \
        + ["ssr worst", f"ssr @{step_ms:g} ms + host", f"best peer @{step_ms:g} ms + host"]
    lines = [[t["suite"], t["engine"]] + [cell(t["ratios"].get(m)) for m in modes]
             + [cell(t["ssr_vs_best"])] + [cell(t[f"ssr_vs_{oracle}"]) for oracle in oracles]
             + [cell(t["ssr_worst"]), cell(t["at_step"].get("ssr")), cell(t["at_step"].get(t["best_peer"]))]
             for t in table]
    return render_table(columns, lines, markdown)
