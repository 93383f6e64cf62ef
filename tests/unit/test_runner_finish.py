"""What the parent stores when a cell process dies or is stopped (nothing measured is lost)."""
from __future__ import annotations

from kveval.files import schema
from kveval.run.cell_process import CellPlan, _finish
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.inputs.kvspec import KVSpec
from tests.support.constructed import complete_cell

KV_ERROR = ("ValueError: To serve at least one request with the model's max seq len (2048), (0.04 GiB KV cache is "
            "needed, which is larger than the available KV cache memory (0.04 GiB). Based on the available memory, "
            "the estimated maximum model length is 1664. Try increasing `gpu_memory_utilization`")


def _plan():
    return CellPlan(id="auto-2048", kv=KVSpec("auto"), max_model_len=2048, engine={}, phases=["generation"])


def test_death_before_start_is_classified_from_the_log(tmp_path):
    store = RunDir(tmp_path)
    store.cell_log_path("auto-2048").parent.mkdir(parents=True)
    store.cell_log_path("auto-2048").write_text("INFO loading\nTraceback (most recent call last):\n" + KV_ERROR + "\n")
    facts = _finish(store, _plan(), 1, False, None, 12.0)
    assert facts.started is False and facts.complete is True
    assert facts.failure.reason == "kv_capacity"
    assert facts.failure.estimated_max_model_len == 1664
    assert store.load_cell("auto-2048")["process"]["exit_code"] == 1


def test_crash_after_start_keeps_finished_phases(tmp_path):
    store = RunDir(tmp_path)
    partial = complete_cell({"cell": "auto-2048", "started": True, "complete": False, "max_model_len": 2048,
                             "phases": {"generation": {"sampling": {}, "records": [{"prompt_id": "p", "accepted": True}]}}})
    write_json_atomic(store.cell_path("auto-2048"), partial)
    store.cell_log_path("auto-2048").write_text("Fatal Python error: Segmentation fault\n")
    facts = _finish(store, _plan(), -11, False, None, 30.0)
    assert [schema.dump(r) for r in facts.phases.generation.records] == [{"prompt_id": "p", "accepted": True}]
    assert "crashed with SIGSEGV (exit code -11)" in facts.crash.message
    assert facts.crash.last_log_line == "Fatal Python error: Segmentation fault"


def test_timeout_before_start_says_kveval_stopped_it(tmp_path):
    store = RunDir(tmp_path)
    store.cells_dir.mkdir(parents=True)
    store.cell_log_path("auto-2048").write_text("INFO still importing\n")
    facts = _finish(store, _plan(), -15, True, 5.0, 5.2)
    assert facts.started is False
    assert facts.failure.message.startswith("kveval stopped the cell after its timeout of 5 s")
    assert facts.process.timed_out is True
