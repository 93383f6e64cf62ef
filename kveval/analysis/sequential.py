"""Task evidence gathered in rounds, judged at every round without inflating the error: a group-sequential
design with alpha spending. Pure (scipy for the normal distribution).

Each round adds paired task samples, and the gate looks at the pooled samples after every round. Testing
each look at the full alpha would raise the chance of a false PASS (or a false FAIL) with every look.
Lan & DeMets (1983, Biometrika 70:659) spend alpha over the information fraction t = n_k / N_max
(N_max: the budget's paired samples per cell); kveval uses their Pocock-type function (Kim & DeMets
1987 name it so)

    alpha(t) = alpha · ln(1 + (e − 1) t),   alpha(0) = 0, alpha(1) = alpha,

and look k tests at its increment alpha(t_k) − alpha(t_{k−1}); the final look (the budget is spent)
spends whatever is left. By the union bound the chance of any false decision over all looks is at most
alpha, for the non-inferiority bound and for McNemar's test alike. Pocock-type rather than
O'Brien–Fleming-type spending: kveval's point is to stop as soon as the evidence decides (each round
costs engine starts), and O'Brien–Fleming spends almost nothing before the budget is nearly used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scipy.stats import norm

from kveval.analysis.noninferiority import samples_to_decide


def spent(t: float, alpha: float) -> float:
    """Alpha spent up to information fraction t (Pocock type, Lan & DeMets 1983)."""
    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    return float(alpha * math.log(1.0 + (math.e - 1.0) * t))


def increasing_looks(looks: Sequence[int]) -> list[int]:
    """The looks that added samples: a round that paired nothing new is no new look."""
    out: list[int] = []
    for n in looks:
        if n > 0 and (not out or n > out[-1]):
            out.append(int(n))
    return out


@dataclass(frozen=True)
class Look:
    """The last look of a cell: its number (1-based), information fraction and the alpha it may use."""

    number: int
    fraction: float
    alpha: float
    final: bool
    sequential: bool   # False: one fixed-sample test at the full alpha (no design, or a single final look)


def look_alpha(looks: Sequence[int], n_max: int | None, alpha: float, final: bool) -> Look:
    """The alpha the last of `looks` (cumulative paired samples per look) may spend.

    No design (n_max None or 0) or no looks: the fixed-sample test at alpha. A final look spends
    alpha − alpha(t_{k−1}), so a single final look is exactly the fixed-sample test."""
    looks = increasing_looks(looks)
    if not n_max or not looks:
        return Look(max(1, len(looks)), 1.0, alpha, True, False)
    fractions = [min(1.0, n / n_max) for n in looks]
    before = spent(fractions[-2], alpha) if len(fractions) > 1 else 0.0
    now = alpha if final else spent(fractions[-1], alpha)
    return Look(len(looks), fractions[-1], max(0.0, now - before), final, len(looks) > 1 or not final)


def final_look_alpha(alpha: float) -> float:
    """What the last look of a design whose previous look came at half its samples spends: the level a
    rerun with a larger budget would test at, for saying how many samples would decide."""
    return alpha - spent(0.5, alpha)


def samples_to_show_drop(n: int, b: int, c: int, alpha: float) -> int | None:
    """Paired samples at which McNemar's test would reach p < alpha if the discordance held (normal
    approximation: the statistic (b − c) / √(b + c) grows with √n). None without an observed drop."""
    if n <= 0 or b <= c:
        return None
    z = (b - c) / math.sqrt(b + c)
    need = n * (norm.ppf(1.0 - alpha / 2.0) / z) ** 2
    return max(n + 1, math.ceil(need))


def next_look_size(n: int, b: int, c: int, baseline_accuracy: float, margin: float, alpha: float,
                   looks: Sequence[int], n_max: int) -> int:
    """Paired samples per cell the next look should have: what would decide if the observed discordance
    held (non-inferiority where the recovery clears the margin, else a significant drop), tested at the
    alpha that look would spend; at least double the samples so far, at most n_max."""
    looks = increasing_looks(looks) or [n]
    before = spent(min(1.0, looks[-1] / n_max), alpha)
    target = min(n_max, 2 * n)
    for _ in range(8):  # the alpha depends on the size and the size on the alpha: a few passes settle it
        level = max(spent(min(1.0, target / n_max), alpha) - before, 1e-12)
        need = samples_to_decide(n, b, c, baseline_accuracy, margin, level) if baseline_accuracy else None
        need = need or samples_to_show_drop(n, b, c, level)
        wanted = min(n_max, max(2 * n, need or 0))
        if wanted == target:
            break
        target = wanted
    return max(target, min(n_max, n + 1))
