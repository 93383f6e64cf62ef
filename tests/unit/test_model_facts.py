"""ModelFacts: the model's config read once per run (inputs/model_config.model_facts), on local
config.json files of the shapes kveval meets: a plain GQA model, RoPE-scaled context, sliding-window
layers, a checkpoint in float32, and an unreadable config."""
from __future__ import annotations

import json

from kveval.inputs.model_config import ModelFacts, ModelSource, model_facts

SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
           "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
           "intermediate_size": 1536, "max_position_embeddings": 8192, "vocab_size": 49152,
           "torch_dtype": "bfloat16"}


def _facts(tmp_path, config: dict) -> ModelFacts:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model_facts(ModelSource(path=str(tmp_path)))


def test_a_plain_model_gives_every_fact_from_one_read(tmp_path):
    facts = _facts(tmp_path, SMOLLM2)
    assert facts.architecture == "LlamaForCausalLM" and facts.layers == 30 and facts.dtype == "bfloat16"
    assert facts.max_position_embeddings == 8192
    assert facts.served_length_limit == (8192, "max_position_embeddings 8,192")
    # FACTS.md: 30 layers · 3 KV heads · 64 dims · K and V = 11,520 elements per token.
    assert facts.kv_layout == {"layers": 30, "kv_heads": 3, "head_dim": 64, "attention": "gqa",
                               "per_layer_elements": 384, "sliding_window_layers": [], "sliding_window": None}


def test_rope_scaling_raises_the_served_limit_and_says_how(tmp_path):
    facts = _facts(tmp_path, {**SMOLLM2, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    assert facts.max_position_embeddings == 8192
    assert facts.served_length_limit == (32768, "max_position_embeddings 8,192 × RoPE scaling factor 4")


def test_sliding_window_layers_are_named(tmp_path):
    config = {**SMOLLM2, "num_hidden_layers": 4, "sliding_window": 512,
              "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}
    facts = _facts(tmp_path, config)
    assert facts.kv_layout["sliding_window_layers"] == [0, 2] and facts.kv_layout["sliding_window"] == 512


def test_a_float32_checkpoint_caches_in_bfloat16(tmp_path):
    assert _facts(tmp_path, {**SMOLLM2, "torch_dtype": "float32"}).dtype == "bfloat16"
    assert _facts(tmp_path, {**SMOLLM2, "torch_dtype": "float16"}).dtype == "float16"


def test_an_unreadable_config_means_unknown_not_an_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    facts = model_facts(ModelSource(path=str(tmp_path)))
    assert facts == ModelFacts() and facts.served_length_limit is None and facts.dtype == "bfloat16"
