"""Tests for kveval.analysis.divergence: top-k KL, summaries, position buckets, cell comparisons."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from kveval.analysis.divergence import (
    by_position_bucket,
    cell_divergence,
    default_edges,
    divergence_summary,
    position_divergence,
    position_kl,
)
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells

ln = math.log


def top(*pairs):
    """[(token, probability)] -> [[token, logprob]]."""
    return [[tok, ln(p)] for tok, p in pairs]


def pos(token, p_token, *pairs):
    return {"token": token, "logprob": ln(p_token), "top": top(*pairs)}


# --- position_kl -------------------------------------------------------------------------------

def test_identical_distributions_have_zero_kl():
    dist = top((1, 0.6), (2, 0.3), (3, 0.05))
    kl, k, missing = position_kl(dist, dist)
    assert kl == 0.0
    assert (k, missing) == (3, 0)


def test_hand_computed_kl_with_rest_bucket():
    # Rest bucket is 0.1 on both sides, so it contributes 0.
    kl, k, missing = position_kl(top((1, 0.6), (2, 0.3)), top((1, 0.5), (2, 0.4)))
    expected = 0.6 * ln(0.6 / 0.5) + 0.3 * ln(0.3 / 0.4)
    assert kl == pytest.approx(expected, abs=1e-12)
    assert kl == pytest.approx(0.0230880, abs=1e-6)
    assert (k, missing) == (2, 0)


def test_rest_bucket_counts_when_mass_moves_outside_top_k():
    # Same listed tokens, but the candidate moves 0.2 of the listed mass into the unlisted rest.
    kl, _, _ = position_kl(top((1, 0.8), (2, 0.1)), top((1, 0.6), (2, 0.1)))
    expected = 0.8 * ln(0.8 / 0.6) + 0.1 * ln(0.1 / 0.1) + 0.1 * ln(0.1 / 0.3)
    assert kl == pytest.approx(expected, abs=1e-12)
    assert kl == pytest.approx(0.120284, abs=1e-6)


def test_missing_token_takes_candidate_leftover():
    # Token 2 is not in the candidate's top: leftover 1 - 0.9 = 0.1 < smallest listed 0.2 -> q = 0.1.
    kl, k, missing = position_kl(top((1, 0.6), (2, 0.3)), top((1, 0.7), (3, 0.2)))
    expected = 0.6 * ln(0.6 / 0.7) + 0.3 * ln(0.3 / 0.1) + 0.1 * ln(0.1 / (1 - 0.7 - 0.1))
    assert kl == pytest.approx(expected, abs=1e-12)
    assert (k, missing) == (2, 1)


def test_missing_token_capped_at_smallest_listed_candidate_probability():
    # Leftover 0.45 but the candidate's smallest listed probability is 0.05 -> q = 0.05, rest 0.45.
    kl, _, missing = position_kl(top((1, 0.6), (2, 0.3)), top((1, 0.5), (3, 0.05)))
    expected = 0.6 * ln(0.6 / 0.5) + 0.3 * ln(0.3 / 0.05) + 0.1 * ln(0.1 / 0.45)
    assert kl == pytest.approx(expected, abs=1e-12)
    assert missing == 1


def test_leftover_is_shared_among_missing_tokens():
    # Two missing tokens share leftover 0.2 -> 0.1 each (below the cap 0.3).
    kl, _, missing = position_kl(top((1, 0.5), (2, 0.2), (3, 0.2)), top((1, 0.5), (4, 0.3)))
    expected = 0.5 * ln(1) + 0.2 * ln(0.2 / 0.1) * 2 + 0.1 * ln(0.1 / (1 - 0.7))
    assert kl == pytest.approx(expected, abs=1e-12)
    assert missing == 2


def test_candidate_with_no_leftover_is_floored_not_infinite():
    kl, _, _ = position_kl(top((1, 0.5), (2, 0.5)), top((1, 1.0)))
    assert math.isfinite(kl)
    assert kl == pytest.approx(0.5 * ln(0.5) + 0.5 * ln(0.5 / 1e-10), rel=1e-9)


# --- position_divergence ------------------------------------------------------------------------

def test_position_divergence_rows():
    ref = [pos(1, 0.6, (1, 0.6), (2, 0.3)), pos(2, 0.3, (1, 0.6), (2, 0.3))]
    cand = [pos(1, 0.5, (1, 0.5), (2, 0.4)), pos(2, 0.45, (2, 0.45), (1, 0.4))]
    frame = position_divergence(ref, cand, start=52)
    assert list(frame["position"]) == [52, 53]
    assert list(frame["top1_agree"]) == [True, False]
    assert frame["dp"].tolist() == pytest.approx([-0.1, 0.15])
    assert frame["abs_dp"].tolist() == pytest.approx([0.1, 0.15])
    assert frame["kl"].iloc[0] == pytest.approx(0.0230880, abs=1e-6)
    assert list(frame["k"]) == [2, 2]


def test_position_divergence_rejects_different_tokens():
    with pytest.raises(ValueError, match="token differs at position 7"):
        position_divergence([pos(1, 0.5, (1, 0.5))], [pos(2, 0.5, (2, 0.5))], start=7)


# --- summaries ----------------------------------------------------------------------------------

def frame_of(kl, agree, dp, start=0):
    return pd.DataFrame({"position": np.arange(start, start + len(kl)), "kl": kl, "top1_agree": agree,
                         "dp": dp, "abs_dp": np.abs(dp)})


def test_summary_percentiles_on_known_array():
    kl = np.arange(101, dtype=float) / 100  # 0.00 .. 1.00
    agree = [True] * 90 + [False] * 11
    dp = np.array([0.1, -0.1] * 50 + [0.5])
    s = divergence_summary(frame_of(kl, agree, dp))
    assert s["n"] == 101
    assert s["kl_mean"] == pytest.approx(0.5)
    assert s["kl_median"] == pytest.approx(0.5)
    assert s["kl_p90"] == pytest.approx(0.9)
    assert s["kl_p99"] == pytest.approx(0.99)
    assert s["kl_max"] == pytest.approx(1.0)
    p = 90 / 101
    assert s["top1_agreement"] == pytest.approx(p)
    assert s["top1_agreement_se"] == pytest.approx(math.sqrt(p * (1 - p) / 100))
    assert s["abs_dp_max"] == pytest.approx(0.5)
    assert s["abs_dp_mean"] == pytest.approx((100 * 0.1 + 0.5) / 101)
    assert s["dp_rms"] == pytest.approx(math.sqrt((100 * 0.01 + 0.25) / 101))
    assert s["dp_mean"] == pytest.approx(0.5 / 101)


def test_summary_of_empty_frame_is_all_none():
    s = divergence_summary(frame_of(np.array([]), [], np.array([])))
    assert s["n"] == 0
    assert s["kl_mean"] is None and s["top1_agreement"] is None and s["dp_rms"] is None


def test_default_edges_are_powers_of_two_trimmed_to_data():
    assert default_edges(100) == [0, 128]
    assert default_edges(128) == [0, 128, 256]
    assert default_edges(5000) == [0, 128, 256, 512, 1024, 2048, 4096, 8192]


def test_buckets_split_by_absolute_position():
    kl = np.array([0.0] * 200 + [1.0] * 100)
    frame = frame_of(kl, [True] * 300, np.zeros(300), start=0)
    buckets = by_position_bucket(frame)
    assert list(buckets["bucket"]) == ["0-127", "128-255", "256-511"]
    assert list(buckets["n"]) == [128, 128, 44]
    assert buckets["kl_mean"].tolist() == pytest.approx([0.0, 56 / 128, 1.0])  # 200..255 are ones


def test_buckets_with_custom_edges_and_open_end():
    frame = frame_of(np.ones(10), [True] * 10, np.zeros(10), start=95)
    buckets = by_position_bucket(frame, edges=[0, 100])
    assert list(buckets["bucket"]) == ["0-99", "100+"]
    assert list(buckets["n"]) == [5, 5]


# --- cell_divergence ----------------------------------------------------------------------------

TOKENS = list(range(100, 140))
SCORED_FROM = 10
N = len(TOKENS) - SCORED_FROM  # 30 scored positions


def positions(shift: float = 0.0, flip_every: int = 0):
    """Reference-like distributions; `shift` moves mass from the best token to the second."""
    out = []
    for i in range(SCORED_FROM, len(TOKENS)):
        a, b = 0.7 - shift, 0.2 + shift
        best, second = (TOKENS[i], 7) if not (flip_every and i % flip_every == 0) else (7, TOKENS[i])
        pa, pb = (a, b) if best == TOKENS[i] else (b, a)
        out.append({"token": TOKENS[i], "logprob": ln(pa if best == TOKENS[i] else pb),
                    "top": [[best, ln(max(a, b))], [second, ln(min(a, b))]]})
    return out


def scoring(shift=0.0, flip_every=0, noise_shift=None):
    seq = {"id": "doc-0", "kind": "document", "token_ids": TOKENS, "scored_from": SCORED_FROM,
           "accepted": True, "rejection": None, "positions": positions(shift, flip_every)}
    phase = {"top_k": 2, "sequences": [seq]}
    if noise_shift is not None:
        phase["noise"] = {"sequences": [dict(seq, positions=positions(noise_shift))]}
    return phase


def cell(kv, length, started=True, **kw):
    facts = {"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length, "started": started}
    if started:
        facts["phases"] = {"scoring": scoring(**kw)}
    return complete_cell(facts)


def kl_of(shift):
    a, b = 0.7, 0.2
    return a * ln(a / (a - shift)) + b * ln(b / (b + shift))


def test_cell_divergence_kv_and_noise_floor():
    cells = {
        "auto-2048": cell("auto", 2048, noise_shift=0.01),
        "auto-8192": cell("auto", 8192, shift=0.02),
        "fp8-2048": cell("fp8", 2048, shift=0.05),
        "fp8-8192": cell("fp8", 8192, shift=0.02),
    }
    result = cell_divergence(typed_cells(cells))
    json.dumps(result, allow_nan=False)  # plain JSON
    kinds = [(c["kind"], c["cell"], c["reference"]) for c in result["comparisons"]]
    assert kinds == [("kv", "fp8-2048", "auto-2048"), ("kv", "fp8-8192", "auto-8192"),
                     ("noise_length", "auto-8192", "auto-2048"), ("noise_batch", "auto-2048", "auto-2048")]
    fp8_2k = result["comparisons"][0]
    assert fp8_2k["summary"]["n"] == N
    assert fp8_2k["summary"]["kl_mean"] == pytest.approx(kl_of(0.05))
    assert fp8_2k["summary"]["top1_agreement"] == 1.0
    assert fp8_2k["same_length"] is True
    # fp8-8192 and auto-8192 share shift 0.02 -> identical distributions.
    assert result["comparisons"][1]["summary"]["kl_mean"] == 0.0
    assert fp8_2k["per_sequence"][0]["id"] == "doc-0"
    assert fp8_2k["per_sequence"][0]["scored_from"] == SCORED_FROM
    assert [b["bucket"] for b in fp8_2k["buckets"]] == ["0-127"]
    assert fp8_2k["buckets"][0]["end"] == 128
    floor = result["noise_floor"]
    # noise_length shift 0.02 beats noise_batch shift 0.01.
    assert floor["kl_mean"] == pytest.approx(kl_of(0.02))
    assert floor["kl_p99"] == pytest.approx(kl_of(0.02))
    assert floor["top1_disagreement"] == 0.0
    assert {s["kind"] for s in floor["source"]} == {"noise_length", "noise_batch"}


def test_noise_floor_top1_disagreement_is_worst_over_sources():
    cells = {"auto-2048": cell("auto", 2048), "auto-4096": cell("auto", 4096, flip_every=3)}
    floor = cell_divergence(typed_cells(cells))["noise_floor"]
    assert floor["top1_disagreement"] == pytest.approx(10 / 30)


def test_no_noise_comparison_gives_no_floor():
    result = cell_divergence(typed_cells({"auto-2048": cell("auto", 2048), "fp8-2048": cell("fp8", 2048, shift=0.1)}))
    assert result["noise_floor"] is None
    assert [c["kind"] for c in result["comparisons"]] == ["kv"]


def test_unstarted_cells_and_missing_baseline():
    cells = {
        "auto-2048": cell("auto", 2048),
        "auto-98304": cell("auto", 98304, started=False),
        "fp8-98304": cell("fp8", 98304, shift=0.05),
        "fp8-4096": cell("fp8", 4096, started=False),
    }
    result = cell_divergence(typed_cells(cells))
    assert result["unmatched"] == [{"cell": "fp8-4096", "reason": "did not start"}]
    (comp,) = result["comparisons"]
    # Auto could not start at 98304: compared with the nearest started auto cell, marked as such.
    assert (comp["cell"], comp["reference"], comp["same_length"]) == ("fp8-98304", "auto-2048", False)
    assert comp["summary"]["kl_mean"] == pytest.approx(kl_of(0.05))


def test_sequences_with_different_tokens_or_rejections_are_skipped():
    auto, fp8 = cell("auto", 2048), cell("fp8", 2048, shift=0.05)
    other = dict(fp8["phases"]["scoring"]["sequences"][0], id="doc-1")
    fp8["phases"]["scoring"]["sequences"].append(dict(other, token_ids=TOKENS[::-1]))
    auto["phases"]["scoring"]["sequences"].append(dict(other, positions=positions()))
    auto["phases"]["scoring"]["sequences"].append(dict(other, id="doc-2", accepted=False, positions=[]))
    fp8["phases"]["scoring"]["sequences"].append(dict(other, id="doc-2"))
    comp = cell_divergence(typed_cells({"auto-2048": auto, "fp8-2048": fp8}))["comparisons"][0]
    assert [s["id"] for s in comp["per_sequence"]] == ["doc-0"]
    assert comp["skipped"] == [{"id": "doc-1", "reason": "token ids differ between the cells"}]
    assert comp["summary"]["n"] == N


def test_different_scored_from_aligns_on_absolute_position():
    auto, fp8 = cell("auto", 2048), cell("fp8", 2048, shift=0.05)
    seq = fp8["phases"]["scoring"]["sequences"][0]
    seq["scored_from"] = SCORED_FROM + 5
    seq["positions"] = seq["positions"][5:]
    comp = cell_divergence(typed_cells({"auto-2048": auto, "fp8-2048": fp8}))["comparisons"][0]
    assert comp["summary"]["n"] == N - 5
    assert comp["per_sequence"][0]["scored_from"] == SCORED_FROM + 5
    assert comp["summary"]["kl_mean"] == pytest.approx(kl_of(0.05))


def test_kv_comparisons_carry_figures_per_scored_sequence():
    # Two documents with different shifts: the clustered KL mean is the position-weighted mean over both, its
    # standard error the CR1 figure over the two sequences (analysis/cluster_interval.py); noise rows have none.
    auto, fp8 = cell("auto", 2048, noise_shift=0.01), cell("fp8", 2048, shift=0.05)
    second = dict(fp8["phases"]["scoring"]["sequences"][0], id="doc-1", positions=positions(0.1, flip_every=2))
    fp8["phases"]["scoring"]["sequences"].append(second)
    auto["phases"]["scoring"]["sequences"].append(dict(second, positions=positions()))
    result = cell_divergence(typed_cells({"auto-2048": auto, "fp8-2048": fp8}))
    comp = result["comparisons"][0]
    clustered = comp["clustered"]
    assert set(clustered) == {"kl_mean", "top1_agreement"}  # no late start given: no late figure
    kl = clustered["kl_mean"]
    assert (kl["clusters"], kl["positions"]) == (2, 2 * N) and kl["positions"] == comp["summary"]["n"]
    assert kl["estimate"] == pytest.approx(comp["summary"]["kl_mean"])
    per_doc = [s["kl_mean"] for s in comp["per_sequence"]]
    # CR1 with two equal-sized clusters: sqrt(2 · Σ (n (m_g − m))²) / (2n) = |m_1 − m_2| / 2.
    assert kl["se"] == pytest.approx(abs(per_doc[0] - per_doc[1]) / 2)
    top1 = clustered["top1_agreement"]
    assert top1["estimate"] == pytest.approx(comp["summary"]["top1_agreement"])
    assert top1["clusters"] == 2 and top1["se"] > 0
    assert all("clustered" not in c for c in result["comparisons"] if c["kind"] != "kv")
