"""A real `--model FILE.gguf` conversion with transformers (no vLLM): the default model's GGUF,
copied elsewhere so it is handled as a user file. About 20-50 s per conversion on a small CPU.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from kveval.inputs import models  # noqa: E402
from kveval.inputs.models import ModelError, find_default_gguf, resolve_model  # noqa: E402

pytestmark = pytest.mark.engine  # a real conversion: the slow suite (make test), not make unit


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Convert once for the module; return (the copied GGUF, the ModelInfo, progress lines, home)."""
    try:
        original = find_default_gguf()
    except ModelError as error:  # pragma: no cover - the README install provides it
        pytest.skip(str(error))
    root = tmp_path_factory.mktemp("gguf-model")
    copy = root / "user" / "my-smol.gguf"
    copy.parent.mkdir()
    shutil.copy2(original, copy)
    home = root / "home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVEVAL_HOME", str(home))
        lines: list[str] = []
        info = resolve_model(str(copy), progress=lines.append)
    return copy, info, lines, home


def test_converted_directory_is_a_plain_model(converted):
    copy, info, lines, home = converted
    target = Path(info.path)
    assert target.parent == home / "models" and target.name.startswith("my-smol-")
    assert info.name == "Smollm2 135M 8k Lc100K Mix1 Ep2"  # the GGUF's general.name
    assert info.source == f"GGUF file {copy.resolve()} (dequantised to bf16 once into {target})"
    assert info.ready and any("Converting my-smol.gguf once" in line for line in lines)
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["dtype"] == "bfloat16"
    assert (target / "model.safetensors").is_file()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".converting-")]


def test_tokenizer_keeps_the_chat_template(converted):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted[1].path)
    assert tokenizer.chat_template
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_ready_marker_records_the_source(converted):
    copy, info, _, _ = converted
    marker = json.loads((Path(info.path) / "kveval-model.json").read_text())
    assert marker["source"] == str(copy.resolve())
    assert marker["size"] == copy.stat().st_size
    assert marker["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert marker["architecture"] == "llama"


def test_weights_are_the_dequantised_gguf(converted):
    """The token embedding is stored unpermuted, so it compares directly with gguf's dequantiser."""
    import numpy as np
    from safetensors import safe_open

    copy, info, _, _ = converted
    tensor = next(t for t in gguf.GGUFReader(str(copy)).tensors if t.name == "token_embd.weight")
    with safe_open(str(Path(info.path) / "model.safetensors"), "pt") as f:
        saved = f.get_tensor("model.embed_tokens.weight").float().numpy()
    reference = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(saved.shape)
    assert np.abs(reference - saved).max() <= 0.01 * np.abs(reference).max()  # bf16 rounding


def test_second_resolve_reuses_the_cache(converted, monkeypatch):
    copy, info, _, home = converted
    monkeypatch.setenv("KVEVAL_HOME", str(home))
    marker = Path(info.path) / "kveval-model.json"
    before = marker.stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted a second time")

    monkeypatch.setattr(models, "convert_gguf", no_conversion)
    lines: list[str] = []
    again = resolve_model(str(copy), progress=lines.append)
    assert again == info and lines == [] and marker.stat().st_mtime_ns == before
    # a renamed copy elsewhere has the same content, so it reuses the same directory
    moved = copy.parent.parent / "renamed.gguf"
    shutil.copy2(copy, moved)
    assert resolve_model(str(moved), progress=lines.append).path == info.path


def test_default_model_goes_through_the_same_conversion(default_model_dir):
    # The session's default model (converted by this same code on a fresh machine; CI time: not twice).
    target = Path(default_model_dir)
    assert target == models.kveval_home() / "models" / models.DEFAULT_MODEL_NAME
    # A conversion made by an earlier kveval wrote a shorter marker (source, package only) and is
    # still reused, so the architecture is read from the model's own config, not the marker.
    marker = json.loads((target / "kveval-model.json").read_text())
    assert marker["package"] == models.DEFAULT_MODEL_PACKAGE
    assert json.loads((target / "config.json").read_text())["model_type"] == "llama"
    assert models.default_model_info().ready
    assert "quantization_config" not in json.loads((target / "config.json").read_text())
