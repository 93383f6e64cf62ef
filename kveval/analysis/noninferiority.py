"""Non-inferiority of paired task accuracy: is the tested cell's accuracy shown to be at least
`margin` × the baseline's on the same samples? Pure (scipy for the normal quantile and the root).

The recovery is the ratio of two paired proportions, cell accuracy / baseline accuracy. Its one-sided
lower confidence bound inverts the asymptotic score test for that ratio in a matched-pair design:
Tang, Tang & Chan (2003), "On tests of equivalence via non-unity relative risk for matched-pair
design", Statistics in Medicine 22:1217–1233 (also Nam & Blackwelder 2002, Stat Med 21:689–699;
Fagerland, Lydersen & Laake 2017, *Statistical Analysis of Contingency Tables*, ch. 8, recommend it
for the paired ratio). With the paired table

                      baseline right   baseline wrong
    cell right            n11              c
    cell wrong             b               n22

and N samples, the score statistic for H0: recovery = φ is

    T(φ) = (n11 + c − φ (n11 + b)) / sqrt(N (1 + φ) p̃ + (n11 + c + b)(φ − 1)),

where p̃ is the restricted maximum-likelihood estimate of the "only the baseline right" probability
(a closed-form root of a quadratic). T falls as φ rises; the lower bound is the φ at which
T(φ) = z₁₋α, so it is never below 0. With no discordant pair it is N11 / (N11 + z²) (0.957 for 60
samples both right), so a small perfect pairing is still no proof (16 of 16: 0.86).
"""
from __future__ import annotations

import math
from functools import lru_cache

from scipy.optimize import brentq
from scipy.stats import norm

_TINY = 1e-9


@lru_cache(maxsize=None)
def _z(level: float) -> float:
    """norm.ppf(level), once per level: the gate and its simulations ask for the same few levels thousands
    of times, and scipy's scalar ppf costs ~0.3 ms a call (test CPU time, issue 42)."""
    return float(norm.ppf(level))


def _restricted_p21(phi: float, n11: int, c: int, b: int, n: int) -> float:
    """Restricted MLE of P(cell wrong, baseline right) under recovery = phi (Tang et al. 2003, eq. 3)."""
    a = n * (1 + phi)
    bb = (n11 + b) * phi ** 2 - (n11 + c + 2 * b)
    cc = b * (1 - phi) * (n11 + c + b) / n
    return (-bb + math.sqrt(max(bb * bb - 4 * a * cc, 0.0))) / (2 * a)


def score_statistic(phi: float, n11: int, c: int, b: int, n: int) -> float:
    """Tang's score statistic for H0: cell accuracy / baseline accuracy = phi (positive: above phi)."""
    numerator = (n11 + c) - phi * (n11 + b)
    if numerator == 0:
        return 0.0
    variance = n * (1 + phi) * _restricted_p21(phi, n11, c, b, n) + (n11 + c + b) * (phi - 1)
    if variance <= 0:
        return math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def _table(n: int, b: int, c: int, baseline_accuracy: float) -> int:
    if n <= 0 or not baseline_accuracy:
        raise ValueError("the recovery bound needs paired samples and a baseline accuracy above 0")
    n11 = round(baseline_accuracy * n) - b
    if n11 < 0 or n11 + b + c > n:
        raise ValueError(f"inconsistent paired counts: n {n}, b {b}, c {c}, baseline accuracy {baseline_accuracy}")
    return n11


def paired_recovery_bound(n: int, b: int, c: int, baseline_accuracy: float, alpha: float = 0.05) -> float:
    """One-sided (1 − alpha) lower confidence bound of the paired recovery (Tang's score interval).
    b: samples only the baseline got right; c: only the cell."""
    n11 = _table(n, b, c, baseline_accuracy)
    estimate = (n11 + c) / (n11 + b)
    if estimate == 0 or alpha >= 1:
        return 0.0
    z = _z(1 - alpha)

    def excess(phi: float) -> float:
        return score_statistic(phi, n11, c, b, n) - z

    if excess(_TINY) <= 0:
        return 0.0
    return float(brentq(excess, _TINY, estimate, xtol=1e-10))


def paired_recovery_upper_bound(n: int, b: int, c: int, baseline_accuracy: float, alpha: float = 0.05) -> float:
    """One-sided (1 − alpha) upper confidence bound of the paired recovery: the same score interval's
    other side, the phi above the estimate where T(phi) = −z (inf when nothing bounds it)."""
    n11 = _table(n, b, c, baseline_accuracy)
    estimate = (n11 + c) / (n11 + b)
    if alpha >= 1:
        return estimate
    z = _z(1 - alpha)

    def excess(phi: float) -> float:
        return score_statistic(phi, n11, c, b, n) + z

    high = max(2 * estimate, 2.0)
    while excess(high) > 0:
        if high > 1e6:
            return math.inf
        high *= 2
    low = max(estimate, _TINY)
    if excess(low) <= 0:
        return low
    return float(brentq(excess, low, high, xtol=1e-10))


def samples_to_decide(n: int, b: int, c: int, baseline_accuracy: float, margin: float,
                      alpha: float = 0.05) -> int | None:
    """Paired samples at which the bound would reach `margin` if the observed shares held: the score
    statistic at the margin grows with √n. A recovery above 1 is taken as 1 (no benefit is assumed:
    the cell's extra right answers are set to the baseline's). None when the observed recovery is
    within 0.02 of the margin or under it: more samples would then not decide a PASS."""
    if n <= 0 or not baseline_accuracy:
        return None
    n11 = _table(n, b, c, baseline_accuracy)
    observed = (n11 + c) / (n11 + b)
    if min(observed, 1.0) - margin < 0.02:
        return None
    statistic = score_statistic(margin, n11, min(b, c), b, n)   # no benefit assumed: c at most b
    if not statistic > 0:
        return None
    if math.isinf(statistic):
        return n + 1
    need = n * (norm.ppf(1 - alpha) / statistic) ** 2
    return max(n + 1, int(math.ceil(need)))
