"""Tests for kveval.gate: thresholds loading and the PASS / FAIL / INCONCLUSIVE verdict."""
from __future__ import annotations

import json

import pytest

from kveval.gate import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    EXIT_USAGE,
    GateConfigError,
    Thresholds,
    evaluate,
    exit_code,
    load_thresholds,
)

# FACTS.md measurements (fp8 vs auto, SmolLM2-135M, teacher-forced, 1,499-token document).
HEALTHY_H200 = {"kl_mean": 0.0034, "kl_p99": 0.037, "top1_agreement": 0.969}
HEALTHY_CPU = {"kl_mean": 0.0078, "kl_p99": 0.124, "top1_agreement": 0.963}
HARMED_H200 = {"kl_mean": 0.41, "kl_p99": 4.3, "top1_agreement": 0.80}


def summary(n=1499, **figures):
    return {"n": n, "top1_n": n, "top1_agreement_se": 0.005, **figures}


def evidence(figures=None, *, n=1499, floor=None, cells=None, comparisons=None, **extra):
    """One auto + one fp8 cell at 8192 with the given fp8-vs-auto figures."""
    cells = cells if cells is not None else {
        "auto-8192": {"kv_cache_dtype": "auto", "max_model_len": 8192, "started": True},
        "fp8-8192": {"kv_cache_dtype": "fp8", "max_model_len": 8192, "started": True},
    }
    if comparisons is None:
        comparisons = [{"kind": "kv", "cell": "fp8-8192", "reference": "auto-8192", "same_length": True,
                        "summary": summary(n, **figures)}]
    return {"cells": cells, "divergence": {"comparisons": comparisons, "unmatched": [], "noise_floor": floor}, **extra}


def check(verdict, name, cell="fp8-8192"):
    (found,) = [c for c in verdict.checks if c.name == name and c.cell == cell]
    return found


# --- defaults against the measured figures ------------------------------------------------------

@pytest.mark.parametrize("figures", [HEALTHY_H200, HEALTHY_CPU], ids=["h200", "cpu"])
def test_healthy_models_pass_on_both_platforms(figures):
    verdict = evaluate(evidence(figures), Thresholds())
    assert verdict.status == "PASS"
    assert exit_code(verdict) == EXIT_PASS
    assert [r.level for r in verdict.reasons] == []
    assert check(verdict, "kl_p99").limit == 0.5
    assert all(c.passed for c in verdict.checks)


def test_inferpilot_p99_rule_would_fail_healthy_cpu():
    # Why the default p99 limit is looser than InferPilot's 0.1.
    verdict = evaluate(evidence(HEALTHY_CPU), Thresholds(kl_p99_max=0.1))
    assert verdict.status == "FAIL"
    assert check(verdict, "kl_p99").passed is False


def test_harmed_model_fails_every_kl_check_by_a_wide_margin():
    verdict = evaluate(evidence(HARMED_H200), Thresholds())
    assert verdict.status == "FAIL"
    assert exit_code(verdict) == EXIT_FAIL
    assert {c.name for c in verdict.checks if c.passed is False} == {"kl_mean", "kl_p99", "top1_agreement"}
    assert check(verdict, "kl_mean").value / check(verdict, "kl_mean").limit > 10
    messages = [r.message for r in verdict.reasons if r.level == "FAIL"]
    assert "fp8-8192: KL mean 0.41 > budget 0.03 (threshold 0.03, no noise floor measured)" in messages
    assert "fp8-8192: top-1 agreement 80.0 % < 85.0 % (n 1499)" in messages


def test_milder_systematic_damage_fails_on_mean_alone():
    verdict = evaluate(evidence({"kl_mean": 0.05, "kl_p99": 0.4, "top1_agreement": 0.95}), Thresholds())
    assert verdict.status == "FAIL"
    assert [c.name for c in verdict.checks if c.passed is False] == ["kl_mean"]


def test_noise_floor_widens_budget_and_is_named():
    floor = {"kl_mean": 0.015, "kl_p99": 0.2, "top1_disagreement": 0.06, "source": []}
    figures = {"kl_mean": 0.04, "kl_p99": 0.55, "top1_agreement": 0.83}
    verdict = evaluate(evidence(figures, floor=floor), Thresholds())
    assert verdict.status == "PASS"
    assert check(verdict, "kl_mean").limit == pytest.approx(0.045)
    assert check(verdict, "kl_p99").limit == pytest.approx(0.6)
    assert check(verdict, "top1_agreement").limit == pytest.approx(0.82)
    assert any("widens the KL mean budget to 0.045" in r.message for r in verdict.reasons if r.level == "NOTE")

    harmed = evaluate(evidence(HARMED_H200, floor=floor), Thresholds())
    assert "fp8-8192: KL mean 0.41 > budget 0.045 (max(0.03, 3 × noise floor 0.015))" in [r.message for r in harmed.reasons]


def test_small_noise_floor_does_not_lower_the_threshold():
    floor = {"kl_mean": 0.001, "kl_p99": 0.01, "top1_disagreement": 0.0, "source": []}
    verdict = evaluate(evidence(HEALTHY_CPU, floor=floor), Thresholds())
    assert verdict.status == "PASS"
    assert check(verdict, "kl_mean").limit == 0.03
    assert check(verdict, "top1_agreement").limit == 0.85


# --- inconclusive and not-started ---------------------------------------------------------------

def test_no_auto_baseline_is_inconclusive():
    cells = {"fp8-8192": {"kv_cache_dtype": "fp8", "max_model_len": 8192, "started": True}}
    verdict = evaluate(evidence(cells=cells, comparisons=[]), Thresholds())
    assert verdict.status == "INCONCLUSIVE"
    assert exit_code(verdict) == EXIT_INCONCLUSIVE
    assert [r.message for r in verdict.reasons] == ["no auto baseline cell started: nothing to compare with"]


def test_auto_failed_to_start_is_inconclusive():
    cells = {"auto-8192": {"kv_cache_dtype": "auto", "max_model_len": 8192, "started": False},
             "fp8-8192": {"kv_cache_dtype": "fp8", "max_model_len": 8192, "started": True}}
    assert evaluate(evidence(cells=cells, comparisons=[]), Thresholds()).status == "INCONCLUSIVE"


def test_too_few_scored_tokens_is_inconclusive():
    verdict = evaluate(evidence(HARMED_H200, n=150), Thresholds())
    assert verdict.status == "INCONCLUSIVE"
    assert check(verdict, "scored_tokens").passed is None
    assert verdict.reasons[0].message == "fp8-8192: only 150 scored positions vs auto-8192 (need 200)"


def test_started_cell_without_divergence_data_is_inconclusive():
    verdict = evaluate(evidence(comparisons=[]), Thresholds())
    assert verdict.status == "INCONCLUSIVE"
    assert verdict.reasons[0].message == "fp8-8192: no teacher-forced comparison (no divergence data)"


def test_only_auto_cells_is_inconclusive():
    cells = {"auto-8192": {"kv_cache_dtype": "auto", "max_model_len": 8192, "started": True}}
    verdict = evaluate(evidence(cells=cells, comparisons=[]), Thresholds())
    assert verdict.status == "INCONCLUSIVE"


def test_fp8_cell_not_started_is_a_note_not_a_failure():
    cells = {
        "auto-8192": {"kv_cache_dtype": "auto", "max_model_len": 8192, "started": True},
        "fp8-8192": {"kv_cache_dtype": "fp8", "max_model_len": 8192, "started": True},
        "fp8_e5m2-8192": {"kv_cache_dtype": "fp8_e5m2", "max_model_len": 8192, "started": False},
    }
    verdict = evaluate(evidence(HEALTHY_H200, cells=cells), Thresholds())
    assert verdict.status == "PASS"
    (reason,) = verdict.reasons
    assert (reason.level, reason.cell) == ("NOTE", "fp8_e5m2-8192")
    assert "did not start" in reason.message and "not a quality failure" in reason.message
    assert check(verdict, "started", "fp8_e5m2-8192").passed is None


def test_no_fp8_cell_started_is_inconclusive_not_fail():
    cells = {"auto-8192": {"kv_cache_dtype": "auto", "max_model_len": 8192, "started": True},
             "fp8-8192": {"kv_cache_dtype": "fp8", "max_model_len": 8192, "started": False}}
    verdict = evaluate(evidence(cells=cells, comparisons=[]), Thresholds())
    assert verdict.status == "INCONCLUSIVE"
    assert "no fp8 cell started: quality could not be measured" in [r.message for r in verdict.reasons]


def test_cross_length_comparison_is_noted():
    cells = {"auto-2048": {"kv_cache_dtype": "auto", "max_model_len": 2048, "started": True},
             "auto-98304": {"kv_cache_dtype": "auto", "max_model_len": 98304, "started": False},
             "fp8-98304": {"kv_cache_dtype": "fp8", "max_model_len": 98304, "started": True}}
    comparisons = [{"kind": "kv", "cell": "fp8-98304", "reference": "auto-2048", "same_length": False,
                    "summary": summary(**HEALTHY_H200)}]
    verdict = evaluate(evidence(cells=cells, comparisons=comparisons), Thresholds())
    assert verdict.status == "PASS"
    assert any(r.level == "NOTE" and "compared with auto-2048" in r.message for r in verdict.reasons)


# --- degeneration and tasks ---------------------------------------------------------------------

def degeneration(outputs, new):
    return {"cells": {"fp8-8192": {"outputs": outputs, "new_degenerate": new, "detectors": {}},
                      "auto-8192": {"outputs": outputs, "new_degenerate": 0, "detectors": {}}}}


def test_a_single_new_loop_is_tolerated():
    verdict = evaluate(evidence(HEALTHY_H200, degeneration=degeneration(12, 1)), Thresholds())
    assert verdict.status == "PASS"
    assert check(verdict, "new_degenerate_share").value == pytest.approx(1 / 12)


def test_many_new_degenerate_outputs_fail():
    verdict = evaluate(evidence(HEALTHY_H200, degeneration=degeneration(40, 5)), Thresholds())
    assert verdict.status == "FAIL"
    assert verdict.reasons[0].message.startswith("fp8-8192: 5 of 40 outputs degenerate where the baseline's do not (12.5 %")
    # 2 of 40 is exactly the 5 % share: allowed.
    assert evaluate(evidence(HEALTHY_H200, degeneration=degeneration(40, 2)), Thresholds()).status == "PASS"


def tasks(recovery, p, n, cell="fp8-8192", **extra):
    """evidence["tasks"] with one cell's pooled-over-tasks comparison against auto-8192."""
    return {"cells": {cell: {"reference": "auto-8192", "recovery": recovery, "mcnemar_p": p, "n": n,
                             "baseline_accuracy": 0.9 if recovery is not None else 0.0,
                             "cell_accuracy": None if recovery is None else 0.9 * recovery, "b": 7, "c": 1,
                             "rejected": 0}}, **extra}


def test_task_recovery_fails_when_low_and_significant():
    verdict = evaluate(evidence(HEALTHY_H200, tasks=tasks(0.80, 0.001, 200)), Thresholds())
    assert verdict.status == "FAIL"
    found = check(verdict, "task_recovery")
    assert (found.value, found.limit, found.passed) == (0.80, 0.95, False)
    (reason,) = [r for r in verdict.reasons if r.level == "FAIL"]
    assert reason.cell == "fp8-8192"
    assert reason.message.startswith("fp8-8192: task accuracy recovery 80.0 % < 95.0 %, significant "
                                     "(McNemar p 0.001 < 0.05, n 200")


def test_task_recovery_low_but_not_significant_is_inconclusive():
    verdict = evaluate(evidence(HEALTHY_H200, tasks=tasks(0.80, 0.3, 20)), Thresholds())
    assert verdict.status == "INCONCLUSIVE"
    assert check(verdict, "task_recovery").passed is None
    (reason,) = verdict.reasons
    assert reason.level == "INCONCLUSIVE"
    assert reason.message == ("fp8-8192: task accuracy below the 95.0 % recovery bar, but too few samples to tell: "
                              "recovery 80.0 %, McNemar p 0.3, n 20")


def test_task_recovery_at_or_above_the_bar_passes_whatever_p():
    for recovery in (0.95, 0.99, 1.1):
        verdict = evaluate(evidence(HEALTHY_H200, tasks=tasks(recovery, 0.001, 200)), Thresholds())
        assert verdict.status == "PASS"
        assert check(verdict, "task_recovery").passed is True
        assert verdict.reasons == []


def test_task_recovery_honours_thresholds():
    assert evaluate(evidence(HEALTHY_H200, tasks=tasks(0.80, 0.001, 200)),
                    Thresholds(task_recovery_min=0.75)).status == "PASS"
    assert evaluate(evidence(HEALTHY_H200, tasks=tasks(0.80, 0.03, 200)), Thresholds(alpha=0.01)).status == "INCONCLUSIVE"


def test_no_task_check_without_pairs_or_recovery():
    assert not [c for c in evaluate(evidence(HEALTHY_H200, tasks=tasks(None, None, 0)), Thresholds()).checks
                if c.name == "task_recovery"]
    verdict = evaluate(evidence(HEALTHY_H200, tasks=tasks(None, 1.0, 12)), Thresholds())
    assert verdict.status == "PASS"
    assert not [c for c in verdict.checks if c.name == "task_recovery"]
    assert [r.level for r in verdict.reasons] == ["NOTE"] and "recovery undefined" in verdict.reasons[0].message
    # Absent or empty task evidence: nothing at all.
    for empty in ({}, None):
        verdict = evaluate(evidence(HEALTHY_H200, tasks=empty), Thresholds())
        assert verdict.status == "PASS" and verdict.reasons == []


def test_crashed_tasks_phase_is_noted():
    verdict = evaluate(evidence(HEALTHY_H200, tasks={"cells": {}, "errors": {"fp8-8192": "RuntimeError: boom"}}),
                       Thresholds())
    assert verdict.status == "PASS"
    (reason,) = verdict.reasons
    assert reason.level == "NOTE" and "tasks phase failed (RuntimeError: boom)" in reason.message


def test_verdict_to_dict_is_json():
    verdict = evaluate(evidence(HARMED_H200, degeneration=degeneration(10, 5)), Thresholds())
    data = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    assert data["status"] == "FAIL" and data["exit_code"] == 1
    assert data["thresholds"]["kl_mean_max"] == 0.03
    assert {"name", "cell", "value", "limit", "passed", "detail"} <= set(data["checks"][0])


def test_exit_code_constants():
    assert (EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE) == (0, 1, 2, 3)


# --- end to end with cell_divergence ------------------------------------------------------------

def test_evaluate_on_cell_divergence_output():
    import math

    from kveval.analysis.divergence import cell_divergence

    tokens = list(range(300))

    def facts(kv, shift):
        positions = [{"token": t, "logprob": math.log(0.7 - shift),
                      "top": [[t, math.log(0.7 - shift)], [-1, math.log(0.2 + shift)]]} for t in tokens[1:]]
        seq = {"id": "doc", "kind": "document", "token_ids": tokens, "scored_from": 1, "accepted": True,
               "positions": positions}
        return {"kv_cache_dtype": kv, "max_model_len": 4096, "started": True,
                "phases": {"scoring": {"top_k": 2, "sequences": [seq]}}}

    cells = {"auto-4096": facts("auto", 0.0), "fp8-4096": facts("fp8", 0.01), "fp8_bad-4096": facts("fp8_bad", 0.3)}
    verdict = evaluate({"cells": cells, "divergence": cell_divergence(cells)}, Thresholds())
    assert verdict.status == "FAIL"
    assert {c.cell for c in verdict.checks if c.passed is False} == {"fp8_bad-4096"}
    assert check(verdict, "kl_mean", "fp8-4096").value == pytest.approx(
        0.7 * math.log(0.7 / 0.69) + 0.2 * math.log(0.2 / 0.21))


# --- thresholds loading -------------------------------------------------------------------------

def test_load_defaults_yaml_and_overrides(tmp_path):
    assert load_thresholds(None, {}) == Thresholds()
    path = tmp_path / "gate.yaml"
    path.write_text("kl_mean_max: 1e-2\nkl_p99_max: 0.1\nmin_scored_tokens: 500\n")
    loaded = load_thresholds(str(path), {"kl_p99_max": "0.3", "alpha": None})
    assert loaded.kl_mean_max == 0.01  # YAML 1.1 reads 1e-2 as a string; accepted
    assert loaded.kl_p99_max == 0.3  # override wins
    assert loaded.min_scored_tokens == 500 and isinstance(loaded.min_scored_tokens, int)
    assert loaded.alpha == 0.05  # None = unset override


def test_empty_yaml_gives_defaults(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("")
    assert load_thresholds(path, {}) == Thresholds()


@pytest.mark.parametrize(("text", "message"), [
    ("kl_mean_maxx: 0.01\n", "unknown threshold 'kl_mean_maxx'"),
    ("kl_mean_max: lots\n", "kl_mean_max must be a number, got 'lots'"),
    ("kl_mean_max: [0.01]\n", "kl_mean_max must be a number, got list"),
    ("kl_mean_max: true\n", "kl_mean_max must be a number, got bool"),
    ("min_scored_tokens: 2.5\n", "min_scored_tokens must be a whole number"),
    ("top1_agreement_min: 90\n", "top1_agreement_min is a share"),
    ("kl_mean_max: -1\n", "non-negative"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("kl_mean_max: [\n", "not valid YAML"),
])
def test_yaml_errors_name_the_problem(tmp_path, text, message):
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    with pytest.raises(GateConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_thresholds(str(path), {})


def test_missing_file_and_unknown_override():
    with pytest.raises(GateConfigError, match="cannot read thresholds file"):
        load_thresholds("/nonexistent/gate.yaml", {})
    with pytest.raises(GateConfigError, match="override: unknown threshold 'kl_max'"):
        load_thresholds(None, {"kl_max": 1})
