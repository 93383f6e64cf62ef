"""What one cell asks of vLLM: the settings and the keyword arguments `vllm.LLM` gets. No vLLM import,
so the tests' stand-in engine (worker/fake_engine.py) shares it with worker/engine.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineSettings:
    """What one cell asks of vLLM. `extra` passes straight through to `vllm.LLM`."""

    model: str
    kv_cache_dtype: str
    max_model_len: int
    seed: int = 0
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    # Layers whose cache keeps the model dtype while the rest use kv_cache_dtype (vLLM >= 0.26).
    kv_cache_dtype_skip_layers: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def llm_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "enforce_eager": self.enforce_eager,
            # Per-request timing (TTFT, decode) only exists with stats on.
            "disable_log_stats": False,
            # Repeated speed runs of the same prompt must not be served from the prefix cache.
            "enable_prefix_caching": False,
        }
        if self.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.kv_cache_dtype_skip_layers:
            kwargs["kv_cache_dtype_skip_layers"] = list(self.kv_cache_dtype_skip_layers)
        kwargs.update(self.extra)
        return kwargs
