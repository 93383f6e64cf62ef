"""`--model FILE.gguf`: the error paths and the content-keyed cache, without a real conversion.

Tiny GGUFs are written with gguf.GGUFWriter; a fake convert_gguf stands in for transformers where
only the caching is under test.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from kveval.inputs import models  # noqa: E402
from kveval.inputs.models import ModelError, resolve_model  # noqa: E402


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """Every test gets its own $KVEVAL_HOME, so nothing touches the real cache."""
    path = tmp_path / "home"
    monkeypatch.setenv("KVEVAL_HOME", str(path))
    return path


def write_gguf(path: Path, arch: str = "rwkv6", name: str | None = "Tiny Test", seed: int = 0) -> Path:
    """A minimal but well-formed GGUF: an architecture, a name and one small tensor."""
    writer = gguf.GGUFWriter(str(path), arch)
    if name:
        writer.add_name(name)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def fake_convert(monkeypatch):
    """Replace the transformers conversion by one that writes a marker and counts its calls."""
    calls: list[Path] = []

    def convert(gguf_path, target, progress=print, *, label=None, marker_extra=None):
        calls.append(Path(gguf_path))
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        marker = {"source": str(gguf_path), "cache_key": models.gguf_cache_key(Path(gguf_path)),
                  "name": "Tiny Test"}
        (target / models._READY_MARKER).write_text(json.dumps(marker))
        return target

    monkeypatch.setattr(models, "convert_gguf", convert)
    return calls


def quiet(*args, **kwargs):
    pass


# --- errors --------------------------------------------------------------------------------------

def test_missing_gguf_file(tmp_path):
    with pytest.raises(ModelError, match=r"no such file"):
        resolve_model(str(tmp_path / "absent.gguf"), progress=quiet)


def test_relative_missing_gguf_is_not_taken_as_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError, match=r"no such file"):
        resolve_model("absent.gguf", progress=quiet)


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not a gguf" * 10)
    with pytest.raises(ModelError, match=r"not a GGUF file"):
        resolve_model(str(bogus), progress=quiet)


def test_a_non_gguf_file_of_any_name_is_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{}")
    with pytest.raises(ModelError, match=r"not a GGUF file"):
        resolve_model(str(config), progress=quiet)


@pytest.mark.parametrize("keep", [8, 40])
def test_truncated_header(tmp_path, keep):
    whole = write_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:keep])
    with pytest.raises(ModelError, match=r"cannot be read as a GGUF|truncated"):
        models.read_gguf_header(cut, "--model cut.gguf")


def test_truncated_tensor_data(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-16])
    with pytest.raises(ModelError, match=r"truncated"):
        models.read_gguf_header(cut, "--model cut.gguf")


def test_truncated_file_is_refused_by_resolve_model(tmp_path):
    whole = write_gguf(tmp_path / "whole.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole.read_bytes()[:-16])
    with pytest.raises(ModelError, match=r"truncated"):
        resolve_model(str(cut), progress=quiet)
    assert not any((models.models_dir()).glob("*")), "a failed conversion left something behind"


def test_header_fields_are_read(tmp_path):
    header = models.read_gguf_header(write_gguf(tmp_path / "t.gguf", arch="llama"), "t")
    assert header == models.GGUFHeader(architecture="llama", name="Tiny Test", chat_template=None)


def test_unsupported_architecture(tmp_path, home):
    path = write_gguf(tmp_path / "rwkv.gguf", arch="rwkv6")
    with pytest.raises(ModelError) as caught:
        resolve_model(str(path), progress=quiet)
    message = str(caught.value)
    assert "GGUF architecture 'rwkv6' cannot be read by transformers" in message
    assert "supported:" in message and "llama" in message and "qwen2" in message
    assert "tokenizer" not in message.split("supported:")[1]  # mapping sections are not architectures
    assert not any((home / "models").glob("*")), "a refused file left a cache directory"


def test_supported_architecture_list_and_renames():
    supported = models.supported_gguf_architectures()
    assert supported is not None and {"llama", "qwen2", "mistral"} <= set(supported)
    assert "general" not in supported and "tokenizer" not in supported
    models.check_gguf_architecture("qwen2", "x")
    models.check_gguf_architecture("qwen2moe", "x")  # GGUF spelling of transformers' qwen2_moe
    with pytest.raises(ModelError, match="'bert'"):
        models.check_gguf_architecture("bert", "x")


def test_transformers_exception_is_one_line_and_leaves_no_cache_dir(tmp_path, home):
    """t5 is a GGUF architecture transformers reads, but not as a causal LM: it raises ValueError."""
    pytest.importorskip("transformers")
    path = write_gguf(tmp_path / "seq2seq.gguf", arch="t5")
    with pytest.raises(ModelError) as caught:
        resolve_model(str(path), progress=quiet)
    message = str(caught.value)
    assert message.startswith(f"--model {path}: transformers could not convert the GGUF: ValueError: ")
    assert "\n" not in message and len(message) < 600
    assert list((home / "models").iterdir()) == [], "half-written directory left behind"


def test_weights_transformers_cannot_map_are_refused(tmp_path, home):
    """transformers fills unmapped weights randomly and only logs it; that must not become a model."""
    pytest.importorskip("transformers")
    path = write_gguf(tmp_path / "hollow-llama.gguf", arch="llama")
    with pytest.raises(ModelError, match=r"could not fill \d+ weight\(s\) from the GGUF"):
        resolve_model(str(path), progress=quiet)
    assert list((home / "models").iterdir()) == []


def test_one_line_error_text():
    assert models._one_line(ValueError("a\n  b")) == "ValueError: a b"
    assert models._one_line(KeyError()) == "KeyError"
    assert models._one_line(RuntimeError("x" * 1000)).endswith("...")


def test_directory_without_config_or_gguf(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"no config.json"):
        resolve_model(str(tmp_path / "empty"), progress=quiet)


def test_directory_with_several_ggufs(tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    write_gguf(folder / "a.gguf")
    write_gguf(folder / "b.gguf", seed=1)
    with pytest.raises(ModelError, match=r"several GGUF files \(a.gguf, b.gguf\)"):
        resolve_model(str(folder), progress=quiet)


# --- the cache key -------------------------------------------------------------------------------

def test_same_content_same_dir_different_content_different_dir(tmp_path):
    a = write_gguf(tmp_path / "model.gguf", seed=0)
    (tmp_path / "elsewhere").mkdir()
    copy = Path(shutil.copy2(a, tmp_path / "elsewhere" / "model.gguf"))
    (tmp_path / "other").mkdir()
    other = write_gguf(tmp_path / "other" / "model.gguf", seed=1)
    assert models.gguf_model_dir(a) == models.gguf_model_dir(copy)
    assert models.gguf_model_dir(a) != models.gguf_model_dir(other)
    assert models.gguf_model_dir(a).parent == models.models_dir()
    assert models.gguf_model_dir(a).name.startswith("model-")


def test_cache_key_ignores_mtime_but_sees_the_last_bytes(tmp_path):
    a = write_gguf(tmp_path / "a.gguf")
    key = models.gguf_cache_key(a)
    a.touch()
    assert models.gguf_cache_key(a) == key
    data = bytearray(a.read_bytes())
    data[-1] ^= 0xFF
    a.write_bytes(bytes(data))
    assert models.gguf_cache_key(a) != key


def test_cache_key_of_a_large_file_reads_both_ends(tmp_path):
    big = tmp_path / "big.gguf"
    body = bytearray(b"GGUF" + bytes(3 * (1 << 20)))
    big.write_bytes(bytes(body))
    key = models.gguf_cache_key(big)
    body[(1 << 20) + 10] = 1  # the middle is not hashed: a cheap key, not a checksum
    big.write_bytes(bytes(body))
    assert models.gguf_cache_key(big) == key
    body[-10] = 1
    big.write_bytes(bytes(body))
    assert models.gguf_cache_key(big) != key


def test_resolve_converts_once_and_a_moved_copy_reuses_it(tmp_path, fake_convert):
    a = write_gguf(tmp_path / "model.gguf")
    first = resolve_model(str(a), progress=quiet)
    assert first.path == str(models.gguf_model_dir(a))
    assert first.name == "Tiny Test"
    assert first.source == f"GGUF file {a.resolve()} (dequantised to bf16 once into {first.path})"
    assert resolve_model(str(a), progress=quiet).path == first.path
    (tmp_path / "moved").mkdir()
    moved = Path(shutil.move(str(a), tmp_path / "moved" / "renamed.gguf"))
    assert resolve_model(str(moved), progress=quiet).path == first.path
    assert len(fake_convert) == 1


def test_different_content_converts_again(tmp_path, fake_convert):
    a = resolve_model(str(write_gguf(tmp_path / "a.gguf", seed=0)), progress=quiet)
    b = resolve_model(str(write_gguf(tmp_path / "b.gguf", seed=1)), progress=quiet)
    assert a.path != b.path and len(fake_convert) == 2


def test_directory_with_one_gguf(tmp_path, fake_convert):
    folder = tmp_path / "download"
    folder.mkdir()
    path = write_gguf(folder / "model.gguf")
    info = resolve_model(str(folder), progress=quiet)
    assert info.path == str(models.gguf_model_dir(path)) and len(fake_convert) == 1


def test_unfinished_directory_is_not_taken_as_ready(tmp_path, fake_convert):
    a = write_gguf(tmp_path / "model.gguf")
    leftover = models.gguf_model_dir(a)
    leftover.mkdir(parents=True)
    (leftover / "config.json").write_text("{}")  # no ready marker: an interrupted conversion
    assert models.find_converted_gguf(a) is None


def test_publish_replaces_an_unmarked_leftover(tmp_path):
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    (staging / models._READY_MARKER).write_text("{}")
    target.mkdir()
    (target / "junk").write_text("x")
    models._publish(staging, target)
    assert models.is_converted(target) and not (target / "junk").exists() and not staging.exists()


def test_publish_keeps_a_concurrent_finished_conversion(tmp_path):
    staging, target = tmp_path / "staging", tmp_path / "target"
    for folder, tag in ((staging, "mine"), (target, "theirs")):
        folder.mkdir()
        (folder / models._READY_MARKER).write_text(json.dumps({"name": tag}))
    models._publish(staging, target)
    assert models.read_marker(target).name == "theirs"


def test_default_model_names_kept_for_the_cli():
    """cli.py's `kveval models` imports these names."""
    for name in ("ModelError", "default_model_info", "kveval_home", "prepare_default_model"):
        assert hasattr(models, name)


def test_finished_conversion_gets_umask_permissions(tmp_path):
    import os
    import stat

    folder = tmp_path / "staging"
    folder.mkdir(mode=0o700)
    (folder / "model.safetensors").write_bytes(b"x")
    os.chmod(folder / "model.safetensors", 0o600)
    mask = os.umask(0o022)
    try:
        models._apply_umask(folder)
    finally:
        os.umask(mask)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "model.safetensors").stat().st_mode) == 0o644
