"""Confidence bounds for a divergence figure whose unit is the scored sequence, not the position. Pure
(numpy, scipy for the t quantile).

Positions of one document share its fate (one unlucky passage drifts for hundreds of positions), so
a count of positions overstates the evidence: a cell's KL mean over 7,000 positions can rest on two
documents. Each figure is a ratio of sums over the scored sequences g (documents and prompt
continuations): KL mean = Σ_g S_g / Σ_g n_g with S_g the sequence's summed KL and n_g its positions
(top-1 agreement: S_g the agreeing positions). Its cluster-robust variance is the CR1 sandwich of the
intercept-only regression with sequences as clusters (Cameron & Miller 2015, "A Practitioner's Guide
to Cluster-Robust Inference", J. Human Resources 50:317, eq. 11 with the G/(G−1) correction;
`statsmodels` OLS with cov_type="cluster" gives the same figure, tests/unit/test_cluster_interval.py):

    V = G / (G − 1) · Σ_g (S_g − m n_g)² / (Σ_g n_g)²,

and the bound uses Student's t with G − 1 degrees of freedom, the usual few-cluster correction
(Cameron & Miller 2015, section VI; Bell & McCaffrey 2002). With one sequence there is no interval.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import t as student_t


@dataclass(frozen=True)
class ClusterMean:
    """A ratio-of-sums mean over clusters with its CR1 standard error; se None with fewer than 2 clusters."""

    estimate: float
    se: float | None
    clusters: int
    positions: int

    @property
    def df(self) -> int:
        return self.clusters - 1

    def upper(self, alpha: float) -> float | None:
        """One-sided (1 − alpha) upper confidence bound; None when there is no interval."""
        if self.se is None or not 0 < alpha < 1:
            return None
        return self.estimate + float(student_t.ppf(1 - alpha, self.df)) * self.se

    def lower(self, alpha: float) -> float | None:
        """One-sided (1 − alpha) lower confidence bound; None when there is no interval."""
        if self.se is None or not 0 < alpha < 1:
            return None
        return self.estimate - float(student_t.ppf(1 - alpha, self.df)) * self.se


def cluster_mean(sums: Sequence[float], counts: Sequence[float]) -> ClusterMean | None:
    """Σ sums / Σ counts with its CR1 standard error over the clusters; None without any counted unit."""
    s = np.asarray(sums, dtype=float)
    n = np.asarray(counts, dtype=float)
    keep = n > 0
    s, n = s[keep], n[keep]
    total = float(n.sum())
    if not total:
        return None
    estimate = float(s.sum() / total)
    g = len(n)
    if g < 2:
        return ClusterMean(estimate, None, g, int(total))
    residuals = s - estimate * n
    variance = g / (g - 1) * float(np.sum(residuals ** 2)) / total ** 2
    return ClusterMean(estimate, math.sqrt(max(variance, 0.0)), g, int(total))
