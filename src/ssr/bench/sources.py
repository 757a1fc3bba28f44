"""Where accepted tokens come from: each token a verify pass accepted is attributed to the
first text that holds the n-gram ending at it (the token and the NGRAM - 1 before it).

Answer tokens: the draft's accepted prefix first; span tokens then to `prompt`, `cot`,
`draft` (only in the draft: what drafting alone adds), `answer` (the answer's own earlier
text), else `other`. CoT span tokens: `cot:prompt`, `cot:cot` (the CoT's own earlier text),
else `cot:other`. Used by `ssr report` (the sources table) to tell where SSR's draft earns
its keep and where copying from the prompt decides the race.
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict

NGRAM = 4
ANSWER_SOURCES = ("draft prefix", "prompt", "cot", "draft", "answer", "other")
COT_SOURCES = ("cot:prompt", "cot:cot", "cot:other")


def _ngrams(tokens: list[int]) -> set[tuple[int, ...]]:
    return {tuple(tokens[i : i + NGRAM]) for i in range(len(tokens) - NGRAM + 1)}


def _first_ends(tokens: list[int]) -> dict[tuple[int, ...], int]:
    """n-gram -> index of the token that ends its first occurrence in `tokens`."""
    first: dict[tuple[int, ...], int] = {}
    for end in range(NGRAM - 1, len(tokens)):
        first.setdefault(tuple(tokens[end - NGRAM + 1 : end + 1]), end)
    return first


def accepted_sources(row: dict) -> Counter:
    """Accepted tokens of one bench row by source (see the module docstring)."""
    counts: Counter = Counter()
    metrics, trace = row["metrics"], row.get("trace", [])
    prompt, cot, answer, draft = row["prompt_ids"], row["cot_ids"], row["answer_ids"], row.get("draft_ids", [])
    counts["draft prefix"] = metrics.get("accepted_prefix_tokens", 0)
    texts = {"prompt": _ngrams(prompt), "cot": _ngrams(cot), "draft": _ngrams(draft)}
    own_first = {"span": _first_ends(answer), "cot_span": _first_ends(cot)}  # the output's own earlier text
    for event in trace:
        if "at" not in event or not event["accepted"]:
            continue
        if event["kind"] == "span":
            output, own, order = answer, "answer", ("prompt", "cot", "draft")
        elif event["kind"] == "cot_span":
            output, own, order = cot, "cot:cot", ("prompt",)
        else:
            continue
        context = (prompt + cot + row.get("forced_ids", [])) if event["kind"] == "span" else prompt  # before the output
        for position in range(event["at"], min(event["at"] + event["accepted"], len(output))):
            window = (context + output[: position + 1])[-NGRAM:]
            gram = tuple(window)
            source = next((name for name in order if gram in texts[name]), None)
            if source is None:
                earlier = own_first[event["kind"]].get(gram, position) < position  # ends before this token
                source = own if earlier else ("other" if own == "answer" else "cot:other")
            elif event["kind"] == "cot_span":
                source = "cot:" + source
            counts[source] += 1
    return counts


def sources_table(rows: list[dict], group_name) -> list[dict]:
    """Per (suite, mode) of the speculating modes: mean accepted tokens per run by source."""
    groups: dict[tuple[str, str], list[Counter]] = defaultdict(list)
    for row in rows:
        speculated = row["mode"] != "ar" or any("at" in event for event in row.get("trace", []))  # vLLM's own
        if speculated and "prompt_ids" in row:  # rows with their tokens
            groups[(group_name(row), row["mode"])].append(accepted_sources(row))
    return [{"suite": suite, "mode": mode, "runs": len(counts),
             **{name: statistics.mean(c[name] for c in counts) for name in ANSWER_SOURCES + COT_SOURCES}}
            for (suite, mode), counts in sorted(groups.items())]
