"""The parent's caches between looks (issue 18): RunDir keeps each cell file's typed record until the file
changes, and the divergence analysis keeps each pair of sequences' position frame. Neither may change a
result: a rewritten file is read again, and a frame handed out is the caller's own copy."""
from __future__ import annotations

from kveval.analysis.divergence import compare_sequences
from kveval.files import schema
from kveval.files.rundir import write_json_atomic
from tests.support.constructed import record, scoring_phase, started_cell, write_run


def _cells(shape: str = "healthy") -> dict[str, dict]:
    records = [record("short_64-0", [1, 2, 3], "a b c")]
    return {"auto-1024": started_cell("auto", 1024, 1792, records, scoring_phase(40, "same", "same")),
            "fp8-1024": started_cell("fp8", 1024, 3584, records, scoring_phase(40, shape))}


def test_an_unchanged_cell_file_is_parsed_once_and_a_rewritten_one_again(tmp_path):
    store = write_run(tmp_path, [], _cells())
    first = store.cell_result("fp8-1024")
    assert store.cell_result("fp8-1024") is first
    changed = _cells()["fp8-1024"]
    changed["startup_seconds"] = 9.5
    write_json_atomic(store.cell_path("fp8-1024"), changed)
    again = store.cell_result("fp8-1024")
    assert again is not first and again.startup_seconds == 9.5
    # What the parent parsed from the data it just wrote stands for the file, until the file changes.
    typed = schema.parse(schema.CellResult, changed, "x")
    store.remember_cell("fp8-1024", typed)
    assert store.cell_result("fp8-1024") is typed


def test_a_cached_position_frame_gives_the_same_figures_and_a_copy(tmp_path):
    store = write_run(tmp_path, [], _cells("healthy"))
    auto, fp8 = store.cell_result("auto-1024"), store.cell_result("fp8-1024")
    ref = {s.id: s for s in auto.phases.scoring.sequences}
    cand = {s.id: s for s in fp8.phases.scoring.sequences}
    first, per_sequence, _ = compare_sequences(ref, cand)
    first["kl"] = -1.0   # the caller's frame is its own
    second, per_sequence_again, _ = compare_sequences(ref, cand)
    assert (second["kl"] >= 0).all() and per_sequence_again == per_sequence
    fresh = write_run(tmp_path / "other", [], _cells("healthy"))   # equal data, other objects: computed anew
    third, _, _ = compare_sequences({s.id: s for s in fresh.cell_result("auto-1024").phases.scoring.sequences},
                                    {s.id: s for s in fresh.cell_result("fp8-1024").phases.scoring.sequences})
    assert third.equals(second)
