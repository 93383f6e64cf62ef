"""The common-word task: a long numbered word list whose 5 most common words are asked for."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kveval.inputs.task_data.haystack import SIZE_TOLERANCE, fit, invert, measure, task_prompt
from kveval.inputs.workloads import load_corpus
from kveval.inputs.workloads.chat import encode_batch

CWE_INTRO = ("Below is a numbered list of words. In these words, some appear more often than "
             "others. Memorize the ones that appear most often.")
CWE_QUESTION = ("Question: What are the 5 most common words in the above list? "
                "Answer with the five words only.")
CWE_COMMON = 5


def _cwe_vocabulary(paragraphs: Sequence[str]) -> list[str]:
    """Lowercase alphabetic corpus words of 4+ letters, sorted (so the order is fixed)."""
    return sorted({w.lower() for p in paragraphs for w in re.findall(r"[A-Za-z]+", p)
                   if len(w) >= 4})


def _cwe_counts(n: int, capacity: int, vocabulary_size: int) -> tuple[int, int]:
    """(occurrences of each common word, most occurrences of any other word) for about n items.

    Other words appear at most `uncommon` times; common words at least twice that and two
    more, and about 3 % of the list each (RULER's 30-vs-3 at 4K tokens is the same shape).
    `uncommon` grows when the vocabulary could not otherwise fill `capacity` items.
    """
    uncommon = 1 if n < 200 else 2 if n < 600 else 3
    while True:
        common = max(uncommon + 2, 2 * uncommon, round(0.03 * n))
        if capacity - CWE_COMMON * common <= uncommon * (vocabulary_size - CWE_COMMON):
            return common, uncommon
        uncommon += 1


@dataclass
class CweSources:
    """The common-word task's material, made once per call of `cwe_sources` and shared by its documents."""

    vocabulary: list[str]                  # corpus words
    word_cost: dict[str, int]              # each word's tokens after a space
    number_cost: list[int] = field(default_factory=lambda: [0])   # grown on demand by _number_costs


def cwe(tokenizer, sources: CweSources, rng, target, depth):
    del depth
    vocabulary = list(sources.vocabulary)
    rng.shuffle(vocabulary)
    common_words, pool = vocabulary[:CWE_COMMON], vocabulary[CWE_COMMON:]
    word_cost = sources.word_cost

    overhead = measure(tokenizer, task_prompt(CWE_INTRO, "", CWE_QUESTION))
    line_cost = _number_costs(tokenizer, sources, 64)
    mean_word = sum(word_cost[w] for w in vocabulary) / len(vocabulary)

    def rough(n: int) -> int:
        return overhead + sum(line_cost[1:n + 1]) + round(mean_word * n)

    # Size the list roughly first; the counts of common/uncommon words are fixed from it.
    n_rough = 1
    while rough(n_rough * 2) <= target and n_rough < 1 << 24:
        n_rough *= 2
        line_cost = _number_costs(tokenizer, sources, 4 * n_rough + 64)
    n_rough = invert(rough, target, 0, 2 * n_rough)
    n_max = n_rough + n_rough // 4 + 64
    common, uncommon = _cwe_counts(n_rough, n_max, len(vocabulary))
    n_min = CWE_COMMON * common + CWE_COMMON
    if n_rough < n_min:
        raise ValueError(
            f"target of {target} tokens is too small for the common-word task: it holds about "
            f"{n_rough} list items, and {n_min} are needed ({CWE_COMMON} words x {common} plus "
            f"some others) after {overhead} tokens of instructions and question; use a larger "
            f"length fraction or max_model_len")
    line_cost = _number_costs(tokenizer, sources, n_max + 1)

    # An endless-enough stream of uncommon words, each at most `uncommon` times, and the
    # common words at fixed fractional positions; any list length n takes a prefix of both.
    stream = [w for w in pool for _ in range(uncommon)]
    rng.shuffle(stream)
    commons = [w for w in common_words for _ in range(common)]
    rng.shuffle(commons)
    fractions = sorted(rng.random() for _ in commons)

    def items(n: int) -> list[str]:
        slots: list[int] = []
        for j, f in enumerate(fractions):
            slot = max(int(f * n), slots[-1] + 1 if slots else 0)
            slots.append(min(slot, n - len(commons) + j))
        out, u = [], 0
        is_common = dict(zip(slots, commons))
        for i in range(n):
            if i in is_common:
                out.append(is_common[i])
            else:
                out.append(stream[u])   # never runs out: _cwe_counts sized it for n_max
                u += 1
        return out

    def body(words: Sequence[str]) -> str:
        return "\n".join(f"{i}. {w}" for i, w in enumerate(words, start=1))

    def estimate(n: int) -> int:
        return overhead + sum(line_cost[1:n + 1]) + sum(word_cost[w] for w in items(n))

    def build(n: int) -> str:
        return task_prompt(CWE_INTRO, body(items(n)), CWE_QUESTION)

    n, text, tokens = fit(tokenizer, target, build, estimate, n_min, n_max)
    if target - tokens > SIZE_TOLERANCE:
        text, tokens = _cwe_fill(tokenizer, target, items(n), tokens, common_words, pool,
                                 uncommon, word_cost, body)
    return text, tokens, [], common_words


def _cwe_fill(tokenizer, target, words, tokens, common_words, pool, uncommon, word_cost, body):
    """Close a gap wider than SIZE_TOLERANCE that whole items cannot fill (one item costs more
    than the gap): swap uncommon words near the end for longer ones still under their limit."""
    best_words, best_tokens = list(words), tokens
    best_text = task_prompt(CWE_INTRO, body(best_words), CWE_QUESTION)
    aim = target - best_tokens - SIZE_TOLERANCE // 2
    for _ in range(8):
        if target - best_tokens <= SIZE_TOLERANCE or aim <= 0:
            break
        trial = _swap_longer(best_words, aim, common_words, pool, uncommon, word_cost)
        text = task_prompt(CWE_INTRO, body(trial), CWE_QUESTION)
        measured = measure(tokenizer, text)
        if measured <= target:
            if measured > best_tokens:
                best_words, best_text, best_tokens = trial, text, measured
            aim = target - best_tokens - SIZE_TOLERANCE // 2
            if trial == best_words and measured < best_tokens:
                break
        else:
            aim -= measured - target + 1   # overshot: ask the same base for less
    return best_text, best_tokens


def _swap_longer(words, tokens, common_words, pool, uncommon, word_cost) -> list[str]:
    """`words` with uncommon words, from the end, swapped for longer ones adding about `tokens`."""
    out = list(words)
    counts: dict[str, int] = {}
    for w in out:
        counts[w] = counts.get(w, 0) + 1
    for i in range(len(out) - 1, -1, -1):
        if tokens <= 0:
            break
        w = out[i]
        if w in common_words:
            continue
        options = [v for v in pool if counts.get(v, 0) < uncommon
                   and 0 < word_cost[v] - word_cost[w] <= tokens]
        if not options:
            continue
        v = max(options, key=lambda v: (word_cost[v] - word_cost[w], v))
        tokens -= word_cost[v] - word_cost[w]
        out[i] = v
        counts[w] -= 1
        counts[v] = counts.get(v, 0) + 1
    return out


def _number_costs(tokenizer, sources: CweSources, n: int) -> list[int]:
    """costs[i] = estimated tokens of the "\\n{i}." part of list line i (index 0 unused)."""
    cache = sources.number_cost
    if len(cache) <= n:
        new = [f"\n{i}." for i in range(len(cache), n + 1)]
        cache.extend(len(ids) for ids in encode_batch(tokenizer, new))
    return cache



def cwe_sources(tokenizer, data_dir: Path) -> CweSources:
    """The cwe vocabulary (corpus words) and each word's token cost, once per call."""
    vocabulary = _cwe_vocabulary(load_corpus(Path(data_dir)))
    costs = encode_batch(tokenizer, [" " + w for w in vocabulary])
    return CweSources(vocabulary, {w: len(ids) for w, ids in zip(vocabulary, costs)})
