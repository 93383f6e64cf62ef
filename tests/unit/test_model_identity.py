"""Which weights a run judged (inputs/model_identity.py): the hash follows the weight files' bytes,
not their names' order or their modification times, and the manifest's resume check uses it."""
from __future__ import annotations

import hashlib
import os

from kveval.inputs import model_identity as identity
from kveval.inputs.model_identity import cached_weights, hash_weights, model_identity
from kveval.run.resume import _settings_fingerprint


def _model(folder, shards: dict[str, bytes]):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")          # not a weight file: not hashed
    for name, data in shards.items():
        (folder / name).write_bytes(data)
    return folder


def test_the_hash_covers_every_weight_file_and_only_those(tmp_path):
    one = hash_weights(_model(tmp_path / "a", {"model-00001.safetensors": b"x" * 100, "model-00002.safetensors": b"y"}))
    assert one.files == 2 and one.bytes == 101 and one.method == "sha256 of the weight files"
    lines = "".join(f"{name}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n"
                    for name, data in (("model-00001.safetensors", b"x" * 100), ("model-00002.safetensors", b"y")))
    assert one.sha256 == hashlib.sha256(lines.encode()).hexdigest()
    same = hash_weights(_model(tmp_path / "b", {"model-00002.safetensors": b"y", "model-00001.safetensors": b"x" * 100}))
    assert same.sha256 == one.sha256                                   # another folder, the same weights
    (tmp_path / "b" / "config.json").write_text('{"changed": true}')
    assert hash_weights(tmp_path / "b").sha256 == one.sha256
    (tmp_path / "b" / "model-00002.safetensors").write_bytes(b"z")    # one byte of the weights changed
    assert hash_weights(tmp_path / "b").sha256 != one.sha256
    assert hash_weights(_model(tmp_path / "empty", {})) is None


def test_large_models_are_fingerprinted_and_say_so(tmp_path, monkeypatch):
    monkeypatch.setattr(identity, "FULL_HASH_LIMIT", 10)
    monkeypatch.setattr(identity, "FINGERPRINT_BYTES", 4)
    found = hash_weights(_model(tmp_path / "m", {"w.safetensors": b"0123456789abcdef"}))
    assert found.method.startswith("fingerprint")
    # Only the first and last 4 bytes (and the size) count: a change in the middle is not seen, by design.
    (tmp_path / "m" / "w.safetensors").write_bytes(b"0123XXXXXXXXcdef")
    assert hash_weights(tmp_path / "m").sha256 == found.sha256


def test_hashes_are_remembered_until_a_file_changes(tmp_path, monkeypatch):
    folder = _model(tmp_path / "m", {"w.safetensors": b"abc"})
    cache = tmp_path / "home" / "weights-hashes.json"
    first = cached_weights(folder, cache)
    calls = []
    monkeypatch.setattr(identity, "hash_weights", lambda d: calls.append(d) or first)
    assert cached_weights(folder, cache) == first and calls == []      # read from the cache
    (folder / "w.safetensors").write_bytes(b"abcd")
    os.utime(folder / "w.safetensors", ns=(1, 1))
    cached_weights(folder, cache)
    assert calls == [folder]                                            # size and mtime changed: hashed again


def test_a_hub_id_records_its_revision_and_no_hash(tmp_path):
    found = model_identity("HuggingFaceTB/SmolLM2-135M-Instruct", "a1b2c3", tmp_path / "cache.json")
    assert found.revision == "a1b2c3" and found.weights is None


def test_a_resume_is_refused_when_the_weights_changed_but_not_for_an_older_run(tmp_path):
    def manifest(weights=None):
        model = {"name": "m", "path": "/m"}
        if weights:
            model["weights"] = {"sha256": weights, "method": "sha256 of the weight files", "files": 1, "bytes": 3}
        return {"model": model, "options": {}, "prompt_ids": [], "scoring_ids": []}
    older, now, changed = manifest(), manifest("aa"), manifest("bb")
    assert _settings_fingerprint(older) == _settings_fingerprint(now, older)          # recorded by neither: reused
    assert _settings_fingerprint(now) == _settings_fingerprint(manifest("aa"), now)
    assert _settings_fingerprint(now) != _settings_fingerprint(changed, now)          # other weights: not reused
