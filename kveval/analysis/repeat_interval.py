"""Intervals for repeated speed measurements (issue 41): the median of one cell's repeats, and the ratio
of a tested cell's repeats to the `auto` cell's. Pure functions of lists of numbers; no assumption about
the shape of the timing distribution (run-to-run timings are skewed and have outliers).

- The median's interval is the distribution-free order-statistic interval [x_(k), x_(n+1-k)], k the largest
  with 1 - 2·P(Binom(n, 1/2) <= k-1) at or above the confidence asked (Conover 1999, *Practical
  Nonparametric Statistics*, 3rd ed., §3.2; Hahn & Meeker 1991, *Statistical Intervals*, §5.2). Below 6
  repeats no such k reaches 95 %: the interval is then [min, max] with the confidence it really has
  (1 - 2^(1-n)), stated beside it.
- The ratio tested / auto is the Hodges-Lehmann estimate on the log scale: exp of the median of every
  log(x_i) - log(y_j), with the distribution-free interval from the Mann-Whitney null distribution of U
  (Bauer 1972, *JASA* 67:687; Hollander, Wolfe & Chicken 2014, *Nonparametric Statistical Methods*,
  3rd ed., §4.3). The two cells' repeats come from two engine processes, so they are unpaired. Exact and
  deterministic (no resampling): a review re-rendered from stored evidence gives the same interval.

Only the standard library: every cell process imports this (worker/repeats.py), and scipy.stats would add
~1.1 s to each cell's imports on the 2-core CPU (and, at import, inspects whatever module is named `torch`).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple, Sequence


CONFIDENCE = 0.95


class Interval(NamedTuple):
    """A point estimate, its interval and the interval's real coverage (which may fall short of the
    confidence asked when there are few repeats)."""

    estimate: float | None
    low: float | None
    high: float | None
    confidence: float | None
    n: int

    @property
    def relative_half_width(self) -> float | None:
        if self.estimate is None or self.low is None or self.high is None or not self.estimate:
            return None
        return (self.high - self.low) / 2.0 / abs(self.estimate)

    def tight(self, target: float, confidence: float = CONFIDENCE) -> bool:
        """Its real coverage reaches `confidence` and its half-width is at most `target` × the estimate."""
        width = self.relative_half_width
        return width is not None and (self.confidence or 0.0) >= confidence - 1e-12 and width <= target


def _clean(values: Sequence[float | None]) -> list[float]:
    return sorted(float(v) for v in values if v is not None and not math.isnan(float(v)))


def median_interval(values: Sequence[float | None], confidence: float = CONFIDENCE) -> Interval:
    """The median and its order-statistic interval (module doc)."""
    xs = _clean(values)
    n = len(xs)
    if n == 0:
        return Interval(None, None, None, None, 0)
    median = (xs[(n - 1) // 2] + xs[n // 2]) / 2.0
    if n == 1:
        return Interval(median, None, None, None, 1)
    k = 1
    while k + 1 <= n // 2 and 1.0 - 2.0 * _binom_half_cdf(k, n) >= confidence:
        k += 1   # k+1 still covers: take the narrower pair of order statistics
    coverage = 1.0 - 2.0 * _binom_half_cdf(k - 1, n)
    return Interval(median, xs[k - 1], xs[n - k], coverage, n)


def _binom_half_cdf(k: int, n: int) -> float:
    """P(Binom(n, 1/2) <= k), exact: the integer count of outcomes over 2^n."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / (1 << n)


def _normal_cdf(z: float) -> float:
    """The standard normal distribution function."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of arrangements giving each value of the Mann-Whitney U (0..m·n) under the null:
    f(m, n, u) = f(m-1, n, u-n) + f(m, n-1, u)."""
    if m == 0 or n == 0:
        return (1,)
    with_last_x = _u_counts(m - 1, n)   # the largest value is x: it exceeds all n y's
    with_last_y = _u_counts(m, n - 1)
    counts = [0] * (m * n + 1)
    for u, c in enumerate(with_last_y):
        counts[u] += c
    for u, c in enumerate(with_last_x):
        counts[u + n] += c
    return tuple(counts)


def _u_cdf(k: int, m: int, n: int) -> float:
    """P(U <= k) under the null; exact up to 30 repeats a side, the normal approximation beyond."""
    if k < 0:
        return 0.0
    if m <= 30 and n <= 30:
        counts = _u_counts(m, n)
        return sum(counts[:k + 1]) / math.comb(m + n, m)
    mean, sd = m * n / 2.0, math.sqrt(m * n * (m + n + 1) / 12.0)
    return _normal_cdf((k + 0.5 - mean) / sd)


def ratio_interval(tested: Sequence[float | None], baseline: Sequence[float | None],
                   confidence: float = CONFIDENCE) -> Interval:
    """tested / baseline: Hodges-Lehmann ratio with its Mann-Whitney interval (module doc). Values must be
    positive (rates, times); `n` is the number of pairwise ratios."""
    xs = [v for v in _clean(tested) if v > 0]
    ys = [v for v in _clean(baseline) if v > 0]
    m, n = len(xs), len(ys)
    if not m or not n:
        return Interval(None, None, None, None, 0)
    logs = sorted(math.log(x) - math.log(y) for x in xs for y in ys)
    count = len(logs)
    middle = (logs[(count - 1) // 2] + logs[count // 2]) / 2.0
    if count == 1:
        return Interval(math.exp(middle), None, None, None, 1)
    # The interval is [D_(k), D_(mn+1-k)] with k the largest such that P(U <= k-1) <= (1 - confidence)/2.
    k = 1
    while k + 1 <= count // 2 and 1.0 - 2.0 * _u_cdf(k, m, n) >= confidence:
        k += 1
    coverage = 1.0 - 2.0 * _u_cdf(k - 1, m, n)
    return Interval(math.exp(middle), math.exp(logs[k - 1]), math.exp(logs[count - k]), coverage, count)
