"""Degeneration scan: loops, runs, duplicated tokens, symbol garbage and length blow-up in outputs.

These are the visible FP8-KV failures users report (ANCHORS.md): repetition runaway, "!!!!" or
"????////" output, every second token duplicated, unreadable output that runs to the token limit.
A tiny model loops on its own under greedy decoding, so a finding only counts against a KV dtype
when it is new: the baseline (auto) cell's output for the same prompt did not show it.

Each detector is a pure function returning None or one Finding. Thresholds are module constants,
chosen so that normal prose, code and markdown (table rules, `---`, `...`, banners) stay silent.
"""
from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV, Prompt, baseline_for, generation_records, prompts_of
from kveval.files.schema import CellResult, GenerationRecord

Records = dict[str, dict[str, GenerationRecord]]   # cell -> prompt id -> its output

# -- repeated n-grams (loops) -------------------------------------------------------------------
# Repetition runaway repeats a phrase or sentence: "The pass key is the pass key. The pass key ..."
LOOP_MAX_PERIOD_TOKENS = 32   # a looping sentence is typically 5-30 tokens
LOOP_MIN_REPEATS = 4          # back-to-back copies; prose never repeats a phrase 4x in a row
LOOP_MIN_TOKENS = 16          # ... and the loop must be this long, so "no no no no" stays silent
LOOP_MAX_PERIOD_CHARS = 128   # ~ the same sentences measured in characters
LOOP_MIN_CHARS = 48
LOOP_MIN_COVERAGE = 0.30      # a loop not at the end must cover this share of the output
LOOP_END_SLACK_TOKENS = 2     # a loop "at the end" may be followed by EOS / one stray token
LOOP_END_SLACK_CHARS = 4

# -- single-token runs and duplicated tokens ----------------------------------------------------
TOKEN_RUN_MIN = 16            # tokenizers merge whitespace and dashes; 16 equal ids in a row is a stuck model
ALT_DUP_MIN_PAIRS = 8         # "t0 t0 t1 t1 ..." must double at least this many tokens ...
ALT_DUP_MIN_DISTINCT = 4      # ... of this many different ids (else it is a plain run or loop)
ALT_DUP_MAX_GAP = 4           # doublings at most this far apart form one stretch (tolerates a miss)

# -- symbol garbage -----------------------------------------------------------------------------
# Characters that form legitimate long lines: markdown rules and tables, setext headings, comment
# banners, ellipses and table-of-contents leaders. Other symbols (category So: emoji, box drawing)
# also appear in banners, so they are treated alike. They only count as garbage past a line width.
RULE_CHARS = frozenset("-=_*#~.+/\\|:\u2026")
RULE_RUN_MIN = 100            # same layout char; banners and rules stay within an ~80-column line
CHAR_RUN_MIN = 20             # non-layout symbols in one run ("!!!!", "????////"); emphasis stays under ~10
TABLE_RULE_CHARS = frozenset("-=:|+ ")   # a line of only these, with a | or +, is a table border
SYMBOL_MAX_DISTINCT = 4       # ... made of a short pattern: a regex character class is not garbage
# Joiners, variation selectors, combining marks and skin-tone modifiers: part of an emoji or letter,
# so they neither break a symbol run nor count towards its length.
_NEUTRAL_CATEGORIES = frozenset({"Mn", "Me", "Cf", "Sk"})

# -- unreadable text ----------------------------------------------------------------------------
# Output that is neither a loop nor a symbol run but no longer language: random sub-word soup such as
# "cuts((⊙w)lat:" or "reveleadalsydklfjfhwesdkghj" (a remedy cell broken by the engine path, issue 23).
# A word counts as unreadable on signs that prose, code, markdown and mixed-script text do not show:
UNREADABLE_MIN_WORDS = 3        # unreadable words in one output ...
UNREADABLE_MIN_SHARE = 0.05     # ... and this share of its words (one odd identifier is not garbage)
CONSONANT_RUN_MIN = 7           # lowercase consonants in a row ("dklfjfhw"); English peaks at 5-6 ("latchstring")
_VOWELS = frozenset("aeiouy")   # y: "rhythms" is a word
# Alphabets that do not mix inside one word in real text. CJK and kana are left out (Chinese and
# Japanese run Latin words into their own without spaces), and Greek too (units and maths: "10μs", "2π").
_SEPARATE_SCRIPTS = ("LATIN", "CYRILLIC", "ARABIC", "HEBREW", "ARMENIAN", "GEORGIAN", "THAI", "DEVANAGARI",
                     "HANGUL", "BENGALI", "TAMIL")

# -- length -------------------------------------------------------------------------------------
BLOWUP_FACTOR = 3.0           # vllm#13133: 140 -> 1000+ tokens; 3x is far outside greedy noise
BLOWUP_MIN_EXTRA = 64         # ... and at least this many tokens more, so 5 -> 16 is not a blow-up

EXCERPT_CHARS = 120

DETECTORS = ("ngram_loop_tokens", "ngram_loop_chars", "token_run", "alternating_duplication", "char_run",
             "unreadable_text", "length_blowup", "hit_token_limit")
# Reported and counted, but not a failure by itself (a long answer may just need more tokens).
INFORMATIONAL_DETECTORS = frozenset({"hit_token_limit"})

FINDING_COLUMNS = ["cell", "kv_spec", "max_model_len", "prompt", "workload", "detector", "detail",
                   "excerpt", "new_vs_baseline", "baseline_cell", "baseline_excerpt", "late"]
# A loop or run that starts after this share of an answer cut at max_tokens came after the answer
# (issue 22): it is listed, marked late, and not counted as a degenerate output.
LATE_SHARE = 0.8


@dataclass(frozen=True)
class Finding:
    detector: str
    detail: str
    excerpt: str
    start_share: float | None = None   # where a loop or run starts, as a share of the output

    def to_dict(self) -> dict[str, str]:
        return {"detector": self.detector, "detail": self.detail, "excerpt": self.excerpt}


# ----------------------------------------------------------------------------------- helpers

def _text_near(text: str, index: int, length: int, at_end: bool = False) -> str:
    """Text near token `index` of `length`: without a tokenizer, positions are mapped proportionally."""
    if at_end:
        return text[-EXCERPT_CHARS:]
    start = int(len(text) * index / length) if length else 0
    return text[start:start + EXCERPT_CHARS]


def _token_excerpt(token_ids: Sequence[int], text: str, index: int, at_end: bool = False) -> str:
    if text:
        return _text_near(text, index, len(token_ids), at_end)
    return str(list(token_ids[index:index + 24]))


def _extend(seq: Sequence[Any], period: int, index: int) -> tuple[int, int]:
    """The maximal run of positions around `index` where seq[i] == seq[i + period]."""
    last = len(seq) - period - 1
    lo = hi = index
    while lo > 0 and seq[lo - 1] == seq[lo - 1 + period]:
        lo -= 1
    while hi < last and seq[hi + 1] == seq[hi + 1 + period]:
        hi += 1
    return lo, hi


def _periodic_spans(seq: Sequence[Any], period: int, min_length: int) -> list[tuple[int, int]]:
    """Maximal [start, end) stretches of at least min_length items where seq[i] == seq[i + period].

    Such a stretch holds `need = min_length - period` matching positions in a row, so probing every
    need-th position finds all of them; this keeps the scan cheap on long normal text.
    """
    need, spans = max(1, min_length - period), []
    index = need - 1
    while index < len(seq) - period:
        if seq[index] != seq[index + period]:
            index += need
            continue
        lo, hi = _extend(seq, period, index)
        if hi - lo + 1 >= need:
            spans.append((lo, hi + 1 + period))
        index = hi + 1 + need
    return spans


@dataclass(frozen=True)
class _Loop:
    start: int
    end: int
    period: int
    at_end: bool

    @property
    def length(self) -> int:
        return self.end - self.start


def _find_loop(seq: Sequence[Any], max_period: int, min_length: int, end_slack: int,
               unit_ok: Callable[[Sequence[Any]], bool] = lambda unit: True) -> _Loop | None:
    """The longest qualifying back-to-back repetition (smallest period on ties), or None.

    Qualifying: >= LOOP_MIN_REPEATS copies, >= min_length items, and either reaching the end of the
    output or covering >= LOOP_MIN_COVERAGE of it.
    """
    n, best = len(seq), None
    for period in range(1, min(max_period, n // LOOP_MIN_REPEATS) + 1):
        for start, end in _periodic_spans(seq, period, max(min_length, LOOP_MIN_REPEATS * period)):
            length = end - start
            at_end = end >= n - end_slack
            if not (at_end or length >= LOOP_MIN_COVERAGE * n) or not unit_ok(seq[start:start + period]):
                continue
            if best is None or length > best.length:
                best = _Loop(start, end, period, at_end)
    return best


def _loop_detail(loop: _Loop, n: int, unit: str, what: str) -> str:
    where = "at the end" if loop.at_end else f"from {what[:-1]} {loop.start}"
    return (f"{loop.period}-{what[:-1]} unit {unit} repeated {loop.length / loop.period:.1f}x "
            f"({loop.length} of {n} {what}, {loop.length / n:.0%}) {where}")


# ----------------------------------------------------------------------------------- detectors

def ngram_loop_tokens(token_ids: Sequence[int], text: str = "") -> Finding | None:
    """A token n-gram (n <= LOOP_MAX_PERIOD_TOKENS) repeated back-to-back at the end or over 30 %."""
    ids = list(token_ids)
    loop = _find_loop(ids, LOOP_MAX_PERIOD_TOKENS, LOOP_MIN_TOKENS, LOOP_END_SLACK_TOKENS)
    if loop is None:
        return None
    unit = ids[loop.start:loop.start + loop.period]
    return Finding("ngram_loop_tokens", _loop_detail(loop, len(ids), str(unit), "tokens"),
                   _token_excerpt(ids, text, loop.start, loop.at_end), loop.start / len(ids))


def _has_content(unit: Sequence[str]) -> bool:
    """A loop unit of whitespace and rule characters is layout (a rule, indentation), not a loop."""
    return any(not ch.isspace() and ch not in RULE_CHARS for ch in unit)


def ngram_loop_chars(text: str) -> Finding | None:
    """Same as ngram_loop_tokens on characters: sees loops whose tokenization drifts between copies."""
    loop = _find_loop(text or "", LOOP_MAX_PERIOD_CHARS, LOOP_MIN_CHARS, LOOP_END_SLACK_CHARS, _has_content)
    if loop is None:
        return None
    unit = text[loop.start:loop.start + loop.period]
    return Finding("ngram_loop_chars", _loop_detail(loop, len(text), repr(unit), "chars"),
                   text[loop.start:loop.start + EXCERPT_CHARS], loop.start / len(text))


def token_run(token_ids: Sequence[int], text: str = "") -> Finding | None:
    """The longest run of one token id, when it reaches TOKEN_RUN_MIN."""
    best_start, best_length, position = 0, 0, 0
    for _, group in itertools.groupby(token_ids):
        length = sum(1 for _ in group)
        if length > best_length:
            best_start, best_length = position, length
        position += length
    if best_length < TOKEN_RUN_MIN:
        return None
    token = token_ids[best_start]
    return Finding("token_run", f"token {token} repeated {best_length}x from token {best_start}",
                   _token_excerpt(token_ids, text, best_start), best_start / len(token_ids))


def _doublings(ids: Sequence[int]) -> list[int]:
    """Positions i where ids[i] repeats ids[i-1] and is not the third+ item of a longer run."""
    return [i for i in range(1, len(ids)) if ids[i] == ids[i - 1] and (i < 2 or ids[i - 2] != ids[i - 1])]


def _chains(positions: list[int], max_gap: int) -> list[list[int]]:
    chains: list[list[int]] = []
    for position in positions:
        if chains and position - chains[-1][-1] <= max_gap:
            chains[-1].append(position)
        else:
            chains.append([position])
    return chains


def alternating_duplication(token_ids: Sequence[int], text: str = "") -> Finding | None:
    """Every-other-token duplication, "t0 t0 t1 t1 t2 t2 ...", over a stretch (ANCHORS failure 6)."""
    ids = list(token_ids)
    best = None
    for chain in _chains(_doublings(ids), ALT_DUP_MAX_GAP):
        distinct = len({ids[i] for i in chain})
        if len(chain) >= ALT_DUP_MIN_PAIRS and distinct >= ALT_DUP_MIN_DISTINCT:
            if best is None or len(chain) > len(best):
                best = chain
    if best is None:
        return None
    start, end = best[0] - 1, best[-1] + 1
    return Finding("alternating_duplication",
                   f"{len(best)} tokens doubled over tokens {start}..{end} of {len(ids)} "
                   f"(e.g. {ids[start:min(end, start + 8)]})",
                   _token_excerpt(ids, text, start), start / len(ids))


def _char_kind(ch: str) -> str:
    """One of: neutral (joiner, modifier), symbol (punctuation, symbol, emoji), other."""
    if ch.isalnum() or ch.isspace():
        return "other"
    return "neutral" if unicodedata.category(ch) in _NEUTRAL_CATEGORIES else "symbol"


def _symbol_runs(text: str) -> list[tuple[int, str]]:
    """(start, run) for every maximal stretch of symbol (and neutral) characters."""
    runs: list[tuple[int, str]] = []
    start: int | None = None
    for index, ch in enumerate(text + " "):
        if _char_kind(ch) == "other":
            if start is not None:
                runs.append((start, text[start:index]))
            start = None
        elif start is None:
            start = index
    return runs


def _is_layout(ch: str) -> bool:
    return ch in RULE_CHARS or unicodedata.category(ch) == "So"


def _table_rule(text: str, index: int) -> bool:
    """Whether the line holding text[index] is a table border ("| --- | --- |", "+-----+"): as wide
    as the table's cells, so any length is normal there."""
    end = text.find("\n", index)
    line = text[text.rfind("\n", 0, index) + 1:end if end != -1 else len(text)].strip()
    return set(line) <= TABLE_RULE_CHARS and ("|" in line or "+" in line)


def _garbage_run(counted: list[str]) -> str | None:
    """>= CHAR_RUN_MIN non-layout symbols in one run, made of a short pattern ("!!!!", "????////")."""
    garbage = [ch for ch in counted if not _is_layout(ch)]
    if len(garbage) >= CHAR_RUN_MIN and len(set(counted)) <= SYMBOL_MAX_DISTINCT:
        return f"{len(counted)} symbols of {''.join(sorted(set(counted)))!r} in a row"
    return None


def _layout_run(counted: list[str]) -> str | None:
    """One layout character repeated past a line width."""
    for ch, group in itertools.groupby(counted):
        length = sum(1 for _ in group)
        if _is_layout(ch) and length >= RULE_RUN_MIN:
            return f"{ch!r} x{length}"
    return None


def char_run(text: str) -> Finding | None:
    """Runs of one punctuation/symbol character ("!!!!") or of symbols only ("????////")."""
    for start, run in _symbol_runs(text or ""):
        counted = [ch for ch in run if _char_kind(ch) == "symbol"]
        problem = _garbage_run(counted)
        if problem is None:
            layout = _layout_run(counted)
            problem = layout if layout and not _table_rule(text, start) else None
        if problem:
            return Finding("char_run", f"{problem} at char {start}", text[start:start + EXCERPT_CHARS],
                           start / len(text))
    return None


def _script(ch: str) -> str | None:
    """The alphabet of a letter among _SEPARATE_SCRIPTS, else None."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return next((script for script in _SEPARATE_SCRIPTS if name.startswith(script)), None)


def _unreadable_sign(word: str) -> str | None:
    """Why one whitespace-delimited word is not language, or None."""
    for ch in word:
        category = unicodedata.category(ch)
        if ch == "\ufffd" or (category[0] == "C" and category != "Cf"):   # words hold no whitespace
            return "broken or control character"
    for index, ch in enumerate(word):
        # Arrows ("input→output") are writing; other maths symbols glued to letters are not.
        if unicodedata.category(ch) == "Sm" and not ch.isascii() and not "\u2190" <= ch <= "\u21ff":
            neighbours = word[max(0, index - 1):index] + word[index + 1:index + 2]
            if any(n.isalpha() for n in neighbours):
                return f"maths symbol {ch!r} inside a word"
    run = 0
    for ch in word:
        run = run + 1 if "a" <= ch <= "z" and ch not in _VOWELS else 0
        if run >= CONSONANT_RUN_MIN:
            return f"{CONSONANT_RUN_MIN}+ consonants in a row"
    scripts = {script for script in map(_script, word) if script}
    if len(scripts) > 1:
        return f"{' and '.join(sorted(scripts)).lower()} letters in one word"
    return None


def unreadable_text(text: str) -> Finding | None:
    """Several words that are not language (see _unreadable_sign), at least UNREADABLE_MIN_SHARE of them."""
    words = [(match.start(), match.group(0)) for match in re.finditer(r"\S+", text or "")]
    odd = [(start, word, sign) for start, word in words if (sign := _unreadable_sign(word))]
    if len(odd) < UNREADABLE_MIN_WORDS or len(odd) < UNREADABLE_MIN_SHARE * len(words):
        return None
    start, word, sign = odd[0]
    shown = ", ".join(repr(w[:24]) for _, w, _ in odd[:3])
    return Finding("unreadable_text", f"{len(odd)} of {len(words)} words are not language (e.g. {shown}: {sign})",
                   text[start:start + EXCERPT_CHARS], start / len(text))


def length_blowup(output_tokens: int, baseline_tokens: int | None, text: str = "") -> Finding | None:
    """Output more than BLOWUP_FACTOR x (and BLOWUP_MIN_EXTRA tokens) longer than the baseline's."""
    if baseline_tokens is None:
        return None
    if output_tokens > BLOWUP_FACTOR * baseline_tokens and output_tokens - baseline_tokens >= BLOWUP_MIN_EXTRA:
        ratio = f"{output_tokens / baseline_tokens:.1f}x" if baseline_tokens else "from nothing"
        return Finding("length_blowup", f"{output_tokens} tokens vs baseline {baseline_tokens} ({ratio})",
                       text[-EXCERPT_CHARS:])
    return None


def hit_token_limit(finish_reason: str | None, output_tokens: int = 0, text: str = "") -> Finding | None:
    """Generation stopped at max_tokens, not at EOS: informational, counted as a rate."""
    if finish_reason != "length":
        return None
    return Finding("hit_token_limit", f"stopped at max_tokens after {output_tokens} tokens", text[-EXCERPT_CHARS:])


# ----------------------------------------------------------------------------------- scanning

def _token_count(record: GenerationRecord) -> int:
    ids = record.token_ids
    return len(ids) if ids is not None else int(record.output_tokens or 0)


def scan_output(record: GenerationRecord | None,
                baseline_record: GenerationRecord | None = None) -> list[Finding]:
    """Every detector over one accepted record; length_blowup only with an accepted baseline record."""
    if not record or not record.accepted:
        return []
    text, tokens = record.text or "", _token_count(record)
    base_tokens = _token_count(baseline_record) if baseline_record and baseline_record.accepted else None
    found = [*_content_findings(tuple(record.token_ids or ()), text), length_blowup(tokens, base_tokens, text),
             hit_token_limit(record.finish_reason, tokens, text)]
    return [finding for finding in found if finding is not None]


@functools.lru_cache(maxsize=1 << 14)
def _content_findings(ids: tuple[int, ...], text: str) -> tuple[Finding | None, ...]:
    """The detectors that read only the output itself. The evidence is rebuilt after every cell, search
    step and round over every output so far, so each output is scanned once, not at every rebuild
    (findings are frozen: sharing them is safe)."""
    return (ngram_loop_tokens(ids, text), ngram_loop_chars(text), token_run(ids, text),
            alternating_duplication(ids, text), char_run(text), unreadable_text(text))


def _baseline_source(cells: dict[str, CellResult], name: str, prompt_id: str, baseline_kv: str,
                     records: Records) -> str | None:
    """The baseline cell whose output for this prompt excuses a finding in cell `name`.

    The baseline at the same max_model_len; when it did not start or refused the prompt, the
    baseline cell nearest in max_model_len that accepted it (greedy outputs rarely depend on it).
    """
    facts = cells[name]
    same = baseline_for(cells, facts, baseline_kv)
    candidates = [other for other, f in cells.items() if f.kv_spec == baseline_kv and f.started
                  and _accepted(records[other].get(prompt_id))]
    for other in candidates:
        if cells[other] is same:
            return other
    length = facts.max_model_len
    return min(candidates, key=lambda other: abs(cells[other].max_model_len - length), default=None)


def _accepted(record: GenerationRecord | None) -> bool:
    return bool(record and record.accepted)


def _scanned(workloads: list[dict[str, Any]], cells: dict[str, CellResult],
             records: Records) -> Iterator[tuple[str, Prompt, GenerationRecord]]:
    """(cell, prompt spec, record) for every accepted output of a started cell, in workload order."""
    for name, facts in cells.items():
        if not facts.started:
            continue
        for prompt in prompts_of(workloads):
            record = records[name].get(prompt.id)
            if record is not None and _accepted(record):
                yield name, prompt, record


def scan_cells(workloads: list[dict[str, Any]], cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    """One row per finding; `new_vs_baseline` is False for baseline cells and for findings a baseline
    output for the same prompt also had, at any length (detector by detector)."""
    records = {name: generation_records(facts) for name, facts in cells.items()}
    own: dict[tuple[str, str], list[Finding]] = {}
    sources: dict[tuple[str, str], str | None] = {}
    for name, prompt, record in _scanned(workloads, cells, records):
        key = (name, prompt.id)
        is_base = cells[name].kv_spec == baseline_kv
        source = None if is_base else _baseline_source(cells, name, prompt.id, baseline_kv, records)
        sources[key] = source
        base_record = records[source].get(prompt.id) if source else None
        own[key] = scan_output(record, base_record)
    rows = []
    for name, prompt, record in _scanned(workloads, cells, records):
        key, facts = (name, prompt.id), cells[name]
        source = sources[key]
        is_base = facts.kv_spec == baseline_kv
        # A finding the baseline also has for this prompt, at this length or at another one, is the
        # model's own habit on that prompt (greedy outputs of a small model loop readily), not new.
        base_hits = set() if not source else {
            f.detector for other, f_cell in cells.items() if f_cell.kv_spec == baseline_kv
            for f in own.get((other, prompt.id), [])}
        for finding in own[key]:
            late = (record.finish_reason == "length" and finding.start_share is not None
                    and finding.start_share >= LATE_SHARE)
            detail = finding.detail + (f"; late: starts after {100 * LATE_SHARE:.0f} % of an answer cut at max_tokens, "
                                       "not counted" if late else "")
            rows.append({"cell": name, "kv_spec": facts.kv_spec,
                         "max_model_len": facts.max_model_len, "prompt": prompt.id,
                         "workload": prompt.workload, "detector": finding.detector, "detail": detail,
                         "excerpt": finding.excerpt, "late": late,
                         # None: no baseline output for this prompt, so "new" cannot be judged.
                         "new_vs_baseline": (False if is_base else None if source is None
                                             else finding.detector not in base_hits),
                         "baseline_cell": source,
                         # What the baseline answered instead, for the reader to set beside the excerpt.
                         "baseline_excerpt": None if not source else _text(records[source].get(prompt.id))[:EXCERPT_CHARS]})
    return pd.DataFrame(rows, columns=FINDING_COLUMNS)


def _counted(findings: pd.DataFrame) -> pd.DataFrame:
    """The findings that make an output degenerate: not informational, not late."""
    return findings[~findings.detector.isin(INFORMATIONAL_DETECTORS) & ~findings.late.fillna(False).astype(bool)]


def _text(record: GenerationRecord | None) -> str:
    return (record.text or "") if record else ""


def _discordant(findings: pd.DataFrame, cells: dict[str, CellResult], name: str, workloads: list[dict[str, Any]],
                records: Records) -> tuple[int, int]:
    """The paired 2×2's discordant counts (gate: McNemar's test) against the baseline output that judges each
    prompt: (outputs with a new finding whose baseline output is clean; outputs that are clean where the
    baseline output degenerates). An output that degenerates on both sides is concordant, whichever detectors
    fired on each (a base model's `????` run against its own `<h2><h2>` loop is one prompt both caches fail);
    a loop a baseline has at another length stays excused (scan_cells)."""
    failing = _counted(findings)
    bad = set(zip(failing.cell, failing.prompt))
    new = failing[failing.new_vs_baseline.fillna(False).astype(bool)]
    with_new = set(new.prompt[new.cell == name])
    only_here = only_baseline = 0
    for _, prompt, _ in _scanned(workloads, {name: cells[name]}, {name: records[name]}):
        source = _baseline_source(cells, name, prompt.id, BASELINE_KV, records)
        if source is None:
            continue
        there = (source, prompt.id) in bad
        only_here += prompt.id in with_new and not there
        only_baseline += there and (name, prompt.id) not in bad
    return only_here, only_baseline


def _cumulative(rounds: list[int]) -> list[int]:
    """Counts after each round present in `rounds` (round numbers, one per output), cumulative."""
    looks, total = [], 0
    for number in sorted(set(rounds)):
        total += rounds.count(number)
        looks.append(total)
    return looks


def degeneration_summary(findings: pd.DataFrame, cells: dict[str, CellResult], workloads: list[dict[str, Any]]) -> pd.DataFrame:
    """Per started cell: outputs scanned, outputs with (new) findings, count per detector, token-limit rate.

    hit_token_limit is informational: it has its own count and rate, but does not make an output
    count as "with findings".
    """
    records = {name: generation_records(facts) for name, facts in cells.items()}
    rows = []
    for name, facts in cells.items():
        if not facts.started:
            continue
        outputs = [record for _, _, record in _scanned(workloads, {name: facts}, {name: records[name]})]
        mine = findings[findings.cell == name]
        failures = _counted(mine)
        new = failures[failures.new_vs_baseline.fillna(False).astype(bool)]
        is_base = facts.kv_spec == BASELINE_KV
        # Outputs with a baseline output for the same prompt: only these can show "new" degeneration.
        judged_rounds = [] if is_base else [
            int(record.round or 0) for _, prompt, record in _scanned(workloads, {name: facts}, {name: records[name]})
            if _baseline_source(cells, name, prompt.id, BASELINE_KV, records) is not None]
        judged = None if is_base else len(judged_rounds)
        # The paired 2×2's discordant cells (gate: McNemar's test), output by output.
        only_here, baseline_only = (None, None) if is_base else _discordant(findings, cells, name, workloads, records)
        limited = sum(1 for record in outputs if record.finish_reason == "length")
        row = {"cell": name, "kv_spec": facts.kv_spec, "max_model_len": facts.max_model_len,
               "outputs": len(outputs),
               "outputs_with_findings": int(failures.prompt.nunique()),
               "outputs_with_new_findings": int(new.prompt.nunique()), "judged_outputs": judged,
               "degenerate_only_here": only_here,
               "baseline_only_degenerate": baseline_only,
               # Judged outputs after each round that added some (rounds of new probes, run/rounds.py):
               # the looks of the sequential design. One look when there were no rounds.
               "looks": None if is_base else _cumulative(judged_rounds),
               "look_rounds": None if is_base else sorted(set(judged_rounds)),
               **{detector: int((mine.detector == detector).sum()) for detector in DETECTORS},
               "token_limit_rate": limited / len(outputs) if outputs else None}
        rows.append(row)
    columns = ["cell", "kv_spec", "max_model_len", "outputs", "outputs_with_findings",
               "outputs_with_new_findings", "judged_outputs", "degenerate_only_here", "baseline_only_degenerate",
               "looks", "look_rounds", *DETECTORS,
               "token_limit_rate"]
    return pd.DataFrame(rows, columns=columns)
