"""Attribution: plain FP8 whose drift the diagnosed layers explain FAILs, naming those layers."""
from __future__ import annotations

from kveval.files import schema
from kveval.gate.collector import _Collector, _g, _pct
from kveval.gate.defects import _layers
from kveval.gate.divergence_checks import _divergence_state
from kveval.gate.thresholds import Thresholds
from kveval.gate.verdict import FAIL


def _attribute(out: _Collector, evidence: schema.Evidence, defective: set[str], t: Thresholds) -> dict[str, list[str]]:
    """Plain FP8 whose drift the diagnosed layers explain FAILs (`attribution_min_reduction`).

    False alarms: the FAIL needs (1) plain FP8 outside the platform's healthy budget, which healthy
    runs sit well inside; (2) a remedy cell that is itself inside every healthy budget and sound; (3)
    most of the KL mean removed, and (4) the one-sided paired block test at level alpha. Under the
    null hypothesis that the kept layers do not matter, (4) alone errs with probability at most
    alpha, and (1) must hold as well. A FAIL here says plain FP8 is worse than a configuration
    that fixes it, and the review names that configuration.
    """
    attributed: dict[str, list[str]] = {}
    for pair in evidence.attribution or []:
        plain, remedy = pair.plain, pair.remedy
        if remedy in defective or FAIL in out.levels(plain):
            continue
        if _divergence_state(out, plain) != "drift" or _divergence_state(out, remedy) != "healthy":
            continue
        reduction, p = pair.reduction, pair.p_plain_worse
        if reduction is None or p is None or reduction < t.attribution_min_reduction or p >= t.alpha:
            continue
        attributed[plain] = list(pair.kept)
        out.check("remedy_attribution", plain, reduction, t.attribution_min_reduction, False,
                  f"{remedy}: KL mean {_g(pair.remedy_kl_mean)} vs {_g(pair.plain_kl_mean)}, "
                  f"{pair.n_blocks} blocks of positions, one-sided Wilcoxon signed-rank p {_g(p)}")
        out.reason(FAIL, plain, f"{plain}: its divergence is caused by {_layers(pair.kept)}: keeping them in the "
                                f"model dtype ({remedy}) cuts the KL mean from {_g(pair.plain_kl_mean)} to "
                                f"{_g(pair.remedy_kl_mean)} ({_pct(reduction)} of it) on the same "
                                f"{pair.n_positions:,} positions (one-sided Wilcoxon signed-rank test on "
                                f"{pair.n_blocks} blocks of positions, p {_g(p)} < {t.alpha:g}), and the remedy "
                                "is inside every healthy budget", code="harm_attributed")
    return attributed
