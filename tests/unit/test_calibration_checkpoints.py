"""Calibrated checkpoint copies (run/calibration.py, issue 20): a model that carries its own K/V scales is
used as it is; a scaled spec without its copy is refused; the copy is made once and reused; --search's
--kv rules. The calibration child is the fake (KVEVAL_ENGINE=fake): nothing here needs llm-compressor."""
from __future__ import annotations

import json

import pytest

from kveval import api
from kveval.errors import KvevalError
from kveval.files.calibration import CalibrationRequest
from kveval.inputs.calibration_documents import CalibrationDocuments
from kveval.inputs.kvspec import KVSpec
from kveval.run import calibration
from kveval.run.plan import cell_plan
from kveval.worker.fake_calibrate import calibrate as fake_calibrate

CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "num_key_value_heads": 2,
          "num_attention_heads": 2, "hidden_size": 8, "max_position_embeddings": 512, "torch_dtype": "bfloat16"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("KVEVAL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KVEVAL_ENGINE", "fake")
    calibration.toolkit_dir().mkdir(parents=True)
    (calibration.toolkit_dir() / ".complete").write_text("test")
    return tmp_path


def _model(path):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    return path


DOCUMENTS = CalibrationDocuments(names=["a.txt"], token_ids=[[1, 2, 3, 4]])


def test_a_model_with_its_own_scales_is_used_as_it_is(home):
    scaled = home / "scaled"
    fake_calibrate(CalibrationRequest(model=str(_model(home / "m")), out=str(scaled), strategy="tensor",
                                      documents=[[1, 2]], document_names=["a.txt"]))
    notes = []
    made = calibration.calibrated_checkpoint(str(scaled), "tensor", DOCUMENTS, "m", notes.append)
    assert made.path == str(scaled) and not made.calibrated_by_kveval and made.scales["calibrated"]
    assert "carries its own K/V scales" in notes[0]


def test_a_copy_is_made_once_then_reused_and_holds_scales(home):
    model = _model(home / "m")
    first = calibration.calibrated_checkpoint(str(model), "head", DOCUMENTS, "My Model", lambda _: None)
    assert first.calibrated_by_kveval and not first.reused and first.scales["calibrated"]
    assert first.record["strategy"] == "attn_head" and first.scales["per_head"]
    assert first.path.startswith(str(home / "home" / "calibrated" / "my-model-head-"))
    again = calibration.calibrated_checkpoint(str(model), "head", DOCUMENTS, "My Model", lambda _: None)
    assert again.path == first.path and again.reused
    other_text = CalibrationDocuments(names=["b.txt"], token_ids=[[5, 6]])
    assert calibration.calibrated_checkpoint(str(model), "head", other_text, "My Model", lambda _: None).path != first.path


def test_a_scaled_cell_without_its_copy_is_refused():
    options = api.compare_options(kv=["fp8:scaled", "auto"], max_model_len=[1024])
    with pytest.raises(KvevalError, match="no calibrated checkpoint"):
        cell_plan(options, "/m", None, KVSpec("fp8", scaled="tensor"), 1024)


def test_search_starts_its_own_ladder():
    assert api.compare_options(kv=["search"], max_model_len=[1024]).kv == ("fp8", "auto")
    options = api.compare_options(search=True, max_model_len=[1024])
    assert options.search and options.kv == ("fp8", "auto")
    with pytest.raises(KvevalError, match="--search tries its own ladder"):
        api.compare_options(kv=["fp8:keep=0", "auto"], search=True, max_model_len=[1024])
