"""measure_kv_ranges on tiny random qwen2 (K bias) and gemma3 (k-norm, sliding layers) models
built from configs (no hub): the recording cache works across attention implementations, the
documents are cut to max_tokens, scales set the limits, and the quantile sample is deterministic."""
from __future__ import annotations

import pytest

import kveval.worker.kv_ranges as kv_ranges
from kveval.analysis.kv_range import diagnose

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DOCS = [list(range(1, 40)), list(range(5, 100)), list(range(3, 30))]


def tiny(kind: str, path):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, dtype="bfloat16")
    if kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_hidden_layers=3, **common))
    else:
        config = transformers.Gemma3TextConfig(num_hidden_layers=4, head_dim=16, sliding_window=8,
                                               layer_types=["sliding_attention"] * 3 + ["full_attention"], **common)
        model = transformers.Gemma3ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("kind, layers, types", [
    ("qwen2", 3, ["full_attention"] * 3),
    ("gemma3", 4, ["sliding_attention"] * 3 + ["full_attention"]),
])
def test_every_layer_is_recorded_within_the_token_budget(tmp_path, kind, layers, types):
    model = tiny(kind, tmp_path / kind)
    ranges = kv_ranges.measure_kv_ranges(model, DOCS, max_tokens=100, device="cpu",
                                         scales={"k_scale": {"1": 0.5}, "v_scale": {}})
    measured = ranges["measurement"]
    assert measured["tokens"] == 100 and measured["documents_used"] == 2  # 39 + 61 of the second
    assert [layer["attention_type"] for layer in ranges["layers"]] == types
    assert len(ranges["layers"]) == layers == ranges["model"]["num_layers"]
    for layer in ranges["layers"]:
        assert layer["k"]["count"] == layer["v"]["count"] == 100 * 2 * 16  # tokens × kv heads × head_dim
        assert layer["k"]["absmax"] > 0 and layer["v"]["absmax"] > 0
    assert ranges["layers"][1]["k"]["limits"]["fp8_e4m3"] == 224.0 and ranges["layers"][1]["k"]["scale"] == 0.5
    assert ranges["layers"][0]["k"]["limits"]["fp8_e4m3"] == 448.0
    assert diagnose(ranges)["offending_layers"] == []
    # The query after the rotary embedding, as an FP8 attention kernel (FA3) would quantise it: every
    # attention head (4, against 2 KV heads), at the FP8 limit of scale 1.0.
    for layer in ranges["layers"]:
        assert layer["q"]["count"] == 100 * 4 * 16 and layer["q"]["absmax"] > 0
        assert layer["q"]["limits"]["fp8_e4m3"] == 448.0
    assert diagnose(ranges)["query"]["over_layers"] == []


def test_sampled_quantiles_are_deterministic(tmp_path, monkeypatch):
    model = tiny("qwen2", tmp_path / "qwen2")
    monkeypatch.setattr(kv_ranges, "SAMPLE_LIMIT", 500)
    first = kv_ranges.measure_kv_ranges(model, DOCS, max_tokens=100, device="cpu")
    second = kv_ranges.measure_kv_ranges(model, DOCS, max_tokens=100, device="cpu")
    k0 = first["layers"][0]["k"]
    assert k0["sampled"] is True and k0["sample_size"] == 500 < k0["count"]
    assert k0["p50"] <= k0["p99"] <= k0["p99_9"] <= k0["absmax"]
    assert [layer["k"] for layer in first["layers"]] == [layer["k"] for layer in second["layers"]]
