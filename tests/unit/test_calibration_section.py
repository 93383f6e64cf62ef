"""The review's calibrated-scales table (render/calibration_section.py): per-tensor scales give each
layer's limit and ratio; per-head scales give ranges, and the worst head's ratio as the bounds that the
layer's measured max allows (the range pass measures layers, not heads)."""
from __future__ import annotations

import pytest

from kveval.files import schema
from kveval.render.calibration_section import _scale_rows


def _entry(scaled: str, k: dict, v: dict, per_head: dict | None = None) -> schema.CalibrationEntry:
    scales = schema.KvScales(calibrated=True, source="compressed-tensors", k_scale=k, v_scale=v,
                             auto_is_fp8=False, notes=[], per_head=per_head)
    return schema.CalibrationEntry(scaled=scaled, path="/x", calibrated_by_kveval=True, reused=False, record={},
                                   scales=scales)


def test_per_tensor_rows_give_the_limit_and_the_ratio_of_the_measured_max():
    frame = _scale_rows(_entry("tensor", {"0": 0.5}, {"0": 0.01}), {(0, "k"): 448.0, (0, "v"): 2.24})
    row = frame.iloc[0]
    assert row["k_scale"] == "0.5" and row["K limit (448 × scale)"] == "224" and row["max |K| / limit"] == "2"
    assert row["v_scale"] == "0.01" and row["V limit (448 × scale)"] == "4.48" and row["max |V| / limit"] == "0.5"


def test_per_head_rows_bound_the_worst_heads_ratio_by_the_largest_and_smallest_limit():
    per_head = {"k_scale": {"0": [0.25, 1.0]}, "v_scale": {"0": [0.01, 0.02]}}
    # The smallest head scale stands for the layer in k_scale/v_scale (checkpoint_scales: conservative).
    frame = _scale_rows(_entry("head", {"0": 0.25}, {"0": 0.01}, per_head), {(0, "k"): 224.0, (0, "v"): 4.48})
    row = frame.iloc[0]
    assert row["k_scale (heads)"] == "0.25–1" and row["K limit (448 × scale)"] == "112–448"
    # The head holding max |K| = 224 has a limit of 112 or 448: its ratio is 0.5 or 2, both inside the bounds.
    assert row["worst head's max |K| / limit"] == "0.5–2"
    assert row["worst head's max |V| / limit"] == "0.5–1"
    assert "max |K| / limit" not in frame.columns   # no single ratio against another head's limit


@pytest.mark.parametrize("measured", [{}, {(0, "v"): 1.0}])
def test_a_layer_without_a_measured_range_leaves_the_ratio_blank(measured):
    per_head = {"k_scale": {"0": [0.25, 1.0]}}
    frame = _scale_rows(_entry("head", {"0": 0.25}, {"0": 0.01}, per_head), measured)
    assert frame.iloc[0]["worst head's max |K| / limit"] == ""
