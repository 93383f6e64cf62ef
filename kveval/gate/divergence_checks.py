"""Teacher-forced divergence of a cell against its baseline, judged against the platform's healthy
budget and harm limits (widened by the baseline's noise floor), and the state it leaves a cell in."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.cluster_interval import ClusterMean, cluster_mean
from kveval.analysis.sequential import look_alpha
from kveval.files import schema
from kveval.gate.collector import _Collector, _g, _pct
from kveval.gate.thresholds import Budget, Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE, NOTE


def _widen(limit: float, multiplier: float, floor: float | None) -> float:
    return limit if floor is None else max(limit, multiplier * floor)


def look_levels(comp: schema.Comparison, t: Thresholds) -> tuple[float, float]:
    """(PASS level, FAIL level) of the comparison's last look. Scoring rounds (run/rounds.py) make the
    divergence test group-sequential in scored documents: each look tests at the nominal level of the
    exact Lan–DeMets boundary for its information fraction (analysis/sequential.py), so repeated looks
    keep each error at its alpha. Without a design (no rounds: --budget 0, evidence from before): the
    fixed-sample levels."""
    design = comp.design
    if design is None:
        return t.divergence_pass_alpha, t.fail_alpha
    figure = (comp.clustered or {}).get("kl_mean")
    looks = comp.looks or ([figure.clusters] if figure else [])
    return (look_alpha(looks, design.n_max, t.divergence_pass_alpha, design.final).alpha,
            look_alpha(looks, design.n_max, t.fail_alpha, design.final).alpha)


def _look_note(comp: schema.Comparison) -> str:
    """Where the comparison stands in its design: the looks taken (sequences compared at each)."""
    if comp.design is None:
        return ""
    looks = comp.looks or []
    taken = f"looks at {', '.join(str(n) for n in looks)} sequences" if len(looks) > 1 else "first look"
    return (f" ({taken} of a sequential design over at most {comp.design.n_max} scored sequences"
            f"{', the final look' if comp.design.final else ''})")


def _divergence_decide(comp: schema.Comparison, between: list[str]) -> str:
    """What would settle an undecided divergence: more documents while the design has room and a figure
    could still fall either way; otherwise what else can (tasks, the per-layer diagnosis)."""
    answers = "task accuracy shows whether the drift costs answers (--tasks)"
    if between:
        return (f"the drift is shown between the healthy budget and the harm limit, so more documents would only "
                f"confirm it: {answers}; the per-layer K/V range diagnosis and its remedy show whether a few "
                "layers cause it")
    if comp.design is not None and comp.design.final:
        return (f"the divergence design's {comp.design.n_max} scored sequences are spent: {answers}; "
                "--suite full scores more documents in the first look")
    return ("more scored documents narrow the interval (--suite standard scores more; rounds add them within "
            "--budget); task accuracy shows whether the drift costs answers")


def _bounds(figure: schema.ClusterFigure | None, floor: float, levels: tuple[float, float]) -> tuple[float, float] | None:
    """(upper bound at the PASS level, lower bound at one FAIL path's level) of a figure's excess over the
    noise floor, or None without an interval (fewer than 2 sequences). A KL is never negative, so
    neither bound is reported below 0."""
    if figure is None or figure.se is None:
        return None
    estimate = ClusterMean(float(figure.estimate) - floor, float(figure.se), figure.clusters, figure.positions)
    upper, lower = estimate.upper(levels[0]), estimate.lower(levels[1])
    if upper is None or lower is None:
        return None
    return max(0.0, upper), max(0.0, lower)


def _agreement_bound(figure: schema.ClusterFigure | None, level: float) -> float | None:
    if figure is None or figure.se is None:
        return None
    lower = ClusterMean(float(figure.estimate), float(figure.se), figure.clusters, figure.positions).lower(level)
    return None if lower is None else min(1.0, max(0.0, lower))


class _SequenceFigures(BaseModel):
    """Of one row of a comparison's per_sequence (analysis/divergence.py), the figures the gate rebuilds from."""

    model_config = ConfigDict(extra="ignore")

    n: int = 0                                # scored positions
    kl_mean: Optional[float] = None
    top1_n: int = 0
    top1_agreement: Optional[float] = None


def _from_per_sequence(comp: schema.Comparison) -> dict[str, schema.ClusterFigure]:
    """Evidence written before the per-sequence figures existed (2026-12-05) still lists each sequence's
    positions, KL mean and top-1 agreement: the overall figures are rebuilt from them. The late half's are
    not (no per-sequence late figures were stored), so such evidence has no late interval."""
    rows = [row for row in map(_SequenceFigures.model_validate, comp.per_sequence) if row.n]
    out = {}
    kl = cluster_mean([row.n * row.kl_mean for row in rows if row.kl_mean is not None],
                      [row.n for row in rows if row.kl_mean is not None])
    top1 = cluster_mean([row.top1_n * row.top1_agreement for row in rows if row.top1_agreement is not None],
                        [row.top1_n for row in rows if row.top1_agreement is not None])
    for name, figure in (("kl_mean", kl), ("top1_agreement", top1)):
        if figure is not None:
            out[name] = schema.ClusterFigure(estimate=figure.estimate, se=figure.se, clusters=figure.clusters,
                                             positions=figure.positions)
    return out


def _divergence(out: _Collector, cell: str, comp: schema.Comparison | None, why_missing: str,
                floor: schema.NoiseFloor | None, budget: Budget, t: Thresholds) -> None:
    """Divergence as a test on scored sequences (analysis/cluster_interval.py): healthy when the upper
    bound of the KL excess over the noise floor (all positions, and the late half) is under its budget and
    the lower bound of top-1 agreement is at or above its minimum; FAIL when the lower bound of a KL excess
    is over its harm limit (each at `fail_alpha`: two of the gate's FAIL paths); else undecided."""
    if comp is None:
        out.reason(INCONCLUSIVE, cell, f"{cell}: no teacher-forced divergence ({why_missing})",
                   "run the scoring phase (it is in the default --phases) with a started baseline at this length",
                   code="divergence_missing")
        return
    s, late = comp.summary, comp.late
    late_start = late.start if late else "?"
    floor_kl = float(floor.kl_mean) if floor and floor.kl_mean is not None else 0.0
    reference = comp.reference
    other_length = comp.same_length is False   # None: not a kv comparison, or from before the field
    if other_length:
        own = f"{BASELINE_KV}-{comp.max_model_len}" if comp.max_model_len else f"the {BASELINE_KV} cell"
        out.reason(NOTE, cell, f"{cell}: its own-length baseline {own} did not start; divergence is measured "
                               f"against {reference} on the sequences both scored", code="baseline_other_length")
    mult = t.noise_multiplier
    clustered = comp.clustered if comp.clustered is not None else _from_per_sequence(comp)
    levels = look_levels(comp, t)
    harmed, undecided, between = [], [], []
    for name, label, value, ok, bad, n in (
            ("kl_mean", "KL mean", s.kl_mean, _widen(budget.kl_mean_max, mult, floor_kl or None),
             _widen(budget.kl_mean_fail, mult, floor_kl or None), s.n),
            ("kl_late_mean", f"KL mean at positions ≥ {late_start}", late.kl_mean if late else None,
             _widen(budget.kl_late_max, mult, floor_kl or None), _widen(budget.kl_late_fail, mult, floor_kl or None),
             late.n if late else 0)):
        figure = clustered.get(name)
        if value is None or not n:
            out.check(name, cell, None, ok, None, "no positions")
            continue
        bounds = _bounds(figure, floor_kl, levels)
        documents = figure.clusters if figure else None
        excess = max(0.0, float(value) - floor_kl)
        if bounds is None:
            out.check(name, cell, excess, ok, None, f"healthy budget {_g(ok)}, harm limit {_g(bad)}, n {n}, "
                                                    f"{documents or 'no'} sequence{'s' if documents != 1 else ''}: no interval")
            undecided.append(f"{label} {_g(excess)} rests on {documents or 'no'} scored sequence"
                             f"{'s' if documents != 1 else ''}: no interval" if documents or comp.clustered is not None
                             else f"{label} {_g(excess)}: no per-sequence figures in this evidence (written before "
                                  "2026-12-05), so no interval")
            continue
        upper, lower = bounds
        detail = (f"excess over the noise floor {_g(excess)} on {documents} sequences ({n} positions), "
                  f"{_confidence(levels[0])} upper bound {_g(upper)} vs healthy budget {_g(ok)}, "
                  f"{_confidence(levels[1])} lower bound {_g(lower)} vs harm limit {_g(bad)}{_look_note(comp)}")
        if lower > bad and n >= min(t.min_scored_tokens, t.min_late_tokens):
            out.check(name, cell, excess, bad, False, detail)
            harmed.append(f"{label} {_g(excess)}, lower bound {_g(lower)} > harm limit {_g(bad)} "
                          f"({documents} sequences)")
        elif upper <= ok:
            out.check(name, cell, excess, ok, True, detail)
        else:
            out.check(name, cell, excess, ok, None, detail)
            if lower > ok and upper <= bad:   # shown between the limits: more documents only confirm it
                between.append(name)
                undecided.append(f"{label} {_g(excess)} is shown between the healthy budget {_g(ok)} and the harm "
                                 f"limit {_g(bad)} (lower bound {_g(lower)}, upper bound {_g(upper)}; "
                                 f"{documents} sequences){_look_note(comp)}")
            elif lower > ok:
                undecided.append(f"{label} {_g(excess)} is shown over the healthy budget {_g(ok)} (lower bound "
                                 f"{_g(lower)}) but is not shown beyond the harm limit {_g(bad)} (upper bound "
                                 f"{_g(upper)}; {documents} sequences){_look_note(comp)}")
            else:
                undecided.append(f"{label} {_g(excess)} is not shown inside the healthy budget {_g(ok)} (upper bound "
                                 f"{_g(upper)}) nor beyond the harm limit {_g(bad)} (lower bound {_g(lower)}; "
                                 f"{documents} sequences){_look_note(comp)}")
    disagreement = floor.top1_disagreement if floor else None
    top1_ok = budget.top1_agreement_min if disagreement is None else min(budget.top1_agreement_min, 1 - mult * disagreement)
    agreement = s.top1_agreement
    if agreement is None or not s.top1_n:
        out.check("top1_agreement", cell, None, top1_ok, None, "no positions")
    else:
        bound = _agreement_bound(clustered.get("top1_agreement"), levels[0])
        figure = clustered.get("top1_agreement")
        documents = figure.clusters if figure else 0
        healthy = bound is not None and bound >= top1_ok
        out.check("top1_agreement", cell, agreement, top1_ok, True if healthy else None,
                  f"{_confidence(levels[0])} one-sided bound {_pct(bound) if bound is not None else 'none'} vs minimum "
                  f"{_pct(top1_ok)}, n {s.top1_n}, {documents} sequences")
        if not healthy:
            undecided.append(f"top-1 agreement {_pct(agreement)} is not shown at or above {_pct(top1_ok)} (one-sided bound "
                             f"{_pct(bound) if bound is not None else 'none'}; {documents} sequences)")
    if harmed:
        out.reason(FAIL, cell, f"{cell}: divergence vs {reference} shown beyond the harm limit: {'; '.join(harmed)}",
                   code="divergence_harm")
    elif undecided:
        out.reason(INCONCLUSIVE, cell, f"{cell}: {'; '.join(undecided)}", _divergence_decide(comp, between),
                   code="divergence_undecided")
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
                   "score documents that reach the late half: --suite standard (documents at 55-90 % of max_model_len)"
                   + ("" if not other_length else f", with the {BASELINE_KV} cell started at this length "
                                                                 "(raise --kv-cache-memory)"),
                   code="divergence_too_few_late_positions")


def _confidence(level: float) -> str:
    """95 % for alpha 0.05, 99 % for 0.01."""
    share = 100 * (1 - level)
    return f"{share:g} %" if share == round(share, 2) else f"{share:.4g} %"


_DIVERGENCE_CHECKS = ("kl_mean", "kl_late_mean", "top1_agreement")


def _divergence_state(out: _Collector, cell: str) -> str | None:
    """"healthy" (every divergence figure inside its budget), "drift" (some figure outside the healthy
    budget, none beyond the harm limit), "harm", or None (no divergence figures)."""
    checks = [c for c in out.checks if c.cell == cell and c.name in _DIVERGENCE_CHECKS and c.value is not None]
    if not checks:
        return None
    if any(c.passed is False for c in checks):
        return "harm"
    return "healthy" if all(c.passed for c in checks) else "drift"
