"""kveval compare on the real vLLM CPU engine and the default model (a 2 x 2 matrix).

The KV budget (40 MiB) is chosen so that `auto` (bf16, 23,040 bytes/token) holds 1,792 tokens:
enough for max_model_len 1024, not for 2048 — that cell must fail to start with kv_capacity.
FP8 halves the bytes per token, so its pool is twice as large. vLLM's CPU backend runs an FP8 KV
cache only on x86 with AVX-512 or AMX; on other CPUs the fp8 cells must fail as
`unsupported_dtype` in vLLM's words (and vLLM still logs the pool it sized first).
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kveval.cli.commands import cli
from kveval.gate import exit_code
from kveval.files import schema
from tests.integration.conftest import MATRIX_COUNTS

pytestmark = pytest.mark.engine

COUNTS = MATRIX_COUNTS


@pytest.fixture(scope="module")
def run(fp8_auto_matrix):
    # The run itself is in tests/integration/conftest.py: test_tasks_engine pairs its fp8 and auto task samples.
    return fp8_auto_matrix


def _fp8_supported(run) -> bool:
    flags = run.manifest.hardware.cpu_flags
    return any(f.startswith(("avx512", "amx")) for f in flags)


PLANNED = ["auto-1024", "fp8-1024", "auto-2048", "fp8-2048"]


def _reference_expected(run) -> bool:
    """auto-2048 cannot start on 40 MiB; where fp8-2048 starts, an auto quality reference is run there."""
    return bool(run.cell("fp8", 2048).started)


def test_every_planned_cell_is_stored(run):
    reference = ["auto-2048.reference"] if _reference_expected(run) else []
    assert set(run.cells) == set(PLANNED + reference)
    for facts in run.cells.values():
        assert facts.complete is True
        assert (run.run_dir / "cells" / f"{facts.cell}.log").stat().st_size > 0


def test_auto_fails_at_2048_for_kv_capacity(run):
    facts = run.cell("auto", 2048)
    assert facts.started is False
    assert facts.failure.reason == "kv_capacity"
    assert "KV cache" in facts.failure.message
    estimate = facts.failure.estimated_max_model_len
    assert estimate is not None and 1024 <= estimate < 2048


def test_auto_1024_starts_with_measured_pool(run):
    facts = run.cell("auto", 1024)
    assert facts.started is True
    assert facts.capacity.kv_pool_tokens == 1792  # 40 MiB / 23,040 B per token, whole 128-token blocks
    assert facts.capacity.max_concurrency == pytest.approx(1792 / 1024, rel=0.01)
    assert facts.info.platform == "cpu"
    assert facts.info.vllm_version


def test_fp8_cells_start_with_twice_the_pool_or_fail_as_unsupported(run):
    auto_pool = run.cell("auto", 1024).capacity.kv_pool_tokens
    for length in (1024, 2048):
        facts = run.cell("fp8", length)
        if _fp8_supported(run):
            assert facts.started is True, facts.failure
            assert facts.capacity.kv_pool_tokens / auto_pool == pytest.approx(2.0, rel=0.05)
        else:
            assert facts.started is False
            assert facts.failure.reason == "unsupported_dtype"
            assert "FP8" in facts.failure.message
            # vLLM sized the FP8 pool before the backend refused it: still twice auto's.
            assert facts.logged_capacity.kv_pool_tokens / auto_pool == pytest.approx(2.0, rel=0.05)


def test_over_long_prompt_is_rejected_with_engine_message_and_rest_still_runs(run):
    facts = run.cell("auto", 1024)
    records = {r.prompt_id: r for r in facts.phases.generation.records}
    over = records["over_1024-0"]
    assert over.accepted is False
    assert "maximum context length is 1024" in over.rejection
    over_2048 = records["over_2048-0"]
    assert over_2048.accepted is False
    accepted = [r for r in records.values() if r.accepted]
    assert accepted, "a refused prompt must not sink the others"
    for record in accepted:
        assert record.text.strip() and record.output_tokens > 0
        assert record.finish_reason in ("stop", "length")
    started_2048 = [f for f in run.cells.values() if f.started and f.max_model_len == 2048]
    for cell in started_2048:  # a longer cell accepts the prompt a shorter one refused
        assert {r.prompt_id: r for r in cell.phases.generation.records}["over_1024-0"].accepted


def test_prompts_and_probes_run_batched_on_the_real_engine_with_the_time_split(run):
    cell = run.cell("auto", 1024)
    generation = cell.phases.generation
    assert generation.sampling.in_one_batch == len(generation.records) > COUNTS["probe"]
    assert generation.sampling.one_request_at_a_time is False
    # Issue 18: the time inside engine calls and the efficiency against one batched call of a sample.
    for name in ("generation", "scoring"):
        phase = getattr(cell.phases, name)
        assert 0 < phase.engine_seconds <= phase.seconds
        assert phase.efficiency.reference_requests > 0 and phase.efficiency.ratio > 0
    probes = [r for r in generation.records if r.workload == "probe"]
    assert len(probes) == COUNTS["probe"] and all(r.accepted and r.output_tokens > 0 for r in probes)
    assert run.evidence.degeneration.cells["auto-1024"].outputs >= COUNTS["probe"]


def test_scoring_is_stored_with_a_noise_floor_and_the_healthy_model_never_fails(run):
    # The healthy side of test_planted_degradation (whose harmed model must FAIL where FP8 runs): the
    # default model's fp8-1024 on 40 MiB is scored against auto-1024 and never FAILs, on every CPU kind.
    scoring = run.cell("auto", 1024).phases.scoring
    assert scoring.top_k == 20 and scoring.reference_cell == "auto-1024"
    scored = [s for s in scoring.sequences if s.accepted]
    assert {s.kind for s in scored} == {"continuation", "document"}
    assert sum(len(s.positions) for s in scored) >= 100
    assert scoring.noise.sequences
    assert run.verdict.status != "FAIL", [r.message for r in run.verdict.reasons]
    if not run.cell("fp8", 1024).started:
        assert run.verdict.status == "INCONCLUSIVE"


def test_speed_figures_are_positive(run):
    speed = run.cell("auto", 1024).phases.speed
    assert speed.workloads
    for entry in speed.workloads:
        assert entry.runs, entry
        assert entry.ttft_s.median > 0
        assert entry.decode_tok_s.median > 0


def test_review_shows_the_facts_and_report_rerenders_it(run):
    review = run.review_path.read_text()
    assert "auto-2048" in review and "kv_capacity" in review
    assert "✗ rejected" in review and "maximum context length" in review
    assert "2.00×" in review  # the fp8/auto pool ratio, started or sized-then-refused
    if not _fp8_supported(run):
        assert "unsupported_dtype" in review
    run.review_path.unlink()
    result = CliRunner().invoke(cli, ["report", str(run.run_dir)])
    # `kveval report` exits with the verdict's code: the same verdict compare reached.
    assert result.exit_code == exit_code(run.verdict), result.output
    assert run.review_path.read_text() == review
    results = json.loads((run.run_dir / "results.json").read_text())
    assert results["verdict"]["status"] == run.verdict.status
    if not _fp8_supported(run):
        assert run.verdict.status == "INCONCLUSIVE"  # no fp8 cell started: quality not measured


def test_manifest_records_command_versions_and_options(run):
    manifest = json.loads((run.run_dir / "manifest.json").read_text())
    assert manifest["versions"]["vllm"] and manifest["versions"]["torch"]
    assert manifest["options"]["kv_cache_memory_bytes"] == 40 * 2**20
    reference = ["auto-2048.reference"] if _reference_expected(run) else []
    assert [c["id"] for c in manifest["cells"]] == PLANNED + reference
    assert manifest["prompt_format"] == {"chat_template": True, "bos_token": "<|im_start|>", "adds_bos": False}
    assert "the model's chat template applied" in run.review_path.read_text()


def test_the_tasks_phase_runs_by_default_between_scoring_and_speed_and_throughput_last(run):
    facts = run.cell("auto", 1024)
    assert list(schema.dump(facts.phases)) == ["generation", "scoring", "tasks", "speed", "throughput"]
    samples = facts.phases.tasks.samples
    assert {s.task for s in samples} == {"kveval_passkey"}
    assert {s.length_fraction for s in samples} == {0.25, 0.5}  # the quick suite's sizes
    assert all(s.accepted and s.score in (0.0, 1.0) for s in samples)


def test_throughput_sweep_ran_on_the_cells_own_engine(run):
    phase = run.cell("auto", 1024).phases.throughput
    assert phase.levels == [1, 4] and phase.prompt_tokens == 128  # quick suite: 12.5 % of 1024
    assert [r.concurrency for r in phase.runs] == [1, 4]
    for level in phase.runs:
        assert level.accepted and len(level.requests) == level.concurrency
        assert isinstance(level.preemptions, int) and level.preemptions >= 0  # vLLM's own counter, read
        assert all(r.output_tokens == 16 and r.ttft_s and r.ttft_s > 0 for r in level.requests)
    rows = [r for r in run.evidence.throughput if r.cell == "auto-1024"]
    assert [r.concurrency for r in rows] == [1, 4] and all(r.output_tok_s > 0 for r in rows)
    assert "## Throughput under concurrency" in run.review_path.read_text()


def test_predicted_pool_equals_the_measured_one(run):
    assert run.manifest.model.kv_layout.per_layer_elements == 384
    rows = {r.cell: r for r in run.evidence.capacity_model}
    auto = rows["auto-1024"]
    assert auto.bytes_per_token == 23_040 and auto.predicted_tokens == auto.measured_tokens == 1792
    assert auto.deviation == 0 and auto.flag is None
    assert rows["fp8-1024"].predicted_tokens == 3584
    if _fp8_supported(run):
        assert rows["fp8-1024"].deviation == 0
    assert "## KV capacity: predicted vs measured" in run.review_path.read_text()


def test_fp8_at_a_length_auto_cannot_start_is_judged_against_a_quality_reference(run):
    if not _reference_expected(run):
        assert run.manifest.quality_references is None  # nothing started at 2048: nothing to judge
        pytest.skip("this CPU runs no FP8 KV cache: no tested cell started at 2048")
    reference = run.cells["auto-2048.reference"]
    assert reference.started and reference.kv_spec == "auto"
    assert run.manifest.quality_references["auto-2048.reference"].kv_cache_memory_bytes == 80 * 2 ** 20
    [comparison] = [c for c in run.evidence.divergence.comparisons if c.kind == "kv" and c.cell == "fp8-2048"]
    assert comparison.reference == "auto-2048.reference" and comparison.same_length
    assert all(row.cell != "auto-2048.reference" for row in run.evidence.startup)  # never a capacity figure
    assert "judged against auto-2048.reference" in run.review_path.read_text()
