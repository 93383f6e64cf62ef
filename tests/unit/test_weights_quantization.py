"""Quantized weights (issue 38): the checkpoint's quantization is read from its config, named in the manifest
and the review, and a K/V range pass that cannot load the weights here is announced before any engine
starts, with what is lost."""
from __future__ import annotations

import importlib.util
import json

import pytest

from kveval.files import schema
from kveval.inputs.model_config import ModelSource, model_facts
from kveval.inputs.weights_quantization import WeightsQuantization, range_pass_obstacle, weights_quantization
from kveval.render.run_section import run_section
from kveval.run.setup import diagnosis_obstacle
from kveval.run.options import CompareOptions
from tests.support.evidence import typed_evidence, typed_manifest

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "num_attention_heads": 9,
         "num_key_value_heads": 3, "num_hidden_layers": 30, "intermediate_size": 1536,
         "max_position_embeddings": 8192, "vocab_size": 49152}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
FP8_DYNAMIC = {"quant_method": "compressed-tensors", "format": "float-quantized",
               "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}}


@pytest.mark.parametrize("config,label", [({**LLAMA, "quantization_config": AWQ}, "awq (4-bit)"),
                                          ({**LLAMA, "quantization_config": FP8_DYNAMIC},
                                           "compressed-tensors (W8A16: fp8 weights; float-quantized)"),
                                          (LLAMA, None)])
def test_the_configs_quantization_is_read_once_with_the_model_facts(tmp_path, config, label):
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    facts = model_facts(ModelSource(path=str(tmp_path)))
    assert (facts.weights_quantization.label if facts.weights_quantization else None) == label
    assert weights_quantization(config) == facts.weights_quantization


def test_a_missing_backend_or_gpu_is_an_obstacle_and_an_installed_one_is_not(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("gptqmodel", "awq") else real(name, *a))
    assert "gptqmodel or awq" in range_pass_obstacle(WeightsQuantization(method="awq", detail="4-bit"), has_gpu=True)
    assert range_pass_obstacle(WeightsQuantization(method="compressed-tensors"), has_gpu=False) is None  # installed
    assert "on a GPU only" in range_pass_obstacle(WeightsQuantization(method="fp8"), has_gpu=False)
    assert range_pass_obstacle(None, has_gpu=False) is None


def test_the_run_says_before_any_engine_what_it_loses(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "quantization_config": AWQ}), encoding="utf-8")
    facts = model_facts(ModelSource(path=str(tmp_path)))
    line = diagnosis_obstacle(CompareOptions(model=str(tmp_path)), facts, has_gpu=True)
    assert line.startswith("The per-layer K/V diagnosis cannot run: its awq (4-bit) weights need")
    assert "the remedy" in line and "--search" in line and "\n" not in line
    # Nothing to say when no FP8 cell is asked for, or the diagnosis is off.
    assert diagnosis_obstacle(CompareOptions(model=str(tmp_path), kv=("auto",)), facts, True) is None
    assert diagnosis_obstacle(CompareOptions(model=str(tmp_path), diagnose=False), facts, True) is None


def test_the_review_names_the_weights_served():
    manifest = typed_manifest({"model": {"name": "m", "path": "/m", "source": "local", "ready": True,
                                         "max_position_embeddings": 8192, "weights_quantization": "awq (4-bit)"}})
    text = run_section(manifest, typed_evidence({}))
    assert "weights quantized: awq (4-bit), served as they are" in text
    assert schema.ModelEntry.model_validate({"name": "m", "path": "/m", "source": "local", "ready": True,
                                             "max_position_embeddings": None}).weights_quantization is None


# llm-compressor's two data-free schemes as scripts/make_quantized.py writes them (config_groups trimmed to the keys read).
W4A16_G64 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "input_activations": None, "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64}}}}
FP8_DYNAMIC_W8A8 = {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False}}}}


@pytest.mark.parametrize("raw,label", [
    (W4A16_G64, "compressed-tensors (W4A16: int4 weights in groups of 64; pack-quantized)"),
    (FP8_DYNAMIC_W8A8, "compressed-tensors (W8A8: fp8 weights per channel, fp8 dynamic activations per token; "
                       "float-quantized)")])
def test_compressed_tensors_schemes_are_named_as_llm_compressor_names_them(raw, label):
    assert weights_quantization({"quantization_config": raw}).label == label


def test_the_range_pass_rounds_fp8_dynamic_inputs_as_vllm_does_and_leaves_weight_only_schemes_alone():
    # worker/kv_ranges._fast_cpu_linears: a linear whose compressed-tensors scheme quantizes its input to FP8 per
    # token (llm-compressor's FP8_DYNAMIC) gets each token's input rounded to e4m3 on its own scale in the fp32
    # path; a weight-only (W4A16) linear computes on the unrounded input.
    from types import SimpleNamespace

    import torch

    from kveval.worker.kv_ranges import _fast_cpu_linears

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32, bias=False), torch.nn.Linear(64, 32, bias=False)).bfloat16()
    fp8_token = SimpleNamespace(type="float", num_bits=8, strategy="token", dynamic=True)
    model[0].quantization_scheme = SimpleNamespace(input_activations=fp8_token)
    model[1].quantization_scheme = SimpleNamespace(input_activations=None)
    model[1].weight.data = model[0].weight.data.clone()
    x = (torch.randn(5, 64) * torch.logspace(-2, 2, 5)[:, None]).bfloat16()   # tokens of very different sizes
    assert _fast_cpu_linears(model) == 2
    unrounded = torch.nn.functional.linear(x.float(), model[0].weight.float())
    scale = x.float().abs().amax(dim=-1, keepdim=True) / 448
    rounded = torch.nn.functional.linear((x.float() / scale).to(torch.float8_e4m3fn).float() * scale,
                                         model[0].weight.float())
    with torch.no_grad():
        assert torch.equal(model[0](x), rounded.bfloat16()) and not torch.equal(model[0](x), model[1](x))
        assert torch.equal(model[1](x), unrounded.bfloat16())
