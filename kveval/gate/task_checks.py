"""Long-context task accuracy of a cell against its baseline, in three zones: PASS when the paired
recovery's lower bound clears the non-inferiority margin, FAIL when its upper bound is under the harm
bar (at the FAIL path's share of alpha), else undecided with how many samples would decide it."""
from __future__ import annotations

import math

from scipy.stats import binomtest, norm

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.noninferiority import (paired_recovery_bound, paired_recovery_upper_bound, samples_to_decide,
                                            score_statistic)
from kveval.analysis.sequential import Look, final_look_alpha, look_alpha
from kveval.files import schema
from kveval.gate.collector import _Collector, _g, _pct
from kveval.gate.thresholds import Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE, NOTE

# Tasks the baseline answers less often than this carry no evidence about the KV cache: once the auto
# cell's accuracy is shown under it (one-sided Clopper-Pearson bound at alpha; 0 of 29 samples at the
# defaults), the stream is left out as if tasks were off. Gemma-3-270M base answered 0 of 4 at 1024.
UNINFORMATIVE_ACCURACY = 0.10


def _tasks(out: _Collector, cell: str, result: schema.TaskCell | None, tasks_planned: bool, unmatched: str | None,
           error: str | None, pace: schema.Pace | None, t: Thresholds) -> None:
    """Non-inferiority of paired task recovery; see the rules in gate/evaluate.py's docstring."""
    if not tasks_planned:
        out.reason(NOTE, cell, f"{cell}: long-context task accuracy not measured (tasks turned off); a PASS rests on "
                               "divergence and degeneration alone", code="tasks_off")
        return
    if error:
        out.reason(INCONCLUSIVE, cell, f"{cell}: the long-context tasks phase failed ({' '.join(error.split())[:200]})",
                   "fix the cause and run the same command again (finished cells are kept)", code="task_phase_failed")
        return
    if result is None or not result.n:
        why = unmatched or f"no paired task sample (no started {BASELINE_KV} cell with task results at this length)"
        out.reason(INCONCLUSIVE, cell, f"{cell}: task accuracy not judged: {why}",
                   f"a started {BASELINE_KV} cell at the same max_model_len with task results", code="task_not_judged")
        return
    n, b, c = result.n, result.b, result.c
    base_acc, rec, p = result.baseline_accuracy, result.recovery, result.mcnemar_p
    detail = (f"accuracy {_pct(result.cell_accuracy)} vs {_pct(base_acc)} on {n} paired samples "
              f"({b} only {BASELINE_KV} right, {c} only this cell), McNemar p {_g(p)}")
    if rec is None or not base_acc:
        answered = round((base_acc or 0.0) * n)
        upper = binomtest(answered, n, alternative="less").proportion_ci(1 - t.alpha).high if n else 1.0
        if upper < UNINFORMATIVE_ACCURACY:
            out.check("task_recovery", cell, None, t.task_noninferiority_margin, None, detail)
            out.reason(NOTE, cell, f"{cell}: the long-context tasks carry no evidence here: the {BASELINE_KV} cell "
                                   f"answered none of the {n} paired samples (its accuracy under "
                                   f"{_pct(UNINFORMATIVE_ACCURACY)}, one-sided bound {_pct(upper)}); a PASS rests on "
                                   "divergence and degeneration alone", code="task_recovery_undefined")
            return
        # Open: more samples either show the baseline cannot answer these tasks or give a recovery.
        out.check("task_noninferiority", cell, None, t.task_noninferiority_margin, None, detail)
        out.reason(INCONCLUSIVE, cell, f"{cell}: task recovery undefined: the {BASELINE_KV} cell answered none of the "
                                       f"{n} paired samples (its accuracy is not yet shown under "
                                       f"{_pct(UNINFORMATIVE_ACCURACY)}: one-sided bound {_pct(upper)})",
                   "more task samples: rounds add them within --budget, until the baseline's accuracy is shown "
                   "too low to matter or a recovery can be judged; or tasks the model can answer at this length "
                   "(smaller --task-lengths); or --tasks none to judge on divergence and degeneration alone",
                   code="task_recovery_undefined")
        return
    # Rounds of task samples are judged at every round: each look tests at the nominal level its exact
    # group-sequential boundary gives (analysis/sequential.py), the PASS side at alpha and the FAIL side at
    # its share of alpha; no design, or one final look: the fixed-sample test.
    final = result.final is not False
    caps = result.n_max_looks or result.n_max   # per look where a larger --budget extended the design
    look = look_alpha(result.looks or [n], caps, t.alpha, final)
    fail_look = look_alpha(result.looks or [n], caps, t.fail_alpha, final)
    level, fail_level = look.alpha, fail_look.alpha
    # The bound of a recovery is never below 0; at a tiny alpha (an early look) the exact bound of b / n
    # nears 1 and the formula would go negative, which says nothing more than 0 does.
    bound = max(0.0, paired_recovery_bound(n, b, c, base_acc, level)) if level > 0 else 0.0
    upper = paired_recovery_upper_bound(n, b, c, base_acc, fail_level) if fail_level > 0 else math.inf
    p_drop = float(binomtest(b, b + c, 0.5, alternative="greater").pvalue) if b > c else 1.0
    detail += (f", recovery {_pct(rec)}, {_confidence(level)} lower bound {_pct(bound)}, "
               f"{_confidence(fail_level)} upper bound {_shown(upper)}")
    if look.sequential:
        detail += (f"; look {look.number} of a sequential design over at most {result.n_max} samples, "
                   f"nominal levels {_g(level)} (PASS) and {_g(fail_level)} (FAIL){' (the final look)' if look.final else ''}")
    # Harm: the upper bound under the harm bar, and McNemar's exact one-sided test agreeing (it keeps a few
    # samples from deciding where the asymptotic bound alone would: 3 of 3 against 0 is p 0.125).
    if upper < t.task_recovery_min and p_drop < fail_level:
        out.check("task_recovery", cell, rec, t.task_recovery_min, False, detail)
        out.reason(FAIL, cell, f"{cell}: task accuracy drop shown: recovery {_pct(rec)}, upper bound {_shown(upper)} < "
                               f"{_pct(t.task_recovery_min)} ({detail})", code="task_drop")
    elif bound >= t.task_noninferiority_margin:
        out.check("task_noninferiority", cell, bound, t.task_noninferiority_margin, True, detail)
    else:
        out.check("task_noninferiority", cell, bound, t.task_noninferiority_margin, None, detail)
        out.reason(INCONCLUSIVE, cell,
                   f"{cell}: task accuracy neither shown non-inferior nor shown to drop: recovery {_pct(rec)}, lower "
                   f"bound {_pct(bound)} < margin {_pct(t.task_noninferiority_margin)}, upper bound {_shown(upper)} ≥ "
                   f"harm bar {_pct(t.task_recovery_min)} ({n} paired samples)",
                   _more_samples_hint(n, b, c, base_acc, rec, look, result.n_max, pace, t),
                   code="task_undecided")


def _samples_to_show_harm(n: int, b: int, c: int, base_acc: float, t: Thresholds) -> int | None:
    """Paired samples at which the recovery's upper bound would fall under the harm bar, at the FAIL level
    of a design's last look, if the observed shares held: Tang's statistic at the bar grows with √n."""
    n11 = round(base_acc * n) - b
    statistic = score_statistic(t.task_recovery_min, n11, c, b, n)
    if not statistic < 0 or math.isinf(statistic):
        return None
    z = float(norm.ppf(1 - final_look_alpha(t.fail_alpha)))
    return max(n + 1, math.ceil(n * (z / statistic) ** 2))


def _shown(value: float) -> str:
    return "none" if math.isinf(value) else _pct(value)


def _confidence(level: float) -> str:
    """95 % for alpha 0.05; more digits where an early look spends little (99.97 %)."""
    share = 100 * (1 - level)
    return f"{share:g} %" if share == round(share, 2) else f"{share:.4g} %"


def _more_samples_hint(n: int, b: int, c: int, base_acc: float, rec: float, look: Look, n_max: int | None,
                       pace: schema.Pace | None, t: Thresholds) -> str:
    """What would decide an undecided task comparison, never contradicting itself: a sample count when
    more samples could show non-inferiority (or a significant drop), else that the observed recovery
    at or under the margin is the finding."""
    sequential = bool(n_max)
    # A new run with a budget spends its last look at about this (its previous look at half its samples).
    level = final_look_alpha(t.alpha) if sequential else t.alpha
    need = samples_to_decide(n, b, c, base_acc, t.task_noninferiority_margin, level)
    if need is None:
        hint = (f"the observed recovery {_pct(rec)} is not 2 points above the margin "
                f"{_pct(t.task_noninferiority_margin)}: if it holds, more samples would not show it non-inferior, "
                "and that is the finding")
        drop = _samples_to_show_harm(n, b, c, base_acc, t) if rec < t.task_recovery_min else None
        if drop:
            hint += f"; about {drop:,} paired samples per cell would show whether it is under the harm bar {_pct(t.task_recovery_min)}"
            hint += f" (--budget {drop})" if sequential else ""
        return hint
    if sequential and not look.final:
        return f"more rounds of task samples: about {need:,} paired samples per cell (now {n}) within --budget {n_max}"
    hint = f"about {need:,} paired samples per cell (now {n})"
    if sequential:
        hint += f"; this run's rounds stopped short of them: --budget {need} gives a run that many"
    per_point = pace.samples_per_unit if pace else None
    if per_point and not sequential:
        k = max(1, math.ceil(need / per_point))
        hint += f": --task-samples {k} ({per_point} samples per step)"
    seconds = pace.seconds_per_sample if pace else None
    if pace and seconds:
        minutes = need * seconds * max(1, pace.cells) / 60
        hint += f", roughly {minutes:.0f} min of task time at this run's pace"
    return hint
