"""Long-context task statistics on constructed per-sample records (kveval.analysis.task_accuracy; no engine)."""
from __future__ import annotations

import json
import math

import pytest
from scipy.stats import binomtest

from kveval.analysis.task_accuracy import (
    ACCURACY_COLUMNS,
    ALL_TASKS,
    cell_samples,
    COMPARISON_COLUMNS,
    GRID_COLUMNS,
    depth_length_grid,
    mcnemar_p,
    recovery,
    task_accuracy,
    task_comparisons,
    task_evidence,
    task_samples,
    wilson_interval,
)
from tests.support.constructed import started_cell
from tests.support.task_samples import passkey_grid, sample, with_tasks
from tests.support.evidence import typed_cells

# fp8 misses (fraction, depth, seed): 3 of the 12 scored passkey samples; fraction 1.0 is rejected in both.
WRONG = {(0.25, 0.0, 0), (0.5, 0.0, 1), (0.5, 0.5, 0)}


def cell(kv, length, samples=None, error=None):
    return with_tasks(started_cell(kv, length, 4 * length, []), samples, error)


def cwe(index, correct=True, **kw):
    return sample("kveval_cwe", index, depth=None, expected=("apple", "pear"), correct=correct, **kw)


def grid_cells():
    return {"auto-1024": cell("auto", 1024, passkey_grid() + [cwe(i) for i in range(4)]),
            "fp8-1024": cell("fp8", 1024, passkey_grid(wrong=WRONG) + [cwe(i, correct=i < 3) for i in range(4)])}


def row(frame, **match):
    found = frame
    for key, value in match.items():
        found = found[found[key] == value]
    assert len(found) == 1, (match, found)
    return found.iloc[0]


# --- statistics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("k, n", [(5, 6), (0, 10), (10, 10), (37, 50), (1, 3)])
def test_wilson_interval_matches_scipy(k, n):
    low, high = wilson_interval(k, n)
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert (low, high) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert low <= k / n <= high


def test_wilson_interval_known_value_and_empty():
    assert wilson_interval(5, 6) == pytest.approx((0.4365, 0.9699), abs=1e-4)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_mcnemar_exact_p_on_known_tables():
    assert mcnemar_p(10, 0, 6, 4) == pytest.approx(0.03125)       # 2 × 0.5^6
    assert mcnemar_p(10, 6, 0, 4) == pytest.approx(0.03125)
    assert mcnemar_p(10, 3, 3, 4) == 1.0
    assert mcnemar_p(10, 0, 0, 4) == 1.0                           # no discordant pair
    for b, c in [(1, 9), (2, 7), (12, 30)]:
        assert mcnemar_p(50, b, c, 5) == pytest.approx(binomtest(b, b + c, 0.5).pvalue)


def test_recovery():
    assert recovery(0.75, 1.0) == 0.75
    assert recovery(0.9, 0.6) == pytest.approx(1.5)
    assert recovery(0.5, 0.0) is None
    assert recovery(None, 0.5) is None and recovery(0.5, float("nan")) is None


# --- samples and accuracy --------------------------------------------------------------------------

def test_task_samples_keeps_every_record_and_field():
    samples_ = [sample("kveval_passkey", 0, correct=True), sample("kveval_passkey", 1, accepted=False),
                {**sample("kveval_passkey", 2, error="EngineDeadError: gone"), "new_field": 7}]
    frame = task_samples(typed_cells({"auto-1024": cell("auto", 1024, samples_), "fp8-1024": started_cell("fp8", 1024, 4096, [])}))
    assert list(frame.cell) == ["auto-1024"] * 3
    assert list(frame.accepted) == [True, False, True]
    assert list(frame.scored) == [True, False, False]
    assert list(frame.scored_correct) == [True, False, False]
    assert frame.rejection.iloc[1].startswith("prompt of 256 tokens")
    assert frame.error.iloc[2] == "EngineDeadError: gone" and frame.new_field.iloc[2] == 7
    assert frame.expected.iloc[0] == ["71432"] and frame.max_model_len.iloc[0] == 1024
    assert task_samples(typed_cells({})).empty and "kv_spec" in task_samples(typed_cells({})).columns


def test_status_separates_errors_from_rejections():
    unasked = {**sample("t", 3, accepted=False), "rejection": None, "error": "lm-eval made no request for this sample"}
    samples_ = [sample("t", 0), sample("t", 1, accepted=False), {**sample("t", 2), "score": None}, unasked,
                {**sample("t", 4, accepted=False), "error": "EngineDeadError", "rejection": None}]
    cells = typed_cells({"auto-1024": cell("auto", 1024, samples_)})
    assert list(task_samples(cells).status) == ["scored", "rejected", "unscored", "error", "error"]
    pooled = row(task_accuracy(cell_samples(cells)), level="cell")
    assert (pooled.samples, pooled.n, pooled.rejected, pooled.errors) == (5, 1, 1, 2)


def test_correct_falls_back_to_score():
    loose = {**sample("t", 0), "correct": None, "score": 1.0}
    wrong = {**sample("t", 1), "correct": None, "score": 0.5}
    frame = task_samples(typed_cells({"auto-1024": cell("auto", 1024, [loose, wrong])}))
    assert list(frame.scored_correct) == [True, False]


def test_accuracy_levels_rejected_and_errors_outside_n():
    samples_ = ([sample("kveval_passkey", i, correct=i < 4) for i in range(6)]
                + [sample("kveval_passkey", 6 + i, accepted=False) for i in range(2)]
                + [sample("kveval_passkey", 8, error="boom"), cwe(0), cwe(1, correct=False)])
    accuracy = task_accuracy(cell_samples(typed_cells({"auto-1024": cell("auto", 1024, samples_)})))
    assert list(accuracy.columns) == ACCURACY_COLUMNS
    assert list(accuracy.level) == ["point", "task", "point", "task", "cell"]
    passkey = row(accuracy, level="task", task="kveval_passkey")
    assert (passkey.samples, passkey.n, passkey.correct, passkey.rejected, passkey.errors) == (9, 6, 4, 2, 1)
    assert passkey.accuracy == pytest.approx(4 / 6)
    assert (passkey.wilson_low, passkey.wilson_high) == pytest.approx(wilson_interval(4, 6))
    assert math.isnan(passkey.length_fraction) and math.isnan(passkey.depth)
    point = row(accuracy, level="point", task="kveval_passkey")
    assert (point.length_fraction, point.depth, point.target_tokens, point.n) == (0.25, 0.5, 256, 6)
    cwe_point = row(accuracy, level="point", task="kveval_cwe")
    assert math.isnan(cwe_point.depth) and cwe_point.n == 2        # a task without depth keeps its rows
    pooled = row(accuracy, level="cell", task=ALL_TASKS)
    assert (pooled.n, pooled.correct, pooled.rejected, pooled.errors, pooled.samples) == (8, 5, 2, 1, 11)
    assert pooled.prompt_tokens_mean == pytest.approx(253.0)


def test_all_rejected_point_has_no_accuracy():
    accuracy = task_accuracy(cell_samples(typed_cells(grid_cells())))
    point = row(accuracy, cell="auto-1024", level="point", task="kveval_passkey", length_fraction=1.0, depth=0.5)
    assert (point.n, point.rejected, point.target_tokens) == (0, 2, 1024)
    assert math.isnan(point.accuracy) and math.isnan(point.wilson_low)


# --- comparisons -----------------------------------------------------------------------------------

def test_comparison_counts_recovery_and_mcnemar():
    comparisons = task_comparisons(cell_samples(typed_cells(grid_cells())))
    assert list(comparisons.columns) == COMPARISON_COLUMNS
    assert list(comparisons.task) == ["kveval_passkey", "kveval_cwe", ALL_TASKS]
    pooled = row(comparisons, task=ALL_TASKS)
    assert (pooled.cell, pooled.reference, pooled.n_paired) == ("fp8-1024", "auto-1024", 16)
    assert (pooled.baseline_correct, pooled.cell_correct, pooled.both) == (16, 12, 12)
    assert (pooled.baseline_only, pooled.cell_only, pooled.neither) == (4, 0, 0)
    assert pooled.recovery == pytest.approx(0.75)
    assert pooled.mcnemar_p == pytest.approx(binomtest(0, 4, 0.5).pvalue) == pytest.approx(0.125)
    passkey = row(comparisons, task="kveval_passkey")
    assert (passkey.n_paired, passkey.baseline_only, passkey.cell_only) == (12, 3, 0)
    assert passkey.mcnemar_p == pytest.approx(0.25)
    assert pooled.cell_rejected == 0  # fraction 1.0 is rejected by both: not a cell-only rejection


def test_pairing_uses_only_samples_both_cells_scored():
    auto = [sample("t", 0), sample("t", 1), sample("t", 2), sample("t", 3, error="boom"), sample("t", 4),
            sample("t", 5, correct=False), sample("t", 6)]
    fp8 = [sample("t", 0), sample("t", 1, accepted=False), sample("t", 2, correct=False), sample("t", 3),
           sample("t", 4, error="boom"), sample("t", 5)]  # t-6 missing in fp8
    comparisons = task_comparisons(cell_samples(typed_cells({"auto-1024": cell("auto", 1024, auto),
                                                 "fp8-1024": cell("fp8", 1024, fp8)})))
    pooled = row(comparisons, task=ALL_TASKS)
    assert pooled.n_paired == 3                       # samples 0, 2, 5
    assert (pooled.both, pooled.baseline_only, pooled.cell_only, pooled.neither) == (1, 1, 1, 0)
    assert pooled.recovery == pytest.approx(1.0) and pooled.mcnemar_p == 1.0
    assert (pooled.cell_rejected, pooled.baseline_rejected) == (1, 0)
    assert (pooled.cell_errors, pooled.baseline_errors) == (1, 1)


def test_comparisons_pair_within_the_same_max_model_len_only():
    cells = {"auto-1024": cell("auto", 1024, [sample("t", i, length=1024) for i in range(4)]),
             "auto-2048": cell("auto", 2048, [sample("t", i, length=2048, correct=False) for i in range(4)]),
             "fp8-2048": cell("fp8", 2048, [sample("t", i, length=2048, correct=i < 2) for i in range(4)]),
             "fp8-4096": cell("fp8", 4096, [sample("t", i, length=4096) for i in range(4)])}
    comparisons = task_comparisons(cell_samples(typed_cells(cells)))
    assert set(zip(comparisons.cell, comparisons.reference)) == {("fp8-2048", "auto-2048")}
    pooled = row(comparisons, task=ALL_TASKS)
    assert (pooled.baseline_accuracy, pooled.cell_accuracy, pooled.cell_only) == (0.0, 0.5, 2)
    assert pooled.recovery is None                   # the baseline got none right
    evidence = task_evidence(typed_cells(cells))
    assert evidence["cells"]["fp8-2048"]["recovery"] is None
    assert evidence["unmatched"] == [{"cell": "fp8-4096", "reason": "no auto cell with task results at max_model_len 4096"}]


def test_empty_samples_give_headed_frames():
    empty = cell_samples(typed_cells({}))
    assert list(task_accuracy(empty).columns) == ACCURACY_COLUMNS
    assert list(task_comparisons(empty).columns) == COMPARISON_COLUMNS
    assert list(depth_length_grid(empty).columns) == GRID_COLUMNS


# --- grid --------------------------------------------------------------------------------------------

def test_depth_length_grid_values():
    grid = depth_length_grid(cell_samples(typed_cells(grid_cells())))
    assert list(grid.columns) == GRID_COLUMNS
    assert set(grid.cell) == {"auto-1024", "fp8-1024"}
    assert len(grid) == 2 * 3 * 3                      # cwe has no depth: left out
    assert sorted(grid.target_tokens.unique()) == [256, 512, 1024]
    fp8 = grid[grid.cell == "fp8-1024"].set_index(["depth", "target_tokens"])
    assert fp8.loc[(0.0, 256), "accuracy"] == 0.5 and fp8.loc[(0.0, 256), "n"] == 2
    assert fp8.loc[(0.5, 512), "correct"] == 1
    assert fp8.loc[(1.0, 512), "accuracy"] == 1.0
    assert fp8.loc[(0.5, 1024), "n"] == 0 and fp8.loc[(0.5, 1024), "rejected"] == 2
    assert math.isnan(fp8.loc[(0.5, 1024), "accuracy"])
    assert fp8.loc[(0.0, 512), "length_fraction"] == 0.5


# --- evidence ----------------------------------------------------------------------------------------

def test_task_evidence_shape_and_json():
    evidence = task_evidence(typed_cells(grid_cells()))
    json.dumps(evidence, allow_nan=False)
    assert set(evidence) == {"baseline_kv", "tasks", "samples", "sample_rows", "accuracy", "comparisons", "grid",
                             "cells", "unmatched", "errors", "task_errors", "runs"}
    assert evidence["tasks"] == ["kveval_passkey", "kveval_cwe"]
    assert evidence["samples"] == 2 * 22 == len(evidence["sample_rows"])
    assert evidence["cells"] == {"fp8-1024": {"reference": "auto-1024", "max_model_len": 1024, "recovery": 0.75,
                                              "mcnemar_p": 0.125, "n": 16, "baseline_accuracy": 1.0,
                                              "cell_accuracy": 0.75, "b": 4, "c": 0, "rejected": 0}}
    assert evidence["errors"] == {} and evidence["task_errors"] == {} and evidence["unmatched"] == []
    assert evidence["runs"]["auto-1024"]["lm_eval_version"] == "0.4.13"
    point = [r for r in evidence["accuracy"] if r["level"] == "point" and r["length_fraction"] == 1.0][0]
    assert point["accuracy"] is None and point["target_tokens"] == 1024


def test_task_evidence_empty_when_no_cell_ran_tasks():
    assert task_evidence(typed_cells({})) == {}
    assert task_evidence(typed_cells({"auto-1024": started_cell("auto", 1024, 4096, [])})) == {}
    assert task_evidence(typed_cells({"auto-1024": cell("auto", 1024, [])})) == {}


def test_task_evidence_reports_single_failed_tasks():
    crashed = cell("fp8", 1024, [sample("kveval_passkey", 0)])
    crashed["phases"]["tasks"]["task_errors"] = {"kveval_cwe": "ValueError: bad yaml"}
    evidence = task_evidence(typed_cells({"auto-1024": cell("auto", 1024, [sample("kveval_passkey", 0)]), "fp8-1024": crashed}))
    assert evidence["task_errors"] == {"fp8-1024": {"kveval_cwe": "ValueError: bad yaml"}}
    assert evidence["cells"]["fp8-1024"]["n"] == 1


def test_task_evidence_reports_crashed_phases():
    cells = {**grid_cells(), "fp8-2048": cell("fp8", 2048, error="RuntimeError: lm-eval crashed")}
    evidence = task_evidence(typed_cells(cells))
    assert evidence["errors"] == {"fp8-2048": "RuntimeError: lm-eval crashed"}
    assert set(evidence["cells"]) == {"fp8-1024"} and "fp8-2048" not in evidence["runs"]
    only_crash = task_evidence(typed_cells({"fp8-2048": cells["fp8-2048"]}))
    assert only_crash["errors"] == {"fp8-2048": "RuntimeError: lm-eval crashed"}
    assert only_crash["samples"] == 0 and only_crash["cells"] == {} and only_crash["grid"] == []
