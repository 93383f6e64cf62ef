"""Non-inferiority of paired task accuracy: is the tested cell's accuracy shown to be at least
`margin` × the baseline's on the same samples? Pure (scipy for the normal quantile).

The recovery is cell accuracy / baseline accuracy = 1 + (c − b) / (n · baseline accuracy), with
b the samples only the baseline got right and c those only the cell got right. Its one-sided lower
bound takes the exact (Clopper–Pearson) upper bound of the rate b / n and the observed c / n:

    bound = 1 + (c / n − upper₁₋α(b, n)) / baseline accuracy

Conservative where it matters: 16 of 16 right in both cells still leaves b / n up to 17 %, so a
small, perfect pairing is not taken as proof (0.83 at a baseline accuracy of 1). The baseline
accuracy is treated as known; with a few hundred samples its own error is small next to b's.
"""
from __future__ import annotations

import math

from scipy.stats import beta, norm


def paired_recovery_bound(n: int, b: int, c: int, baseline_accuracy: float, alpha: float = 0.05) -> float:
    """One-sided (1 − alpha) lower confidence bound of the paired recovery."""
    if n <= 0 or not baseline_accuracy:
        raise ValueError("the recovery bound needs paired samples and a baseline accuracy above 0")
    upper_b = 1.0 if b >= n else float(beta.ppf(1 - alpha, b + 1, n - b))
    return 1.0 + (c / n - upper_b) / baseline_accuracy


def samples_to_decide(n: int, b: int, c: int, baseline_accuracy: float, margin: float,
                      alpha: float = 0.05) -> int | None:
    """Paired samples at which the bound would reach `margin` if the observed discordance and
    recovery held (a recovery above 1 is taken as 1: no benefit is assumed). None when the observed
    recovery is within 0.02 of the margin or under it: more samples would then not decide a PASS."""
    if n <= 0 or not baseline_accuracy:
        return None
    observed = 1.0 + (c - b) / n / baseline_accuracy
    assumed = min(observed, 1.0)
    gap = baseline_accuracy * (assumed - margin)
    if assumed - margin < 0.02:
        return None
    rate = (b + c + 1) / (n + 2)  # discordance per sample, kept above 0
    d = baseline_accuracy * (assumed - 1.0)
    need = norm.ppf(1 - alpha) ** 2 * max(rate - d * d, 1e-6) / gap ** 2
    return max(n + 1, math.ceil(need))
