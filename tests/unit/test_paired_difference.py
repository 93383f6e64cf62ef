"""Tango's score bound for the excess of paired degenerate outputs (analysis/paired_difference.py)."""
import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from kveval.analysis.paired_difference import _restricted_p21, excess_lower_bound, score_statistic


@pytest.mark.parametrize("b,c,n,delta", [(12, 4, 109, 0.02), (8, 0, 60, 0.05), (30, 5, 105, 0.1), (3, 7, 50, -0.03)])
def test_the_closed_form_restricted_mle_is_the_numerical_one(b, c, n, delta):
    def minus_log_likelihood(p21):
        return -(b * math.log(p21 + delta) + (c * math.log(p21) if c else 0) + (n - b - c) * math.log(1 - 2 * p21 - delta))
    numerical = minimize_scalar(minus_log_likelihood, bounds=(max(0, -delta) + 1e-9, (1 - delta) / 2 - 1e-9),
                                method="bounded", options={"xatol": 1e-12}).x
    assert _restricted_p21(delta, b, c, n) == pytest.approx(numerical, abs=1e-6)


def test_at_zero_the_statistic_is_mcnemars_z():
    assert score_statistic(0.0, 12, 4, 109) == pytest.approx((12 - 4) / math.sqrt(16))


def test_the_bound_is_below_the_estimate_and_grows_with_evidence():
    assert excess_lower_bound(109, 12, 4) == pytest.approx(0.0141, abs=5e-4)
    assert excess_lower_bound(109, 12, 4) < 8 / 109
    assert excess_lower_bound(9, 2, 0) < 0 < excess_lower_bound(60, 12, 0)
    assert -1 <= excess_lower_bound(100, 0, 0) < 0


def test_coverage_at_a_true_excess_of_five_points():
    # 105 prompts, 5 % baseline-only and 10 % cell-only loops (true excess 5 %): a FAIL rule "bound > 5 %"
    # must fire in at most about alpha of runs.
    rng = np.random.default_rng(0)
    draws = rng.multinomial(105, [0.10, 0.05, 0.85], size=2000)
    fired = np.mean([excess_lower_bound(105, int(b), int(c)) > 0.05 for b, c, _ in draws])
    assert fired <= 0.06


def test_the_upper_bound_mirrors_the_lower_one():
    from kveval.analysis.paired_difference import excess_upper_bound
    # 7 only in the cell, 5 only in the baseline, of 109: the excess 1.8 % lies inside (-3.7 %, 7.6 %).
    low, high = excess_lower_bound(109, 7, 5), excess_upper_bound(109, 7, 5)
    assert low < 2 / 109 < high
    assert (round(low, 3), round(high, 3)) == (-0.037, 0.076)
    assert excess_upper_bound(109, 5, 7) == pytest.approx(-low)
