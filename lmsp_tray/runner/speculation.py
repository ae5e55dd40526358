"""Speculative decoding without a draft model: prompt lookup, and when drafting pays.

Text a model mostly copies — an edited document, a rewritten function, a quoted
passage — repeats stretches of its own context. `PromptLookup` finds the
longest recent n-gram (24, 12, 4, then 3 tokens) that ends the sequence so far and
also occurs earlier in it (prompt or output), and proposes the tokens that
followed that earlier occurrence as a draft. A long match is a passage being
copied: it drafts long at once (24 tokens after 12 matched, 32 after 24), even
while short drafts are paused, so copying resumes a few tokens after each edit;
and the 24-token context picks the right one of several places where the last
12 tokens occur (boilerplate in code). Where that earlier occurrence is only a
few tokens back (the output is going round a loop), a stream decoding alone
drafts on around the loop (`_around`). The scheduler decodes the
sequence's next token and the draft in the same batch as every other
sequence's step, then samples each position in order with the sequence's own
sampler and keeps a draft token only while it equals what was sampled there:

- Greedy decoding gives the tokens it gives without speculation (each kept
  token is the model's own argmax at its position), as exactly as llama.cpp
  computes a position the same in a batch of several as in a one-token step:
  on this CPU build they differ in the third decimal of a log probability, so
  a near-tie closer than that can fall the other way (a random test model's
  -0.7753 against -0.7786), as it can between a prompt evaluated whole and one
  resumed from the cache.
- With sampling, each emitted token is still drawn from the model's own
  distribution given the tokens before it, with the same random stream in the
  same order: for a drafter that proposes one token with certainty this *is*
  the standard acceptance rule (keep with probability p(draft), else draw
  from the rest), so the output distribution — and a seeded output — is
  unchanged.
- Grammars, penalties and lazy grammar triggers see the emitted tokens one at
  a time, in order, exactly as without speculation.

A request asked again (a regenerated answer, a benchmark's next round, an agent that retries) has
its earlier answer in no context of its own. `Recent` keeps the model's last finished sequences,
and a long match (12 or 24 tokens) is also looked up there: the earlier answer drafts the new one
from its first token, through the edits a copy of the prompt would draft wrongly. llama.cpp's
`ngram-mod` keeps its table across requests for the same reason, and a code edit asked again took 15
decode steps with it against 100 for prompt lookup alone (`benchmarks/README.md`, 2 December 2026).
A recent sequence is looked at where the match last occurs in it and where the present stands in
it (the same prompt asked again: an answer that repeats itself holds the match again later, where it
agrees over a few tokens and soon ends). Where both the sequence's own tokens and a recent sequence
hold the match, the one whose agreement with the present reaches further back wins (the earlier
answer, not the prompt's copy of the text it edits). Where that agreement spans `RECALL` tokens
(the same request again, or well into its answer), the draft may be `RECALLED_DRAFT` long: such a
draft rarely runs past its run's end, and at 32 a repeated edit took 19 steps where `ngram-mod`'s 64 took 10 (replayed: 0.95-1.37x of it,
and 1.00-1.45x at 62). Drafts are verified the same way whatever their source. What `Recent` holds
is the model's own recent tokens, in the model process (as its prompt cache holds their KV), and is
gone with the model.

`Drafting` decides how long a draft may be for one sequence: it grows while
drafts are accepted whole, shrinks to what was accepted, and after drafts
keep failing it stops drafting short for a while (longer each time), so free-form
text, where lookups rarely predict anything, pays almost nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

NGRAMS = (24, 12, 4, 3)  # match lengths tried, longest first (2-grams recur by chance in free text)
MAX_DRAFT = 16
# A 12-token match is a passage being copied: its draft may be this long at once, whatever the
# adaptive length or a pause. Before long drafts (16 at most) a 600-token edit ran at 0.84x, a code
# edit at 0.60x of llama-server's ngram-simple (which drafts 48 after a 12-token match).
LONG_NGRAM = 12
# After 24 matched tokens (llama.cpp's ngram-mod matches 24 and drafts 48-64): surer, so longer.
LONGER_NGRAM = 24
# How long: each drafted token costs a third of a plain step or more on a CPU (one row more through
# every matrix, the output layer's 262k rows on Gemma 3), kept or not, while a step saved saves its
# fixed part. A draft runs past where a copied passage ends (the edit, the end of the text) by up to
# its length, so long drafts waste the most where runs are short. Replayed on the edit workload's
# own greedy texts and priced with this machine's measured decode costs (`benchmarks/spec_replay.py`:
# the same text for every drafter, no load), 24 and 32 beat the 48 and 62 used before on every
# document: 1.03-1.14x llama.cpp's best n-gram drafter against 1.00-1.05x (AVX-512, a token 0.34 of
# a step); so they did with a token priced at half a step and at a fifth of one. Both stay under the 64
# queries of one sequence where llama.cpp's CPU flash attention takes a tiled kernel that rounds
# differently from a plain decode (GGML_FA_TILE_Q).
LONG_DRAFT = 24
LONGER_DRAFT = 32
RECENT_TOKENS = 32_768  # what `Recent` keeps, in tokens of finished sequences (newest first)
RECENT_SEQUENCES = 16  # and at most this many: each is looked up at every step that drafts
REACH = 512  # how far back two matches' agreement is compared, in tokens
RECALL = 64  # a recent sequence agreeing with the present over this many tokens drafts up to RECALLED_DRAFT
RECALLED_DRAFT = 62
FIRST_DRAFT = 2
MISSES_BEFORE_PAUSE = 2  # verifications in a row that kept nothing
FIRST_PAUSE = 8  # steps without drafting after that; doubles each time, up to MAX_PAUSE
MAX_PAUSE = 256


class Drafter(Protocol):
    """Proposes draft tokens for one sequence, told each token the sequence emits."""

    def append(self, token: int) -> None: ...  # pragma: no cover

    def draft(self, limit: int, long_limit: int = 0, *, loop: bool = False) -> list[int]: ...  # pragma: no cover


# Made for a sequence from its tokens so far (the prompt, and the next token to decode).
DrafterFactory = Callable[[list[int]], Drafter]


class PromptLookup:
    """The tokens of one sequence so far, indexed by n-gram for draft lookups."""

    def __init__(self, tokens: Sequence[int], recent: Recent | None = None) -> None:
        """`recent`: the model's finished sequences, where long matches are also looked up."""
        self.tokens = list(tokens)
        self._recent = recent
        t = self.tokens
        last = len(t) - 1  # the n-gram that ends the sequence has no continuation yet
        # key: the n tokens before position i (exclusive) -> i, the most recent occurrence wins
        self._index: dict[int, dict[tuple[int, ...], int]] = {}
        for n in NGRAMS:
            keys = zip(*(t[j : last - n + 1 + j] for j in range(n)), strict=True) if last >= n else iter(())
            self._index[n] = dict(zip(keys, range(n, last + 1), strict=False))

    def append(self, token: int) -> None:
        t = self.tokens
        t.append(token)
        i = len(t) - 1  # position `i` now has a token: the n-gram before it has a continuation
        for n, index in self._index.items():
            if i >= n:
                index[tuple(t[i - n : i])] = i

    def find(self, key: tuple[int, ...]) -> int | None:
        """Where what followed the latest occurrence of `key` (of a length in `NGRAMS`) starts."""
        return self._index[len(key)].get(key)

    def draft(self, limit: int, long_limit: int = 0, *, loop: bool = False) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the sequence's ending;
        when that ending is `LONG_NGRAM` tokens long, up to `long_limit` (at most `LONG_DRAFT`, or
        `LONGER_DRAFT` after `LONGER_NGRAM`), even where `limit` is 0 (short drafts paused). A long
        ending is also looked up in `recent` sequences; the match that agrees further back wins.

        With `loop`, where what followed runs into the present (the ending occurred a few tokens back:
        the sequence is repeating itself), the draft goes on around the loop (`_around`)."""
        t = self.tokens
        if max(limit, long_limit) <= 0:
            return []
        for n, index in self._index.items():
            if len(t) <= n:
                continue
            key = tuple(t[-n:])
            at = index.get(key)
            source, longest = t, LONGER_DRAFT if n >= LONGER_NGRAM else LONG_DRAFT
            if n >= LONG_NGRAM and self._recent is not None:
                found = self._recent.find(t, key)
                if found is not None:
                    other, there, agree = found
                    if at is None or agree > reach(t, at - n, t, n):
                        source, at = other, there
                        if n + agree >= RECALL:  # the same request again, well past where it began
                            longest = RECALLED_DRAFT
            if at is not None:
                count = limit if n < LONG_NGRAM else max(limit, min(long_limit, longest))
                if source is not t:
                    return source[at : at + count]
                return _around(t, at, count) if loop else t[at : at + count]
        return []


def reach(source: list[int], start: int, tokens: list[int], n: int) -> int:
    """How many tokens before `source[start]` agree with those before `tokens`' last `n` (the match
    found in `source` starts at `start`), up to `REACH`: the longer agreement is the likelier context
    of what follows."""
    end = len(tokens) - n
    k = 0
    while k < REACH:
        step = min(32, REACH - k, start - k, end - k)
        if step <= 0:
            break
        if source[start - k - step : start - k] == tokens[end - k - step : end - k]:
            k += step
            continue
        while source[start - k - 1] == tokens[end - k - 1]:  # within this chunk: stops before its end
            k += 1
        break
    return k


class Recent:
    """The model's last finished sequences, newest first, with their n-gram indexes (`RECENT_TOKENS`
    tokens and `RECENT_SEQUENCES` sequences at most): where a request asked again finds its earlier
    answer."""

    def __init__(self, budget: int = RECENT_TOKENS) -> None:
        self._budget = budget
        self._lookups: collections.deque[PromptLookup] = collections.deque()
        self._tokens = 0

    def add(self, lookup: PromptLookup) -> None:
        """Keep a finished sequence's tokens and index (no longer appended to), dropping the oldest."""
        size = len(lookup.tokens)
        if size > self._budget:
            return
        self._lookups.appendleft(lookup)
        self._tokens += size
        while self._tokens > self._budget or len(self._lookups) > RECENT_SEQUENCES:
            self._tokens -= len(self._lookups.pop().tokens)

    def find(self, tokens: list[int], key: tuple[int, ...]) -> tuple[list[int], int, int] | None:
        """The finished sequence holding `key` (the end of `tokens`) whose agreement with `tokens` reaches
        furthest back (the newest of equals), where what followed there starts, and that agreement.

        Why not simply the newest: documents of one form (the same notice for another street, one
        function over orders or invoices) share their endings, and the newest may be another
        document's answer, which drafts wrongly at every name that differs."""
        n = len(key)
        here = len(tokens)
        best: tuple[list[int], int, int] | None = None
        for lookup in self._lookups:
            other = lookup.tokens
            # Where the key stands at the present's own position (the same prompt asked again), and
            # where it last occurs: the index keeps only the latest occurrence, and an answer that
            # repeats itself holds the key again later, where its agreement with the present is
            # shorter and its end cuts the draft short.
            places = [here] if here < len(other) and tuple(other[here - n : here]) == key else []
            latest = lookup.find(key)
            if latest is not None and latest not in places:
                places.append(latest)
            for at in places:
                agree = reach(other, at - n, tokens, n)
                if best is None or agree > best[2]:
                    best = (other, at, agree)
        return best


def _around(tokens: list[int], at: int, count: int) -> list[int]:
    """`count` tokens from `tokens[at]` on, going on with the draft's own first tokens where `tokens` ends.

    Why: a sequence whose ending occurred `p` tokens back is repeating a loop of `p` tokens (a small
    model's output that has fallen into a cycle, a table's rows, a list's items), and what followed
    that occurrence is only the `p` tokens up to the present. Cut there, drafts of a loop of two or
    three tokens stayed that short: on Gemma 3 270M a step of 3 tokens costs 2.8 plain steps, and a
    looping edit decoded at 0.6x llama-server's `ngram-mod` (which drafts token by token from a table,
    and so around a loop). The draft is verified like any other; a loop that ends costs the rest.

    Only for a sequence that decodes alone (the scheduler's `loop`): in a step shared by several, a
    long loop draft lengthens every stream's step, and eight streams gained nothing from it (0.85-0.86x
    `llama-server -np 8` with it, 0.83-0.88x without) while four streams' longest gaps with big bodies
    arriving grew (1.03, 1.47 s against 0.58, 0.59 s, `benchmarks/loop_stall.py --rounds 1` in turn)."""
    out = tokens[at : at + count]
    period = len(tokens) - at  # at least 1: a continuation's position is inside the sequence
    while len(out) < count:
        out.append(out[-period])
    return out


@dataclass
class Drafting:
    """How much one sequence drafts, learned from what its drafts kept."""

    length: int = FIRST_DRAFT
    misses: int = 0  # verifications in a row that kept nothing
    pause: int = 0  # steps left without drafting
    next_pause: int = FIRST_PAUSE
    drafted: int = 0
    accepted: int = 0
    history: list[tuple[int, int]] = field(default_factory=list)  # (drafted, kept), for tests

    def limit(self) -> int:
        """The longest draft to propose at this step (0: not now)."""
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.length

    def record(self, drafted: int, kept: int) -> None:
        if drafted <= 0:
            return
        self.drafted += drafted
        self.accepted += kept
        if len(self.history) < 64:
            self.history.append((drafted, kept))
        if kept == drafted:
            self.length = min(MAX_DRAFT, self.length * 2)
            self.misses = 0
            self.pause = 0  # a long draft taken whole during a pause: copying again
            self.next_pause = FIRST_PAUSE
        elif kept > 0:
            self.length = max(1, kept + 1)
            self.misses = 0
        else:
            self.length = max(1, self.length // 2)
            self.misses += 1
            if self.misses >= MISSES_BEFORE_PAUSE:
                self.pause, self.misses = self.next_pause, 0
                self.next_pause = min(MAX_PAUSE, self.next_pause * 2)
                self.length = FIRST_DRAFT
