"""Attribution: plain FP8 whose drift the diagnosed layers explain FAILs, naming those layers."""
from __future__ import annotations

import math

from kveval.files import schema
from kveval.gate.collector import _Collector, _g, _pct
from kveval.gate.defects import _layers
from kveval.gate.thresholds import Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE

# The divergence checks (gate/divergence_checks.py) whose state the rule reads: passed True (inside
# the healthy budget), False (beyond the harm limit: a FAIL of its own), None (neither shown).
DIVERGENCE_CHECKS = ("kl_mean", "kl_late_mean", "top1_agreement")


def _state(out: _Collector, cell: str) -> str | None:
    """"healthy" (every divergence check passed), "harm" (one failed), "drift" (none failed, some not
    shown healthy), or None (no divergence checks with a figure)."""
    checks = [c for c in out.checks if c.cell == cell and c.name in DIVERGENCE_CHECKS and c.value is not None]
    if not checks:
        return None
    if any(c.passed is False for c in checks):
        return "harm"
    return "healthy" if all(c.passed is True for c in checks) else "drift"


def sequences_needed(level: float) -> int:
    """The fewest sequences whose sign-flip test can reach p < level (2^-G < level)."""
    return math.floor(math.log2(1 / level)) + 1


def _attribute(out: _Collector, evidence: schema.Evidence, defective: set[str], t: Thresholds) -> dict[str, list[str]]:
    """Plain FP8 whose drift the diagnosed layers explain FAILs (`attribution_min_reduction`).

    False alarms: the FAIL needs (1) plain FP8 outside the platform's healthy budget (its divergence
    checks neither all passed nor any failed), which healthy runs sit well inside; (2) a remedy cell
    whose divergence checks all passed, and that is sound; (3) most of the KL mean removed, and (4) the
    one-sided sign-flip test by sequence (analysis/attribution.py) at `t.fail_alpha`, this path's share
    of alpha. Under the null hypothesis that the kept layers do not matter, (4) alone errs with
    probability at most fail_alpha, whatever the dependence of positions within a document, and (1)
    must hold as well. A FAIL here says plain FP8 is worse than a configuration that fixes it, and the
    review names that configuration. With too few sequences for the test to reach the level at all,
    the reason says so and what would decide it.
    """
    attributed: dict[str, list[str]] = {}
    level = t.fail_alpha
    for pair in evidence.attribution or []:
        plain, remedy = pair.plain, pair.remedy
        if remedy in defective or FAIL in out.levels(plain):
            continue
        if _state(out, plain) != "drift" or _state(out, remedy) != "healthy":
            continue
        # Evidence from before the test by sequence (no n_sequences) carries the block test's p: not used.
        reduction, p, n = pair.reduction, pair.p_plain_worse, pair.n_sequences
        if reduction is None or p is None or n is None or reduction < t.attribution_min_reduction:
            continue
        test = f"one-sided sign-flip test over {n} scored sequence{'s' if n != 1 else ''}"
        cut = (f"keeping {_layers(pair.kept)} in the model dtype ({remedy}) cuts the KL mean from "
               f"{_g(pair.plain_kl_mean)} to {_g(pair.remedy_kl_mean)} ({_pct(reduction)} of it) on the same "
               f"{pair.n_positions:,} positions")
        if pair.min_p is not None and pair.min_p >= level:
            out.check("remedy_attribution", plain, p, level, None,
                      f"{remedy}: {test}, p {_g(p)}; smallest attainable p {_g(pair.min_p)} ≥ {level:g}")
            out.reason(INCONCLUSIVE, plain,
                       f"{plain}: {cut}, but the {test} cannot show it at level {level:g}: with {n} sequences its "
                       f"smallest attainable p is {_g(pair.min_p)} (2^-{n}), so no outcome could be significant",
                       f"score more documents: at least {sequences_needed(level)} scored sequences can reach p < "
                       f"{level:g} (--suite standard scores more documents)", code="divergence_undecided")
            continue
        if p >= level:
            continue
        attributed[plain] = list(pair.kept)
        out.check("remedy_attribution", plain, reduction, t.attribution_min_reduction, False,
                  f"{remedy}: KL mean {_g(pair.remedy_kl_mean)} vs {_g(pair.plain_kl_mean)}, {test}, p {_g(p)}")
        out.reason(FAIL, plain, f"{plain}: its divergence is caused by {_layers(pair.kept)}: {cut} ({test}, "
                                f"p {_g(p)} < {level:g}), and the remedy is inside every healthy budget",
                   code="harm_attributed")
    return attributed
