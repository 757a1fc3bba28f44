"""What ssr's one chain a pass picks, against what its candidates held, per (set, model) group.

How often the pick's first token is right, how often some candidate's is, and whether a ranker
with more of the context to go on picks better.

`ssr traces --candidates chain` verifies one candidate a pass, as vLLM does. Each pass here is
replayed as there (GPU preset), and every candidate the sources offered is kept beside the span
policy's pick and the text the model wrote next. The ranker is a logistic regression over each
distinct first token of the pass's candidates: the span policy's own chance for it (its
sources' first-token chances pooled, span_policy.pooled_probs) and, for the context's last 1..6
tokens, how often that token followed them, whether it was their commonest and their latest
follower, and how long ago it last did. It is fitted on the other groups and tested on each
(leave one group out), so it is what such features can tell on text they were not fitted to.

    python scripts/chain_picks.py ../shared/traces/*.dev.jsonl.gz --limit 6 [--orders deployment]
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import Counter, defaultdict

import numpy as np

from ssr.config import ConfigError
from ssr.bench.trace_replay import CostSetting, replay_trace
from ssr.bench.traces import tokenized_traces
from ssr.loop.candidates import CandidatePass
from ssr.pricing.costs import gpu_preset
from ssr.pricing.drafting import PolicyStats
from ssr.pricing.span_policy import pooled_probs
from ssr.proposing.history import ResponseHistory
from ssr.verifying.verify import common_prefix

ORDERS = 6  # the context n-grams the ranker reads: its last 1 .. ORDERS tokens


def record(tokens, order: str, history, learnt) -> list[dict]:
    """Every chain pass of one ssr replay: where it was (output tokens written before its span, the
    pending token the pass feeds among them), each candidate (its span and its source's
    acceptance curve S(1) .. S(length)) and the pick, read from CandidatePass.propose."""
    passes = []
    original = CandidatePass.propose

    def propose(self, proposer, room, policy):
        asked = _Asked(proposer) if proposer is not None else None
        chosen = original(self, asked, room, policy)
        if chosen and asked.found:
            at = self.seqs.length(self.seqs.parent) - len(tokens.prompt_ids) + 1  # the pending token is written
            passes.append({"at": at, "picked": chosen[0][1], "spans": [span for _, span in asked.found],
                           "curves": [policy.stats[source].probs(len(span)) for source, span in asked.found]})
        return chosen

    CandidatePass.propose = propose
    try:
        replay_trace(tokens, "ssr", CostSetting("gpu", gpu_preset()), order, history, learnt, candidates="chain")
    finally:
        CandidatePass.propose = original
    return passes


class _Asked:
    """A request's proposer, keeping the candidates it was asked for (the pass asks once)."""

    def __init__(self, proposer) -> None:
        self.proposer, self.found = proposer, []

    def candidates(self, room):
        self.found = self.proposer.candidates(room)
        return self.found


def features(passes: list[dict], text: list[int], prompt: int) -> list[tuple[list[float], bool, bool, int]]:
    """(features, right, picked, the pass's index) of each distinct first token of each pass (see
    the module's text)."""
    follows = [defaultdict(Counter) for _ in range(ORDERS + 1)]  # [k]: last k tokens -> what came next
    latest = [dict() for _ in range(ORDERS + 1)]  # [k]: last k tokens -> the latest token after them
    when = [dict() for _ in range(ORDERS + 1)]  # [k]: (last k tokens, token) -> where it last came
    rows, done = [], 1
    for index, each in enumerate(passes):
        at = prompt + each["at"]
        for i in range(done, min(at, len(text))):  # the context up to the pass, indexed
            for k in range(1, min(ORDERS, i) + 1):
                key = tuple(text[i - k:i])
                follows[k][key][text[i]] += 1
                latest[k][key] = text[i]
                when[k][(key, text[i])] = i
        done = max(done, at)
        if at >= len(text):
            continue
        chances = defaultdict(list)
        for span, curve in zip(each["spans"], each["curves"]):
            chances[span[0]].append(curve[0])
        for token, firsts in chances.items():
            row = [1.0 - math.prod(1.0 - c for c in firsts), max(firsts), math.log(len(firsts))]
            for k in range(1, ORDERS + 1):
                key = tuple(text[at - k:at])
                seen = follows[k].get(key)
                count = seen.get(token, 0) if seen else 0
                last = when[k].get((key, token))
                row += [float(bool(seen)), count / sum(seen.values()) if seen else 0.0, math.log1p(count),
                        float(bool(seen) and count == max(seen.values())), float(latest[k].get(key) == token),
                        math.log1p(at - last) if last is not None else 12.0]
            rows.append((row, token == text[at], token == each["picked"][0], index))
    return rows


def ranker(x: np.ndarray, y: np.ndarray, steps: int = 500, rate: float = 0.5) -> tuple:
    """A logistic regression on standardised features, by gradient descent: (weights, mean, scale)."""
    mean, scale = x.mean(0), x.std(0) + 1e-9
    z = (x - mean) / scale
    z = np.hstack([z, np.ones((len(z), 1))])
    weights = np.zeros(z.shape[1])
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ weights, -30, 30)))
        weights -= rate * (z.T @ (p - y) / len(y) + 1e-4 * weights)
    return weights, mean, scale


def right_share(score: np.ndarray, right: np.ndarray, pass_of: np.ndarray) -> float:
    """The share of passes whose highest-scored first token is right."""
    best: dict[int, int] = {}
    for i, each in enumerate(pass_of):
        if each not in best or score[i] > score[best[each]]:
            best[each] = i
    return float(np.mean([right[i] for i in best.values()]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="trace files (.jsonl, .jsonl.gz), as `ssr traces` reads them")
    parser.add_argument("--limit", type=int, default=6, help="traces per (set, model) group")
    parser.add_argument("--orders", choices=("cold", "deployment"), default="cold")
    args = parser.parse_args()
    try:
        traces = tokenized_traces(args.files, limit=args.limit)
    except ConfigError as error:
        print(f"chain_picks: {error}", file=sys.stderr)
        return 2
    deployed = args.orders == "deployment"
    rows: dict[str, list] = defaultdict(list)  # group -> (features, right, picked, pass id)
    accepted: dict[str, Counter] = defaultdict(Counter)  # group -> passes, tokens the pick / best took
    depths = Counter()  # (what, k): over every candidate k tokens long or more, where the text goes that far
    histories, learnt = defaultdict(ResponseHistory), defaultdict(PolicyStats)
    for tokens in traces:
        group = tokens.trace.group
        passes = record(tokens, args.orders, histories[group] if deployed else None,
                        learnt[group] if deployed else PolicyStats())
        output = tokens.cot_ids + tokens.answer_ids
        first_id = accepted[group]["passes"]
        for each in passes:
            truth = output[each["at"]:each["at"] + max(map(len, each["spans"]))]
            accepted[group]["passes"] += 1
            accepted[group]["picked"] += common_prefix(each["picked"], truth)
            accepted[group]["best"] += max(common_prefix(span, truth) for span in each["spans"])
            for span, curve in zip(each["spans"], each["curves"]):
                right = common_prefix(span, truth)
                for k in range(1, min(len(span), len(truth)) + 1):
                    depths["spans", k] += 1
                    depths["predicted", k] += curve[k - 1]
                    depths["right", k] += right >= k
                    depths["reached", k] += right >= k - 1  # its first k - 1 tokens right
        for row, right, picked, index in features(passes, tokens.prompt_ids + output, len(tokens.prompt_ids)):
            rows[group].append((row, right, picked, first_id + index))
        print(f"{group}: {tokens.trace.item}, {len(passes)} passes", file=sys.stderr)
    report(rows, accepted)
    depth_report(depths)
    return 0


DEPTHS = (1, 2, 3, 5, 9, 13, 17, 25, 32)  # the span positions depth_report shows


def depth_report(depths: Counter) -> None:
    """Over every candidate of every pass, where the text goes on that far: its source's predicted
    S(k) (the span policy's curve), the share of them right through token k, and the chance that
    token k is right given the ones before it."""
    print()
    print("| token k of a span | candidates | predicted S(k) | right through k | token k right, given the ones before |")
    print("|---|---|---|---|---|")
    for k in DEPTHS:
        spans = depths["spans", k]
        if spans:
            predicted, right = depths["predicted", k] / spans, depths["right", k] / spans
            print(f"| {k} | {spans} | {predicted:.4f} | {right:.4f} | {depths['right', k] / depths['reached', k]:.2f} |")


def report(rows: dict[str, list], accepted: dict[str, Counter]) -> None:
    """One line a group: the pick's, the ranker's (fitted on the other groups) and the best
    candidate's first token right, a share of passes; tokens accepted a pass, picked and best."""
    print("| set / model | passes | first token right: pick | ranker | some candidate | "
          "accepted a pass: pick | best candidate |")
    print("|---|---|---|---|---|---|---|")
    for group in sorted(rows):
        test = rows[group]
        right = np.array([r[1] for r in test], float)
        pass_of = np.array([r[3] for r in test])
        picked = right_share(np.array([r[2] for r in test], float), right, pass_of)
        some = np.zeros(pass_of.max() + 1)
        np.maximum.at(some, pass_of, right)  # a pass's best: 1 where some candidate's first token is right
        train = [row for other, each in rows.items() if other != group for row in each]
        ranked = "-"  # one group alone: nothing to fit on
        if train:
            weights, mean, scale = ranker(np.array([r[0] for r in train]), np.array([r[1] for r in train], float))
            z = (np.array([r[0] for r in test]) - mean) / scale
            ranked = f"{right_share(np.hstack([z, np.ones((len(z), 1))]) @ weights, right, pass_of):.3f}"
        counts = accepted[group]
        print(f"| {group} | {counts['passes']} | {picked:.3f} | {ranked} | {some[np.unique(pass_of)].mean():.3f} | "
              f"{counts['picked'] / counts['passes']:.3f} | {counts['best'] / counts['passes']:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
