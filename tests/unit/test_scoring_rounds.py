"""Divergence as a stream sampled in rounds (issue 40): which cells score new documents
(run/round_plan.py), how round documents join the cell and give the looks (files/task_rounds.py,
analysis/divergence.sequence_looks), and the gate judging each look at its nominal level
(gate/divergence_checks.look_levels)."""
from __future__ import annotations

import pytest

from kveval.analysis.divergence import sequence_looks
from kveval.analysis.sequential import look_alpha
from kveval.files import schema
from kveval.files.task_rounds import RoundDesign, RoundStreams, merge_rounds
from kveval.gate import FAIL, INCONCLUSIVE, PASS, Thresholds, evaluate
from kveval.gate.divergence_checks import look_levels
from kveval.inputs.budget import parse_budget
from kveval.run.round_plan import MAX_SCORED_SEQUENCES, plan_round
from tests.support.constructed import scored_document, scoring_phase, started_cell
from tests.unit.test_gate import evidence

T = Thresholds()
# The AMX CPU budget: healthy 0.08, harm 0.12. KL 0.09 with a standard error of 0.009 on 24 sequences is neither
# shown under 0.08 nor over 0.12: only the divergence stream keeps the cell open.
IN_THE_GAP = {"kl_mean": 0.09, "kl_p99": 0.6, "top1_agreement": 0.9}
UNDER_BUDGET = {"kl_mean": 0.07, "kl_p99": 0.6, "top1_agreement": 0.9}


def _open(figures=IN_THE_GAP, documents=24, **more):
    ev = evidence(figures, profile="cpu-amx", documents=documents, **more)
    verdict = evaluate(ev)
    assert verdict.cells["fp8-8192"] == INCONCLUSIVE, verdict.reasons
    return verdict, ev


def test_an_undecided_divergence_scores_new_documents_doubling_the_sequences():
    verdict, ev = _open()
    assert {r.code for r in verdict.reasons if r.cell == "fp8-8192" and r.level == INCONCLUSIVE} \
        == {"divergence_undecided"}
    plan = plan_round(verdict, ev, parse_budget("600"), T, {}, None, 0, scoring=True)
    (length_round,) = plan.rounds
    assert length_round.reference == "auto-8192" and length_round.scoring_cells == ["fp8-8192"]
    assert (length_round.documents, length_round.document_target) == (24, 48)
    assert length_round.task_cells == [] and length_round.probe_cells == []


def test_no_scoring_round_without_the_scoring_phase_or_past_the_design():
    verdict, ev = _open()
    off = plan_round(verdict, ev, parse_budget("600"), T, {}, None, 0, scoring=False)
    assert not off.rounds and not off.notes
    verdict, ev = _open(documents=40)
    spent = plan_round(verdict, ev, parse_budget("600"), T, {}, None, 0, scoring=True)
    assert not spent.rounds   # 48 is the next look, and 8 more sequences are under a quarter of 40
    assert f"the design's {MAX_SCORED_SEQUENCES} scored sequences per cell are spent" in spent.notes[0]


def test_with_another_count_open_documents_go_only_where_kl_leans_to_harm():
    # Degeneration open beside divergence, and no probe stream in this run: documents alone cannot PASS
    # the cell. Under its healthy budget they cannot FAIL it either (no round); over it they may.
    degeneration = {"fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "outputs": 30, "new_degenerate": 2,
                                 "judged_outputs": 30, "baseline_only_degenerate": 0,
                                 "outputs_with_findings": 2, "detectors": {}, "token_limit_rate": None}}
    leaning_healthy, ev = _open(UNDER_BUDGET, degeneration=degeneration)
    plan = plan_round(leaning_healthy, ev, parse_budget("600"), T, {}, None, 0, scoring=True)
    assert not plan.rounds
    assert any("no scoring round: another count keeps it undecided" in note for note in plan.notes)
    leaning_harm, ev = _open(IN_THE_GAP, degeneration=degeneration)
    plan = plan_round(leaning_harm, ev, parse_budget("600"), T, {}, None, 0, scoring=True)
    assert plan.rounds[0].scoring_cells == ["fp8-8192"]


def test_round_documents_join_the_cell_tagged_with_their_round():
    base = started_cell("fp8", 1024, 3584, [], scoring=scoring_phase(20, "healthy", documents=3))
    extra = started_cell("fp8", 1024, 3584, [], scoring={
        "top_k": 5, "reference_cell": "auto-1024",
        "sequences": [scored_document(20, "healthy", f"doc:r1:{i}") for i in range(4)]})
    merged = merge_rounds(schema.parse(schema.CellResult, base, "base"),
                          [(1, schema.parse(schema.CellResult, extra, "r1")), (2, None)],
                          RoundDesign(n_max=600, final=False, documents_n_max=48), RoundStreams([], [], (1, 2)))
    scoring = merged.phases.scoring
    assert [s.round for s in scoring.sequences] == [0, 0, 0, 1, 1, 1, 1]   # round 2 failed: adds nothing
    assert scoring.design.n_max == 48 and scoring.design.final is False
    assert sequence_looks([s.round for s in scoring.sequences]) == [3, 7]


def test_sequence_looks_are_cumulative_per_round():
    assert sequence_looks([0] * 21 + [1] * 21) == [21, 42]
    assert sequence_looks([0, 0, 2, 2, 2]) == [2, 5]
    assert sequence_looks([0] * 5) == [5]


def _comparison(looks, final, n_max=48):
    design = None if n_max is None else schema.ScoringDesign(n_max=n_max, final=final)
    return evidence(IN_THE_GAP, profile="cpu-amx").divergence.comparisons[0].model_copy(
        update={"looks": looks, "design": design})


def test_an_early_look_is_stricter_and_the_final_look_spends_what_is_left():
    first_pass, first_fail = look_levels(_comparison([21], False), T)
    final_pass, final_fail = look_levels(_comparison([21, 42], True), T)
    assert first_pass < T.divergence_pass_alpha and first_fail < T.fail_alpha
    assert first_pass == pytest.approx(look_alpha([21], 48, T.divergence_pass_alpha, False).alpha)
    assert final_pass == pytest.approx(look_alpha([21, 42], 48, T.divergence_pass_alpha, True).alpha)
    assert 0 < final_pass < T.divergence_pass_alpha   # the two looks together spend alpha, not each
    # One final look is the fixed-sample test; no design (no rounds: --budget 0, older runs) as well.
    assert look_levels(_comparison([48], True), T) == pytest.approx((T.divergence_pass_alpha, T.fail_alpha))
    assert look_levels(_comparison(None, False, n_max=None), T) == (T.divergence_pass_alpha, T.fail_alpha)


def test_the_review_names_the_looks_and_a_final_look_decides():
    comp = _comparison([21, 42], True)
    ev = evidence(IN_THE_GAP, profile="cpu-amx")
    ev.divergence.comparisons[0] = comp
    verdict = evaluate(ev)
    text = " ".join(r.message for r in verdict.reasons if r.cell == "fp8-8192")
    assert "looks at 21, 42 sequences of a sequential design over at most 48 scored sequences, the final look" \
        in text
    # A clearly healthy cell passes at a first, stricter look; a clearly harmed one fails there.
    healthy = evidence({"kl_mean": 0.02, "kl_p99": 0.2, "top1_agreement": 0.92}, profile="cpu-amx")
    healthy.divergence.comparisons[0] = healthy.divergence.comparisons[0].model_copy(
        update={"looks": [21], "design": schema.ScoringDesign(n_max=48, final=False)})
    assert evaluate(healthy).cells["fp8-8192"] == PASS
    harmed = evidence({"kl_mean": 0.4, "kl_p99": 3.0, "top1_agreement": 0.5}, profile="cpu-amx")
    harmed.divergence.comparisons[0] = harmed.divergence.comparisons[0].model_copy(
        update={"looks": [21], "design": schema.ScoringDesign(n_max=48, final=False)})
    assert evaluate(harmed).cells["fp8-8192"] == FAIL
