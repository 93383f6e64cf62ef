"""Output diff on constructed records and cells (pure, no engine)."""
from __future__ import annotations

import pandas as pd
import pytest

from kveval.analysis.diff import (EXCERPT_AFTER, EXCERPT_BEFORE, PAIR_COLUMNS, SUMMARY_COLUMNS, compare_outputs,
                                  diff_pairs, diff_summary, divergence_excerpt, first_diverging_examples)
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells, typed_record


def _rec(prompt_id, ids, text, accepted=True):
    if not accepted:
        return {"prompt_id": prompt_id, "workload": prompt_id.rsplit("-", 1)[0], "accepted": False,
                "rejection": "This model's maximum context length is 1024 tokens."}
    return {"prompt_id": prompt_id, "workload": prompt_id.rsplit("-", 1)[0], "accepted": True, "text": text,
            "token_ids": list(ids), "finish_reason": "stop", "output_tokens": len(ids)}


def _cell(kv, length, records, started=True):
    return complete_cell({"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length, "started": started,
                          "phases": {"generation": {"records": records}}})


# ----------------------------------------------------------------------------- compare_outputs

def test_identical_outputs():
    a = _rec("p-0", [1, 2, 3], "one two three")
    result = compare_outputs(typed_record(a), typed_record(dict(a)))
    assert result == {"identical": True, "first_divergent_token": None, "similarity": 1.0, "length_ratio": 1.0,
                      "tokens": 3, "reference_tokens": 3, "excerpt": None}


def test_diverging_outputs_locate_the_divergence_in_text():
    candidate = _rec("p-0", [10, 11, 12, 13, 14], "The cache stores keys in blocks.")
    reference = _rec("p-0", [10, 11, 12, 20, 14, 15], "The cache stores values in blocks.")
    result = compare_outputs(typed_record(candidate), typed_record(reference))
    assert result["identical"] is False
    assert result["first_divergent_token"] == 3
    assert result["tokens"] == 5 and result["reference_tokens"] == 6
    assert result["length_ratio"] == pytest.approx(5 / 6)
    assert 0.8 < result["similarity"] < 1.0
    assert result["excerpt"] == {"before": "The cache stores ", "candidate": "keys in blocks.",
                                 "reference": "values in blocks.", "char_offset": 17}


def test_prefix_output_diverges_where_the_shorter_one_ends():
    candidate = _rec("p-0", [1, 2], "Hello there")
    reference = _rec("p-0", [1, 2, 3, 4], "Hello there, how are you")
    result = compare_outputs(typed_record(candidate), typed_record(reference))
    assert result["first_divergent_token"] == 2
    assert result["length_ratio"] == 0.5
    assert result["excerpt"]["candidate"] == ""
    assert result["excerpt"]["reference"] == ", how are you"
    assert result["excerpt"]["before"] == "Hello there"


def test_empty_outputs():
    empty = _rec("p-0", [], "")
    both = compare_outputs(typed_record(empty), typed_record(dict(empty)))
    assert both["identical"] is True and both["similarity"] == 1.0 and both["length_ratio"] is None
    one = compare_outputs(typed_record(_rec("p-0", [7, 8], "Hi.")), typed_record(empty))
    assert one["identical"] is False and one["first_divergent_token"] == 0
    assert one["similarity"] == 0.0 and one["length_ratio"] is None
    assert one["excerpt"] == {"before": "", "candidate": "Hi.", "reference": "", "char_offset": 0}
    other = compare_outputs(typed_record(empty), typed_record(_rec("p-0", [7], "Hi.")))
    assert other["length_ratio"] == 0.0 and other["first_divergent_token"] == 0


def test_missing_text_counts_as_empty():
    result = compare_outputs(typed_record({"prompt_id": "p-0", "accepted": True, "token_ids": [1]}),
                             typed_record({"prompt_id": "p-0", "accepted": True, "token_ids": [1], "text": None}))
    assert result["identical"] is True and result["similarity"] == 1.0


def test_excerpt_window_sizes_and_unicode():
    shared = "Émoji 🙂 and ünïcode stay whole. " * 10
    excerpt = divergence_excerpt(shared + "Ja, 好的 " * 30, shared + "Nein 🚀 " * 30)
    assert excerpt["char_offset"] == len(shared)
    assert excerpt["before"] == shared[-EXCERPT_BEFORE:] and len(excerpt["before"]) == EXCERPT_BEFORE
    assert excerpt["candidate"] == ("Ja, 好的 " * 30)[:EXCERPT_AFTER]
    assert excerpt["reference"] == ("Nein 🚀 " * 30)[:EXCERPT_AFTER]


def test_same_text_with_different_tokens_still_reports_divergence():
    # Two tokenizations of the same text: token ids differ, text is identical.
    result = compare_outputs(typed_record(_rec("p-0", [1, 2], "abc")), typed_record(_rec("p-0", [3], "abc")))
    assert result["identical"] is False and result["similarity"] == 1.0
    assert result["excerpt"] == {"before": "abc", "candidate": "", "reference": "", "char_offset": 3}


# ----------------------------------------------------------------------------- diff_pairs

WORKLOADS = [
    {"id": "short_256-0", "workload": "short_256", "kind": "short", "max_tokens": 256, "token_ids": [1], "text": "q"},
    {"id": "short_256-1", "workload": "short_256", "kind": "short", "max_tokens": 256, "token_ids": [2], "text": "q"},
    {"id": "ctx_90pct-0", "workload": "ctx_90pct", "kind": "context", "max_tokens": 256,
     "token_ids": list(range(3000)), "text": "doc"},
]

BASE_0 = ([1, 2, 3, 4], "Paris is the capital of France.")
BASE_1 = ([5, 6, 7], "Water boils at one hundred degrees.")
LONG = ([9, 9, 8], "The document is about lighthouses.")


def _grid():
    """auto/fp8 at 1024, 4096, 8192; auto-16384 and fp8-16384 did not start; the 3,000-token prompt is
    refused at 1024."""
    long_refused = _rec("ctx_90pct-0", [], "", accepted=False)
    return {
        "auto-1024": _cell("auto", 1024, [_rec("short_256-0", *BASE_0), _rec("short_256-1", *BASE_1), long_refused]),
        "fp8-1024": _cell("fp8", 1024, [_rec("short_256-0", [1, 2, 30, 31], "Paris is a city in France."),
                                        _rec("short_256-1", *BASE_1), long_refused]),
        "auto-4096": _cell("auto", 4096, [_rec("short_256-0", *BASE_0),
                                          _rec("short_256-1", [5, 6, 70], "Water boils at 100 C."),
                                          _rec("ctx_90pct-0", *LONG)]),
        "fp8-4096": _cell("fp8", 4096, [_rec("short_256-0", *BASE_0),
                                        _rec("short_256-1", [5, 6, 70], "Water boils at 100 C."),
                                        _rec("ctx_90pct-0", [9, 8], "The text.")]),
        "auto-8192": _cell("auto", 8192, [_rec("short_256-0", *BASE_0), _rec("short_256-1", *BASE_1),
                                          _rec("ctx_90pct-0", *LONG)]),
        "auto-16384": _cell("auto", 16384, [], started=False),
        "fp8-16384": _cell("fp8", 16384, [_rec("short_256-0", *BASE_0)]),
    }


def _rows(pairs):
    return {(r.cell, r.prompt): r for r in pairs.itertuples(index=False)}


def test_diff_pairs_kv_and_length_comparisons():
    pairs = diff_pairs(WORKLOADS, typed_cells(_grid()))
    assert list(pairs.columns) == PAIR_COLUMNS
    rows = _rows(pairs)
    kv = {key: r.reference for key, r in rows.items() if r.comparison == "kv"}
    length = {key: r.reference for key, r in rows.items() if r.comparison == "length"}
    assert kv == {("fp8-1024", "short_256-0"): "auto-1024", ("fp8-1024", "short_256-1"): "auto-1024",
                  ("fp8-4096", "short_256-0"): "auto-4096", ("fp8-4096", "short_256-1"): "auto-4096",
                  ("fp8-4096", "ctx_90pct-0"): "auto-4096"}
    # Cross-length reference: the smallest started auto cell; per prompt the smallest that accepted it.
    assert length == {("auto-4096", "short_256-0"): "auto-1024", ("auto-4096", "short_256-1"): "auto-1024",
                      ("auto-8192", "short_256-0"): "auto-1024", ("auto-8192", "short_256-1"): "auto-1024",
                      ("auto-8192", "ctx_90pct-0"): "auto-4096"}
    assert len(pairs) == 10   # no rows for fp8-16384 (its auto did not start) or refused prompts


def test_diff_pairs_values():
    rows = _rows(diff_pairs(WORKLOADS, typed_cells(_grid())))
    changed = rows[("fp8-1024", "short_256-0")]
    assert not changed.identical
    assert changed.first_divergent_token == 2
    assert changed.excerpt["before"] == "Paris is " and changed.excerpt["candidate"].startswith("a city")
    same = rows[("fp8-1024", "short_256-1")]
    assert bool(same.identical) and pd.isna(same.first_divergent_token) and same.excerpt is None
    assert same.similarity == 1.0 and same.length_ratio == 1.0
    noise = rows[("auto-4096", "short_256-1")]
    assert noise.first_divergent_token == 2 and noise.tokens == 3 and noise.reference_tokens == 3
    short = rows[("fp8-4096", "ctx_90pct-0")]
    assert short.length_ratio == pytest.approx(2 / 3) and short.first_divergent_token == 1


def test_diff_pairs_custom_baseline_kv():
    cells = {"fp8-1024": _cell("fp8", 1024, [_rec("short_256-0", *BASE_0)]),
             "fp16-1024": _cell("fp16", 1024, [_rec("short_256-0", *BASE_0)])}
    pairs = diff_pairs(WORKLOADS, typed_cells(cells), baseline_kv="fp16")
    assert pairs[["cell", "reference", "comparison"]].values.tolist() == [["fp8-1024", "fp16-1024", "kv"]]


def test_diff_pairs_empty():
    assert diff_pairs(WORKLOADS, typed_cells({})).empty
    only_auto = {"auto-1024": _cell("auto", 1024, [_rec("short_256-0", *BASE_0)])}
    assert diff_pairs(WORKLOADS, typed_cells(only_auto)).empty


# ----------------------------------------------------------------------------- summary / examples

def test_diff_summary():
    summary = diff_summary(diff_pairs(WORKLOADS, typed_cells(_grid())))
    assert list(summary.columns) == SUMMARY_COLUMNS
    by_key = {(r.workload, r.cell, r.comparison): r for r in summary.itertuples(index=False)}
    fp8 = by_key[("short_256", "fp8-1024", "kv")]
    assert (fp8.identical, fp8.compared, fp8.exact_match_rate, fp8.earliest_divergence) == (1, 2, 0.5, 2)
    assert fp8.reference == "auto-1024"
    assert fp8.median_length_ratio == 1.0
    assert 0.5 < fp8.median_similarity < 1.0
    same = by_key[("short_256", "fp8-4096", "kv")]
    assert (same.identical, same.compared, same.exact_match_rate) == (2, 2, 1.0)
    assert pd.isna(same.earliest_divergence) and same.median_similarity == 1.0
    long = by_key[("ctx_90pct", "auto-8192", "length")]
    assert (long.reference, long.identical, long.compared) == ("auto-4096", 1, 1)


def test_first_diverging_examples():
    examples = first_diverging_examples(diff_pairs(WORKLOADS, typed_cells(_grid())))
    found = {(r.workload, r.cell): (r.prompt, r.first_divergent_token) for r in examples.itertuples(index=False)}
    assert found == {("short_256", "fp8-1024"): ("short_256-0", 2),
                     ("short_256", "auto-4096"): ("short_256-1", 2),
                     ("ctx_90pct", "fp8-4096"): ("ctx_90pct-0", 1)}
    row = examples[examples["cell"] == "fp8-1024"].iloc[0]
    assert row["excerpt"]["reference"].startswith("the capital")


def test_summary_and_examples_on_empty_pairs():
    empty = diff_pairs([], typed_cells({}))
    assert diff_summary(empty).empty and list(diff_summary(empty).columns) == SUMMARY_COLUMNS
    assert first_diverging_examples(empty).empty


def test_an_output_cut_short_is_counted_apart_from_a_divergence():
    workloads = [{"id": "ctx_1k-0", "workload": "ctx_1k"}, {"id": "short_64-0", "workload": "short_64"}]
    cells = {
        "auto-1024": _cell("auto", 1024, [_rec("ctx_1k-0", [1, 2, 3], "a b c"), _rec("short_64-0", [5, 6], "x y")]),
        "auto-2048": _cell("auto", 2048, [_rec("ctx_1k-0", [1, 2, 3, 4, 5], "a b c d e"),
                                          _rec("short_64-0", [5, 7], "x z")]),
    }
    pairs = diff_pairs(workloads, typed_cells(cells))
    by_prompt = {row.prompt: row for row in pairs.itertuples()}
    assert by_prompt["ctx_1k-0"].prefix_only and not by_prompt["ctx_1k-0"].identical
    assert not by_prompt["short_64-0"].prefix_only
    summary = diff_summary(pairs)
    assert int(summary[summary.workload == "ctx_1k"].prefix_only.iloc[0]) == 1
