"""Teacher-forced divergence of a cell against its baseline, judged against the platform's healthy
budget and harm limits (widened by the baseline's noise floor), and the state it leaves a cell in."""
from __future__ import annotations

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.gate.collector import _Collector, _g, _pct
from kveval.gate.thresholds import Budget, Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE, NOTE


def _widen(limit: float, multiplier: float, floor: float | None) -> float:
    return limit if floor is None else max(limit, multiplier * floor)


def _divergence(out: _Collector, cell: str, comp: schema.Comparison | None, why_missing: str,
                floor: schema.NoiseFloor | None, budget: Budget, t: Thresholds) -> None:
    """Healthy inside every budget -> positive evidence; beyond a harm limit -> FAIL; else undecided."""
    if comp is None:
        out.reason(INCONCLUSIVE, cell, f"{cell}: no teacher-forced divergence ({why_missing})",
                   "run the scoring phase (it is in the default --phases) with a started baseline at this length",
                   code="divergence_missing")
        return
    s, late = comp.summary, comp.late
    late_start = late.start if late else "?"
    floor_kl_mean, floor_kl_p99 = (floor.kl_mean, floor.kl_p99) if floor else (None, None)
    reference = comp.reference
    other_length = comp.same_length is False   # None: not a kv comparison, or from before the field
    if other_length:
        own = f"{BASELINE_KV}-{comp.max_model_len}" if comp.max_model_len else f"the {BASELINE_KV} cell"
        out.reason(NOTE, cell, f"{cell}: its own-length baseline {own} did not start; divergence is measured "
                               f"against {reference} on the sequences both scored", code="baseline_other_length")
    mult = t.noise_multiplier
    figures = [  # name, label, value, healthy limit, harm limit, higher is worse
        ("kl_mean", "KL mean", s.kl_mean, _widen(budget.kl_mean_max, mult, floor_kl_mean),
         _widen(budget.kl_mean_fail, mult, floor_kl_mean), True, s.n),
        ("kl_p99", "KL p99", s.kl_p99, _widen(budget.kl_p99_max, mult, floor_kl_p99),
         _widen(budget.kl_p99_fail, mult, floor_kl_p99), True, s.n),
        ("kl_late_mean", f"KL mean at positions ≥ {late_start}", late.kl_mean if late else None,
         _widen(budget.kl_late_max, mult, floor_kl_mean), _widen(budget.kl_late_fail, mult, floor_kl_mean),
         True, late.n if late else 0),
    ]
    disagreement = floor.top1_disagreement if floor else None
    top1_ok = budget.top1_agreement_min if disagreement is None else min(budget.top1_agreement_min, 1 - mult * disagreement)
    top1_bad = budget.top1_agreement_fail if disagreement is None else min(budget.top1_agreement_fail, 1 - 2 * mult * disagreement)
    figures.append(("top1_agreement", "top-1 agreement", s.top1_agreement, top1_ok, top1_bad, False, s.top1_n))
    harmed, undecided = [], []
    for name, label, value, ok, bad, higher_worse, n in figures:
        if value is None or not n:
            out.check(name, cell, None, ok, None, "no positions")
            continue
        healthy = value <= ok if higher_worse else value >= ok
        harm = value > bad if higher_worse else value < bad
        shown = _pct if name == "top1_agreement" else _g
        if harm and n >= min(t.min_scored_tokens, t.min_late_tokens):
            out.check(name, cell, value, bad, False, f"harm limit {shown(bad)}, healthy {shown(ok)}, n {n}")
            harmed.append(f"{label} {shown(value)} {'>' if higher_worse else '<'} harm limit {shown(bad)}")
        else:
            out.check(name, cell, value, ok, True if healthy else None, f"healthy budget {shown(ok)}, harm limit {shown(bad)}, n {n}")
            if not healthy:
                undecided.append(f"{label} {shown(value)} is outside the healthy budget {shown(ok)} but within the "
                                 f"harm limit {shown(bad)}")
    if harmed:
        out.reason(FAIL, cell, f"{cell}: divergence vs {reference} far outside the healthy range: {'; '.join(harmed)}",
                   code="divergence_harm")
    elif undecided:
        out.reason(INCONCLUSIVE, cell, f"{cell}: {'; '.join(undecided)}",
                   "task accuracy decides it: more paired samples (--full, or --task-samples N) show whether the "
                   "drift costs answers", code="divergence_undecided")
    n, n_late = s.n, late.n if late else 0
    if n < t.min_scored_tokens:
        out.reason(INCONCLUSIVE, cell, f"{cell}: only {n} scored positions vs {reference} (PASS needs "
                                       f"{t.min_scored_tokens})", "score longer documents: --suite standard",
                   code="divergence_too_few_positions")
    elif n_late < t.min_late_tokens:
        reach = comp.max_position
        out.reason(INCONCLUSIVE, cell,
                   f"{cell}: only {n_late} scored positions at or beyond position {late_start} (the late half "
                   f"of its context; scoring reached position {reach if reach is not None else '?'}); PASS needs "
                   f"{t.min_late_tokens} there, so damage that grows with position could go unseen",
                   "score documents that reach the late half: --suite standard (documents at 90 % of max_model_len)"
                   + ("" if not other_length else f", with the {BASELINE_KV} cell started at this length "
                                                                 "(raise --kv-cache-memory)"),
                   code="divergence_too_few_late_positions")


_DIVERGENCE_CHECKS = ("kl_mean", "kl_p99", "kl_late_mean", "top1_agreement")


def _divergence_state(out: _Collector, cell: str) -> str | None:
    """"healthy" (every divergence figure inside its budget), "drift" (some figure outside the healthy
    budget, none beyond the harm limit), "harm", or None (no divergence figures)."""
    checks = [c for c in out.checks if c.cell == cell and c.name in _DIVERGENCE_CHECKS and c.value is not None]
    if not checks:
        return None
    if any(c.passed is False for c in checks):
        return "harm"
    return "healthy" if all(c.passed for c in checks) else "drift"
