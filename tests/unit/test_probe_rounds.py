"""Degeneration as a stream of paired evidence sampled in rounds (issue 22): which cells get new probes
(run/round_plan.py), how round outputs join the cell and give the looks (files/task_rounds.py,
analysis/degeneration.py), and the gate judging each look at the alpha it may spend (gate.py)."""
from __future__ import annotations

import pytest

from kveval.analysis.degeneration import degeneration_summary, scan_cells
from kveval.evidence import build_evidence
from kveval.files.task_rounds import RoundDesign, RoundStreams, merge_rounds, streams_of
from kveval.gate import INCONCLUSIVE, PASS, Check, Reason, Thresholds, Verdict, evaluate
from kveval.inputs.budget import parse_budget
from kveval.inputs.workloads import round_probe_pool_size
from kveval.run.round_plan import LengthShape, plan_round
from tests.support.constructed import manifest_for, started_cell
from tests.support.evidence import typed_cells, typed_evidence
from tests.support.evidence import typed_manifest

T = Thresholds()
LOOP = "the cat sat on the mat " * 30


def _record(prompt_id: str, looping: bool) -> dict:
    text = LOOP if looping else f"A plain answer to {prompt_id}, different every time: {prompt_id[::-1]}."
    return {"prompt_id": prompt_id, "workload": "probe", "accepted": True, "text": text,
            "token_ids": list(range(len(text.split()))), "finish_reason": "stop", "output_tokens": len(text.split())}


def _prompts(ids):
    return [{"id": i, "workload": "probe", "kind": "probe", "text": "", "token_ids": [1, 2, 3], "max_tokens": 256,
             "target_tokens": None} for i in ids]


def _cells(ids, auto_loops, fp8_loops):
    return {"auto-1024": started_cell("auto", 1024, 1792, [_record(i, i in auto_loops) for i in ids]),
            "fp8-1024": started_cell("fp8", 1024, 3584, [_record(i, i in fp8_loops) for i in ids])}


# --- the plan ---------------------------------------------------------------------------------------

def _open_degeneration(cell="fp8-1024", others=()):
    reasons = [Reason(INCONCLUSIVE, cell, f"{cell}: 12 of 109 outputs degenerate where the auto output does not")]
    reasons += [Reason(INCONCLUSIVE, cell, text) for text in others]
    return Verdict(INCONCLUSIVE, reasons, [Check("degeneration_noninferiority", cell, 0.12, 0.1, None)],
                   cells={cell: INCONCLUSIVE})


def _evidence(judged=109, new=12, base_only=7, **more):
    return typed_evidence({**_evidence_dict(judged, new, base_only), **more})


def _evidence_dict(judged=109, new=12, base_only=7):
    return {"cells": {"auto-1024": {"kv_spec": "auto", "max_model_len": 1024, "started": True},
                      "fp8-1024": {"kv_spec": "fp8", "max_model_len": 1024, "started": True}},
            "degeneration": {"cells": {"fp8-1024": {"max_model_len": 1024, "judged_outputs": judged,
                                                    "new_degenerate": new, "baseline_only_degenerate": base_only}}}}


def test_an_open_degeneration_comparison_gets_new_probes_doubling_the_outputs():
    plan = plan_round(_open_degeneration(), _evidence(), parse_budget("600"), T, {}, None, 0, probes_left=500)
    (length_round,) = plan.rounds
    assert length_round.reference == "auto-1024" and length_round.probe_cells == ["fp8-1024"]
    assert length_round.task_cells == [] and length_round.docs == 0
    assert (length_round.probes, length_round.probe_target) == (109, 218)


def test_probe_rounds_stop_at_the_budget_and_the_pool():
    capped = plan_round(_open_degeneration(), _evidence(judged=400), parse_budget("600"), T, {}, None, 0, probes_left=500)
    assert capped.rounds[0].probe_target == 600 and capped.rounds[0].probes == 200
    spent = plan_round(_open_degeneration(), _evidence(judged=600), parse_budget("600"), T, {}, None, 0, probes_left=500)
    assert not spent.rounds and "budget of 600 outputs per cell is spent" in spent.notes[0]
    dry = plan_round(_open_degeneration(), _evidence(judged=109), parse_budget("600"), T, {}, None, 0, probes_left=0)
    assert not dry.rounds and "pool of new probes is spent" in dry.notes[0]
    off = plan_round(_open_degeneration(), _evidence(), parse_budget("600"), T, {}, None, 0, probes_left=None)
    assert not off.rounds and not off.notes          # no generation phase in the run: no probe stream at all
    few = plan_round(_open_degeneration(), _evidence(judged=3, new=3, base_only=0), parse_budget("600"), T, {}, None,
                     0, probes_left=500)
    assert few.rounds[0].probes == 50                # never a round of a handful


def test_with_another_count_open_probes_go_only_where_loops_lean_to_harm():
    divergence = ["fp8-1024: KL mean outside the healthy budget"]
    leaning = plan_round(_open_degeneration(others=divergence), _evidence(new=12, base_only=4), parse_budget("600"),
                         T, {}, None, 0, probes_left=500)
    assert [r.probe_cells for r in leaning.rounds] == [["fp8-1024"]]       # a FAIL can come of it
    even = plan_round(_open_degeneration(others=divergence), _evidence(new=7, base_only=9), parse_budget("600"),
                      T, {}, None, 0, probes_left=500)
    assert not even.rounds and "do not degenerate more often" in even.notes[0]


def test_tasks_and_probes_open_together_share_one_round():
    verdict = _open_degeneration()
    verdict.reasons.append(Reason(INCONCLUSIVE, "fp8-1024", "fp8-1024: task accuracy not shown non-inferior"))
    verdict.checks.append(Check("task_noninferiority", "fp8-1024", 0.8, 0.9, None))
    evidence = _evidence(tasks={"cells": {"fp8-1024": {"reference": "auto-1024", "max_model_len": 1024, "n": 54,
                                                       "b": 1, "c": 1, "baseline_accuracy": 0.46, "recovery": 1.0,
                                                       "looks": [54]}},
                                "accuracy": [{"cell": "fp8-1024", "level": "cell", "samples": 54}]})
    (length_round,) = plan_round(verdict, evidence, parse_budget("600"), T, {1024: LengthShape(6, 54)}, None, 0,
                                 probes_left=500).rounds
    assert length_round.task_cells == ["fp8-1024"] and length_round.probe_cells == ["fp8-1024"]
    assert length_round.docs > 0 and length_round.probes == 109


# --- pooling and looks ------------------------------------------------------------------------------

def test_round_outputs_join_the_cell_and_give_the_looks():
    first = [f"probe-{i}" for i in range(20)]
    later = [f"probe-r1-{i}" for i in range(20)]
    cells = _cells(first, auto_loops={"probe-1"}, fp8_loops={"probe-2", "probe-3"})
    rounds = _cells(later, auto_loops=set(), fp8_loops={"probe-r1-0"})
    design = RoundDesign(n_max=600, final=False, final_degeneration=True)
    streams = RoundStreams(tasks=[], probes=[1])
    merged = {name: merge_rounds(cells[name], [(1, rounds[name])], design, streams) for name in cells}
    records = merged["fp8-1024"]["phases"]["generation"]["records"]
    assert [r["round"] for r in records] == [0] * 20 + [1] * 20
    assert merged["fp8-1024"]["phases"]["generation"]["design"] == {"n_max": 600, "final": True}
    assert "tasks" not in merged["fp8-1024"]["phases"]
    workloads = _prompts(first + later)
    row = degeneration_summary(scan_cells(workloads, typed_cells(merged)), typed_cells(merged), workloads).set_index("cell").loc["fp8-1024"]
    assert row["looks"] == [20, 40] and row["outputs_with_new_findings"] == 3 and row["baseline_only_degenerate"] == 1
    entry = build_evidence(typed_manifest(manifest_for(merged)), workloads, typed_cells(merged)).degeneration.cells["fp8-1024"]
    assert (entry.looks, entry.n_max, entry.final) == ([20, 40], 600, True)


def test_streams_of_a_round_name_the_baseline_too_and_old_rounds_ran_tasks():
    manifest = typed_manifest({"task_rounds": {"rounds": [
        {"round": 1, "cells": ["auto-1024", "fp8-1024"]},
        {"round": 2, "cells": ["auto-1024", "fp8-1024"], "task_cells": [], "probe_cells": ["auto-1024", "fp8-1024"]}]}})
    assert streams_of(manifest, "auto-1024") == RoundStreams(tasks=[1], probes=[2])
    assert streams_of(manifest, "fp8:keep=0-1024") == RoundStreams(tasks=[], probes=[])


def test_the_round_pool_holds_new_questions_only():
    assert round_probe_pool_size() == 500


# --- the gate at each look ----------------------------------------------------------------------------

def _judge(entry):
    from tests.unit.test_gate import evidence
    return evaluate(evidence(degeneration={"fp8-8192": entry}))


def _looks(entry, judged):
    """The fixed-sample test, an early look and a final look at `judged` outputs of a 600-output design."""
    fixed = _judge(entry)
    early = _judge({**entry, "looks": [judged], "n_max": 600, "final": False})
    final = _judge({**entry, "looks": [judged], "n_max": 600, "final": True})
    bound = {name: next(c for c in v.checks if c.name == "degeneration_noninferiority").value
             for name, v in (("fixed", fixed), ("early", early), ("final", final))}
    return fixed, early, final, bound


def test_an_early_look_is_stricter_and_the_final_look_spends_what_is_left():
    # 7 vs 5 of 218 outputs (the first round's doubling of 109): the excess's upper bound is 3.8 % at the
    # fixed level and 4.5 % at look 1's stricter level, both under the 5-point margin. (7 vs 5 of 109, this
    # test's case while the margin was 10 points, is undecided under today's 5: 7.6 % at the fixed level.)
    base = {"outputs": 218, "new_degenerate": 7, "judged_outputs": 218, "baseline_only_degenerate": 5}
    fixed, early, final, bound = _looks(base, 218)
    assert bound["early"] > bound["fixed"] == pytest.approx(bound["final"])   # one final look: the fixed test
    assert bound["early"] < T.degeneration_noninferiority_margin
    assert fixed.status == early.status == final.status == PASS              # 7 vs 5 of 218 passes either way
    detail = next(c.detail for c in early.checks if c.name == "degeneration_noninferiority")
    assert "look 1 of a sequential design over at most 600 outputs" in detail
    # Where the fixed test passes only narrowly, the early look's stricter bound leaves it undecided:
    # 2 vs 2 of 109 is 3.8 % at the fixed level, 5.8 % at look 1.
    close = {"outputs": 109, "new_degenerate": 2, "judged_outputs": 109, "baseline_only_degenerate": 2}
    fixed, early, final, bound = _looks(close, 109)
    assert bound["fixed"] < T.degeneration_noninferiority_margin < bound["early"]
    assert fixed.status == final.status == PASS and early.status == INCONCLUSIVE


def test_an_open_look_says_rounds_continue_and_a_final_one_what_else_would_decide():
    entry = {"outputs": 109, "new_degenerate": 12, "judged_outputs": 109, "baseline_only_degenerate": 7}
    open_look = _judge({**entry, "looks": [109], "n_max": 600, "final": False})
    (reason,) = [r for r in open_look.reasons if r.level == INCONCLUSIVE and "degenerate" in r.message]
    assert "rounds of new probes continue up to 600" in reason.decide
    last = _judge({**entry, "looks": [109, 600], "judged_outputs": 600, "outputs": 600, "new_degenerate": 80,
                   "baseline_only_degenerate": 32, "n_max": 600, "final": True})
    (reason,) = [r for r in last.reasons if r.level == INCONCLUSIVE and "degenerate" in r.message]
    assert "--prompts FILE" in reason.decide and "the final look" in reason.message
