"""Per-layer KV range diagnosis without a model: diagnose / plan / table / section on synthetic
ranges dicts, checkpoint scale reading on tiny directories, and kveval.worker.kv_ranges' CLI errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kveval.analysis.kv_range import (
    FP8_MAX,
    UNCALIBRATED_NOTE,
    diagnose,
    diagnosis_table,
    fp8_max,
    normalise_scales,
    plan_keep_layers,
    skip_layers_argument,
)
from kveval.analysis.json_values import json_safe
from kveval.files import schema
from kveval.inputs.checkpoint_scales import read_kv_scales
from kveval.worker.kv_ranges import main as kv_ranges_main
from kveval.render.kv_range_plot import kv_range_plot
from kveval.render.diagnosis_section import HEADING, render_diagnosis_section


def typed(diagnosis: dict) -> schema.Diagnosis:
    """A diagnose() dict as the evidence holds it (evidence.diagnosis_evidence: JSON-safe, then typed)."""
    return schema.Diagnosis.model_validate(json_safe(diagnosis))


def stats(absmax, *, count=1000, over_e4m3=0, over_e5m2=0, scale=1.0, p99_9=None):
    """One tensor's statistics in kv_ranges' shape, counted against `scale`."""
    p99_9 = absmax * 0.8 if p99_9 is None else p99_9
    return {"count": count, "absmax": absmax, "mean_abs": absmax / 10, "p50": absmax / 20, "p99": absmax * 0.6,
            "p99_9": p99_9, "p99_99": absmax * 0.95, "sampled": False, "sample_size": count, "nonfinite": 0,
            "scale": scale, "limits": {"fp8_e4m3": 448.0 * scale, "fp8_e5m2": 57344.0 * scale},
            "over": {"fp8_e4m3": over_e4m3, "fp8_e5m2": over_e5m2}, "absmax_per_head": [absmax]}


def ranges(layers, *, scales=None, tokens=512):
    """layers: {index: (k_stats, v_stats)}."""
    return {"schema_version": 1, "model": {"num_layers": len(layers)},
            "measurement": {"tokens": tokens, "documents_used": 1},
            "scales": scales or {"k_scale": {}, "v_scale": {}},
            "layers": [{"layer": i, "attention_type": None, "k": k, "v": v} for i, (k, v) in layers.items()]}


CLEAN = ranges({0: (stats(12.0), stats(3.0)), 1: (stats(19.5), stats(6.0)), 2: (stats(15.0), stats(4.0))})
SATURATING = ranges({
    0: (stats(12.0), stats(3.0)),
    1: (stats(900.0, over_e4m3=5), stats(6.0)),            # K just over: 0.5 % clipped
    2: (stats(15.0), stats(2000.0, over_e4m3=80)),         # V far over: 8 % clipped
    3: (stats(14.0), stats(5.0)),
})


# --- diagnose / plan / table ------------------------------------------------------------------

def test_fp8_max_names_fp8_flavours_and_nothing_else():
    assert fp8_max("fp8") == fp8_max("fp8_e4m3") == 448.0
    assert fp8_max("fp8_e5m2") == 57344.0
    assert fp8_max("auto") is None and fp8_max("bfloat16") is None and fp8_max(None) is None
    assert FP8_MAX["fp8"] == 448.0


def test_clean_model_has_no_offending_layer():
    d = diagnose(CLEAN)
    assert d["offending_layers"] == [] and d["offending"] == []
    assert plan_keep_layers(d) == [] and skip_layers_argument(d) is None
    assert d["calibrated"] is False and d["scale_note"] == UNCALIBRATED_NOTE
    assert d["worst"]["layer"] == 1 and d["worst_ratio"] == pytest.approx(19.5 / 448)
    assert d["largest"]["k"]["layer"] == 1 and d["largest"]["k"]["headroom"] == pytest.approx(448 / 19.5)
    assert len(d["rows"]) == 6 and not any(r["saturates"] for r in d["rows"])


def test_saturating_layers_are_found_with_exact_shares_sorted_by_severity():
    d = diagnose(SATURATING)
    assert d["offending_layers"] == [1, 2]
    assert [(o["layer"], o["tensor"]) for o in d["offending"]] == [(2, "v"), (1, "k")]  # 8 % before 0.5 %
    worst = d["offending"][0]
    assert worst["share_over"] == pytest.approx(0.08) and worst["limit"] == 448.0 and worst["share_exact"]
    assert d["worst"] == {"layer": 2, "tensor": "v", "absmax": 2000.0, "limit": 448.0, "ratio": 2000.0 / 448}
    assert plan_keep_layers(d) == [1, 2]
    assert skip_layers_argument(d) == "--kv-cache-dtype-skip-layers 1 2"


def test_offending_layers_are_the_layers_whose_k_or_v_saturates():
    d = diagnose(SATURATING)
    saturating = {r["layer"] for r in d["rows"] if r["saturates"]}
    assert set(plan_keep_layers(d)) == saturating
    # Every layer left out of the plan stays within its limit.
    assert all(r["absmax"] <= r["limit"] for r in d["rows"] if r["layer"] not in plan_keep_layers(d))


def test_measured_scales_raise_the_limit_and_exact_counts_are_used():
    scaled = ranges({0: (stats(900.0, scale=4.0), stats(3.0)), 1: (stats(12.0), stats(3.0))},
                    scales={"k_scale": {"0": 4.0}, "v_scale": {}, "calibrated": True, "source": "test"})
    d = diagnose(scaled)
    assert d["calibrated"] is True and "test" in d["scale_note"]
    row = next(r for r in d["rows"] if r["layer"] == 0 and r["tensor"] == "k")
    assert row["limit"] == 448.0 * 4 and row["saturates"] is False and row["share_exact"] is True
    assert d["offending_layers"] == []


def test_other_scales_than_measured_still_decide_saturation_exactly():
    # Counted at scale 4 (nothing over 1792), diagnosed at scale 1.0: absmax 900 > 448 clips.
    scaled = ranges({0: (stats(900.0, scale=4.0), stats(3.0))}, scales={"k_scale": {"0": 4.0}, "v_scale": {}})
    d = diagnose(scaled, scales={"k_scale": {}, "v_scale": {}, "calibrated": False})
    assert d["offending_layers"] == [0]
    row = d["offending"][0]
    assert row["share_exact"] is False
    # p50 = 45, p99 = 540 > 448: the bound from the quantiles is 1 - 0.5.
    assert row["share_over"] == pytest.approx(0.5)


def test_string_layer_keys_and_bad_scales():
    assert normalise_scales({"k_scale": {"3": 2.0}, "v_scale": {7: 0.5}}) == {"k": {3: 2.0}, "v": {7: 0.5}}
    with pytest.raises(ValueError, match="positive"):
        normalise_scales({"k_scale": {"1": -1.0}})


def test_e5m2_has_a_far_wider_range():
    d = diagnose(SATURATING, kv_cache_dtype="fp8_e5m2")
    assert d["fp8_max"] == 57344.0 and d["offending_layers"] == []
    huge = ranges({0: (stats(60000.0, over_e4m3=500, over_e5m2=2), stats(1.0))})
    d = diagnose(huge, kv_cache_dtype="fp8_e5m2")
    assert d["offending_layers"] == [0] and d["offending"][0]["share_over"] == pytest.approx(0.002)


def test_non_fp8_cache_has_no_limit():
    d = diagnose(SATURATING, kv_cache_dtype="auto")
    assert d["fp8_max"] is None and d["offending_layers"] == [] and "not FP8" in d["note"]
    assert all(r["limit"] is None for r in d["rows"])
    assert any("not FP8" in line for line in render_diagnosis_section(typed(d)))


def test_empty_and_error_ranges():
    empty = diagnose(ranges({}))
    assert empty["rows"] == [] and empty["worst_ratio"] is None and plan_keep_layers(empty) == []
    table = diagnosis_table(empty)
    assert table.empty and "share_over" in table.columns
    failed = diagnose({"error": "CUDA out of memory"})
    assert failed["error"] == "CUDA out of memory" and plan_keep_layers(failed) == []


def test_table_has_a_row_per_layer_and_tensor():
    table = diagnosis_table(diagnose(SATURATING))
    assert len(table) == 8 and set(table.tensor) == {"k", "v"}
    assert table.loc[table.saturates, "layer"].tolist() == [1, 2]
    assert diagnosis_table(None).empty


# --- markdown section and plot -----------------------------------------------------------------

def test_section_for_a_clean_model_names_the_largest_k_and_its_headroom():
    lines = render_diagnosis_section(typed(diagnose(CLEAN)), plot_file="kv_range.png")
    text = "\n".join(lines)
    assert lines[0] == HEADING
    assert "scale 1.0" in text and "512 tokens" in text
    assert "No layer's K or V leaves the FP8 range (largest |K| is 19.5 in layer 1, 23× below the limit" in text
    assert "![per-layer K/V range vs the FP8 limit](kv_range.png)" in text


def test_section_for_saturating_layers_tables_them_and_gives_the_flag():
    text = "\n".join(render_diagnosis_section(typed(diagnose(SATURATING))))
    assert "**2 layers leave the FP8 range**" in text
    assert "| 2       | V        | 2,000" in text and "8 %" in text
    assert "`--kv-cache-dtype-skip-layers 1 2`" in text
    assert "![" not in text  # no plot file given


def test_section_says_calibrated_when_the_checkpoint_has_scales():
    scaled = ranges({0: (stats(10.0, scale=0.1), stats(1.0))},
                    scales={"k_scale": {"0": 0.1}, "v_scale": {}, "calibrated": True,
                            "source": "compressed-tensors kv_cache_scheme"})
    text = "\n".join(render_diagnosis_section(typed(diagnose(scaled))))
    assert "runs calibrated" in text and "compressed-tensors kv\\_cache\\_scheme" in text


def test_section_without_or_with_a_failed_diagnosis():
    assert "not measured" in render_diagnosis_section(None)[-1]
    line = render_diagnosis_section(typed(diagnose({"error": "model | broken"})))[-1]
    assert "could not be measured" in line and "model \\| broken" in line


def test_a_query_past_the_fp8_range_is_told_apart_from_the_cache():
    # Qwen2.5's case: K and V fit, the query of layer 0 does not (FA3 quantises Q with an FP8 cache).
    measured = ranges({0: (stats(360.0), stats(3.0)), 1: (stats(112.0), stats(6.0)), 2: (stats(13.0), stats(4.0))})
    for layer, q in zip(measured["layers"], (stats(1500.0, over_e4m3=40), stats(90.0), stats(30.0))):
        layer["q"] = q
    diagnosis = diagnose(measured)
    assert diagnosis["offending_layers"] == [] and plan_keep_layers(diagnosis) == []   # the cache does not clip
    assert diagnosis["query"]["over_layers"] == [0] and diagnosis["query"]["largest"]["layer"] == 0
    text = "\n".join(render_diagnosis_section(typed(diagnosis)))
    assert "largest |Q| is 1,500 in layer 0 (median layer peak 90)" in text
    assert "leaves the FP8 range in layer 0, so its attention scores are computed from clipped queries" in text
    assert "|Q|" not in "\n".join(render_diagnosis_section(typed(diagnose(CLEAN))))   # not measured: nothing said


def test_plot_is_written_and_skipped_without_rows(tmp_path):
    assert kv_range_plot(typed(diagnose(ranges({}))), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
    path = kv_range_plot(typed(diagnose(SATURATING)), tmp_path / "sat.png")
    assert path == tmp_path / "sat.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Different scales per layer draw per-layer limits.
    scaled = ranges({0: (stats(10.0, scale=0.5), stats(1.0)), 1: (stats(12.0), stats(2.0))},
                    scales={"k_scale": {"0": 0.5}, "v_scale": {}})
    assert kv_range_plot(typed(diagnose(scaled)), tmp_path / "scaled.png").stat().st_size > 1000


# --- checkpoint scales -------------------------------------------------------------------------

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2}


def write_checkpoint(directory, config, tensors=None, hf_quant=None):
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (directory / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    weights = {"model.layers.0.self_attn.k_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}
    weights.update({name: torch.tensor(value, dtype=torch.float32) for name, value in (tensors or {}).items()})
    save_file(weights, str(directory / "model.safetensors"))
    return directory


def test_plain_checkpoint_is_uncalibrated(tmp_path):
    out = read_kv_scales(write_checkpoint(tmp_path / "plain", LLAMA_CONFIG))
    assert out["calibrated"] is False and out["source"] is None and out["auto_is_fp8"] is False
    assert out["k_scale"] == {} and out["v_scale"] == {}
    assert UNCALIBRATED_NOTE in out["notes"]


def test_compressed_tensors_scales(tmp_path):
    config = {**LLAMA_CONFIG, "quantization_config": {
        "quant_method": "compressed-tensors",
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}}}
    tensors = {"model.layers.0.self_attn.k_scale": 0.25, "model.layers.0.self_attn.v_scale": 0.125,
               "model.layers.1.self_attn.k_proj.output_scale": 2.0,
               "model.layers.1.self_attn.v_proj.output_scale": 0.5}
    out = read_kv_scales(write_checkpoint(tmp_path / "ct", config, tensors))
    assert out["calibrated"] is True and out["source"] == "compressed-tensors kv_cache_scheme"
    assert out["k_scale"] == {0: 0.25, 1: 2.0} and out["v_scale"] == {0: 0.125, 1: 0.5}
    assert out["auto_is_fp8"] is False  # vLLM resolves `auto` to FP8 only for ModelOpt
    # The result feeds diagnose directly.
    d = diagnose(ranges({0: (stats(150.0, scale=0.25, over_e4m3=3), stats(1.0)),
                         1: (stats(150.0, scale=2.0), stats(1.0))}), scales=out)
    assert d["calibrated"] is True
    assert [r["limit"] for r in d["rows"] if r["tensor"] == "k"] == [112.0, 896.0]
    assert d["offending_layers"] == [0]


def test_compressed_tensors_scheme_without_scale_tensors_runs_at_one(tmp_path):
    config = {**LLAMA_CONFIG, "quantization_config": {
        "quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
    out = read_kv_scales(write_checkpoint(tmp_path / "ct0", config))
    assert out["calibrated"] is False and out["k_scale"] == {}
    assert any("holds no k/v scale tensors" in note for note in out["notes"])


def test_modelopt_hf_quant_config_makes_auto_fp8(tmp_path):
    hf_quant = {"producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    tensors = {"model.layers.0.self_attn.k_proj.k_scale": 0.03, "model.layers.0.self_attn.v_proj.v_scale": 0.02,
               "model.layers.1.self_attn.k_proj.k_scale": 0.05, "model.layers.1.self_attn.v_proj.v_scale": 0.04}
    out = read_kv_scales(write_checkpoint(tmp_path / "mo", LLAMA_CONFIG, tensors, hf_quant))
    assert out["calibrated"] is True and out["auto_is_fp8"] is True
    assert out["source"] == "modelopt hf_quant_config.json"
    assert out["k_scale"] == pytest.approx({0: 0.03, 1: 0.05}) and out["v_scale"] == pytest.approx({0: 0.02, 1: 0.04})


def test_deprecated_kv_scale_serves_k_and_v(tmp_path):
    config = {**LLAMA_CONFIG, "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}}
    out = read_kv_scales(write_checkpoint(tmp_path / "kv", config, {"model.layers.1.self_attn.kv_scale": 0.5}))
    assert out["calibrated"] is True and out["k_scale"] == {1: 0.5} and out["v_scale"] == {1: 0.5}


def test_missing_directory_or_hub_id(tmp_path):
    for model in (str(tmp_path / "nowhere"), "HuggingFaceTB/SmolLM2-135M-Instruct"):
        out = read_kv_scales(model)
        assert out["calibrated"] is False and out["k_scale"] == {} and out["auto_is_fp8"] is False
        assert "not a local directory" in out["notes"][0]


# --- kveval.worker.kv_ranges CLI errors (all caught before torch is loaded) ----------------------------

@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    return tmp_path / "model"


def run_cli(capsys, *args):
    code = kv_ranges_main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (None, "documents file not found"),
    ("{not json", "is not valid JSON"),
    (json.dumps({"token_ids": [1, 2]}), "must hold a JSON list"),
    (json.dumps([{"id": "doc:0"}]), "entry 0 has no token_ids list"),
    (json.dumps([{"token_ids": [1, "two"]}]), "document 0 is not a list of non-negative integer token ids"),
    (json.dumps([{"token_ids": []}]), "every document is empty"),
    (json.dumps([]), "holds no documents"),
])
def test_cli_rejects_bad_documents(tmp_path, model_dir, capsys, content, message):
    documents = tmp_path / "docs.json"
    if content is not None:
        documents.write_text(content)
    code, err = run_cli(capsys, "--model", str(model_dir), "--documents", str(documents), "--out",
                        str(tmp_path / "out.json"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.json").exists()


def test_cli_rejects_bad_model_tokens_and_scales(tmp_path, model_dir, capsys):
    documents = tmp_path / "docs.json"
    documents.write_text(json.dumps([{"token_ids": [1, 2, 3]}]))
    common = ["--documents", str(documents), "--out", str(tmp_path / "out.json")]
    code, err = run_cli(capsys, "--model", str(tmp_path / "missing"), *common)
    assert code == 2 and "model directory not found" in err
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, "--model", str(tmp_path / "empty"), *common)
    assert code == 2 and "has no config.json" in err
    code, err = run_cli(capsys, "--model", str(model_dir), "--max-tokens", "0", *common)
    assert code == 2 and "--max-tokens must be positive" in err
    scales = tmp_path / "scales.json"
    scales.write_text(json.dumps({"k_scale": {"0": -2}}))
    code, err = run_cli(capsys, "--model", str(model_dir), "--scales", str(scales), *common)
    assert code == 2 and "must be a positive number" in err


def test_cli_error_is_one_line_without_traceback_in_a_child_process(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kveval.worker.kv_ranges", "--model", str(tmp_path / "missing"),
                             "--documents", str(tmp_path / "docs.json"), "--out", str(tmp_path / "out.json")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("kveval.worker.kv_ranges: error: model directory not found")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
