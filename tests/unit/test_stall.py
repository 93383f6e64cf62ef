"""A started cell whose engine stops making progress is stopped and recorded as stalled, keeping its
finished phases, and the gate reports it as a defect of that engine path, never as FP8 damage."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from kveval.files.rundir import RunDir
from kveval.files.schema import Stalled
from kveval.gate import evaluate
from kveval.inputs.kvspec import KVSpec
from kveval.files import schema
from kveval.run.cell_process import CellPlan, run_cell_process
from kveval.run.death import explain_death
from tests.support.evidence import typed_evidence
from tests.unit.test_gate import evidence_dict

HANGING = Path(__file__).resolve().parents[1] / "support" / "hanging_cell.py"


def test_a_cell_without_progress_is_stopped_as_stalled_and_keeps_its_phases(tmp_path, monkeypatch):
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HANGING} \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))
    store = RunDir(tmp_path / "run")
    store.cell_log_path("fp8:keep=0,1-8192").parent.mkdir(parents=True)
    store.workloads_path.write_text("[]")
    plan = CellPlan(id="fp8:keep=0,1-8192", kv=KVSpec("fp8", ("0", "1")), max_model_len=8192, engine={},
                    phases=["generation", "scoring"])
    began = time.monotonic()
    facts = run_cell_process(store, plan, timeout_s=120, on_event=lambda event: None, stall_s=2)
    assert time.monotonic() - began < 60            # stopped by the stall watch, not the cell timeout
    assert facts.crash.cause == "stalled"
    assert facts.crash.stalled.phase == "scoring" and facts.crash.stalled.done == 5
    assert "no step of its scoring phase finished" in facts.crash.message
    assert "after step 5 of 10 (last: doc:6554)" in facts.crash.message
    assert [schema.dump(r) for r in facts.phases.generation.records] == [{"prompt_id": "p", "accepted": True}]
    assert facts.process.cause == "stalled"
    # The cell's threads' stacks are in its log: where the engine hung.
    assert "hang_in_the_scheduler" in store.cell_log_path(plan.id).read_text()


def test_engine_start_is_not_watched_for_stalls():
    death = explain_death(None, timed_out=False, timeout_s=None, stopped_by_user=False, kv_cache_memory_bytes=None,
                          log_tail="", stalled=Stalled(phase="tasks", seconds=601, done=None, total=None, item=None))
    assert death.cause == "stalled" and "tasks phase finished for 601 s, so kveval stopped" in death.message
    from kveval.run.cell_process import CellEvent, _ProgressWatch

    watch = _ProgressWatch()
    watch.saw(CellEvent(event="phase", phase="engine_start"))
    watch.since -= 1000                               # CUDA graph capture: minutes without an event
    assert watch.stalled(10) is None
    watch.saw(CellEvent(event="phase", phase="scoring"))
    watch.since -= 11
    assert watch.stalled(10).phase == "scoring"


def test_a_stalled_remedy_is_a_defect_not_fp8_damage():
    message = ("the engine stopped making progress: no step of its scoring phase finished for 300 s after step 5 "
               "of 10, so kveval stopped the cell")
    ev = evidence_dict()
    ev["startup"] = [*ev.get("startup", []), {"cell": "fp8:keep=0,1-8192", "started": True, "crash": message,
                                               "crash_cause": "stalled"}]
    verdict = evaluate(typed_evidence(ev))
    (defect,) = verdict.defects
    assert defect.cell == "fp8:keep=0,1-8192" and "hangs" in defect.message and message in defect.message
    assert any(r.level == "INCONCLUSIVE" and r.cell == "fp8:keep=0,1-8192" for r in verdict.reasons)


def test_requests_the_engine_failed_only_in_the_remedy_are_a_defect_named_in_vllms_words():
    # The H200 run of fp8:keep=0,1 with --enforce-eager (reports/h200-qwen2.5-coder-1.5b-keep-layers-defect):
    # FA3 scheduled the layers kept in bf16 with FP8 metadata and vLLM 0.26 raised this on 5 of 10 prompts.
    message = "RuntimeError: scheduler_metadata must have shape (metadata_size)"
    ev = evidence_dict()
    ev["acceptance"] = {"matrix": [], "rejections": [
        {"cell": "fp8:keep=0,1-8192", "prompt": f"p{i}", "kind": "error", "message": message} for i in range(5)] + [
        {"cell": "auto-8192", "prompt": "over", "kind": "rejected", "message": "VLLMValidationError: too long"}]}
    verdict = evaluate(typed_evidence(ev))
    (defect,) = verdict.defects
    assert defect.cell == "fp8:keep=0,1-8192"
    assert f"vLLM raised `{message}` on 5 requests, the auto cells on none; known in vLLM 0.26" in defect.message
    # The same errors in the baseline too: not specific to the tested configuration, no defect is claimed.
    ev["acceptance"]["rejections"].append({"cell": "auto-8192", "prompt": "p0", "kind": "error", "message": message})
    assert evaluate(typed_evidence(ev)).defects == []
