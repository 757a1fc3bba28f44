"""The recency trie (proposing/trie.py) against brute force over the token stream itself: the
windows it holds, the order it keeps their continuations in, and the draft tree it builds."""
from __future__ import annotations

import random
from collections import deque

import pytest

from ssr.proposing.history import ResponseHistory
from ssr.proposing.source import Source
from ssr.verifying.verify import common_prefix
from ssr.proposing.trie import MAX_BREADTH, MIN_BREADTH, RecencyTrie, TrieProposer


def windows(stream: list[int], depth: int) -> set[tuple[int, ...]]:
    return {tuple(stream[i:j]) for j in range(1, len(stream) + 1) for i in range(max(0, j - depth), j)}


def followers(stream: list[int], gram: tuple[int, ...], depth: int) -> list[int]:
    """Tokens that followed `gram` (a window of gram + token fits the depth), the latest first:
    by the last position each did so."""
    if len(gram) + 1 > depth:
        return []
    last: dict[int, int] = {}
    n = len(gram)
    for i in range(n, len(stream)):
        if tuple(stream[i - n: i]) == gram:
            last[stream[i]] = i
    return sorted(last, key=lambda token: -last[token])


def brute_tree(stream: list[int], depth: int, nodes: int, max_tokens: int) -> list[tuple[int, list[int]]]:
    """The draft tree built from the stream itself: (anchor length, path) per leaf, in build order."""
    scale = (MAX_BREADTH - MIN_BREADTH) / (depth - 1)
    tree: list[dict[int, int]] = [{}]
    match = [0]
    for n in range(min(len(stream), depth - 1), 0, -1):
        gram = tuple(stream[len(stream) - n:])
        if not followers(stream, gram, depth) or len(tree) > nodes:
            continue
        queue = deque([(0, (depth - 1 - n) * scale + MIN_BREADTH, gram, 0)])
        while queue and len(tree) <= nodes:
            at, breadth, path, level = queue.popleft()
            if level >= max_tokens:
                continue
            for token in followers(stream, path, depth)[: max(1, int(breadth))]:
                if len(tree) > nodes:
                    break
                if token not in tree[at]:
                    tree[at][token] = len(tree)
                    tree.append({})
                    match.append(n)
                queue.append((tree[at][token], breadth - scale, path + (token,), level + 1))
    paths = [[]]
    for at, links in enumerate(tree):  # a node's tokens: its parent's and its own (parents come first)
        for token, child in links.items():
            paths.extend([[]] * (child + 1 - len(paths)))
            paths[child] = paths[at] + [token]
    return [(min(match[i], 8), paths[i]) for i in range(1, len(tree)) if not tree[i]]


def nodes_of(node: dict) -> int:
    return sum(1 + nodes_of(child) for child in node.values())


def expanded(trie: RecencyTrie, node=None, length: int = 0) -> dict:
    """The trie as plain nested dicts, its chains (windows written once) made dicts: token -> the
    node one token deeper, the most recently written last."""
    node = trie.root if node is None else node
    return {token: expanded(trie, child, length + 1) for token, child in reversed(list(trie.children(node, length)))}


def check_anchors(trie: RecencyTrie, anchors: list, fresh: int, stream: list[int], earlier=()) -> None:
    """anchors[n]: the node of the stream's last n tokens, a window written before too (in the
    stream or an earlier text); the next `fresh` windows, longer, written just now for the first
    time; depth - 1 tokens at most."""
    assert len(anchors) + fresh == min(len(stream), trie.depth - 1) + 1
    for n in range(len(anchors) + fresh):
        window = stream[len(stream) - n:] if n else []
        again = any(stream[i - n: i] == window for i in range(n, len(stream))) or \
            any(text[i - n: i] == window for text in earlier for i in range(n, len(text) + 1))
        assert again == (n < len(anchors)) or n == 0
    for n, anchor in enumerate(anchors):
        node = trie.resolve(anchor) if type(anchor) is not dict else anchor
        node = node if type(node) is dict else node[:2]
        window = stream[len(stream) - n:] if n else []
        assert expanded(trie, node, n) == _at(expanded(trie), window)
        if type(node) is dict:
            assert node is _node_at(trie, window)


def _node_at(trie: RecencyTrie, tokens: list[int]):
    node = trie.root
    for length, token in enumerate(tokens):
        node = dict(trie.children(node, length))[token]
    return node


@pytest.mark.parametrize("seed", range(30))
def test_the_trie_holds_every_window_once_in_recency_order(seed):
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 18])
    stream = [rng.randrange(rng.choice([2, 4, 9])) for _ in range(rng.randrange(1, 120))]
    trie = RecencyTrie(depth)
    anchors, fresh, text = [trie.root], 0, []
    for token in stream:
        text.append(token)
        anchors, fresh = trie.write(anchors, fresh, text)
    held = set()

    def walk(node: dict, path: tuple[int, ...]) -> None:
        assert list(reversed(node)) == followers(stream, path, depth)  # the latest written last
        for token, child in node.items():
            held.add(path + (token,))
            walk(child, path + (token,))

    whole = expanded(trie)
    walk(whole, ())
    assert held == windows(stream, depth)
    assert trie.nodes == nodes_of(whole) == len(held)
    check_anchors(trie, anchors, fresh, stream)


def _at(node: dict, tokens: list[int]) -> dict:
    for token in tokens:
        node = node[token]
    return node


@pytest.mark.parametrize("seed", range(40))
def test_the_draft_tree_is_the_brute_force_one(seed):
    rng = random.Random(100 + seed)
    stream = [rng.randrange(rng.choice([3, 6, 12])) for _ in range(rng.randrange(2, 200))]
    nodes, max_tokens = rng.choice([4, 11, 24]), rng.choice([1, 3, 64])
    split = rng.randrange(1, len(stream))
    proposer = TrieProposer(stream[:split], nodes=nodes)
    proposer.observe(stream[split:])
    found = proposer.candidates(max_tokens)
    assert [(source.match, path) for source, path in found] == brute_tree(stream, 18, nodes, max_tokens)
    assert all(source is Source.of("trie", source.match) for source, _ in found)
    assert sum(len(path) for _, path in found) >= min(nodes, 1) * bool(found)


def test_a_repeated_line_is_proposed_whole_from_the_prompt():
    line = [5, 6, 7, 8, 9, 10, 11]
    proposer = TrieProposer([1, 2] + line + [3, 4])
    proposer.observe(line[:3])
    assert [path for _, path in proposer.candidates(64)][0] == line[3:] + [3, 4] + line[:3]  # and on, as it went
    assert proposer.candidates(0) == []


def test_requests_of_one_deployment_share_the_trie_and_it_starts_over_when_full(monkeypatch):
    history = ResponseHistory()
    first = TrieProposer([1, 2, 3, 4, 5], history)
    second = TrieProposer([9, 1, 2], history)
    assert second.trie is first.trie
    assert [path for _, path in second.candidates(8)][0] == [3, 4, 5]  # what the first request wrote
    assert TrieProposer([7], None).trie is not first.trie  # cold: a request's own
    monkeypatch.setattr("ssr.proposing.trie.MAX_NODES", first.trie.nodes - 1)
    third = TrieProposer([1, 2], history)
    assert third.trie is not first.trie and third.candidates(8) == []


def _latest_followers(writes: list[tuple[list[int], int]], gram: tuple[int, ...], depth: int) -> list[int]:
    """Tokens written after `gram`, the latest first, over writes (context, token) in time order."""
    if len(gram) + 1 > depth:
        return []
    last: dict[int, int] = {}
    for when, (context, token) in enumerate(writes):
        if len(context) >= len(gram) and tuple(context[len(context) - len(gram):]) == gram:
            last[token] = when
    return sorted(last, key=lambda token: -last[token])


@pytest.mark.parametrize("seed", range(20))
def test_a_prompt_the_last_request_wrote_already_is_not_written_again(seed):
    """Turn 2's prompt starts as turn 1's prompt (and output) did: that start keeps the recency it
    was written with, the rest is written after it. Oracle: every (context, token) write in time
    order, brute force."""
    rng = random.Random(300 + seed)
    alphabet = rng.choice([3, 5, 9])
    prompt1, output1 = ([rng.randrange(alphabet) for _ in range(rng.randrange(1, 40))] for _ in range(2))
    kept = prompt1 + output1[: rng.randrange(len(output1) + 1)]  # how much of turn 1 turn 2 renders as it was
    prompt2 = kept + [alphabet + rng.randrange(2)] + [rng.randrange(alphabet) for _ in range(rng.randrange(30))]
    history = ResponseHistory()
    first = TrieProposer(prompt1, history)
    first.observe(output1)
    second = TrieProposer(prompt2, history)
    turn1 = prompt1 + output1
    writes = [(turn1[:i], turn1[i]) for i in range(len(turn1))]
    writes += [(prompt2[:i], prompt2[i]) for i in range(len(kept), len(prompt2))]
    depth = second.trie.depth

    def check(node: dict, path: tuple[int, ...]) -> None:
        assert list(reversed(node)) == _latest_followers(writes, path, depth)
        for token, child in node.items():
            check(child, path + (token,))

    check(expanded(second.trie), ())
    check_anchors(second.trie, second.anchors, second.fresh, prompt2, [turn1])
    assert second.trie.last == prompt2
    assert second.trie.nodes == nodes_of(expanded(second.trie))


@pytest.mark.parametrize("seed", range(20))
def test_requests_writing_in_turn_into_one_trie_keep_it_whole(seed):
    """Two requests of one deployment writing by turns (each a few tokens, then the other): every
    window each writes is in the trie, in the order of the writes, though another's writes turned
    its new windows into dicts between its own. Oracle: every (context, token) write in time order."""
    rng = random.Random(500 + seed)
    alphabet = rng.choice([2, 3, 5])
    history = ResponseHistory()
    prompts = [[rng.randrange(alphabet) for _ in range(rng.randrange(1, 20))] for _ in range(2)]
    requests = [TrieProposer(prompts[0], history), TrieProposer(prompts[1], history)]
    texts = [list(prompts[0]), list(prompts[1])]
    writes = [(prompts[0][:i], prompts[0][i]) for i in range(len(prompts[0]))]
    held = common_prefix(prompts[0], prompts[1])
    writes += [(prompts[1][:i], prompts[1][i]) for i in range(held, len(prompts[1]))]
    for _ in range(rng.randrange(1, 10)):
        which = rng.randrange(2)
        tokens = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 6))]
        for token in tokens:
            writes.append((list(texts[which]), token))
            texts[which].append(token)
        requests[which].observe(tokens)
        requests[which].candidates(8)
    trie = requests[0].trie
    assert requests[1].trie is trie
    depth = trie.depth

    def check(node: dict, path: tuple[int, ...]) -> None:
        assert list(reversed(node)) == _latest_followers(writes, path, depth)
        for token, child in node.items():
            check(child, path + (token,))

    check(expanded(trie), ())
    assert trie.nodes == nodes_of(expanded(trie))
