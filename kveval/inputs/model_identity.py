"""Which weights a run judged: the revision asked for and a hash of a local model's weight files.

A verdict is about one set of weights. Two runs "of the same model" (a vLLM upgrade compared with
`kveval diff`, a CI gate over time) are comparable only if the weights are the same, so the manifest
records them:

- `revision`: the `--revision` given (vLLM loads that branch, tag or commit); None means the hub's
  default branch, which can move.
- `weights`: for a local directory (also the directory a GGUF was dequantised into), SHA-256 over the
  weight files (name, size and each file's own SHA-256). Above FULL_HASH_LIMIT bytes (a 70B model is
  140 GB: minutes of reading) each file is fingerprinted instead (its size and the SHA-256 of its first
  and last FINGERPRINT_BYTES), and `method` says so. A hub id is not hashed: vLLM downloads it later.

Hashes are kept in $KVEVAL_HOME/weights-hashes.json, keyed by path, size and modification time, so a
model is read once, not once per run.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
FULL_HASH_LIMIT = 16 << 30       # bytes: above this, fingerprints (minutes of reading otherwise)
FINGERPRINT_BYTES = 16 << 20
CHUNK = 8 << 20
WEIGHT_HASHES_FILE = "weights-hashes.json"   # under $KVEVAL_HOME


class WeightsIdentity(BaseModel):
    sha256: str
    method: Literal["sha256 of the weight files", "fingerprint (size, first and last 16 MiB of each file)"]
    files: int
    bytes: int


class ModelIdentity(BaseModel):
    revision: Optional[str] = None
    weights: Optional[WeightsIdentity] = None


def weight_files(directory: Path) -> list[Path]:
    """The model's weight files (top level and sub-folders, as checkpoints shard them), in name order."""
    return sorted((p for p in directory.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES),
                  key=lambda p: p.relative_to(directory).as_posix())


def _file_digest(path: Path, fingerprint: bool) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle:
        if fingerprint and size > 2 * FINGERPRINT_BYTES:
            digest.update(handle.read(FINGERPRINT_BYTES))
            handle.seek(size - FINGERPRINT_BYTES)
            digest.update(handle.read(FINGERPRINT_BYTES))
        else:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
    return digest.hexdigest()


def hash_weights(directory: Path) -> WeightsIdentity | None:
    """SHA-256 over a directory's weight files (None when it has none)."""
    files = weight_files(directory)
    if not files:
        return None
    total = sum(p.stat().st_size for p in files)
    fingerprint = total > FULL_HASH_LIMIT
    combined = hashlib.sha256()
    for path in files:
        line = f"{path.relative_to(directory).as_posix()}\t{path.stat().st_size}\t{_file_digest(path, fingerprint)}\n"
        combined.update(line.encode())
    method = "fingerprint (size, first and last 16 MiB of each file)" if fingerprint else "sha256 of the weight files"
    return WeightsIdentity(sha256=combined.hexdigest(), method=method, files=len(files), bytes=total)


def _cache_key(directory: Path) -> str:
    stats = [(p.relative_to(directory).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in weight_files(directory)]
    return hashlib.sha256(json.dumps([str(directory.resolve()), stats]).encode()).hexdigest()


def cached_weights(directory: Path, cache_file: Path) -> WeightsIdentity | None:
    """hash_weights, remembered in `cache_file` under the files' names, sizes and mtimes."""
    key = _cache_key(directory)
    try:
        cache = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache, dict) and key in cache:
        try:
            return WeightsIdentity.model_validate(cache[key])
        except ValueError:
            pass  # a damaged entry: hash again
    found = hash_weights(directory)
    if found is not None:
        cache = cache if isinstance(cache, dict) else {}
        cache[key] = found.model_dump()
        try:  # a cache we cannot write costs only time
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
            tmp.write_text(json.dumps(cache, indent=1), encoding="utf-8")
            os.replace(tmp, cache_file)
        except OSError:
            pass
    return found


def model_identity(model_path: str, revision: str | None, cache_file: Path) -> ModelIdentity:
    """The revision asked for and, for a local directory, its weights' hash."""
    local = Path(model_path)
    weights = cached_weights(local, cache_file) if local.is_dir() else None
    return ModelIdentity(revision=revision, weights=weights)
