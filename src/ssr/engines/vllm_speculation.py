"""vLLM's own speculation (`--speculative-method suffix|ngram`) inside one request, as trace
events the bench's sources table reads (bench/sources.py): which output tokens vLLM accepted
from its proposer, and from where.

Two readings of the same engine steps:
- vLLM's per-request spec-decode metrics (the engine runs with
  `per_request_spec_decode_metrics="detailed"`): per verify step that had a draft, tokens
  drafted and accepted, in order. Exact counts, no positions; set when the request finishes.
- The output stream: an engine step emits 1 token, or j + 1 after a verify step that accepted
  j drafted tokens (the last the target's own). Positions, but vLLM merges the outputs of
  several steps that a slow reader had not taken yet.
With metrics, the steps are laid over the outputs in order (a verify step goes where the rest
of an output holds it; the last output may cut one short at max_tokens); `aligned` says every
step found its place. Without (an aborted request), an output of n > 1 tokens counts as one
step that accepted n - 1 — a merged output of plain steps is then miscounted.
"""
from __future__ import annotations

from collections.abc import Sequence


def speculation_events(steps: Sequence[int], accepted: Sequence[int] | None, drafted: Sequence[int] | None,
                       kind: str, start: int, used: int, source: str,
                       part: tuple[int, int] | None = None) -> tuple[list[dict], dict]:
    """(trace events, summary) of one request, or of a part of its output (a request that
    wrote the CoT and then the answer is read as two parts).

    steps:    [outputs] new tokens per output, in order (the first holds the prefill's token)
    accepted: [verify steps] drafted tokens vLLM accepted per step that had a draft (None: no metrics)
    drafted:  [verify steps] tokens its proposer drafted per such step
    kind:     the events' kind ("cot_span" for the CoT request, "span" for the answer's)
    start:    position of the request's first output token in the walk's output (CoT or answer)
    used:     output tokens the walk kept (tokens after a stop were decoded but are not counted)
    part:     (first, end) output positions read, the summary counting their verify steps only
    """
    if accepted is None:
        spans = [(position, count - 1, count - 1) for position, count in _outputs(steps) if count > 1]
        aligned = None
    else:
        spans, aligned = _lay_steps(steps, list(accepted), list(drafted or []))
    if part is not None:
        first, end = part
        spans = [(position - first, taken, proposed) for position, taken, proposed in spans if first <= position < end]
        if accepted is not None:  # the part's own verify steps
            accepted, drafted = [span[1] for span in spans], [span[2] for span in spans]
    events = [{"kind": kind, "at": start + position, "source": source, "proposed": proposed,
               "accepted": min(taken, used - position)}
              for position, taken, proposed in spans if position < used and taken > 0]
    summary = {"drafted": sum(drafted) if drafted is not None else None,
               "accepted": sum(accepted) if accepted is not None else None,
               "verify_steps": len(accepted) if accepted is not None else None,
               "accepted_in_output": sum(event["accepted"] for event in events), "aligned": aligned}
    return events, summary


def _outputs(steps: Sequence[int]) -> list[tuple[int, int]]:
    """[(position of the output's first token, its token count)]"""
    positions, position = [], 0
    for count in steps:
        positions.append((position, count))
        position += count
    return positions


def _lay_steps(steps: Sequence[int], accepted: list[int], drafted: list[int]) -> tuple[list[tuple], bool]:
    """([(position, accepted tokens, drafted tokens)] per verify step, whether
    every verify step found its place) - the steps laid over the outputs in order."""
    spans, index = [], 0
    outputs = _outputs(steps)
    for number, (position, count) in enumerate(outputs):
        last = number == len(outputs) - 1
        end = position + count
        while position < end:
            size = accepted[index] + 1 if index < len(accepted) else 0  # the next verify step's tokens
            if index < len(accepted) and (size <= end - position or last):
                taken = min(size, end - position) - 1
                spans.append((position, taken, drafted[index] if index < len(drafted) else taken))
                index += 1
                position += taken + 1
            else:
                position += 1  # a step without a draft: one token
    return spans, index == len(accepted)


def record_speculation(metrics, trace: list[dict], phase: str, request, source: str, start: int, used: int,
                       part: tuple[int, int] | None = None) -> None:
    """One request's speculation into the walk's trace and metrics: engine["speculation"][phase]
    (the summary) and the table's columns (cot_* for the CoT, answer_* for the answer: tokens vLLM
    drafted and accepted, as on the sequence engines). request: engines.vllm.Request; part: its
    output positions read as this phase (one request that wrote both)."""
    stats = request.speculation
    events, summary = speculation_events(
        request.steps, stats.per_step_accepted if stats is not None else None,
        stats.per_step_drafted if stats is not None else None,
        "cot_span" if phase == "cot" else "span", start, used, source, part)
    trace.extend(events)
    metrics.engine.setdefault("speculation", {})[phase] = summary
    drafted = summary["drafted"] if summary["drafted"] is not None else sum(event["proposed"] for event in events)
    if phase == "cot":
        metrics.cot_proposed_tokens, metrics.cot_accepted_tokens = drafted, summary["accepted_in_output"]
    else:
        metrics.answer_proposed_tokens, metrics.answer_accepted_tokens = drafted, summary["accepted_in_output"]
