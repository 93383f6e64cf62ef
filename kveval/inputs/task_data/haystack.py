"""Haystacks: source text laid out as words with token estimates, needles placed at sentence starts near
their depth, and a prompt fitted to a token target (measured with the chat template, as the engine sees it).
What every long-context task shares; the tasks themselves are in needle_tasks.py and cwe.py."""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from kveval.inputs.workloads import render_chat
from kveval.inputs.workloads.chat import encode_batch

SIZE_TOLERANCE = 8          # a doc is target - SIZE_TOLERANCE .. target tokens
MIN_HAYSTACK_TOKENS = 16    # below this a "depth" means nothing
_MAX_FIT_ROUNDS = 24


def task_prompt(intro: str, body: str, question: str) -> str:
    return f"{intro}\n\n{body}\n\n{question}"


def measure(tokenizer, text: str) -> int:
    """Prompt tokens as the engine will count them: chat template included."""
    return len(render_chat(tokenizer, text)[1])


# --------------------------------------------------------------------------- haystacks

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


class Source:
    """Words of a haystack text, with cached per-word token estimates.

    The haystack is laid out as "units": each word with the separator before it (" " inside a
    paragraph, `joiner` before a paragraph's first word). Units are tokenised once, in one batch
    per source, so the size of any prefix can be estimated by summing; the fitting loop then
    measures the real prompt and corrects the estimate.
    """

    def __init__(self, tokenizer, paragraphs: Sequence[str], joiner: str):
        self.paragraphs: list[list[str]] = []
        self.starts: list[list[bool]] = []   # per word: does it begin a sentence?
        for para in paragraphs:
            words = para.split()
            if not words:
                continue
            units = [joiner + words[0]] + [" " + w for w in words[1:]]
            self.paragraphs.append(units)
            self.starts.append([True] + [bool(_SENTENCE_END.search(w)) for w in words[:-1]])
        if not self.paragraphs:
            raise ValueError("haystack source text is empty")
        unique = sorted({u for units in self.paragraphs for u in units})
        counts = encode_batch(tokenizer, unique)
        self.cost = {u: max(1, len(ids)) for u, ids in zip(unique, counts)}


@dataclass
class _Stream:
    """A haystack prefix candidate: units (cycling through the source), costs and boundaries."""
    units: list[str]
    cum: list[int]              # cum[i] = estimated tokens of units[:i]
    boundaries: list[int]       # unit indices where a sentence starts (ascending, from 0)


def _stream(source: Source, first_paragraph: int, min_tokens: int) -> _Stream:
    """Units from `first_paragraph` on, cycling through the source, until min_tokens estimated."""
    units: list[str] = []
    cum = [0]
    boundaries: list[int] = []
    p = first_paragraph % len(source.paragraphs)
    while cum[-1] < min_tokens:
        for unit, starts in zip(source.paragraphs[p], source.starts[p]):
            if starts:
                boundaries.append(len(units))
            units.append(unit)
            cum.append(cum[-1] + source.cost[unit])
        p = (p + 1) % len(source.paragraphs)
    return _Stream(units, cum, boundaries)


@dataclass(frozen=True)
class Needle:
    text: str
    depth: float                 # asked position as a share of the haystack
    after: int | None = None     # place at or after the needle with this index (chains)


def _place(stream: _Stream, k: int, needles: Sequence[Needle]) -> list[int]:
    """Sentence boundary (unit index <= k) for each needle, nearest its depth.

    A needle avoids boundaries already taken while free ones remain; a chained needle
    (`after`) never goes before the one it follows.
    """
    candidates = stream.boundaries[:bisect.bisect_right(stream.boundaries, k)]
    total = stream.cum[k]
    taken: set[int] = set()
    placed: list[int] = []
    for needle in needles:
        pool = candidates
        if needle.after is not None:
            floor = placed[needle.after]
            pool = [b for b in candidates if b >= floor] or [floor]
        free = [b for b in pool if b not in taken] or pool
        want = needle.depth * total
        best = min(free, key=lambda b: (abs(stream.cum[b] - want), b))
        placed.append(best)
        taken.add(best)
    return placed


def _haystack_text(stream: _Stream, k: int, needles: Sequence[Needle],
                   at: Sequence[int]) -> str:
    order = sorted(range(len(needles)), key=lambda i: (at[i], i))
    parts, prev = [], 0
    for i in order:
        parts.append("".join(stream.units[prev:at[i]]))
        parts.append(" " + needles[i].text)
        prev = at[i]
    parts.append("".join(stream.units[prev:k]))
    return "".join(parts).lstrip()


def fit(tokenizer, target: int, build: Callable[[int], str], estimate: Callable[[int], int],
         lo: int, hi: int) -> tuple[int, str, int]:
    """Find a size n in [lo, hi] whose prompt is target - SIZE_TOLERANCE .. target tokens.

    `estimate(n)` predicts the prompt size (it need not be exact, only close and increasing);
    each round measures the real prompt, shifts the estimate by the error seen and keeps a
    bracket of sizes known to be under / over, so a poor estimate still converges.
    Returns (n, text, tokens) of the best size found that is not over the target.
    """
    under, over = lo - 1, hi + 1          # largest n known <= target, smallest n known > target
    best: tuple[int, str, int] | None = None
    offset = 0                             # measured - estimated, from the last round
    n = invert(estimate, target - 2 - offset, lo, hi)
    for _ in range(_MAX_FIT_ROUNDS):
        text = build(n)
        tokens = measure(tokenizer, text)
        if tokens <= target:
            under = max(under, n)
            if best is None or tokens > best[2] or (tokens == best[2] and n < best[0]):
                best = (n, text, tokens)
            if target - tokens <= SIZE_TOLERANCE:
                return best
        else:
            over = min(over, n)
        if over - under <= 1:
            break
        offset = tokens - estimate(n)
        guess = invert(estimate, target - 2 - offset, lo, hi)
        n = min(max(guess, under + 1), over - 1)
    if best is None:
        raise ValueError(f"cannot fit a prompt into {target} tokens")
    return best


def invert(estimate: Callable[[int], int], tokens: int, lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with estimate(n) <= tokens (lo if none)."""
    a, b = lo, hi
    while a < b:
        mid = (a + b + 1) // 2
        if estimate(mid) <= tokens:
            a = mid
        else:
            b = mid - 1
    return a


def haystack_doc(tokenizer, source: Source, target: int, first_paragraph: int,
                  intro: str, question: str,
                  needles: Sequence[Needle]) -> tuple[str, int, list[float]]:
    """(input text, prompt tokens, needle depths) for a haystack task at `target` tokens."""
    empty = task_prompt(intro, " ".join(n.text for n in needles), question)
    overhead = measure(tokenizer, empty)
    if target - overhead < MIN_HAYSTACK_TOKENS:
        raise ValueError(
            f"target of {target} tokens is too small: the instructions, question and needles "
            f"alone take {overhead} tokens and at least {MIN_HAYSTACK_TOKENS} tokens of haystack "
            f"are needed; use a larger length fraction or max_model_len")
    full = _stream(source, first_paragraph, target + 2048)   # room to skip a few sentences
    best = None
    # Whole words almost always land within SIZE_TOLERANCE. When one word costs more than the
    # gap left (a coarse tokenizer), starting the haystack a sentence later shifts every sum.
    for skip in [0] + full.boundaries[1:12]:
        stream = _skip(full, skip)

        def build(k: int) -> str:
            at = _place(stream, k, needles)
            return task_prompt(intro, _haystack_text(stream, k, needles, at), question)

        def estimate(k: int) -> int:
            return overhead + stream.cum[k]

        lo = min(bisect.bisect_left(stream.cum, MIN_HAYSTACK_TOKENS // 2), len(stream.units))
        try:
            k, text, tokens = fit(tokenizer, target, build, estimate, lo, len(stream.units))
        except ValueError:
            if best is None and skip == 0:
                raise
            continue
        if best is None or tokens > best[1]:
            at = _place(stream, k, needles)
            depths = [round(stream.cum[b] / max(1, stream.cum[k]), 4) for b in at]
            best = (text, tokens, depths)
        if target - tokens <= SIZE_TOLERANCE:
            break
    return best


def _skip(stream: _Stream, first: int) -> _Stream:
    """The stream without its first `first` units (a sentence start)."""
    if first == 0:
        return stream
    base = stream.cum[first]
    return _Stream(stream.units[first:], [c - base for c in stream.cum[first:]],
                   [b - first for b in stream.boundaries if b >= first])
