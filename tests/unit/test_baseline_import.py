"""Issue 39 without an engine: the gate on an imported baseline, the no-baseline advice, the preflight lines and
the time estimate (run/preflight.py), and task samples compared by content (run/baseline_import.py)."""
from __future__ import annotations

import json

from kveval.files import schema
from kveval.files.cell_spec import PhaseOptions, ScoringOptions
from kveval.files.rundir import RunDir
from kveval.gate import INCONCLUSIVE, evaluate
from kveval.inputs.kvspec import KVSpec
from kveval.inputs.workloads import PromptSpec
from kveval.run.baseline_import import task_data_differences
from kveval.run.cell_process import CellPlan
from kveval.run.preflight import CellWork, cell_work, estimate_line, fit_problem, preflight_lines
from tests.unit.test_gate import evidence

IMPORTED = {"source": "runs/h200-baseline", "created": "2026-12-06T10:00:00+00:00", "cells": ["auto-8192"],
            "origin": {"host": "Intel Xeon (x86_64)", "gpu": "NVIDIA H200", "vllm": "0.26.0 (vllm)",
                       "attention_backend": "FLASH_ATTN", "profile": "gpu"},
            "cross_machine": True, "differences": ["GPU NVIDIA H200 there, none here"]}


def _reason(verdict, code):
    (reason,) = [r for r in verdict.reasons if r.code == code]
    return reason


def test_a_cross_machine_baseline_is_judged_on_the_wider_profile_and_named():
    # This run on a CPU against an H200 baseline: the CPU profile is the wider; the other way round too.
    for here, there in (("cpu", "gpu"), ("gpu", "cpu")):
        record = {**IMPORTED, "origin": {**IMPORTED["origin"], "profile": there}}
        verdict = evaluate(evidence(profile=here, imported_baseline=record))
        assert verdict.profile.name == "cpu"
        note = _reason(verdict, "imported_baseline").message
        assert "imported from runs/h200-baseline" in note and "NVIDIA H200, vLLM 0.26.0 (vllm), FLASH_ATTN" in note
        assert "carries the difference between the two platforms" in note and "4.5× the baseline run's own" in note


def test_a_baseline_from_this_machine_keeps_the_profile_and_says_so():
    record = {**IMPORTED, "cross_machine": False, "differences": []}
    verdict = evaluate(evidence(profile="gpu", imported_baseline={**record, "origin": {**IMPORTED["origin"],
                                                                                       "profile": "cpu"}}))
    assert verdict.profile.name == "gpu"
    assert _reason(verdict, "imported_baseline").message.endswith("made on this machine")


def test_no_baseline_where_auto_cannot_hold_the_length_names_the_options():
    cells = {"auto-8192": {"kv_spec": "auto", "max_model_len": 8192, "started": False, "failure_reason": "kv_capacity"},
             "fp8-8192": {"kv_spec": "fp8", "max_model_len": 8192, "started": True}}
    reason = _reason(evaluate(evidence(cells=cells, comparisons=[], tasks=None)), "no_baseline")
    assert reason.level == INCONCLUSIVE
    assert "--baseline-from RUN_DIR" in reason.decide and "kveval baseline" in reason.decide
    assert "quality reference" in reason.decide
    # Another reason to fail to start keeps the advice it had.
    cells["auto-8192"]["failure_reason"] = "other"
    assert "--baseline-from" not in _reason(evaluate(evidence(cells=cells, comparisons=[], tasks=None)),
                                            "no_baseline").decide


def _plan(spec: str, length: int, phases=("generation", "scoring", "tasks")) -> CellPlan:
    return CellPlan(id=f"{spec}-{length}", kv=KVSpec(spec), max_model_len=length, engine={}, phases=list(phases),
                    phase_options=PhaseOptions.model_construct(scoring=ScoringOptions(top_k=20, noise=True)))


def _prompt(pid: str, tokens: int, kind: str = "short", max_tokens: int = 10) -> PromptSpec:
    return PromptSpec(id=pid, workload=kind, kind=kind, text="", token_ids=[1] * tokens, max_tokens=max_tokens,
                      target_tokens=tokens)


def test_a_cells_work_counts_what_fits_and_auto_scores_twice():
    prompts = [_prompt("a", 100), _prompt("b", 500), _prompt("over", 2000, "over_limit")]
    documents = [{"id": "doc:800", "token_ids": [1] * 800}, {"id": "doc:3000", "token_ids": [1] * 3000}]
    fp8 = cell_work(_plan("fp8", 1024), prompts, documents, task_docs=4, task_fractions=(0.25, 0.5))
    # generation 600; scoring (100+10) + (500+10) + 800 = 1420; tasks 4 × 1024 × 0.375 = 1536
    assert fp8 == CellWork("fp8-1024", 2, 4, 600 + 1420 + 1536)
    auto = cell_work(_plan("auto", 1024), prompts, documents, task_docs=4, task_fractions=(0.25, 0.5))
    assert auto.prefill_tokens == 600 + 2 * 1420 + 1536


def test_preflight_is_a_few_lines_and_names_the_imported_baseline():
    works = [CellWork("fp8-98304", 24, 36, 2_400_000)]
    lines = preflight_lines(works, ["auto-98304"], [], "runs/h200-baseline")
    assert lines == ["Preflight: 1 cell to run; baseline auto-98304 imported from runs/h200-baseline (not run here)",
                     "  fp8-98304: 24 prompts, 36 task samples, ~2,400K tokens to prefill"]
    two = preflight_lines([CellWork("auto-1024", 12, 2, 12_000), CellWork("fp8-1024", 12, 2, 6_397)], [],
                          ["auto-1024 cannot hold ..."], None)
    assert len(two) == 4 and two[2] == "  fp8-1024: 12 prompts, 2 task samples, ~6,397 tokens to prefill"


def _model(layout: dict) -> schema.ModelEntry:
    return schema.ModelEntry.model_validate({"name": "m", "path": "/m", "source": "local", "ready": True,
                                             "max_position_embeddings": 131072, "dtype": "bfloat16",
                                             "kv_layout": layout})


SMOLLM2 = {"layers": 30, "kv_heads": 3, "head_dim": 64, "attention": "gqa", "per_layer_elements": 384,
           "sliding_window_layers": [], "sliding_window": None}


def test_a_cell_that_cannot_hold_its_length_is_named_with_the_option_that_would_make_it_fit():
    budget = 60 * 2 ** 20   # SmolLM2: 23,040 bytes per token in bf16, 11,520 in FP8
    auto = fit_problem(_plan("auto", 4096), _model(SMOLLM2), budget, False, False)
    assert auto.startswith("auto-4096 cannot hold one request of 4,096 tokens in 60 MiB of KV (needs ~90 MiB)")
    assert "--baseline-from RUN_DIR" in auto and "kveval baseline" in auto
    assert fit_problem(_plan("fp8", 4096), _model(SMOLLM2), budget, False, False) is None   # 45 MiB: fits
    assert "a shorter --max-model-len" in fit_problem(_plan("fp8", 8192), _model(SMOLLM2), budget, False, False)
    assert fit_problem(_plan("auto", 4096), _model(SMOLLM2), budget, False, True) is None   # imported: not run
    assert fit_problem(_plan("auto", 4096), _model(SMOLLM2), None, True, False) is None     # GPU budget unknown yet


def _finished(seconds: float, startup: float) -> schema.CellResult:
    return schema.CellResult.model_construct(started=True, startup_seconds=startup,
                                             process=schema.Process(exit_code=0, seconds=seconds))


def test_the_time_estimate_takes_the_first_cells_start_up_and_pace():
    first = CellWork("auto-8192", 10, 6, 100_000)
    rest = [CellWork("fp8-8192", 10, 6, 50_000), CellWork("fp8-32768", 10, 6, 400_000)]
    line = estimate_line(first, _finished(120.0, 20.0), rest)
    # 1 ms per token: 20 + 50 s and 20 + 400 s
    assert line.startswith("Time estimate: ~8 min for the 2 cells left (auto-8192 took 120 s: 20 s start-up, "
                           "1.00 s per 1K tokens prefilled")
    assert estimate_line(first, _finished(120.0, 20.0), []) is None
    assert estimate_line(first, schema.CellResult.model_construct(started=False, startup_seconds=None,
                                                                 process=None), rest) is None


def _task_run(root, text: str) -> tuple[RunDir, dict]:
    run = RunDir(root)
    (root / "taskdata" / "L1024").mkdir(parents=True)
    (root / "taskdata" / "L1024" / "passkey.jsonl").write_text(text, encoding="utf-8")
    data = {"data_dirs": {"1024": "taskdata/L1024"}, "skipped": {},
            "files": {"1024": {"passkey": {"file": "passkey.jsonl", "docs": 1, "skipped": {}}}}}
    return run, data


def test_task_samples_are_compared_by_content(tmp_path):
    source, theirs = _task_run(tmp_path / "a", json.dumps({"q": 1}))
    run, mine = _task_run(tmp_path / "b", json.dumps({"q": 1}))
    manifest = schema.TaskData.model_validate(theirs)

    class Manifest:
        task_data = manifest
    assert task_data_differences(source, Manifest, run, mine, [1024], True) == []
    (tmp_path / "b" / "taskdata" / "L1024" / "passkey.jsonl").write_text(json.dumps({"q": 2}), encoding="utf-8")
    assert task_data_differences(source, Manifest, run, mine, [1024], True) == [
        "task samples differ by content (passkey@1024)"]
    assert task_data_differences(source, Manifest, run, mine, [1024], False) == []


def test_a_baseline_cell_that_crashed_before_its_phases_is_not_a_baseline():
    # What a CPU baseline looked like after its cell hit the 3,600 s timeout mid-generation (2026-12-07): started,
    # no phase stored. `kveval baseline` says so (exit 3) and --baseline-from refuses it, naming the crash.
    from kveval.run.baseline_import import unusable_phases
    crashed = schema.parse(schema.CellResult, {
        "schema_version": 2, "cell": "auto-2048", "kv_spec": "auto", "max_model_len": 2048, "complete": True,
        "phases": {}, "started": True,
        "info": {"vllm_version": "0.32.0", "platform": "cpu", "device_name": "AMD EPYC", "device_capability": None,
                 "attention_backend": "CPU_ATTN", "model_dtype": "bfloat16", "model_max_model_len": 2048},
        "logged_capacity": {"kv_pool_tokens": 2816, "max_concurrency": 1.38},
        "capacity": {"kv_pool_tokens": 2816, "kv_pool_tokens_source": "cache_config.kv_cache_size_tokens",
                     "max_concurrency": 1.375, "num_blocks": 22, "block_size": 128, "cache_dtype": "auto"},
        "crash": {"message": "kveval stopped the cell after its timeout of 3600 s", "last_log_line": "..."}}, "cell")
    assert unusable_phases(crashed, ["generation", "scoring"]) == [
        "generation, scoring (the cell crashed: kveval stopped the cell after its timeout of 3600 s)"]
    healthy = crashed.model_copy(update={"crash": None, "phases": schema.Phases.model_validate({
        "generation": {"sampling": {"temperature": 0.0}, "records": []},
        "scoring": {"error": "boom"}})})
    assert unusable_phases(healthy, ["generation", "scoring"]) == ["scoring"]
