"""Task evidence gathered in rounds, judged at every round without inflating the error: a group-sequential
design with exact alpha-spending boundaries. Pure (numpy and scipy).

Each round adds paired samples (task samples, degeneration probes, divergence documents), and the gate
looks at the pooled samples after every round. Testing each look at the full alpha would raise the chance
of a false PASS (or a false FAIL) with every look. Lan & DeMets (1983, Biometrika 70:659) spend alpha over
the information fraction t = n_k / N_max (N_max: the budget's paired samples per cell); kveval uses their
Pocock-type function (Kim & DeMets 1987, Biometrics 43:857, name it so)

    alpha(t) = alpha · ln(1 + (e − 1) t),   alpha(0) = 0, alpha(1) = alpha.

Look k gets a boundary c_k on its standardized statistic Z_k such that, under H0,

    P(Z_1 < c_1, …, Z_{k−1} < c_{k−1}, Z_k ≥ c_k) = alpha(t_k) − alpha(t_{k−1}),

with corr(Z_i, Z_j) = √(n_i / n_j): Z_k √n_k is a sum of independent increments (the Brownian-motion
view of Jennison & Turnbull 2000, Group Sequential Methods, ch. 7 and 11). The final look spends whatever is
left, so the chance of any false decision over all looks is exactly alpha, not merely at most alpha as the
union bound of testing each look at its increment gave (0.036–0.043 in fact for 0.05). The gate plugs the
*nominal* level 1 − Φ(c_k) into its confidence bound and its McNemar test: a one-sided bound at that
level clears the margin exactly when Z_k ≥ c_k. Boundaries come from the actual looks (a round that
paired fewer samples than planned included), which Lan–DeMets allows; only the schedule is fixed in
advance (next_look_size). A larger --budget on the same run extends the design: each look carries the
N_max in force when it was taken, so old looks keep their boundaries and later ones spend
max(spent so far, alpha(n_k / N_max')), never more than alpha in all.

The boundaries are found with the numerical-integration recursion of Armitage, McPherson & Rowe (1969,
JRSS A 132:235) as Jennison & Turnbull (ch. 19) set it out: the sub-density of the score S_k = Z_k √n_k on
the continuation region is carried from look to look on a grid with Simpson's rule, and brentq finds each
c_k. Deterministic and accurate to about 1e-9, where Genz's Monte-Carlo multivariate-normal CDF would give
brentq a noisy function and take seconds per look. Results are cached: the gate asks at every look for
several streams and alpha levels.

Pocock-type rather than O'Brien–Fleming-type spending: kveval's point is to stop as soon as the evidence
decides (each round costs engine starts), and O'Brien–Fleming spends almost nothing before the budget is
nearly used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

GRID = 400          # Simpson intervals per look on the Z scale: ~0.025 apart, error ~1e-9
TAIL = 8.0          # the grid's reach in null standard deviations (mass beyond: ~1e-15)


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


def cumulative_spending(looks: Sequence[int], n_max: Sequence[int], alpha: float, final: bool) -> list[float]:
    """Alpha spent up to each look: alpha(n_k / N_k) with N_k the N_max in force at look k, never less than
    what earlier looks spent (a larger budget does not give back alpha already spent), all of it at a final
    look."""
    out: list[float] = []
    for n, cap in zip(looks, n_max):
        out.append(max(out[-1] if out else 0.0, spent(n / cap, alpha)))
    if final and out:
        out[-1] = alpha
    return out


def _simpson(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Simpson's nodes and weights on [lo, hi]."""
    x = np.linspace(lo, hi, 2 * (GRID // 2) + 1)
    w = np.ones_like(x)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (hi - lo) / (3 * (len(x) - 1))


@lru_cache(maxsize=4096)
def boundaries(looks: tuple[int, ...], spending: tuple[float, ...]) -> tuple[float, ...]:
    """Boundaries c_k on Z_k (inf: the look spends nothing) for strictly increasing `looks` and the
    cumulative alpha `spending` after each (Armitage–McPherson–Rowe recursion, Jennison & Turnbull ch. 19)."""
    out: list[float] = []
    # The sub-density of S_{k-1} on its continuation region (set at look 0, read from look 1 on).
    nodes = weights = dens = np.empty(0)
    before = 0.0
    for k, (n, total) in enumerate(zip(looks, spending)):
        share, before = max(0.0, total - before), total
        sd = math.sqrt(n)
        if k == 0:
            c = float(norm.isf(share)) if share > 1e-15 else math.inf
        else:
            step = math.sqrt(n - looks[k - 1])
            mass = weights * dens

            def crossing(z: float) -> float:
                return float(mass @ norm.sf((z * sd - nodes) / step))

            c = math.inf if share <= 1e-15 else brentq(lambda z: crossing(z) - share, -TAIL, TAIL + 2, xtol=1e-10)
        out.append(c)
        if k + 1 < len(looks):   # carry the density below the boundary to the next look
            new_nodes, new_weights = _simpson(-TAIL * sd, min(c, TAIL) * sd)
            if k == 0:
                new_dens = norm.pdf(new_nodes / sd) / sd
            else:
                kernel = norm.pdf((new_nodes[:, None] - nodes[None, :]) / step) / step
                new_dens = kernel @ (weights * dens)
            nodes, weights, dens = new_nodes, new_weights, new_dens
    return tuple(out)


@lru_cache(maxsize=4096)
def _nominal(looks: tuple[int, ...], n_max: tuple[int, ...], alpha: float, final: bool) -> tuple[float, ...]:
    spending = tuple(cumulative_spending(looks, n_max, alpha, final))
    levels = [float(norm.sf(c)) for c in boundaries(looks, spending)]
    levels[0] = spending[0]   # the first look is a plain test at what it spends (exactly alpha if final)
    return tuple(levels)


def nominal_levels(looks: Sequence[int], n_max: int | Sequence[int | None], alpha: float,
                   final: bool) -> list[float]:
    """The nominal one-sided level 1 − Φ(c_k) of every look (`looks` increasing; see look_alpha for n_max)."""
    caps = _caps(looks, n_max)
    return list(_nominal(tuple(int(n) for n in looks), tuple(caps), float(alpha), bool(final)))


def _caps(looks: Sequence[int], n_max: int | Sequence[int | None]) -> list[int]:
    """N_max per look: one for all, or per look (a missing one: the last one given)."""
    if isinstance(n_max, (int, np.integer)):
        return [int(n_max)] * len(looks)
    given = [int(x) for x in n_max if x]
    caps = [int(x) if x else (given[-1] if given else 0) for x in list(n_max)[:len(looks)]]
    return caps + [given[-1]] * (len(looks) - len(caps))


@dataclass(frozen=True)
class Look:
    """The last look of a cell: its number (1-based), information fraction and the nominal level it tests at."""

    number: int
    fraction: float
    alpha: float       # the nominal one-sided level 1 − Φ(c_k): what the bound and the test use
    final: bool
    sequential: bool   # False: one fixed-sample test at the full alpha (no design, or a single final look)


def look_alpha(looks: Sequence[int], n_max: int | Sequence[int | None] | None, alpha: float, final: bool) -> Look:
    """The nominal level of the last of `looks` (cumulative paired samples per look).

    n_max: the design's N_max, or one per look (the N_max in force when each look was taken: a larger
    --budget extends the design). No design (n_max None or 0) or no looks: the fixed-sample test at alpha.
    A final look spends all that is left, so a single final look is exactly the fixed-sample test."""
    raw = list(looks)
    kept = increasing_looks(raw)
    given = n_max if isinstance(n_max, (int, np.integer)) or n_max is None else [x for x in n_max if x]
    if n_max is None or not given or not kept:
        return Look(max(1, len(kept)), 1.0, alpha, True, False)
    if not isinstance(n_max, (int, np.integer)):
        # Keep each kept look's own N_max (the first occurrence of its n: a look that added nothing is no look).
        per = _caps(raw, n_max)
        firsts: dict[int, int] = {}
        for n, cap in zip(raw, per):
            firsts.setdefault(int(n), cap)
        n_max = [firsts[n] for n in kept]
    caps = _caps(kept, n_max)
    level = nominal_levels(kept, caps, alpha, final)[-1]
    return Look(len(kept), min(1.0, kept[-1] / caps[-1]), level, final, len(kept) > 1 or not final)


def look_caps(look_rounds: Sequence[int], n_max: int, n_max_rounds: Sequence[int] | None) -> list[int] | None:
    """The N_max in force at each look (one per round that made a look; `n_max_rounds[k]`: the N_max at
    the look after round k, files/task_rounds.n_max_rounds), or None where one N_max held throughout."""
    if not n_max_rounds:
        return None
    return [int(n_max_rounds[k]) if k < len(n_max_rounds) else int(n_max) for k in look_rounds]


def final_look_alpha(alpha: float) -> float:
    """The nominal level of the last look of a two-look design whose first look came at half its samples:
    the level a rerun with a larger budget would test at, for saying how many samples would decide."""
    return nominal_levels([1, 2], 2, alpha, final=True)[-1]


def samples_to_show_drop(n: int, b: int, c: int, alpha: float) -> int | None:
    """Paired samples at which McNemar's test would reach p < alpha if the discordance held (normal
    approximation: the statistic (b − c) / √(b + c) grows with √n). None without an observed drop."""
    if n <= 0 or b <= c:
        return None
    z = (b - c) / math.sqrt(b + c)
    need = n * (norm.ppf(1.0 - alpha / 2.0) / z) ** 2
    return max(n + 1, int(math.ceil(need)))


def next_look_size(looks: Sequence[int], n_max: int, min_step: int = 1) -> int:
    """Paired samples per cell the next look should have, on a schedule fixed in advance (never sized from
    the data: that would make the look times depend on the outcome): n_1, 2·n_1, 4·n_1, … with n_1 the
    first look, each planned step at least `min_step`, capped at n_max. A look that paired fewer than
    planned keeps its place in the schedule; the next planned size above the samples so far is taken."""
    kept = increasing_looks(looks)
    if not kept:
        return n_max
    n = kept[-1]
    planned = kept[0]
    for _ in kept:   # the planned size of look len(kept) + 1
        planned = max(2 * planned, planned + min_step)
    while planned <= n:
        planned = max(2 * planned, planned + min_step)
    return max(min(n_max, planned), min(n_max, n + 1))
