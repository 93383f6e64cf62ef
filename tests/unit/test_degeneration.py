"""Degeneration detectors on constructed outputs, and the new-vs-baseline logic on small cells."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from kveval.analysis import degeneration as dg
from kveval.analysis.degeneration import (DETECTORS, FINDING_COLUMNS, Finding, alternating_duplication, char_run,
                                          degeneration_summary, hit_token_limit, length_blowup, ngram_loop_chars,
                                          ngram_loop_tokens, scan_cells, scan_output, token_run, unreadable_text)
from kveval.inputs.workloads import load_corpus
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells, typed_record

_VOCAB: dict[str, int] = {}


def ids(text: str) -> list[int]:
    """A word-level stand-in tokenizer: words, whitespace runs, and punctuation where a run of one
    mark merges into tokens of up to 16 chars, as BPE vocabularies do (SmolLM2's tokenizer turns 80
    '/' into 10 tokens and 150 '-' into 3)."""
    pieces = (m.group(0) for m in re.finditer(r"\w+|([^\w\s])\1{0,15}|\s+", text))
    return [_VOCAB.setdefault(piece, len(_VOCAB) + 1) for piece in pieces]


PROSE = " ".join(load_corpus())   # ~6,300 words of original essays shipped with kveval

MARKDOWN = """## Results

| kv_cache_dtype | max_model_len | KV tokens | ratio |
|:---------------|--------------:|----------:|:-----:|
| auto           | 2048          | 51,200    | 1.00  |
| fp8            | 2048          | 71,680    | 1.40  |

| setting | value |
| ------- | ----------------------------------------------------------------------------------------------------------------------- |
| a       | b |

---

***

Setext heading
==============

Well... it depends. Wait -- really?! Yes!!! (see *Notes*), e.g. `x = y ** 2`.

* item one
* item two
  * nested item

> quoted text... and more text…
Chapter one ........................................ page five
"""

CODE = '''# ==============================================================================
# Binary search
# ==============================================================================
def binary_search(items: list[int], target: int) -> int:
    """Return the index of target, or -1."""
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


matrix = [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
print(f"{matrix!r}")  # -> [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
pattern = re.compile(r"([(){}\\[\\]:!#$%&*+.\\\\/<=>?@^|~-]+)")
/* ------------------------------------------------------------------------ */
if (a && (b || c)) { return f(g(h(x))); }
"""
'''

EMOJI = ("Great question! 🎉 Here is a summary 👇\n\n✅ Greedy outputs matched 🙂\n👨‍👩‍👧‍👦 family, 👍🏽 thumbs, "
         "🇫🇷 flag, ❤️ heart\nこんにちは、世界！これはテストです。Ünïcödé façade naïve café. Привет, мир!\n")

NORMAL_TEXTS = {"prose": PROSE, "markdown": MARKDOWN, "code": CODE, "emoji": EMOJI}
LOOP_UNIT = "The pass key is the pass key. "


def _all_detectors(text: str) -> list[Finding]:
    tokens = ids(text)
    found = [ngram_loop_tokens(tokens, text), ngram_loop_chars(text), token_run(tokens, text),
             alternating_duplication(tokens, text), char_run(text), unreadable_text(text)]
    return [f for f in found if f is not None]


# ----------------------------------------------------------------------------- no false alarms

@pytest.mark.parametrize("name", sorted(NORMAL_TEXTS))
def test_normal_text_fires_nothing(name):
    assert _all_detectors(NORMAL_TEXTS[name]) == []


def test_long_prose_is_long_and_silent():
    assert len(PROSE) > 30_000
    for start in range(0, len(PROSE), 2_000):   # also as output-sized pieces ending anywhere
        assert _all_detectors(PROSE[start:start + 2_000]) == []


@pytest.mark.parametrize("text", ["", "a", "!", "🙂", " "])
def test_tiny_outputs_fire_nothing(text):
    assert _all_detectors(text) == []
    assert ngram_loop_tokens([]) is None and token_run([]) is None and alternating_duplication([]) is None
    assert ngram_loop_tokens([7]) is None and token_run([7]) is None and alternating_duplication([7]) is None


# ----------------------------------------------------------------------------- ngram_loop_tokens

def test_token_loop_at_the_end():
    text = "Sure, the answer is: " + LOOP_UNIT * 6
    finding = ngram_loop_tokens(ids(text), text)
    assert finding.detector == "ngram_loop_tokens"
    assert finding.detail.startswith("15-token unit")     # 7 words, 7 spaces and the full stop
    assert "at the end" in finding.detail
    assert finding.excerpt == text[-dg.EXCERPT_CHARS:]


def test_token_loop_followed_by_eos_is_still_at_the_end():
    text = "Answer: " + LOOP_UNIT * 5
    tokens = ids(text) + [0]     # an EOS id after the loop
    assert "at the end" in ngram_loop_tokens(tokens, text).detail


def test_token_loop_in_the_middle_needs_coverage():
    loop = LOOP_UNIT * 5                                # 75 tokens
    big = PROSE[:150] + loop + PROSE[150:300]           # loop covers over 30 %
    finding = ngram_loop_tokens(ids(big), big)
    assert finding is not None and "at the end" not in finding.detail
    small = PROSE[:3000] + loop + PROSE[3000:6000]      # loop covers < 30 % and is not at the end
    assert ngram_loop_tokens(ids(small), small) is None


def test_token_loop_thresholds():
    unit = [11, 12, 13, 14]
    assert ngram_loop_tokens([1, 2, 3] + unit * 4) is not None         # 4 copies, 16 tokens
    assert ngram_loop_tokens([1, 2, 3] + unit * 3 + unit[:3]) is None   # 3.75 copies
    assert ngram_loop_tokens([1, 2, 3] + [11, 12] * 7) is None           # 7 copies but only 14 tokens
    assert ngram_loop_tokens([1, 2, 3] + [11, 12] * 8) is not None       # 16 tokens
    long_unit = list(range(100, 100 + dg.LOOP_MAX_PERIOD_TOKENS + 1))
    assert ngram_loop_tokens(long_unit * 5) is None                      # unit longer than the maximum


def test_token_loop_reports_smallest_period():
    finding = ngram_loop_tokens([1, 2, 3] + [5, 6] * 20)
    assert finding.detail.startswith("2-token unit [5, 6] repeated 20.0x")


def test_token_loop_excerpt_without_text_shows_ids():
    assert ngram_loop_tokens([1, 2, 3] + [5, 6] * 20).excerpt == str([5, 6] * 12)


# ----------------------------------------------------------------------------- ngram_loop_chars

def test_char_loop_sees_loops_whatever_the_tokens():
    text = "Here is the key. " + "the pass key is 12. " * 6
    finding = ngram_loop_chars(text)
    assert finding.detector == "ngram_loop_chars" and "20-char unit" in finding.detail
    assert "at the end" in finding.detail
    # Token ids that never repeat (a different tokenization each copy) hide it from the token detector.
    assert ngram_loop_tokens(list(range(len(text) // 3)), text) is None


def test_char_loop_thresholds():
    assert ngram_loop_chars("Result: " + "abcdefghijkl" * 4) is not None      # 4 x 12 = 48 chars
    assert ngram_loop_chars("Result: " + "abcdefghijk" * 4) is None           # 44 chars
    assert ngram_loop_chars("Result: " + "ab" * 23) is None                   # 46 chars


def test_char_loop_ignores_layout_only_units_and_catches_emoji_spam():
    assert ngram_loop_chars("Table:\n" + "-" * 300) is None        # char_run's business
    assert ngram_loop_chars("code\n" + " " * 200) is None
    finding = ngram_loop_chars("I love it " + "😂" * 60)
    assert finding is not None and finding.detail.startswith("1-char unit '😂'")


# ----------------------------------------------------------------------------- token_run

def test_token_run():
    assert token_run([1, 2] + [9] * dg.TOKEN_RUN_MIN + [3]).detail == "token 9 repeated 16x from token 2"
    assert token_run([1, 2] + [9] * (dg.TOKEN_RUN_MIN - 1) + [3]) is None
    assert token_run([4] * 40 + [5] * 50).detail == "token 5 repeated 50x from token 40"


# ----------------------------------------------------------------------------- alternating_duplication

def test_every_token_doubled():
    words = ids(PROSE[:400])
    doubled = [t for t in words for _ in range(2)]
    finding = alternating_duplication(doubled)
    assert finding.detector == "alternating_duplication"
    assert finding.detail.startswith(f"{len(words)} tokens doubled over tokens 0..{len(doubled)}")


def test_doubling_tolerates_a_miss_and_every_third_pattern():
    base = list(range(100, 140))
    with_miss = [t for i, t in enumerate(base) for _ in range(1 if i == 10 else 2)]
    assert alternating_duplication(with_miss).detail.startswith("39 tokens doubled")
    every_other = [t for i, t in enumerate(base) for _ in range(2 if i % 2 else 1)]   # t0 t1 t1 t2 t3 t3
    assert alternating_duplication(every_other) is not None


def test_doubling_negatives():
    assert alternating_duplication([7] * 40) is None                      # a run, not a doubling
    assert alternating_duplication([1, 1, 2, 2] * 10) is None             # two ids: a loop
    short = [t for t in range(100, 107) for _ in range(2)]                # 7 doublings
    assert alternating_duplication([1, 2, 3] + short + [4, 5]) is None
    prose = ids(PROSE[:2000])
    sprinkled = prose[:50] + [prose[50]] + prose[50:300] + [prose[300]] + prose[300:]   # "the the" typos
    assert alternating_duplication(sprinkled) is None


# ----------------------------------------------------------------------------- char_run

@pytest.mark.parametrize("garbage", ["!" * 20, "?" * 64, "????////" * 5, "!?" * 15, "！" * 30, ")" * 20,
                                     "-" * 100, "_" * 150, "." * 120])
def test_char_run_fires(garbage):
    finding = char_run("The answer is " + garbage + " done")
    assert finding.detector == "char_run" and finding.detail.endswith("at char 14")
    assert finding.excerpt.startswith(garbage[:20])


@pytest.mark.parametrize("fine", ["!" * 19, "????////" * 2, "-" * 99, "." * 60, "=" * 80, "*" * 3, "...", "?!",
                                  "🚨" * 48, "─" * 80, "+" + "-" * 200 + "+", "| --- | " + "-" * 150 + " |",
                                  "#$%&'()*+,-./:;<=>?@[]^_`{|}~" * 2])
def test_char_run_stays_silent(fine):
    assert char_run("The answer is\n" + fine + "\ndone") is None


# ----------------------------------------------------------------------------- unreadable_text

# The garbage of the broken remedy cells in reports/h200-qwen2.5-coder-1.5b/keep-layers (their excerpts),
# which no other detector saw.
BROKEN_REMEDY = ("lock perfectly symmetrical cuts((⊙w)lat:\n matéria roateemonading JavaScript is\n0 "
                 "lock satisfying all reveleadalsydklfjfhwesdkghjuijshsjflkjnjshODO\n\nainer oil0\nis "
                 "lock picking out of 你提到过载\n;&#spring... 为了简化XMLHttpRequest0.0000000000 sdfghjkl qwrtzpx")


def test_unreadable_text_fires_on_sub_word_soup():
    finding = unreadable_text(BROKEN_REMEDY)
    assert finding.detector == "unreadable_text"
    assert finding.detail.startswith("4 of 25 words are not language")
    assert "'cuts((⊙w)lat:'" in finding.detail and finding.excerpt.startswith("cuts((⊙w)lat:")


@pytest.mark.parametrize("word, sign", [("cuts((⊙w)lat:", "maths symbol"), ("sydklfjfhwes", "consonants"),
                                        ("Bаsилий", "cyrillic and latin"), ("ab\ufffdcd", "broken"),
                                        ("x\x07y", "control")])
def test_unreadable_signs(word, sign):
    assert sign in dg._unreadable_sign(word)


@pytest.mark.parametrize("word", ["用Python写代码", "10μs", "2πr", "input→output", "latchstring", "rhythms",
                                  "HTTPSConnection", "x²", "naïve", "👨‍👩‍👧‍👦", "3×3", "Привет", "mask=0xFFFF"])
def test_real_words_are_readable(word):
    assert dg._unreadable_sign(word) is None


def test_unreadable_text_needs_several_words_and_a_share_of_them():
    two = "A fine answer with sdfghjkl and qwrtzpx in it."
    assert unreadable_text(two) is None
    three = two + " Also bcdfghjk."
    assert unreadable_text(three).detail.startswith("3 of 11 words")
    assert unreadable_text(PROSE[:3000] + " sdfghjkl qwrtzpx bcdfghjk") is None   # 3 of ~500 words: under 5 %


# ----------------------------------------------------------------------------- length and limit

def test_length_blowup():
    finding = length_blowup(1000, 140, "tail text")
    assert finding == Finding("length_blowup", "1000 tokens vs baseline 140 (7.1x)", "tail text")
    assert length_blowup(420, 140) is None                   # exactly 3x is not more than 3x
    assert length_blowup(421, 140) is not None
    assert length_blowup(40, 10) is None                     # 4x but only +30 tokens
    assert length_blowup(100, 30) is not None                # 3.3x and +70
    assert length_blowup(64, 0).detail == "64 tokens vs baseline 0 (from nothing)"
    assert length_blowup(63, 0) is None
    assert length_blowup(5000, None) is None                 # no baseline, no verdict


def test_hit_token_limit():
    assert hit_token_limit("length", 256, "abc").to_dict() == {
        "detector": "hit_token_limit", "detail": "stopped at max_tokens after 256 tokens", "excerpt": "abc"}
    assert hit_token_limit("stop", 12) is None and hit_token_limit(None) is None


# ----------------------------------------------------------------------------- scan_output

def _rec(prompt_id, text, finish="stop", token_ids=None, accepted=True):
    if not accepted:
        return {"prompt_id": prompt_id, "workload": prompt_id.rsplit("-", 1)[0], "accepted": False,
                "rejection": "This model's maximum context length is 1024 tokens."}
    tokens = ids(text) if token_ids is None else token_ids
    return {"prompt_id": prompt_id, "workload": prompt_id.rsplit("-", 1)[0], "accepted": True, "text": text,
            "token_ids": tokens, "finish_reason": finish, "output_tokens": len(tokens)}


def test_scan_output():
    assert scan_output(typed_record(_rec("p-0", "", token_ids=[]))) == []
    assert scan_output(typed_record(_rec("p-0", PROSE[:1500]))) == []
    assert scan_output(typed_record(_rec("p-0", "", accepted=False))) == []
    looping = _rec("p-0", "Answer: " + LOOP_UNIT * 8, finish="length")
    assert [f.detector for f in scan_output(typed_record(looping))] == ["ngram_loop_tokens", "ngram_loop_chars",
                                                          "hit_token_limit"]
    short_base = _rec("p-0", "The key is 123.")
    assert [f.detector for f in scan_output(typed_record(looping), typed_record(short_base))] == [
        "ngram_loop_tokens", "ngram_loop_chars", "length_blowup", "hit_token_limit"]
    assert "length_blowup" not in [f.detector for f in scan_output(typed_record(looping), typed_record(_rec("p-0", "", accepted=False)))]


# ----------------------------------------------------------------------------- scan_cells

WORKLOADS = [
    {"id": "short_256-0", "workload": "short_256", "kind": "short", "max_tokens": 256, "token_ids": [1], "text": "q"},
    {"id": "short_256-1", "workload": "short_256", "kind": "short", "max_tokens": 256, "token_ids": [2], "text": "q"},
    {"id": "over_1024-0", "workload": "over_1024", "kind": "over_limit", "max_tokens": 64,
     "token_ids": list(range(1025)), "text": "doc"},
]

LOOP = "Answer: " + LOOP_UNIT * 8          # the tiny model loops on its own
NORMAL = "The pass key is 4821."


def _cell(kv, length, records, started=True):
    return complete_cell({"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length, "started": started,
                          "phases": {"generation": {"records": records}}})


def _cells():
    looped_and_stuck = LOOP + "!" * 40
    return {
        "auto-1024": _cell("auto", 1024, [_rec("short_256-0", LOOP, finish="length"), _rec("short_256-1", NORMAL),
                                          _rec("over_1024-0", "", accepted=False)]),
        # Same loop as the baseline (not new) plus garbage at the end (new); prompt 1 blows up.
        "fp8-1024": _cell("fp8", 1024, [_rec("short_256-0", looped_and_stuck, finish="length"),
                                        _rec("short_256-1", "Sure. " + "!" * 480, finish="length",
                                             token_ids=ids("Sure. ") + ids("!!!!") * 120),
                                        _rec("over_1024-0", "", accepted=False)]),
        # auto-2048 did not start: the baseline at the nearest length stands in.
        "auto-2048": _cell("auto", 2048, [], started=False),
        "fp8-2048": _cell("fp8", 2048, [_rec("short_256-0", LOOP, finish="length"), _rec("short_256-1", NORMAL),
                                        _rec("over_1024-0", NORMAL)]),
        "fp8-4096": _cell("fp8", 4096, [_rec("short_256-0", LOOP)], started=False),
    }


def _by_key(findings):
    return {(r.cell, r.prompt, r.detector): r for r in findings.itertuples(index=False)}


def test_scan_cells_new_vs_baseline():
    findings = scan_cells(WORKLOADS, typed_cells(_cells()))
    assert list(findings.columns) == FINDING_COLUMNS
    rows = _by_key(findings)
    # The baseline's own loop is never "new": it is the baseline.
    base = [key for key in rows if key[0] == "auto-1024"]
    assert sorted(base) == [("auto-1024", "short_256-0", d) for d in
                            sorted(["ngram_loop_tokens", "ngram_loop_chars", "hit_token_limit"])]
    assert not any(rows[key].new_vs_baseline for key in base)
    assert all(pd.isna(rows[key].baseline_cell) for key in base)
    # fp8 repeats the baseline's loop (not new) and adds "!!!!" (new).
    assert not rows[("fp8-1024", "short_256-0", "ngram_loop_tokens")].new_vs_baseline
    assert not rows[("fp8-1024", "short_256-0", "hit_token_limit")].new_vs_baseline
    assert rows[("fp8-1024", "short_256-0", "char_run")].new_vs_baseline
    assert rows[("fp8-1024", "short_256-0", "char_run")].baseline_cell == "auto-1024"
    new_on_1 = {key[2] for key, row in rows.items() if key[:2] == ("fp8-1024", "short_256-1") and row.new_vs_baseline}
    assert new_on_1 == set(DETECTORS) - {"alternating_duplication", "unreadable_text"}
    row = rows[("fp8-1024", "short_256-1", "length_blowup")]
    assert (row.kv_spec, row.max_model_len, row.workload) == ("fp8", 1024, "short_256")
    # fp8-2048: no started auto at 2048, so auto-1024 excuses the same loop; over_1024-0 has no baseline output.
    assert rows[("fp8-2048", "short_256-0", "ngram_loop_tokens")].baseline_cell == "auto-1024"
    assert not rows[("fp8-2048", "short_256-0", "ngram_loop_tokens")].new_vs_baseline
    assert not any(key[0] == "fp8-4096" for key in rows)   # did not start
    assert not any(key[1] == "over_1024-0" for key in rows)


def test_scan_cells_without_any_baseline_marks_everything_new():
    cells = {"fp8-1024": _cell("fp8", 1024, [_rec("short_256-0", LOOP)])}
    findings = scan_cells(WORKLOADS, typed_cells(cells))
    assert set(findings["detector"]) == {"ngram_loop_tokens", "ngram_loop_chars"}
    assert findings["new_vs_baseline"].all() and findings["baseline_cell"].isna().all()


def test_scan_cells_empty():
    findings = scan_cells(WORKLOADS, typed_cells({}))
    assert findings.empty and list(findings.columns) == FINDING_COLUMNS


def test_degeneration_summary():
    cells = _cells()
    summary = degeneration_summary(scan_cells(WORKLOADS, typed_cells(cells)), typed_cells(cells), WORKLOADS)
    assert list(summary["cell"]) == ["auto-1024", "fp8-1024", "fp8-2048"]   # started cells only
    rows = {r.cell: r for r in summary.itertuples(index=False)}
    auto, fp8, other = rows["auto-1024"], rows["fp8-1024"], rows["fp8-2048"]
    assert (auto.outputs, auto.outputs_with_findings, auto.outputs_with_new_findings) == (2, 1, 0)
    # fp8's "!!!!" on short_256-0 starts after 80 % of an answer cut at max_tokens: listed as late, not
    # counted (issue 22); its blow-up on short_256-1 counts.
    assert (fp8.outputs, fp8.outputs_with_findings, fp8.outputs_with_new_findings) == (2, 2, 1)
    assert (other.outputs, other.outputs_with_findings, other.outputs_with_new_findings) == (3, 1, 0)
    assert (auto.hit_token_limit, fp8.hit_token_limit, fp8.char_run, fp8.length_blowup) == (1, 2, 2, 1)
    assert (auto.token_limit_rate, fp8.token_limit_rate) == (0.5, 1.0)
    assert other.token_limit_rate == pytest.approx(1 / 3)
    assert set(DETECTORS) <= set(summary.columns)


def test_summary_counts_token_limit_from_records_and_not_as_a_finding():
    cells = {"auto-1024": _cell("auto", 1024, [_rec("short_256-0", PROSE[:800], finish="length"),
                                               _rec("short_256-1", NORMAL)])}
    summary = degeneration_summary(scan_cells(WORKLOADS, typed_cells(cells)), typed_cells(cells), WORKLOADS)
    row = summary.iloc[0]
    assert row["outputs"] == 2 and row["outputs_with_findings"] == 0 and row["hit_token_limit"] == 1
    assert row["token_limit_rate"] == 0.5


def test_a_loop_the_baseline_has_at_another_length_is_not_new():
    # Issue 22: auto-2048 loops on short_256-0 and auto-1024 does not; fp8-1024's same loop is the model's
    # habit on that prompt, not FP8's doing. A loop no baseline has stays new.
    cells = {
        "auto-1024": _cell("auto", 1024, [_rec("short_256-0", NORMAL), _rec("short_256-1", NORMAL)]),
        "auto-2048": _cell("auto", 2048, [_rec("short_256-0", LOOP, finish="length"), _rec("short_256-1", NORMAL)]),
        "fp8-1024": _cell("fp8", 1024, [_rec("short_256-0", LOOP, finish="length"),
                                        _rec("short_256-1", LOOP, finish="length")]),
    }
    rows = _by_key(scan_cells(WORKLOADS, typed_cells(cells)))
    assert rows[("fp8-1024", "short_256-0", "ngram_loop_tokens")].baseline_cell == "auto-1024"
    assert not rows[("fp8-1024", "short_256-0", "ngram_loop_tokens")].new_vs_baseline
    assert rows[("fp8-1024", "short_256-1", "ngram_loop_tokens")].new_vs_baseline


def test_a_new_finding_carries_the_baselines_answer_and_the_review_shows_them_side_by_side():
    from kveval.render.degeneration_section import _new_findings_table

    findings = scan_cells(WORKLOADS, typed_cells(_cells()))
    row = _by_key(findings)[("fp8-1024", "short_256-1", "char_run")]
    assert row.baseline_excerpt == NORMAL and row.baseline_cell == "auto-1024"
    assert all(pd.isna(r.baseline_excerpt) for r in findings.itertuples() if r.cell == "auto-1024")
    new = findings[findings.new_vs_baseline.fillna(False).astype(bool)]
    table = _new_findings_table(new)
    assert "auto's output" in table.split("\n")[0] and "The pass key is 4821." in table


def test_a_loop_after_a_capped_answer_is_late_and_not_counted_but_one_replacing_the_answer_is():
    answer = PROSE[:8 * len(LOOP_UNIT * 6)]
    late_loop = answer + LOOP_UNIT * 6           # the answer first, then a loop in the last fifth
    early_loop = "Answer: " + LOOP_UNIT * 20      # the loop is the answer
    cells = {
        "auto-1024": _cell("auto", 1024, [_rec("short_256-0", PROSE[:len(late_loop)], finish="length"),
                                          _rec("short_256-1", NORMAL)]),
        "fp8-1024": _cell("fp8", 1024, [_rec("short_256-0", late_loop, finish="length"),
                                        _rec("short_256-1", early_loop, finish="length")]),
    }
    findings = scan_cells(WORKLOADS, typed_cells(cells))
    rows = _by_key(findings)
    late = rows[("fp8-1024", "short_256-0", "ngram_loop_chars")]
    assert late.late and late.new_vs_baseline and "late: starts after 80 % of an answer cut at max_tokens" in late.detail
    assert all(r.late for r in findings.itertuples() if r.prompt == "short_256-0" and r.cell == "fp8-1024"
               and r.detector != "hit_token_limit")
    assert not rows[("fp8-1024", "short_256-1", "ngram_loop_chars")].late
    summary = degeneration_summary(findings, typed_cells(cells), WORKLOADS)
    fp8 = summary[summary.cell == "fp8-1024"].iloc[0]
    assert (fp8.outputs_with_findings, fp8.outputs_with_new_findings) == (1, 1)   # only the early loop


def test_an_output_that_degenerates_in_both_caches_is_concordant_whatever_the_detectors():
    # McNemar's discordant pairs are outputs, not detectors: auto's loop and fp8's "!!!!" run on short_256-0
    # are one prompt both caches fail; short_256-1 degenerates only with fp8, and the other way round nowhere.
    bangs = _rec("short_256-0", "Sure. " + "!" * 480, token_ids=ids("Sure. ") + ids("!!!!") * 120)
    cells = {
        "auto-1024": _cell("auto", 1024, [_rec("short_256-0", LOOP), _rec("short_256-1", NORMAL)]),
        "fp8-1024": _cell("fp8", 1024, [bangs, _rec("short_256-1", LOOP)]),
    }
    findings = scan_cells(WORKLOADS, typed_cells(cells))
    assert _by_key(findings)[("fp8-1024", "short_256-0", "char_run")].new_vs_baseline   # a detector auto's lacks
    summary = degeneration_summary(findings, typed_cells(cells), WORKLOADS).set_index("cell")
    assert summary.loc["fp8-1024", "outputs_with_new_findings"] == 2            # the findings table's count
    assert (summary.loc["fp8-1024", "degenerate_only_here"], summary.loc["fp8-1024", "baseline_only_degenerate"]) == (1, 0)
    from kveval.evidence import _degeneration_evidence

    gate_reads = _degeneration_evidence(WORKLOADS, typed_cells(cells))["cells"]["fp8-1024"]
    assert (gate_reads["new_degenerate"], gate_reads["baseline_only_degenerate"]) == (1, 0)   # what McNemar tests
