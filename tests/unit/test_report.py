"""Analysis and review rendering on constructed cell facts (pure functions, no engine)."""
from __future__ import annotations

import re

import pandas as pd

from kveval.analysis.capacity import pool_by_length
from kveval.analysis.diff import first_divergence
from kveval.analysis.speed import speed_table
from kveval.gate import Thresholds
from kveval.render.markdown import escape_cell
from tests.support.review import review_of
from tests.support.constructed import complete_cell, expected_kl, scoring_phase
from tests.support.evidence import typed_cells

WORKLOADS = [
    {"id": "short_256-0", "workload": "short_256", "kind": "short", "token_ids": [1, 2, 3], "max_tokens": 256},
    {"id": "over_1024-0", "workload": "over_1024", "kind": "over_limit", "token_ids": list(range(1025)),
     "max_tokens": 64},
]


def _record(prompt_id, tokens, text="hello", accepted=True):
    if not accepted:
        return {"prompt_id": prompt_id, "workload": prompt_id.split("-")[0], "accepted": False,
                "rejection": "VLLMValidationError: This model's maximum context length is 1024 tokens.", "error": None}
    return {"prompt_id": prompt_id, "workload": prompt_id.split("-")[0], "accepted": True, "rejection": None,
            "error": None, "text": text, "token_ids": tokens, "finish_reason": "length", "output_tokens": len(tokens)}


def _speed(ttft, decode):
    return {"workloads": [{"workload": "short_256", "prompt_tokens": 3, "max_tokens": 256,
                           "runs": [{}], "ttft_s": {"median": ttft, "min": ttft, "max": ttft, "n": 1},
                           "decode_tok_s": {"median": decode, "min": decode, "max": decode, "n": 1},
                           "throughput_tok_s": {"median": decode, "n": 1}}]}


def _started(kv, length, pool, tokens, text="hello", ttft=0.1, decode=50.0, scoring=None):
    facts = {"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length, "started": True,
            "complete": True, "startup_seconds": 7.0,
            "capacity": {"kv_pool_tokens": pool, "max_concurrency": pool / length},
            "info": {"attention_backend": "CPU_ATTN", "platform": "cpu"},
            "phases": {"generation": {"records": [_record("short_256-0", tokens, text),
                                                  _record("over_1024-0", [], accepted=False)]},
                       "speed": _speed(ttft, decode)}}
    if scoring is not None:
        facts["phases"]["scoring"] = scoring
    return complete_cell(facts)


def _failed(kv, length, reason="kv_capacity", logged=None):
    return complete_cell({"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length, "started": False,
            "complete": True, "failure": {"reason": reason, "message": "ValueError: To serve at least one request ... "
                                          "the estimated maximum model length is 1792.",
                                          "estimated_max_model_len": 1792, "backend": "CPU_ATTN"},
            "logged_capacity": {"kv_pool_tokens": logged, "max_concurrency": None}, "phases": {}})


CELLS = {
    "auto-1024": _started("auto", 1024, 1792, [5, 6, 7, 8], scoring=scoring_phase(250, "same", noise_shape="same")),
    "fp8-1024": _started("fp8", 1024, 3584, [5, 6, 9, 9], text="a | b <script>\nnext", ttft=0.12, decode=40.0,
                         scoring=scoring_phase(250, "healthy")),
    "auto-2048": _failed("auto", 2048),
    "fp8-2048": _started("fp8", 2048, 3584, [5, 6, 7, 8], scoring=scoring_phase(250, "harmed")),
}
MANIFEST = {"schema_version": 1, "command": "kveval compare --kv fp8 auto", "model": {"name": "m", "path": "/m"},
            "options": {"kv": ["fp8", "auto"], "max_model_len": [1024, 2048], "suite": "quick"},
            "cells": [{"id": c} for c in CELLS], "versions": {}, "hardware": {}}


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], []) is None
    assert first_divergence([], [4]) == 0


def test_pool_ratio_and_who_failed():
    pools = pool_by_length(typed_cells(CELLS))
    at_1024 = pools[pools.max_model_len == 1024].iloc[0]
    assert at_1024.ratio == 2.0
    at_2048 = pools[pools.max_model_len == 2048].iloc[0]
    assert at_2048.baseline_pool_tokens is None or at_2048.baseline_pool_tokens != at_2048.baseline_pool_tokens
    assert "auto-2048 (kv_capacity)" in at_2048.not_started


def test_logged_pool_ratio_for_cells_that_failed_after_sizing():
    cells = {"auto-1024": _started("auto", 1024, 1792, [1]),
             "fp8-1024": _failed("fp8", 1024, reason="unsupported_dtype", logged=3584)}
    pools = pool_by_length(typed_cells(cells))
    assert pools.iloc[0].fallback_ratio == 2.0
    review = review_of(MANIFEST | {"cells": [{"id": c} for c in cells]}, WORKLOADS, cells)
    assert ("rests on vLLM's estimate (the engine log): auto 1,792 (measured) vs fp8 3,584 (vLLM's estimate) tokens, "
            "2.00×" in review)


def test_speed_deltas_against_auto_at_same_length():
    table = speed_table(typed_cells(CELLS))
    fp8 = table[table.cell == "fp8-1024"].iloc[0]
    assert round(fp8.ttft_delta_pct, 6) == 20.0
    assert round(fp8.decode_delta_pct, 6) == -20.0
    # fp8-2048 has no started auto at 2048: no delta rather than a wrong one
    assert pd.isna(table[table.cell == "fp8-2048"].iloc[0].decode_delta_pct)


def test_review_contains_tables_and_escapes_model_output():
    review = review_of(MANIFEST, WORKLOADS, CELLS)
    assert review.startswith("# kveval review")
    assert "| 1,024 " in review and "2.00×" in review
    assert "auto-2048" in review and "kv_capacity" in review and "1,792" in review
    assert "✗ rejected" in review
    assert "0 of 1" in review
    assert "<script>" not in review and "&lt;script&gt;" in review
    assert "a \\| b" in review  # a pipe in model output cannot split the table
    for line in review.splitlines():
        if line.startswith("|"):
            assert line.rstrip().endswith("|")


def _flat(text):
    return re.sub(r" {2,}", " ", text)


def test_review_leads_with_the_verdict_and_shows_divergence_with_noise_floor():
    review = review_of(MANIFEST, WORKLOADS, CELLS)
    assert review.index("## Verdict: **FAIL**") < review.index("## Run") < review.index("## Start-up")
    limit = f"{Thresholds().budget('cpu').kl_mean_fail:.2g}"
    assert (f"- fp8-2048: divergence vs auto-1024 shown beyond the harm limit: KL mean 1.52, lower bound 1.52 > harm "
            f"limit {limit} (3 sequences)") in review
    # No auto at 2048, so fp8-2048's outputs and tasks are not judged; its headline still says FAIL.
    assert "**FP8 fails at 2048, is inconclusive at 1024.**" in review
    # fp8-2048 has no started auto at 2048: compared with auto-1024, said so in the verdict and the section.
    assert "compared with auto-1024 on the sequences both scored" in review
    assert "Not judged (no started `auto` cell at the same max_model_len): fp8-2048." in review
    flat = _flat(review)
    assert "over the reference top-k (k=5) plus a rest bucket" in flat
    kl = expected_kl("healthy")
    # 3 scored documents of 250 positions each; the last column: sequences the gate's intervals rest on (and
    # those reaching the late half: none of 250 positions reach 512, nor 1024).
    assert f"| fp8-1024 vs auto-1024 | KV dtype | 750 | {kl:.3g} | {kl:.3g} |" in flat
    assert f"| fp8-1024 vs auto-1024 | KV dtype | 750 | {kl:.3g} |" in flat and "| 0.01 | 0.01 | 3 (0) |" in flat
    assert "| fp8-2048 vs auto-1024 | KV dtype | 750 | 1.52 |" in flat and "| 0.57 | 0.57 | 3 (0) |" in flat
    assert "| auto-1024 | noise: another batch | 750 | 0 |" in flat
    assert "| **noise floor** (worst noise row) | noise | | 0 |" in flat
    assert "| fp8-1024 vs auto-1024 | KV dtype | 128-255 | 369 |" in flat


def test_review_degeneration_says_when_nothing_fired():
    review = _flat(review_of(MANIFEST, WORKLOADS, CELLS))
    assert "Nothing new: no detector fired on a non-`auto` output" in review
    assert "| fp8-1024 | 1 | 0 | 0 | 0 | none | 100.0 % |" in review  # every output stopped at max_tokens


def test_review_without_scoring_is_inconclusive_and_says_why():
    cells = {name: {**facts, "phases": {k: v for k, v in facts["phases"].items() if k != "scoring"}}
             for name, facts in CELLS.items()}
    review = review_of(MANIFEST, WORKLOADS, cells)
    assert "## Verdict: **INCONCLUSIVE**" in review
    assert "- fp8-1024: no teacher-forced divergence (no scored sequences)" in review
    assert "_No comparison: a non-`auto` cell and an `auto` cell must both have started and scored._" in review


def test_escape_cell_edge_cases():
    assert escape_cell(None) == ""
    assert escape_cell("x\ny") == "x ⏎ y"
    assert escape_cell("\x00") == "\\x00"
    assert escape_cell("é漢字🙂") == "é漢字🙂"
    assert escape_cell("a" * 300, limit=10).endswith("…")
