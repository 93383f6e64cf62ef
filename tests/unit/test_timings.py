"""Where the time went (issue 18): per cell process its start-up, phases, engine time and the rest
(analysis/timings.py), task rounds counted as processes of their own, the parent's time from the
manifest, and the review's short section below the decision screen (render/timing_section.py)."""
from __future__ import annotations

import pytest

from kveval.analysis.timings import process_row, timing_rows, timing_totals
from kveval.files import schema
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.files.task_rounds import round_cell_id
from kveval.gate import Thresholds, evaluate
from kveval.pipeline import stored_run_verdict
from kveval.render.review import render_review
from kveval.render.timing_section import MAX_OPEN_ROWS, timing_section
from kveval.run.parent_clock import ParentClock
from tests.support.constructed import complete_cell, planned_manifest
from tests.support.evidence import typed_evidence, typed_manifest
from tests.support.review import review_of

EFFICIENCY = {"tokens": 4000, "engine_seconds": 20.0, "reference_requests": 8, "reference_tokens": 1000,
              "reference_seconds": 4.0, "ratio": 0.8, "method": "one LLM.generate of 8 of its requests"}


def _cell(name: str = "fp8-1024", *, process: float | None = 100.0, startup: float = 10.0, warm: bool | None = None,
          phases: dict | None = None) -> dict:
    kv, length = name.rsplit("-", 1)
    facts = {"cell": name, "kv_spec": kv, "max_model_len": int(length), "started": True,
             "startup_seconds": startup,
             "phases": phases if phases is not None else {
                 "generation": {"seconds": 30.0, "engine_seconds": 20.0, "efficiency": dict(EFFICIENCY)},
                 "speed": {"seconds": 40.0, "engine_seconds": 38.0}}}
    if process is not None:
        facts["process"] = {"exit_code": 0, "seconds": process, **({"warm": warm} if warm is not None else {})}
    return complete_cell(facts)


def _typed(facts: dict) -> schema.CellResult:
    return schema.parse(schema.CellResult, facts, "the test's cell")


def test_a_process_splits_into_start_up_engine_and_the_rest():
    row = process_row(_typed(_cell(warm=True)), "fp8-1024")
    assert (row.process, row.round, row.started, row.warm) == ("fp8-1024", None, True, True)
    assert [p.phase for p in row.phases] == ["generation", "speed"]
    assert row.engine_seconds == pytest.approx(58.0)
    assert row.outside_engine_seconds == pytest.approx(100.0 - 10.0 - 58.0)
    assert row.split_known
    generation, speed = row.phases
    assert (generation.seconds, generation.engine_seconds, generation.efficiency) == (30.0, 20.0, 0.8)
    assert generation.engine_tok_s == pytest.approx(200.0) and generation.reference_tok_s == pytest.approx(250.0)
    assert (generation.reference_requests, generation.method) == (8, EFFICIENCY["method"])
    assert speed.efficiency is None and speed.engine_tok_s is None   # a controlled measurement: no reference


def test_a_phase_without_engine_time_counts_whole_and_says_the_split_is_unknown():
    row = process_row(_typed(_cell(phases={"generation": {"seconds": 30.0, "engine_seconds": 20.0},
                                           "scoring": {"seconds": 25.0}})), "fp8-1024")
    assert row.engine_seconds == pytest.approx(45.0)          # 20 measured + 25 counted whole
    assert row.outside_engine_seconds == pytest.approx(45.0)  # 100 - 10 - 45
    assert not row.split_known
    assert [p.engine_seconds for p in row.phases] == [20.0, None]


def test_without_a_process_record_the_rest_is_unknown_and_a_cell_that_did_not_start_has_no_phases():
    assert process_row(_typed(_cell(process=None)), "fp8-1024").outside_engine_seconds is None
    failed = complete_cell({"cell": "fp8-2048", "kv_spec": "fp8", "max_model_len": 2048,
                            "startup_seconds": 4.0, "process": {"exit_code": 1, "seconds": 15.0}})
    row = process_row(_typed(failed), "fp8-2048")
    assert (row.started, row.phases, row.engine_seconds, row.outside_engine_seconds) == (False, [], 0, 11.0)
    assert row.split_known


def _tasks(seconds: float, engine: float) -> dict:
    return {"seconds": seconds, "engine_seconds": engine}


def _round(cell: str, number: int, process: float, tasks_seconds: float) -> dict:
    facts = _cell(cell, process=process, startup=5.0, phases={"tasks": _tasks(tasks_seconds, tasks_seconds - 1.0)})
    facts["cell"] = round_cell_id(cell, number)
    return facts


def _rounds_run(tmp_path):
    """A stored run: fp8 and auto at 1024, each with a first tasks phase of 50 s and two task rounds."""
    run_dir = tmp_path / "run"
    cells = {name: _cell(name, process=200.0, phases={"tasks": _tasks(50.0, 45.0),
                                                      "speed": {"seconds": 40.0, "engine_seconds": 39.0}})
             for name in ("auto-1024", "fp8-1024")}
    entry = {"max_model_len": 1024, "cells": list(cells), "data_dir": None, "samples_per_point": 1, "limit": None,
             "target": 100}
    manifest = planned_manifest([{"id": n, "kv_spec": c["kv_spec"], "max_model_len": 1024}
                                 for n, c in cells.items()],
                                task_rounds={"budget": {}, "n_max": 600, "rounds": [{"round": 1, **entry},
                                                                                    {"round": 2, **entry}],
                                             "final": [], "stopped": None, "notes": []},
                                timing={"setup_seconds": 12.0, "diagnosis_seconds": 30.0, "run_seconds": 1000.0})
    write_json_atomic(run_dir / "manifest.json", manifest)
    write_json_atomic(run_dir / "workloads.json", [])
    for name, facts in cells.items():
        write_json_atomic(run_dir / "cells" / f"{name}.json", facts)
        for number, (process, seconds) in {1: (60.0, 20.0), 2: (70.0, 30.0)}.items():
            write_json_atomic(run_dir / "cells" / f"{round_cell_id(name, number)}.json",
                              _round(name, number, process, seconds))
    return run_dir


def test_every_round_is_a_process_of_its_own_and_its_tasks_time_is_not_counted_twice(tmp_path):
    run = RunDir(_rounds_run(tmp_path))
    evidence, _ = stored_run_verdict(run, run.manifest(), None, Thresholds())
    rows = {row.process: row for row in evidence.timings}
    assert list(rows) == ["auto-1024", "auto-1024.tasks-r1", "auto-1024.tasks-r2",
                          "fp8-1024", "fp8-1024.tasks-r1", "fp8-1024.tasks-r2"]
    own = rows["fp8-1024"]
    # The merged cell's tasks phase holds 50 + 20 + 30 s; the cell's own process ran 50 of them.
    assert run.cell_result("fp8-1024", run.manifest()).phases.tasks.seconds == pytest.approx(100.0)
    assert {p.phase: p.seconds for p in own.phases} == {"tasks": pytest.approx(50.0), "speed": 40.0}
    assert own.outside_engine_seconds == pytest.approx(200.0 - 10.0 - 45.0 - 39.0)
    second = rows["fp8-1024.tasks-r2"]
    assert (second.cell, second.round, second.process_seconds, second.startup_seconds) == ("fp8-1024", 2, 70.0, 5.0)
    assert second.outside_engine_seconds == pytest.approx(70.0 - 5.0 - 29.0)
    totals = evidence.timing_totals
    assert totals.processes == 6
    assert totals.process_seconds == pytest.approx(2 * (200.0 + 60.0 + 70.0))
    assert totals.startup_seconds == pytest.approx(2 * (10.0 + 5.0 + 5.0))
    assert {p.phase: p.seconds for p in totals.phases} == {"tasks": pytest.approx(200.0), "speed": pytest.approx(80.0)}
    assert (totals.setup_seconds, totals.diagnosis_seconds, totals.run_seconds) == (12.0, 30.0, 1000.0)
    assert totals.between_cells_seconds == pytest.approx(1000.0 - 12.0 - 30.0 - 660.0)


def _totals(rows, **timing):
    return timing_totals(typed_manifest({"timing": timing} if timing else {}), rows)


def test_the_parent_time_between_cells_only_where_the_processes_are_this_runs_alone():
    rows = [process_row(_typed(_cell()), "fp8-1024")]
    assert _totals(rows, setup_seconds=5.0, run_seconds=150.0).between_cells_seconds == pytest.approx(45.0)
    assert _totals(rows, setup_seconds=5.0, run_seconds=150.0, cells_overlap=True).between_cells_seconds is None
    assert _totals(rows, setup_seconds=5.0, run_seconds=150.0, resumed=True).between_cells_seconds is None
    assert _totals(rows, setup_seconds=5.0, run_seconds=90.0).between_cells_seconds is None   # less than the cells
    assert _totals(rows, setup_seconds=5.0).run_seconds is None
    older = _totals(rows)
    assert (older.setup_seconds, older.run_seconds, older.between_cells_seconds) == (None, None, None)
    assert older.phases[0].engine_seconds == 20.0 and older.phases[0].efficiency is None


def test_the_section_sits_below_the_decision_screen_and_shows_the_figures():
    cells = {"auto-1024": _cell("auto-1024"), "fp8-1024": _cell("fp8-1024", warm=True,
                                                               phases={"generation": {"seconds": 30.0}})}
    manifest = planned_manifest([{"id": n, "kv_spec": c["kv_spec"], "max_model_len": 1024}
                                 for n, c in cells.items()],
                                timing={"setup_seconds": 12.5, "diagnosis_seconds": None, "run_seconds": 400.0})
    review = review_of(manifest, [], cells).splitlines()
    start = review.index("## Where the time went")
    assert start >= 40
    section = review[start:review.index("", start + 6)]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in section if line.startswith("| ") and "---" not in line}
    assert rows["process"] == ["process s", "start-up s", "generation s", "speed s", "engine s", "outside engine s"]
    assert rows["auto-1024"] == ["100.0", "10.0", "30.0 (80 %)", "40.0", "58.0", "32.0"]
    assert rows["fp8-1024"] == ["100.0 (warm)", "10.0", "30.0", "", "30.0*", "60.0"]
    text = "\n".join(review[start:])
    assert "- All 2 cell processes: 200.0 s; start-up 20.0 s, inside engine calls 88.0 s (some phases counted whole)" in text
    assert ("- Parent, outside every cell: set-up 12.5 s (model, tokenising, planning, task data), between cells "
            "187.5 s (judging, planning remedies and rounds); the run took 400.0 s up to its last cell.") in text


def test_a_long_table_folds_and_stored_evidence_without_times_has_no_section():
    rows = [process_row(_typed(_cell(f"fp8-{1024 + i}")), f"fp8-{1024 + i}") for i in range(MAX_OPEN_ROWS + 1)]
    text = timing_section(typed_evidence({"timings": [schema.dump(row) for row in rows],
                                          "timing_totals": schema.dump(_totals(rows))}))
    assert f"<details><summary>{MAX_OPEN_ROWS + 1} processes</summary>" in text and "</details>" in text
    assert "- Parent, outside every cell: not recorded (runs before issue 18)." in text
    assert timing_section(typed_evidence({})) == ""
    evidence = typed_evidence({})
    assert "Where the time went" not in render_review(typed_manifest(planned_manifest([])), evidence, evaluate(evidence))


def test_timing_rows_keep_the_cells_order_without_rounds():
    cells = {name: _typed(_cell(name)) for name in ("auto-1024", "fp8-1024")}
    rows = timing_rows(typed_manifest({}), cells)
    assert [(row.process, row.round) for row in rows] == [("auto-1024", None), ("fp8-1024", None)]


def test_the_parent_steps_between_cells_are_named_with_the_rest():
    rows = [process_row(_typed(_cell()), "fp8-1024")]
    steps = {"looks": {"seconds": 20.0, "count": 4}, "round_data": {"seconds": 6.5, "count": 2},
             "cell_files": {"seconds": 1.5, "count": 6}}
    totals = _totals(rows, setup_seconds=5.0, run_seconds=150.0, steps=steps)
    assert {name: step.seconds for name, step in totals.parent_steps.items()} == {
        "looks": 20.0, "round_data": 6.5, "cell_files": 1.5}
    text = timing_section(typed_evidence({"timings": [schema.dump(row) for row in rows],
                                          "timing_totals": schema.dump(totals)}))
    assert ("between cells 45.0 s (looks at the evidence 20.0 s (4×), rounds' task data and probes 6.5 s, around the "
            "cell processes (specs, hand-over, reading their files) 1.5 s, the rest 17.0 s)") in text
    # Steps say nothing where "between cells" is not this run's own sum (cells at once): none shown.
    assert _totals(rows, setup_seconds=5.0, run_seconds=150.0, steps=steps, cells_overlap=True).parent_steps == {}


def test_the_parent_clock_sums_each_step_and_counts_it():
    clock = ParentClock()
    for _ in range(3):
        with clock.step("looks"):
            pass
    clock.add("cell_files", 2.0)
    clock.add("cell_files", -1.0)   # a process clock ahead of the parent's by rounding: never negative
    record = clock.record()
    assert record["looks"]["count"] == 3 and 0.0 <= record["looks"]["seconds"] < 1.0
    assert record["cell_files"] == {"seconds": 2.0, "count": 2}
    with pytest.raises(RuntimeError):
        with clock.step("looks"):
            raise RuntimeError("a look that fails still counts")
    assert clock.record()["looks"]["count"] == 4
