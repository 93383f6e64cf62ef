"""How many more outputs degenerate in the tested cell than in the baseline, with a bound: the
difference of two paired proportions. Pure (scipy for the normal quantile and the root).

Per prompt the cell's output and the baseline's either degenerate or not; `new` prompts degenerate
only in the cell, `baseline_only` only in the baseline, out of `n` judged. The excess is
(new − baseline_only) / n. Its one-sided lower confidence bound inverts Tango's asymptotic score test
for the difference of paired proportions: Tango (1998), "Equivalence test and confidence interval for
the difference in proportions for the paired-sample design", Statistics in Medicine 17:891–908;
Fagerland, Lydersen & Laake (2014), BMC Medical Research Methodology 14:116, recommend it. With b =
new, c = baseline_only and the restricted maximum-likelihood estimate p̃ of P(baseline only) under
H0: excess = δ,

    T(δ) = (b − c − n δ) / sqrt(n (2 p̃ + δ (1 − δ))),

which at δ = 0 is McNemar's z. T falls as δ rises; the bound is the δ where T(δ) = z₁₋α.
"""
from __future__ import annotations

import math
from functools import lru_cache

from scipy.optimize import brentq
from scipy.stats import norm

_EDGE = 1e-9


@lru_cache(maxsize=None)
def _z(level: float) -> float:
    """norm.ppf(level), once per level: the gate and its simulations ask for the same few levels thousands
    of times, and scipy's scalar ppf costs ~0.3 ms a call (test CPU time, issue 42)."""
    return float(norm.ppf(level))


def _restricted_p21(delta: float, b: int, c: int, n: int) -> float:
    """Restricted MLE of P(baseline only) under excess = delta (Tango 1998, eq. 5)."""
    a = 2 * n
    bb = -b - c + (2 * n - b + c) * delta
    cc = -c * delta * (1 - delta)
    return (-bb + math.sqrt(max(bb * bb - 4 * a * cc, 0.0))) / (2 * a)


def score_statistic(delta: float, b: int, c: int, n: int) -> float:
    """Tango's score statistic for H0: excess = delta (positive: the excess is above delta)."""
    numerator = b - c - n * delta
    variance = n * (2 * _restricted_p21(delta, b, c, n) + delta * (1 - delta))
    if variance <= 0:
        return 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def excess_lower_bound(n: int, new: int, baseline_only: int, alpha: float = 0.05) -> float:
    """One-sided (1 − alpha) lower bound of (new − baseline_only) / n; between −1 and 1."""
    if n <= 0 or new < 0 or baseline_only < 0 or new + baseline_only > n:
        raise ValueError(f"inconsistent paired counts: n {n}, new {new}, baseline only {baseline_only}")
    z = _z(1 - alpha)
    low, high = -1 + _EDGE, (new - baseline_only) / n
    if score_statistic(high, new, baseline_only, n) >= z:  # only when the table is degenerate
        return high
    if score_statistic(low, new, baseline_only, n) <= z:
        return -1.0
    return float(brentq(lambda d: score_statistic(d, new, baseline_only, n) - z, low, high, xtol=1e-10))


def excess_upper_bound(n: int, new: int, baseline_only: int, alpha: float = 0.05) -> float:
    """One-sided (1 − alpha) upper bound of (new − baseline_only) / n: the lower bound with the two
    discordant cells swapped, negated (Tango's statistic is symmetric in them)."""
    return -excess_lower_bound(n, baseline_only, new, alpha)
