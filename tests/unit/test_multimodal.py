"""Multimodal checkpoints (issue 38): kveval runs the text model. Bytes per token come from the text config, the
encoder vLLM loads is counted (from the safetensors headers) and named in the review as fixed memory, and the
K/V range pass runs the text model of a checkpoint that transformers has no causal-LM class for (Qwen2.5-VL).
Tiny random models made from transformers' own config classes (no downloads)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from kveval.files import schema
from kveval.inputs.model_config import ModelSource, model_facts
from kveval.inputs.multimodal import encoder_weight_bytes
from kveval.render.markdown import escape_cell
from kveval.render.run_section import _encoder_line

TEXT = dict(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, vocab_size=512, max_position_embeddings=1024)
CONFIGS = {
    "gemma3": dict(text_config=dict(TEXT, sliding_window=64, layer_types=["sliding_attention", "full_attention"]),
                   vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      image_size=28, patch_size=14), mm_tokens_per_image=4),
    "qwen2_5_vl": dict(text_config=dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [8, 12, 12]}),
                       vision_config=dict(hidden_size=32, intermediate_size=64, depth=2, num_heads=2, out_hidden_size=128,
                                          fullatt_block_indexes=[1])),
}
ENCODER_NAMES = ("vision_tower", "visual", "multi_modal_projector")


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request, tmp_path_factory):
    """(model type, saved directory, bytes of its encoder and projector parameters as the model itself has them)."""
    config = AutoConfig.for_model(request.param, **CONFIGS[request.param])
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).to(torch.bfloat16)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    encoder = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                  if any(part in name.split(".") for part in ENCODER_NAMES))
    return request.param, path, encoder


def test_bytes_per_token_come_from_the_text_model_and_the_encoder_is_counted(tiny):
    model_type, path, encoder_bytes = tiny
    facts = model_facts(ModelSource(path=str(path)))
    layout = facts.kv_layout
    assert (layout["layers"], layout["kv_heads"], layout["head_dim"]) == (2, 1, 64)   # the text config's
    assert layout["sliding_window_layers"] == ([0] if model_type == "gemma3" else [])
    assert facts.architecture.endswith("ForConditionalGeneration")
    assert facts.encoder.modalities == ["vision"] and facts.encoder.weight_bytes == encoder_bytes > 0


def test_a_text_only_model_has_no_encoder(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"], '
                                          '"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64}')
    assert model_facts(ModelSource(path=str(tmp_path))).encoder is None
    assert encoder_weight_bytes(tmp_path) is None   # no safetensors to read


def test_the_review_says_the_encoder_is_fixed_memory(tiny):
    _, path, encoder_bytes = tiny
    facts = model_facts(ModelSource(path=str(path)))
    entry = schema.EncoderEntry.model_validate(facts.encoder.model_dump(mode="json"))
    line = _encoder_line(entry, {})
    name = escape_cell(facts.architecture, None)   # markdown: Qwen2\\_5\\_VL...
    assert line.startswith(f"- **Encoder:** multimodal checkpoint ({name}): kveval runs its text model")
    assert f"vLLM still loads the vision encoder ({encoder_bytes / 2 ** 20:,.1f} MiB" in line
    assert "counts in fixed memory" in line and "language_model_only=true" in line
    assert "kept vLLM from loading the vision encoder" in _encoder_line(entry, {"language_model_only": True})
    assert _encoder_line(None, {}) is None


def test_the_range_pass_runs_the_text_model_of_a_multimodal_checkpoint(tiny):
    from kveval.worker.kv_ranges import measure_kv_ranges

    model_type, path, _ = tiny
    ranges = measure_kv_ranges(str(path), [list(range(1, 100))], device="cpu")
    assert [layer["layer"] for layer in ranges["layers"]] == [0, 1]
    assert all(layer["k"]["absmax"] > 0 for layer in ranges["layers"])
    assert ranges["model"]["head_dim"] == 64

