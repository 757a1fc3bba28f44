"""n-gram lookup over prompt + output: prompt lookup as transformers runs it, vLLM's `ngram` (its
V1 rule), and ssr's own lookup (earliest, latest and other occurrences, the context's frequent
tokens), one source among ssr's (proposers.request_proposer)."""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import ConfigError

from .proposers import OneSource
from .source import FREQUENT_BANDS, Source


class PromptLookupProposer(OneSource):
    """Prompt-lookup decoding as transformers runs it (`prompt_lookup_num_tokens=10`, its
    default `max_matching_ngram_size=2`): the last n tokens (n = max_ngram down to min_ngram)
    are looked up in prompt + output, the earliest occurrence with a continuation wins, and the
    num_tokens tokens after it are proposed, every step, CoT included."""

    source = Source("lookup")

    def __init__(self, seed: Sequence[int], max_ngram: int = 2, num_tokens: int = 10, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram  # longest n-gram matched first
        self.min_ngram = min_ngram  # shortest n-gram matched
        self.num_tokens = num_tokens  # tokens proposed after the match
        self.tokens: list[int] = []  # everything the model has seen
        self._first: dict[tuple[int, ...], int] = {}  # n-gram -> start of its earliest occurrence
        self.observe(seed)

    def add_source(self, token_ids: Sequence[int]) -> None:
        """Prompt lookup reads the request's own tokens only."""

    def observe(self, token_ids: Sequence[int]) -> None:
        tokens, first, low = self.tokens, self._first, self.min_ngram
        for token in token_ids:
            tokens.append(token)
            for size in range(low, min(self.max_ngram, len(tokens)) + 1):
                first.setdefault(tuple(tokens[-size:]), len(tokens) - size)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float] | None]:
        limit = min(max_tokens, self.num_tokens)
        tokens = self.tokens
        for size in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = self._first.get(tuple(tokens[-size:]))
            if limit > 0 and start is not None and start < len(tokens) - size:  # not the suffix itself
                return tokens[start + size : start + size + limit], None
        return [], None


class LookupProposer(PromptLookupProposer):
    """ssr's n-gram lookup over prompt + output: prompt lookup's earliest occurrence of the last n
    tokens (n = max_ngram down to 1: text the prompt states; `propose` is prompt lookup's), and
    beside it their two latest occurrences before the context's end (what the CoT said the last
    times it reached here: real CoTs restate their own recent lines), the tokens after each
    proposed; then the latest occurrence of the longest shorter n-gram that goes another way.
    Candidates whose first token an earlier one already offers are left out (the earliest and
    latest are kept: the policy learns them apart). With `others` (several candidates a pass, as
    one token tree), up to that many more: for the longest n-gram down, every other token the
    context's last n tokens went on to, from the latest occurrence that went that way ("other/n";
    a token tree verifies them for about the price of their nodes); with `skips`, up to that many
    tokens that came two after the context's second-to-last token (one word between: "the red
    dog", "the big dog"), the latest first, each followed by what followed it ("skip": the last
    token matched nothing it is tried after); with `frequent`, then the
    context's that many commonest tokens no candidate starts with, each followed by what followed
    its latest occurrence ("frequent": no context matched — where the last token is new, the
    only candidates; past the 8 commonest, "frequent@9" and "frequent@17", bands learnt apart).
    Each candidate's source names its occurrence and n ("lookup/3", "recent/2", "other/1").
    O(max_ngram) per token; a proposal O(max_ngram + candidates)."""

    def __init__(self, seed: Sequence[int], max_ngram: int = 3, num_tokens: int = 64, others: int = 0,
                 frequent: int = 0, skips: int = 0) -> None:
        self.frequent = FrequentTokens(frequent)  # 0-gram candidates: the context's most frequent tokens
        # [rank]: the source of the rank's candidate, named by its band ("frequent", "frequent@9", ..)
        self._frequent_sources = [Source.of("frequent", band=bisect_right(FREQUENT_BANDS, rank) - 1)
                                  for rank in range(frequent)]
        self._latest: dict[tuple[int, ...], tuple[int, int | None]] = {}  # n-gram -> starts of its latest two
        # [n]: starts of the latest two occurrences of the context's last n tokens before this one
        self._before: list[tuple[int | None, int | None]] = [(None, None)] * (max_ngram + 1)
        self.others = others  # further candidates: other tokens the n-gram went on to
        # n-gram -> {the token that followed it: the start of the latest occurrence followed so}, oldest first
        self._ways: dict[tuple[int, ...], dict[int, int]] = {}
        self.skips = skips  # further candidates: tokens that came two after the second-to-last token
        # token -> {the token two after it: where that one's latest such occurrence is}, oldest first
        self._skips: dict[int, dict[int, int]] = {}
        # tokens observed, not indexed yet: indexed when candidates are asked (a drafter that
        # drafts one span a pass from the suffix tree alone, speculation.Layout.ONE, asks none)
        self._pending: list[int] = []
        # while marked (`mark`): (map, key, its value before) for every entry indexing changed since,
        # MISSING where it had none, oldest first; `rewind` puts them back (None: not marked)
        self._journal: list[tuple[dict, object, object]] | None = None
        self._saved: set[tuple[int, object]] = set()  # (id(ways or skips), key) whose copy is journaled since the mark
        self._marked: tuple[int, list, list[int]] = (0, [], [])  # at the mark: tokens, _before, frequent.top
        super().__init__(seed, max_ngram, num_tokens, min_ngram=1)
        self.settings = (max_ngram, num_tokens, others, frequent, skips)  # what a kept index must match (reused)

    def mark(self) -> None:
        """Index what is pending and remember this state: `rewind` comes back to it (a prompt's
        index kept for the conversation's next turn, whose prompt starts with this one)."""
        self._journal = None  # (what is pending now belongs to the marked state)
        self._index()
        self._journal, self._saved = [], set()
        self._marked = (len(self._tokens), list(self._before), list(self.frequent.top))

    @property
    def marked(self) -> int | None:
        """Tokens at the mark; None where there is none to rewind to: never marked, or more was
        observed since than the mark holds (journaling and rewinding it then cost more than
        indexing the prompt again, and the journal stopped: `_index`)."""
        return self._marked[0] if self._journal is not None else None

    def rewound_for(self, prompt_ids: Sequence[int]) -> int | None:
        """Where `prompt_ids` starts with the marked tokens: rewound to the mark, their number;
        else None, left as it is. The tokens observed since and not indexed yet are dropped, not
        indexed (which could stop the journal)."""
        length = self.marked
        if length is None or length > len(prompt_ids) or self._tokens[:length] != list(prompt_ids[:length]):
            return None
        self.rewind()
        return length

    def rewind(self) -> None:
        """Back to the state at `mark` (`marked` not None), as if nothing after it had been observed
        (the journal's entries undone newest first; the maps' order of keys may differ, which no
        lookup reads)."""
        for table, key, value in reversed(self._journal):
            if value is MISSING:
                table.pop(key, None)  # (a key new twice in one journaled batch)
            else:
                table[key] = value
        length, before, top = self._marked
        del self._tokens[length:]
        self._before[:], self.frequent.top[:] = before, top
        self._pending, self._journal, self._saved = [], [], set()

    def prepare(self) -> None:
        self._index()

    @property
    def tokens(self) -> list[int]:
        """Everything the model has seen, indexed (the pending tokens first)."""
        if self._pending:
            self._index()
        return self._tokens

    @tokens.setter
    def tokens(self, value: list[int]) -> None:
        self._tokens = value

    def observe(self, token_ids: Sequence[int]) -> None:
        self._pending.extend(token_ids)

    def _index(self) -> None:
        """The pending tokens indexed, in order (the same maps as indexing each when observed);
        while marked, the entries they change journaled first, until more was observed since
        the mark than it holds."""
        if self._journal is not None and self._pending:
            if len(self._tokens) + len(self._pending) > 2 * self._marked[0]:
                self._journal, self._saved = None, set()  # no longer worth keeping: `marked` is None
            else:
                self._remember(self._pending)
        self._index_pending()

    def _remember(self, pending: list[int]) -> None:
        """Journal the entries that indexing `pending` will change, as they are before it (which
        entries is the tokens' own business: known before any is indexed)."""
        journal, latest, first, counts, n = self._journal, self._latest, self._first, self.frequent.counts, self.max_ngram
        indexed = len(self._tokens)
        tokens = self._tokens[-(n + 2):] + pending  # the context's last tokens, then the pending ones
        offset = len(tokens) - len(pending)  # where the pending ones start in it
        for at in range(offset, len(tokens)):
            end = indexed + at - offset + 1  # tokens indexed once this one is
            for size in range(1, min(n, end) + 1):
                gram = tuple(tokens[at + 1 - size: at + 1])
                journal.append((latest, gram, latest.get(gram, MISSING)))
                if gram not in first:
                    journal.append((first, gram, MISSING))
                if self.others and end > size:
                    self._save(self._ways, tuple(tokens[at - size: at]))
            if self.skips and end > 2:
                self._save(self._skips, tokens[at - 2])
            if self.frequent.size:
                journal.append((counts, tokens[at], counts.get(tokens[at], MISSING)))

    def _save(self, table: dict, key) -> None:
        """Journal a copy of table[key] (ways, skips: the order of its tokens is read) the first
        time it changes since the mark: a common token's may hold thousands."""
        if (id(table), key) not in self._saved:
            self._saved.add((id(table), key))
            self._journal.append((table, key, dict(table[key]) if key in table else MISSING))

    def _index_pending(self) -> None:
        """The pending tokens indexed: each map filled n-gram size by size, each in the tokens'
        order (the maps' keys differ in length from size to size, so this leaves every map as
        indexing token by token would: the same entries, each dict of ways in the same order)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        tokens = self._tokens
        begin = len(tokens)  # the first pending token's position
        tokens.extend(pending)
        for size in range(1, min(self.max_ngram, len(tokens)) + 1):
            self._index_size(size, begin)
        count = self.frequent.count
        if self.frequent.size:
            for token in pending:
                count(token)
        if self.skips:  # the token two before each went on, one later, to it
            skips = self._skips
            for end in range(max(begin, 2), len(tokens)):
                went = skips.setdefault(tokens[end - 2], {})
                token = tokens[end]
                went.pop(token, None)
                went[token] = end

    def _index_size(self, size: int, begin: int) -> None:
        """The n-grams of `size` tokens that end at a token from `begin` on, in order: latest two,
        earliest, and (with `others`) the token each one before them went on to."""
        tokens, first, latest, ways = self._tokens, self._first, self._latest, self._ways
        low = max(begin, size - 1)  # the first position a gram of this size ends at
        # every gram ending at low - 1 .. the end, built in C (zip of shifted slices)
        grams = list(zip(*(tokens[low - size + k: len(tokens) - size + 1 + k] for k in range(size)))) \
            if low >= size else [None] + list(zip(*(tokens[k: len(tokens) - size + 1 + k] for k in range(size))))
        seen = (None, None)
        start = low - size + 1
        for gram in grams[1:]:
            seen = latest.get(gram, (None, None))
            latest[gram] = (start, seen[0])
            first.setdefault(gram, start)
            start += 1
        self._before[size] = seen
        if self.others:  # the gram before each token went on to it
            start = low - size
            for before, token in zip(grams, tokens[low:]):
                if before is not None:
                    went = ways.setdefault(before, {})
                    went.pop(token, None)
                    went[token] = start
                start += 1

    def candidates(self, max_tokens: int) -> list[tuple[Source, list[int]]]:
        limit = min(max_tokens, self.num_tokens)
        tokens, end = self.tokens, len(self.tokens)
        if limit <= 0:
            return []
        sizes = [size for size in range(min(self.max_ngram, end - 1), 0, -1) if self._before[size][0] is not None]
        if not sizes:  # the last token occurs nowhere before: what skips it, the context's frequent tokens
            offered: set[int] = set()
            return self._skipped(offered, limit) + self._frequent(offered, limit)
        size, after = sizes[0], lambda start, n: tokens[start + n: start + n + limit]
        earliest, (latest, second) = self._first[tuple(tokens[end - size:])], self._before[size]
        out = [(Source.of("lookup", size), after(earliest, size))]
        if latest != earliest:
            out.append((Source.of("recent", size), after(latest, size)))
        offered = {span[0] for _, span in out}
        if second is not None and second != earliest and (span := after(second, size))[0] not in offered:
            out.append((Source.of("recent", size), span))
            offered.add(span[0])
        for shorter in sizes[1:]:  # a shorter match whose latest occurrence goes another way
            span = after(self._before[shorter][0], shorter)
            if span[0] not in offered:
                out.append((Source.of("recent", shorter), span))
                offered.add(span[0])
                break
        return out + self._other_ways(sizes, offered, limit) + self._skipped(offered, limit) + \
            self._frequent(offered, limit)

    def _other_ways(self, sizes: list[int], offered: set[int], limit: int) -> list[tuple[Source, list[int]]]:
        """Up to `others` candidates: for the longest n-gram down, the tokens the context's last n
        tokens went on to that no candidate offers yet, the latest first, each from the latest
        occurrence that went that way."""
        tokens, end, out = self.tokens, len(self.tokens), []
        for size in sizes:
            for token, start in reversed(self._ways.get(tuple(tokens[end - size:]), {}).items()):
                if len(out) >= self.others:
                    return out
                if token not in offered:
                    offered.add(token)
                    out.append((Source.of("other", size), tokens[start + size: start + size + limit]))
        return out

    def _skipped(self, offered: set[int], limit: int) -> list[tuple[Source, list[int]]]:
        """Up to `skips` candidates: the tokens that came two after the context's second-to-last
        token that no candidate offers yet, the latest first, each from where it last came so
        (`offered` grows by their first tokens)."""
        tokens, out = self.tokens, []
        if not self.skips or len(tokens) < 2:
            return out
        for token, start in reversed(self._skips.get(tokens[-2], {}).items()):
            if len(out) >= self.skips:
                break
            if token not in offered:
                offered.add(token)
                out.append((SKIP, tokens[start: start + limit]))
        return out

    def _frequent(self, offered: set[int], limit: int) -> list[tuple[Source, list[int]]]:
        """The context's most frequent tokens no candidate offers yet, most frequent first, each
        followed by what followed its latest occurrence ("frequent": no context matched)."""
        tokens, latest = self.tokens, self._latest
        return [(source, tokens[start: start + limit])
                for source, token in zip(self._frequent_sources, self.frequent.top)
                if token not in offered and (start := latest[(token,)][0]) is not None]


SKIP = Source.of("skip")
MISSING = object()  # a journaled entry that was not there


class FrequentTokens:
    """The `size` most frequent tokens of a context, kept as tokens are counted: O(size) a token
    at worst, O(1) mostly (counts only grow, so a token enters the top only by passing its last).
    Where no n-gram matches (a word the text has not used yet), the next token is often one of the
    context's commonest: on the development traces among the 8 commonest 22-28% of the time."""

    def __init__(self, size: int) -> None:
        self.size = size  # tokens kept
        self.counts: dict[int, int] = {}  # token -> occurrences in the context (counted while size > 0)
        self.top: list[int] = []  # the `size` most counted tokens, most first (ties: the first to get there)

    def count(self, token: int) -> None:
        if not self.size:
            return
        counts, top = self.counts, self.top
        counts[token] = number = counts.get(token, 0) + 1
        if token in top:
            at = top.index(token)
        elif len(top) < self.size:
            top.append(token)
            at = len(top) - 1
        elif number > counts[top[-1]]:
            top[-1], at = token, len(top) - 1
        else:
            return
        while at and counts[top[at - 1]] < number:  # move up past those it now outnumbers
            top[at - 1], top[at] = top[at], top[at - 1]
            at -= 1


@dataclass(frozen=True)
class NgramSettings:
    """vLLM's `ngram` method's settings. The default is vLLM's docs' example,
    {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}, prompt_lookup_min
    left unset then equal to prompt_lookup_max (vllm/config/speculative.py)."""

    min_ngram: int = 4  # prompt_lookup_min
    max_ngram: int = 4  # prompt_lookup_max
    tokens: int = 5  # num_speculative_tokens

    @classmethod
    def parse(cls, text: str) -> NgramSettings:
        """"MIN,MAX,K" (e.g. 3,7,3: SpecDecode-Bench's vLLM runs)."""
        try:
            low, high, tokens = (int(part) for part in text.split(","))
        except ValueError:
            low = high = tokens = 0
        if not 1 <= low <= high or tokens < 1:
            raise ConfigError(f"--ngram: give MIN,MAX,K with 1 <= MIN <= MAX and K >= 1 (e.g. 3,7,3), got {text!r}")
        return cls(low, high, tokens)


def vllm_ngram(prompt: Sequence[int], settings: NgramSettings = NgramSettings()) -> PromptLookupProposer:
    """The `ngram` peer: vLLM's `ngram` method (its docs' example unless told). Its proposer
    (vllm/v1/spec_decode/ngram_proposer.py) takes the longest n-gram in [min, max] ending the
    context (prompt + output) that occurred before, at its earliest occurrence, and proposes the
    k tokens after it: prompt lookup with n from max down to min and k tokens."""
    proposer = PromptLookupProposer(prompt, max_ngram=settings.max_ngram, num_tokens=settings.tokens,
                                    min_ngram=settings.min_ngram)
    proposer.source = Source("ngram")
    return proposer
