"""Degeneration of a cell's outputs against the baseline's for the same prompts (paired, McNemar
and Tango bounds), and what would decide an open comparison."""
from __future__ import annotations

from scipy.stats import binomtest

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.paired_difference import excess_lower_bound, excess_upper_bound
from kveval.analysis.sequential import Look, look_alpha
from kveval.files import schema
from kveval.gate.collector import _Collector, _g, _pct
from kveval.gate.thresholds import Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE, NOTE


def _degeneration(out: _Collector, cell: str, entry: schema.DegenerationCell | None, t: Thresholds) -> None:
    """Degeneration as paired evidence, in three zones: per prompt, does the cell's output degenerate, and
    the baseline's? The excess is (cell-only − baseline-only) / judged outputs, bounded both ways by
    Tango's score interval for the difference of paired proportions (analysis/paired_difference.py).

    - PASS: the one-sided upper bound of the excess (level alpha) under `degeneration_noninferiority_margin`
      (0 vs 0 of 109: 2.4 % < 5 %).
    - FAIL: the lower bound (at the FAIL path's level) above `max_new_degenerate_share`, and McNemar's exact
      one-sided test on the discordant prompts at that level.
    - Otherwise undecided, with the counts; rounds add probes."""
    if entry is None or not entry.outputs:
        return
    judged, new = entry.judged_outputs, entry.new_degenerate
    judged = entry.outputs if judged is None else judged
    if not judged:
        out.reason(NOTE, cell, f"{cell}: degeneration not judged: no {BASELINE_KV} output for the same prompts",
                   code="degeneration_not_judged")
        return
    base_only = entry.baseline_only_degenerate or 0  # None in evidence from before the paired test
    excess = (new - base_only) / judged
    p = float(binomtest(new, new + base_only, 0.5, alternative="greater").pvalue) if new else 1.0
    detail = (f"{new} of {judged} outputs degenerate only here, {base_only} only in {BASELINE_KV}; excess "
              f"{_pct(excess)}, McNemar exact p {_g(p)}")
    # Rounds of new probes are judged at every round, like task samples: each look tests at the nominal
    # level of its exact boundary (analysis/sequential.py), the PASS side at alpha, the FAIL side at its
    # share; without rounds, the fixed-sample test.
    final = entry.final is not False
    caps = entry.n_max_looks or entry.n_max   # per look where a larger --budget extended the design
    look = look_alpha(entry.looks or [judged], caps, t.alpha, final)
    fail_look = look_alpha(entry.looks or [judged], caps, t.fail_alpha, final)
    level, fail_level = look.alpha, fail_look.alpha
    lower = excess_lower_bound(judged, new, base_only, fail_level) if fail_level > 0 else -1.0
    upper = excess_upper_bound(judged, new, base_only, level) if level > 0 else 1.0
    detail += (f", one-sided bounds (Tango score): excess ≤ {_pct(upper)} ({_confidence(level)}), excess ≥ "
               f"{_pct(lower)} ({_confidence(fail_level)})")
    if look.sequential:
        detail += (f"; look {look.number} of a sequential design over at most {entry.n_max} outputs, nominal levels "
                   f"{_g(level)} (PASS) and {_g(fail_level)} (FAIL){' (the final look)' if look.final else ''}")
    # Both: the exact test keeps a few outputs (3 of 3: p 0.125) from deciding, where the asymptotic
    # bound alone would.
    if p < fail_level and lower > t.max_new_degenerate_share:
        out.check("new_degenerate_share", cell, excess, t.max_new_degenerate_share, False, detail)
        out.reason(FAIL, cell, f"{cell}: {new} of {judged} outputs degenerate where the {BASELINE_KV} output for the "
                               f"same prompt does not, {base_only} the other way ({detail}: lower bound > harm bar "
                               f"{_pct(t.max_new_degenerate_share)})", code="degeneration_excess")
        return
    if upper < t.degeneration_noninferiority_margin:
        out.check("degeneration_noninferiority", cell, upper, t.degeneration_noninferiority_margin, True,
                  f"{detail}; the excess is shown under {_pct(t.degeneration_noninferiority_margin)}")
        return
    out.check("degeneration_noninferiority", cell, upper, t.degeneration_noninferiority_margin, None, detail)
    out.reason(INCONCLUSIVE, cell, f"{cell}: {new} of {judged} outputs degenerate where the {BASELINE_KV} output "
                                   f"does not, {base_only} the other way: the excess is neither shown under "
                                   f"{_pct(t.degeneration_noninferiority_margin)} nor above "
                                   f"{_pct(t.max_new_degenerate_share)} ({detail})",
               _more_probes_hint(entry, look), code="degeneration_undecided")


def _confidence(level: float) -> str:
    share = 100 * (1 - level)
    return f"{share:g} %" if share == round(share, 2) else f"{share:.4g} %"


def _more_probes_hint(entry: schema.DegenerationCell, look: Look) -> str:
    """What would decide an open degeneration comparison, in the run's own terms."""
    n_max = entry.n_max
    if n_max and not look.final:
        return (f"more probe outputs: rounds of new probes continue up to {n_max} per cell within --budget "
                "(a larger --budget allows more)")
    if n_max:
        return ("more probe outputs than were judged here: a --prompts FILE of short questions (each is generated in "
                "every cell and scanned with the probes), or a larger --budget while kveval's own probes last")
    return ("more generation prompts show whether the excess is real: rounds of new probes (--budget), or a "
            "--prompts FILE of short questions (every prompt is generated in every cell and scanned with the probes)")
