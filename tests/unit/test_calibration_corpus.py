"""The FP8 KV-scale calibration text (kveval/inputs/data/calibration/*.txt): plain ASCII with no
digits, long enough, and disjoint from the scoring corpus (corpus/*.txt), so a calibrated scale is
never fitted on the text it is judged on. Standard library only."""
from __future__ import annotations

import re
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "kveval" / "inputs" / "data"
CALIBRATION_DIR = DATA_DIR / "calibration"
CORPUS_DIR = DATA_DIR / "corpus"

MIN_WORDS_PER_FILE = 600
MIN_WORDS_TOTAL = 3000
MIN_SENTENCE_WORDS = 8


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.txt"))


def _words(text: str) -> tuple[str, ...]:
    """Normalised word sequence: lowercase, punctuation and spacing dropped."""
    return tuple(re.findall(r"[a-z]+(?:'[a-z]+)*", text.lower()))


def _paragraphs(text: str) -> set[tuple[str, ...]]:
    return {w for w in (_words(p) for p in re.split(r"\n\s*\n", text)) if w}


def _sentences(text: str) -> set[tuple[str, ...]]:
    """Sentences (split on '.', '?' and '!') of at least MIN_SENTENCE_WORDS words."""
    return {w for w in (_words(s) for s in re.split(r"[.?!]", text)) if len(w) >= MIN_SENTENCE_WORDS}


def _read(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in _files(folder)}


def test_calibration_files_exist_and_corpus_is_there_to_compare():
    assert len(_files(CALIBRATION_DIR)) >= 4
    assert _files(CORPUS_DIR)


def test_every_calibration_file_is_ascii_without_digits_and_long_enough():
    for name, text in _read(CALIBRATION_DIR).items():
        assert text.isascii(), f"{name} is not plain ASCII"
        assert not re.search(r"\d", text), f"{name} contains digits (they could look like passkeys)"
        assert "\n\n" in text, f"{name} has no paragraph breaks"
        assert len(text.split()) >= MIN_WORDS_PER_FILE, f"{name} has fewer than {MIN_WORDS_PER_FILE} words"


def test_calibration_total_is_at_least_three_thousand_words():
    total = sum(len(text.split()) for text in _read(CALIBRATION_DIR).values())
    assert total >= MIN_WORDS_TOTAL, total


def test_calibration_shares_no_paragraph_with_the_scoring_corpus():
    corpus = set().union(*(_paragraphs(t) for t in _read(CORPUS_DIR).values()))
    for name, text in _read(CALIBRATION_DIR).items():
        shared = _paragraphs(text) & corpus
        assert not shared, f"{name} repeats a corpus paragraph: {' '.join(next(iter(shared)))[:120]!r}"


def test_calibration_shares_no_long_sentence_with_the_scoring_corpus():
    corpus = set().union(*(_sentences(t) for t in _read(CORPUS_DIR).values()))
    assert corpus, "the scoring corpus yielded no sentences to compare with"
    for name, text in _read(CALIBRATION_DIR).items():
        shared = _sentences(text) & corpus
        assert not shared, f"{name} repeats a corpus sentence: {' '.join(sorted(shared)[0])!r}"


def test_the_checks_would_catch_a_copied_sentence():
    """The normalisation ignores case, spacing and punctuation, so a lightly edited copy still matches."""
    corpus = _sentences("A harbour offers shelter, fresh water and trade to every passing ship. Short one.")
    copied = _sentences("a HARBOUR offers shelter fresh water,\nand trade to every passing ship!")
    assert copied & corpus
    assert not _sentences("Short one.")
