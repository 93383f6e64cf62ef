"""Long-context task data: RULER-style synthetic documents for lm-eval (see lm_eval_tasks/).

Six tasks (passkey, three needle-in-a-haystack variants, variable tracking, common-word
extraction) are generated here as JSONL docs, one file per task, in the schema that
lm_eval_tasks/utils.py loads. Everything is pure and deterministic: the same tokenizer, arguments and
data directory give byte-identical docs, so every cell of a (KV-cache dtype x max_model_len)
grid is asked exactly the same questions.

Each doc is sized as a share of max_model_len, measured the way the engine will see it: the
whole user turn rendered with the chat template (`kveval.inputs.workloads.render_chat`). The final size
is at most the target and at most SIZE_TOLERANCE tokens under it; a share above 1 is allowed so
that rejection of too-long prompts can be probed.

Only the stdlib is imported; the tokenizer is duck-typed as in kveval.inputs.workloads.
"""
from __future__ import annotations

import bisect
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kveval import defaults
from kveval.inputs.resources import DATA_DIR
from kveval.inputs.workloads import load_corpus, render_chat

SIZE_TOLERANCE = 8          # a doc is target - SIZE_TOLERANCE .. target tokens
MIN_HAYSTACK_TOKENS = 16    # below this a "depth" means nothing
DEFAULT_FRACTIONS = defaults.TASK_LENGTHS
DEFAULT_DEPTHS = defaults.TASK_DEPTHS
TASK_GROUP = "kveval_longctx"
_MAX_FIT_ROUNDS = 24


@dataclass(frozen=True)
class TaskSpec:
    name: str            # lm-eval task name (also the YAML `task:` and the JSONL file stem)
    short: str           # what the CLI also accepts
    description: str
    max_gen_toks: int    # answer budget; the YAML's generation_kwargs.max_gen_toks must match
    uses_depth: bool     # False: docs have depth null and no needles (cwe)


TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("kveval_passkey", "passkey",
             "a 5-digit pass key hidden in repeated filler sentences", 16, True),
    TaskSpec("kveval_niah_single", "niah_single",
             "one 7-digit magic number for a key, hidden in essay text", 32, True),
    TaskSpec("kveval_niah_multikey", "niah_multikey",
             "four magic numbers under different keys; the one for the asked key", 32, True),
    TaskSpec("kveval_niah_multivalue", "niah_multivalue",
             "four magic numbers under one key; all four must be recalled", 64, True),
    TaskSpec("kveval_vt", "vt",
             "a 4-hop chain of variable assignments; every variable holding the value", 64, True),
    TaskSpec("kveval_cwe", "cwe",
             "the 5 most common words of a long numbered word list", 64, False),
)}
_BY_SHORT = {spec.short: name for name, spec in TASKS.items()}


def resolve_task_names(names: str | Iterable[str]) -> list[str]:
    """Full task names, in the order given, without repeats.

    Accepts a comma-separated string or a list; short names map to full ones, "kveval_longctx"
    and "all" to the six. Other names are kept as they are: they may be lm-eval built-ins.
    """
    if isinstance(names, str):
        names = names.split(",")
    out: list[str] = []
    for name in (part.strip() for raw in names for part in str(raw).split(",")):
        if not name:
            continue
        if name in (TASK_GROUP, "all"):
            expanded = list(TASKS)
        else:
            expanded = [_BY_SHORT.get(name, name)]
        out.extend(n for n in expanded if n not in out)
    return out


# --------------------------------------------------------------------------- prompt wording

PASSKEY_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
                  "There and back again.")
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_INTRO = ("There is an important piece of information hidden inside a lot of irrelevant "
                 "text. Find it and memorize it. I will quiz you about it afterwards.")
PASSKEY_QUESTION = "What is the pass key? Answer with the pass key only."

NIAH_NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_INTRO = ("Some special magic numbers are hidden within the following text. Make sure to "
              "memorize them. I will quiz you about the numbers afterwards.")
NIAH_QUESTION = ("What is the special magic number for {key} mentioned in the provided text? "
                 "Answer with the number only.")
NIAH_MULTIVALUE_QUESTION = ("What are all the special magic numbers for {key} mentioned in the "
                            "provided text? Answer with the numbers only.")

VT_INTRO = "Memorize and track the chain of variable assignments hidden in the following text."
VT_QUESTION = ("Find all variables that are assigned the value {value} in the text above. "
               "Answer with the variable names only.")

CWE_INTRO = ("Below is a numbered list of words. In these words, some appear more often than "
             "others. Memorize the ones that appear most often.")
CWE_QUESTION = ("Question: What are the 5 most common words in the above list? "
                "Answer with the five words only.")
CWE_COMMON = 5

# Needle keys are adjective-noun pairs ("quiet-harbor"); none of these pairs occur in the corpus.
_ADJECTIVES = ("quiet", "amber", "brisk", "hollow", "silver", "crooked", "gentle", "frozen",
               "golden", "narrow", "restless", "scarlet", "humble", "distant", "velvet", "rusty",
               "eager", "misty", "bold", "lucky", "sleepy", "wooden", "bright", "ancient")
_NOUNS = ("harbor", "lantern", "meadow", "compass", "falcon", "orchard", "anchor", "canyon",
          "willow", "beacon", "pebble", "thimble", "glacier", "kettle", "saddle", "quarry",
          "violin", "marble", "tunnel", "ember", "walrus", "feather", "garnet", "hammock")


def _prompt(intro: str, body: str, question: str) -> str:
    return f"{intro}\n\n{body}\n\n{question}"


def _measure(tokenizer, text: str) -> int:
    """Prompt tokens as the engine will count them: chat template included."""
    return len(render_chat(tokenizer, text)[1])


# --------------------------------------------------------------------------- haystacks

_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


class _Source:
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
        counts = tokenizer(unique, add_special_tokens=False)["input_ids"]
        self.cost = {u: max(1, len(ids)) for u, ids in zip(unique, counts)}


@dataclass
class _Stream:
    """A haystack prefix candidate: units (cycling through the source), costs and boundaries."""
    units: list[str]
    cum: list[int]              # cum[i] = estimated tokens of units[:i]
    boundaries: list[int]       # unit indices where a sentence starts (ascending, from 0)


def _stream(source: _Source, first_paragraph: int, min_tokens: int) -> _Stream:
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
class _Needle:
    text: str
    depth: float                 # asked position as a share of the haystack
    after: int | None = None     # place at or after the needle with this index (chains)


def _place(stream: _Stream, k: int, needles: Sequence[_Needle]) -> list[int]:
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


def _haystack_text(stream: _Stream, k: int, needles: Sequence[_Needle],
                   at: Sequence[int]) -> str:
    order = sorted(range(len(needles)), key=lambda i: (at[i], i))
    parts, prev = [], 0
    for i in order:
        parts.append("".join(stream.units[prev:at[i]]))
        parts.append(" " + needles[i].text)
        prev = at[i]
    parts.append("".join(stream.units[prev:k]))
    return "".join(parts).lstrip()


def _fit(tokenizer, target: int, build: Callable[[int], str], estimate: Callable[[int], int],
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
    n = _invert(estimate, target - 2 - offset, lo, hi)
    for _ in range(_MAX_FIT_ROUNDS):
        text = build(n)
        tokens = _measure(tokenizer, text)
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
        guess = _invert(estimate, target - 2 - offset, lo, hi)
        n = min(max(guess, under + 1), over - 1)
    if best is None:
        raise ValueError(f"cannot fit a prompt into {target} tokens")
    return best


def _invert(estimate: Callable[[int], int], tokens: int, lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with estimate(n) <= tokens (lo if none)."""
    a, b = lo, hi
    while a < b:
        mid = (a + b + 1) // 2
        if estimate(mid) <= tokens:
            a = mid
        else:
            b = mid - 1
    return a


def _haystack_doc(tokenizer, source: _Source, target: int, first_paragraph: int,
                  intro: str, question: str,
                  needles: Sequence[_Needle]) -> tuple[str, int, list[float]]:
    """(input text, prompt tokens, needle depths) for a haystack task at `target` tokens."""
    empty = _prompt(intro, " ".join(n.text for n in needles), question)
    overhead = _measure(tokenizer, empty)
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
            return _prompt(intro, _haystack_text(stream, k, needles, at), question)

        def estimate(k: int) -> int:
            return overhead + stream.cum[k]

        lo = min(bisect.bisect_left(stream.cum, MIN_HAYSTACK_TOKENS // 2), len(stream.units))
        try:
            k, text, tokens = _fit(tokenizer, target, build, estimate, lo, len(stream.units))
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


# --------------------------------------------------------------------------- the tasks

def _seven_digits(rng: random.Random, used: set[str]) -> str:
    while True:
        value = str(rng.randint(1_000_000, 9_999_999))
        if value not in used:
            used.add(value)
            return value


def _keys(rng: random.Random, n: int) -> list[str]:
    return rng.sample([f"{a}-{b}" for a in _ADJECTIVES for b in _NOUNS], n)


def _var_names(rng: random.Random, n: int) -> list[str]:
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if name not in names:
            names.append(name)
    return names


def _passkey(tokenizer, sources, rng, target, depth):
    key = str(rng.randint(10_000, 99_999))
    needles = [_Needle(PASSKEY_NEEDLE.format(key=key), depth)]
    text, tokens, depths = _haystack_doc(tokenizer, sources["filler"], target, 0,
                                         PASSKEY_INTRO, PASSKEY_QUESTION, needles)
    return text, tokens, depths, [key]


def _niah_single(tokenizer, sources, rng, target, depth):
    key, = _keys(rng, 1)
    value = _seven_digits(rng, set())
    needles = [_Needle(NIAH_NEEDLE.format(key=key, value=value), depth)]
    return _essay(tokenizer, sources, rng, target, NIAH_INTRO,
                  NIAH_QUESTION.format(key=key), needles) + ([value],)


def _niah_multikey(tokenizer, sources, rng, target, depth):
    keys = _keys(rng, 4)
    used: set[str] = set()
    values = [_seven_digits(rng, used) for _ in keys]
    needles = [_Needle(NIAH_NEEDLE.format(key=keys[0], value=values[0]), depth)]
    needles += [_Needle(NIAH_NEEDLE.format(key=k, value=v), rng.random())
                for k, v in zip(keys[1:], values[1:])]
    return _essay(tokenizer, sources, rng, target, NIAH_INTRO,
                  NIAH_QUESTION.format(key=keys[0]), needles) + ([values[0]],)


def _niah_multivalue(tokenizer, sources, rng, target, depth):
    key, = _keys(rng, 1)
    used: set[str] = set()
    values = [_seven_digits(rng, used) for _ in range(4)]
    needles = [_Needle(NIAH_NEEDLE.format(key=key, value=values[0]), depth)]
    needles += [_Needle(NIAH_NEEDLE.format(key=key, value=v), rng.random()) for v in values[1:]]
    return _essay(tokenizer, sources, rng, target, NIAH_INTRO,
                  NIAH_MULTIVALUE_QUESTION.format(key=key), needles) + (values,)


def _vt(tokenizer, sources, rng, target, depth):
    names = _var_names(rng, 5)
    value = str(rng.randint(10_000, 99_999))
    hops = sorted(rng.uniform(depth, 1.0) for _ in names[1:])
    needles = [_Needle(f"VAR {names[0]} = {value}.", depth)]
    needles += [_Needle(f"VAR {names[i + 1]} = VAR {names[i]}.", hop, after=i)
                for i, hop in enumerate(hops)]
    return _essay(tokenizer, sources, rng, target, VT_INTRO,
                  VT_QUESTION.format(value=value), needles) + (names,)


def _essay(tokenizer, sources, rng, target, intro, question, needles):
    source = sources["essay"]
    first = rng.randrange(len(source.paragraphs))
    return _haystack_doc(tokenizer, source, target, first, intro, question, needles)


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


def _cwe(tokenizer, sources, rng, target, depth):
    del depth
    vocabulary = list(sources["cwe_vocabulary"])
    rng.shuffle(vocabulary)
    common_words, pool = vocabulary[:CWE_COMMON], vocabulary[CWE_COMMON:]
    word_cost = sources["cwe_word_cost"]

    overhead = _measure(tokenizer, _prompt(CWE_INTRO, "", CWE_QUESTION))
    line_cost = _number_costs(tokenizer, sources, 64)
    mean_word = sum(word_cost[w] for w in vocabulary) / len(vocabulary)

    def rough(n: int) -> int:
        return overhead + sum(line_cost[1:n + 1]) + round(mean_word * n)

    # Size the list roughly first; the counts of common/uncommon words are fixed from it.
    n_rough = 1
    while rough(n_rough * 2) <= target and n_rough < 1 << 24:
        n_rough *= 2
        line_cost = _number_costs(tokenizer, sources, 4 * n_rough + 64)
    n_rough = _invert(rough, target, 0, 2 * n_rough)
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
        return _prompt(CWE_INTRO, body(items(n)), CWE_QUESTION)

    n, text, tokens = _fit(tokenizer, target, build, estimate, n_min, n_max)
    if target - tokens > SIZE_TOLERANCE:
        text, tokens = _cwe_fill(tokenizer, target, items(n), tokens, common_words, pool,
                                 uncommon, word_cost, body)
    return text, tokens, [], common_words


def _cwe_fill(tokenizer, target, words, tokens, common_words, pool, uncommon, word_cost, body):
    """Close a gap wider than SIZE_TOLERANCE that whole items cannot fill (one item costs more
    than the gap): swap uncommon words near the end for longer ones still under their limit."""
    best_words, best_tokens = list(words), tokens
    best_text = _prompt(CWE_INTRO, body(best_words), CWE_QUESTION)
    aim = target - best_tokens - SIZE_TOLERANCE // 2
    for _ in range(8):
        if target - best_tokens <= SIZE_TOLERANCE or aim <= 0:
            break
        trial = _swap_longer(best_words, aim, common_words, pool, uncommon, word_cost)
        text = _prompt(CWE_INTRO, body(trial), CWE_QUESTION)
        measured = _measure(tokenizer, text)
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


def _number_costs(tokenizer, sources, n: int) -> list[int]:
    """costs[i] = estimated tokens of the "\\n{i}." part of list line i (index 0 unused)."""
    cache: list[int] = sources.setdefault("cwe_number_cost", [0])
    if len(cache) <= n:
        new = [f"\n{i}." for i in range(len(cache), n + 1)]
        cache.extend(len(ids) for ids in tokenizer(new, add_special_tokens=False)["input_ids"])
    return cache


_GENERATORS = {
    "kveval_passkey": _passkey,
    "kveval_niah_single": _niah_single,
    "kveval_niah_multikey": _niah_multikey,
    "kveval_niah_multivalue": _niah_multivalue,
    "kveval_vt": _vt,
    "kveval_cwe": _cwe,
}


def _sources(tokenizer, task: str, data_dir: Path) -> dict:
    """Per-call caches: tokenised haystack words (and the cwe vocabulary)."""
    if task == "kveval_passkey":
        return {"filler": _Source(tokenizer, [PASSKEY_FILLER], " ")}
    paragraphs = load_corpus(Path(data_dir))
    if task == "kveval_cwe":
        vocabulary = _cwe_vocabulary(paragraphs)
        costs = tokenizer([" " + w for w in vocabulary], add_special_tokens=False)["input_ids"]
        return {"cwe_vocabulary": vocabulary,
                "cwe_word_cost": {w: len(ids) for w, ids in zip(vocabulary, costs)}}
    return {"essay": _Source(tokenizer, paragraphs, "\n\n")}


def _number(x: float) -> str:
    """0.25 -> "0.25", 0.5 -> "0.50", 0.125 -> "0.125": two decimals unless more are needed."""
    text = f"{x:.2f}"
    return text if float(text) == x else repr(float(x))


def _check_args(task: str, max_model_len: int, fractions, depths, samples_per_point) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown kveval task {task!r}; known: {', '.join(TASKS)}")
    if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len <= 0:
        raise ValueError(f"max_model_len must be a positive integer, got {max_model_len!r}")
    if not fractions:
        raise ValueError("fractions is empty; give at least one length fraction")
    for f in fractions:
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not f > 0:
            raise ValueError(f"length fraction {f!r} must be a number above 0")
    if not depths:
        raise ValueError("depths is empty; give at least one needle depth")
    for d in depths:
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 <= d <= 1:
            raise ValueError(f"needle depth {d!r} must be between 0 and 1")
    if isinstance(samples_per_point, bool) or not isinstance(samples_per_point, int) \
            or samples_per_point < 1:
        raise ValueError(f"samples_per_point must be an integer >= 1, got {samples_per_point!r}")


def generate_task_docs(tokenizer, task: str, max_model_len: int, *,
                       fractions: Sequence[float] = DEFAULT_FRACTIONS,
                       depths: Sequence[float] = DEFAULT_DEPTHS,
                       samples_per_point: int = 1, seed: int = 0,
                       data_dir: Path = DATA_DIR, round_number: int = 0) -> list[dict]:
    """The docs of one task (full or short name) for one max_model_len, in the SCHEMA.md shape.

    Order: fractions, then depths, then samples. A depth task gets samples_per_point docs per
    (fraction, depth); cwe has no depth and gets samples_per_point x len(depths) per fraction,
    so every task has the same number of docs. Each doc has its own seeded generator, so adding
    a fraction or depth leaves the other docs unchanged.

    `round_number` k > 0: another round of new samples for the same run (run/rounds.py): other
    generators, and ids ending in -r<k>, so that no sample of one round pairs with another's.
    Round 0 is the run's first data, unchanged.
    """
    task = resolve_task_names([task])[0]
    _check_args(task, max_model_len, fractions, depths, samples_per_point)
    spec = TASKS[task]
    sources = _sources(tokenizer, task, Path(data_dir))
    generate = _GENERATORS[task]
    if spec.uses_depth:
        points = [(d, i) for d in depths for i in range(samples_per_point)]
    else:
        points = [(None, i) for i in range(samples_per_point * len(depths))]
    docs = []
    for fraction in fractions:
        target = round(fraction * max_model_len)
        for depth, i in points:
            key = f"{seed}-{task}-{max_model_len}-{fraction}-{depth}-{i}"
            rng = random.Random(key if not round_number else f"r{round_number}-{key}")
            try:
                text, tokens, needle_depths, outputs = generate(
                    tokenizer, sources, rng, target, depth)
            except ValueError as e:
                raise ValueError(f"{task}, max_model_len {max_model_len}, fraction {fraction}: "
                                 f"{e}") from None
            where = f"-d{_number(depth)}" if depth is not None else ""
            docs.append({
                "id": f"{task}-L{max_model_len}-f{_number(fraction)}{where}-s{i}"
                      + (f"-r{round_number}" if round_number else ""),
                "task": task,
                "input": text,
                "outputs": list(outputs),
                "max_model_len": max_model_len,
                "length_fraction": float(fraction),
                "target_tokens": target,
                "prompt_tokens": tokens,
                "depth": float(depth) if depth is not None else None,
                "needle_depths": needle_depths,
                "max_gen_toks": spec.max_gen_toks,
                "seed": seed,
            })
    return docs


def write_task_data(tokenizer, out_dir, max_model_len: int, tasks, *,
                    fractions: Sequence[float] = DEFAULT_FRACTIONS,
                    depths: Sequence[float] = DEFAULT_DEPTHS,
                    samples_per_point: int = 1, seed: int = 0,
                    data_dir: Path = DATA_DIR, round_number: int = 0) -> dict:
    """Write out_dir/<task>.jsonl for every kveval task among `tasks` (others are skipped:
    lm-eval built-ins need no data). Returns {task: {"file": file name, "docs": count,
    "skipped": {fraction: why}}}. A size too small for a task's question and needles is skipped
    (and said why) rather than costing the task its other sizes; a task with no size left gets
    no file (file None)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for task in resolve_task_names(tasks):
        if task not in TASKS:
            continue
        docs, skipped = [], {}
        for fraction in fractions:
            try:
                docs += generate_task_docs(tokenizer, task, max_model_len, fractions=(fraction,), depths=depths,
                                           samples_per_point=samples_per_point, seed=seed, data_dir=data_dir,
                                           round_number=round_number)
            except ValueError as error:
                if "too small" not in str(error):
                    raise
                skipped[str(fraction)] = str(error)
        if not docs:
            written[task] = {"file": None, "docs": 0, "skipped": skipped}
            continue
        name = f"{task}.jsonl"
        lines = "".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs)
        tmp = out / f".{name}.tmp"
        tmp.write_text(lines, encoding="utf-8")
        tmp.replace(out / name)   # never leave a half-written file under the real name
        written[task] = {"file": name, "docs": len(docs), "skipped": skipped}
    return written
