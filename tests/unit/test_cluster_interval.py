"""kveval.analysis.cluster_interval against an independent implementation: statsmodels' OLS of the
per-position values on an intercept alone, with cluster-robust covariance (cov_type="cluster", groups =
the scored sequence, its default small-sample corrections, t with G - 1 degrees of freedom). The ratio-of-
sums mean is that regression's intercept; its CR1 standard error and one-sided t bound must agree."""
from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy.stats import t as student_t

from kveval.analysis.cluster_interval import cluster_mean


def _positions(rng, clusters: int, binary: bool = False):
    """Per-position values of `clusters` sequences of unequal lengths, each with its own level (positions of
    one document share its fate): KL-like (skewed, non-negative) or top-1 agreement (0/1)."""
    values, groups = [], []
    for g in range(clusters):
        n = int(rng.integers(5, 400))
        if binary:
            values.append((rng.random(n) < rng.uniform(0.6, 0.98)).astype(float))
        else:
            values.append(rng.gamma(0.5, rng.uniform(0.005, 0.08), n))
        groups.append(np.full(n, g))
    return np.concatenate(values), np.concatenate(groups)


def _statsmodels(values, groups, alpha):
    fit = sm.OLS(values, np.ones((len(values), 1))).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    estimate, se = float(fit.params[0]), float(fit.bse[0])
    # Two-sided (1 - 2 alpha) interval: each end is the one-sided (1 - alpha) bound.
    low, high = fit.conf_int(alpha=2 * alpha)[0]
    return estimate, se, float(low), float(high), float(fit.df_resid_inference)  # G - 1 with clusters


@pytest.mark.parametrize("clusters", [2, 3, 8, 24, 60])
@pytest.mark.parametrize("binary", [False, True], ids=["kl", "top1"])
def test_cluster_mean_is_the_cluster_robust_ols_intercept(clusters, binary):
    rng = np.random.default_rng(1000 * clusters + binary)
    values, groups = _positions(rng, clusters, binary)
    sums = np.bincount(groups, weights=values)
    counts = np.bincount(groups)
    figure = cluster_mean(sums, counts)
    estimate, se, low, high, df = _statsmodels(values, groups, alpha=0.05)
    assert (figure.clusters, figure.positions) == (clusters, len(values))
    assert figure.estimate == pytest.approx(estimate, rel=1e-12)
    assert figure.se == pytest.approx(se, rel=1e-9)
    # The bound uses t with G - 1 degrees of freedom, as statsmodels does for cluster covariance.
    assert figure.df == clusters - 1 == df
    assert figure.upper(0.05) == pytest.approx(high, rel=1e-9)
    assert figure.lower(0.05) == pytest.approx(low, rel=1e-9, abs=1e-12)
    # At the FAIL path's level (alpha / 5) too.
    _, _, low_fail, high_fail, _ = _statsmodels(values, groups, alpha=0.01)
    assert figure.lower(0.01) == pytest.approx(low_fail, rel=1e-9, abs=1e-12)
    assert figure.upper(0.01) == pytest.approx(high_fail, rel=1e-9)
    assert figure.upper(0.01) == pytest.approx(estimate + student_t.ppf(0.99, clusters - 1) * se, rel=1e-9)


def test_one_sequence_has_no_interval():
    figure = cluster_mean([12.0], [400])
    assert (figure.estimate, figure.se, figure.clusters, figure.positions) == (0.03, None, 1, 400)
    assert figure.upper(0.05) is None and figure.lower(0.05) is None


def test_sequences_without_positions_are_left_out_and_nothing_counted_is_none():
    assert cluster_mean([], []) is None
    assert cluster_mean([0.0, 0.0], [0, 0]) is None
    with_empty = cluster_mean([1.0, 0.0, 3.0], [100, 0, 100])
    assert with_empty == cluster_mean([1.0, 3.0], [100, 100])
    assert with_empty.clusters == 2


def test_identical_sequences_have_no_spread():
    # Every sequence at the same mean: the residuals vanish, so the interval is the estimate itself.
    figure = cluster_mean([1.5, 3.0, 0.75], [100, 200, 50])
    assert figure.estimate == pytest.approx(0.015)
    assert figure.se == pytest.approx(0.0, abs=1e-15)
    assert figure.upper(0.05) == pytest.approx(0.015) and figure.lower(0.01) == pytest.approx(0.015)


def test_no_bound_outside_zero_and_one():
    figure = cluster_mean([1.0, 3.0], [100, 100])
    assert figure.upper(0) is None and figure.lower(1) is None
