"""The limit of copy-based speculation (bench/oracle.py, `ssr traces --modes oracle`): the copy
index against brute force, and the oracle replayed: every span it proposes is accepted whole,
and no mode of ssr nor any peer needs fewer passes on the same traces."""
from __future__ import annotations

import random

import pytest

from ssr.bench.oracle import CopyIndex, OracleProposer
from ssr.bench.trace_replay import TRACE_MODES, replay_all
from ssr.bench.traces import load_traces, tokenize_trace
from ssr.verifying.verify import common_prefix
from test_traces import GPU, WordVocab, write_traces

pytestmark = pytest.mark.shared_data  # needs nothing from ../shared: runs from a clone too


def brute_longest(sequences: list[list[int]], tokens: list[int]) -> int:
    """The longest prefix of tokens found inside one of the sequences, by trying every start."""
    best = 0
    for sequence in sequences:
        for start in range(len(sequence)):
            length = 0
            while length < len(tokens) and start + length < len(sequence) and \
                    sequence[start + length] == tokens[length]:
                length += 1
            best = max(best, length)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_copy_index_finds_the_longest_copy_brute_force_finds(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])  # small alphabets: many repeats, many splits
    index, sequences = CopyIndex(), []
    for _ in range(rng.randrange(1, 4)):  # several sequences, each extended in pieces
        index.start()
        sequences.append([])
        for _ in range(rng.randrange(1, 5)):
            piece = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 12))]
            index.extend(piece)
            sequences[-1].extend(piece)
            for _ in range(8):
                query = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 14))]
                assert index.longest(query) == brute_longest(sequences, query), (sequences, query)


def test_no_copy_runs_across_two_sequences():
    index = CopyIndex()
    index.extend([1, 2])
    index.start()
    index.extend([3, 4])
    assert index.longest([2, 3]) == 1 and index.longest([3, 4]) == 2 and index.longest([1, 2, 3]) == 2


def test_the_oracle_proposes_the_longest_copy_of_what_comes_next():
    oracle = OracleProposer(prompt=[7, 8, 9, 7, 8], future=[9, 7, 5, 7, 8, 9], earlier=[[5, 7, 8, 9, 1]], max_span=4)
    assert oracle.propose(10)[0] == [9, 7]  # 9 7 is in the prompt; 9 7 5 nowhere
    oracle.observe([9, 7])
    assert oracle.propose(10)[0] == [5, 7, 8, 9]  # an earlier response holds it, capped at max_span
    assert oracle.propose(2)[0] == [5, 7]  # and at the room given
    oracle.observe([5, 7, 8, 9])
    assert oracle.propose(10) == ([], None) and oracle.candidates(10) == []  # nothing comes next


def brute_anchored(sequences: list[list[int]], tail: list[int], ahead: list[int]) -> int:
    """The longest prefix of `ahead` found inside one of the sequences right after an earlier
    occurrence of `tail` (the last sequence ends with the context's own, which has nothing after it)."""
    best = 0
    for sequence in sequences:
        for start in range(len(sequence) - len(tail) + 1):
            if sequence[start: start + len(tail)] != tail:
                continue
            after = sequence[start + len(tail):]
            best = max(best, common_prefix(after, ahead))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_the_anchored_oracle_copies_only_after_the_context_s_last_token(seed):
    """Step by step through a random output: the anchored oracle's span is the longest copy that
    follows an earlier occurrence of the context's last token(s) (brute force), never longer than
    the plain oracle's."""
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])
    anchor = rng.choice([1, 1, 2])
    earlier = [[rng.randrange(alphabet) for _ in range(rng.randrange(0, 10))] for _ in range(rng.randrange(0, 3))]
    prompt = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 12))]
    future = [rng.randrange(alphabet) for _ in range(20)]
    plain = OracleProposer(prompt, future, earlier, max_span=6)
    anchored = OracleProposer(prompt, future, earlier, max_span=6, anchor=anchor)
    context = list(prompt)
    for seen in range(len(future)):
        ahead = future[seen: seen + 6]
        tail = context[-anchor:] if len(context) >= anchor else None
        expected = brute_anchored(earlier + [context], tail, ahead) if tail is not None else 0
        span, _ = anchored.propose(10)
        assert span == ahead[:expected], (earlier, context, ahead)
        assert len(span) <= len(plain.propose(10)[0])
        for proposer in (plain, anchored):
            proposer.observe([future[seen]])
        context.append(future[seen])


def test_the_oracle_is_accepted_whole_and_no_mode_needs_fewer_passes(tmp_path):
    """Every copy-based proposer's accepted span is a copy from the context, so it is at most the
    oracle's at that position; taking the longest each pass needs the fewest passes (what can be
    copied from position i + 1 is at least what could from i, less one)."""
    vocab = WordVocab()
    tokens = [tokenize_trace(t, vocab) for t in load_traces([write_traces(tmp_path / "s.jsonl.gz", count=4)])]
    rows = replay_all(tokens, TRACE_MODES, [GPU])
    passes = lambda m: m["decode_steps"] + m["cot_passes"] + m["verify_passes"]  # noqa: E731 (steps include the CoT's)
    by = {(r["order"], r["item"], r["mode"]): r for r in rows}
    for row in rows:
        if row["mode"] == "oracle-anchored":  # a copy after the last token: every peer's, not ssr's commonest tokens
            assert row["identical"] and passes(row["metrics"]) >= passes(by[(row["order"], row["item"], "oracle")]["metrics"])
        if row["mode"] != "oracle":
            continue
        metrics = row["metrics"]
        assert row["identical"] and metrics["cot_passes"] > 0
        assert metrics["cot_accepted_tokens"] == metrics["cot_proposed_tokens"]
        assert metrics["answer_accepted_tokens"] == metrics["answer_proposed_tokens"]
        for mode in TRACE_MODES:
            assert passes(metrics) <= passes(by[(row["order"], row["item"], mode)]["metrics"]), mode
