"""The per-layer K/V scales a checkpoint gives vLLM's FP8 cache, read from its files alone.

vLLM stores fp8(x / scale) per layer. Scales come from the checkpoint (compressed-tensors
`kv_cache_scheme`, ModelOpt `kv_cache_quant_algo`, older FP8 checkpoints); a checkpoint without
them runs at scale 1.0, so the FP8 limit is ±448 whatever the model's real range is. The tensor
names accepted are the ones vLLM remaps (`maybe_remap_kv_scale_name` / `get_cache_scale_mapper`
in vLLM 0.32): `...self_attn.k_scale`, `...k_proj.k_scale` (ModelOpt), `...qkv_proj.k_scale`,
`...k_proj.output_scale` (compressed-tensors), `...k_cache.scale`, and the deprecated single
`...kv_scale` that vLLM uses for both K and V.

No torch model is built: only config.json, hf_quant_config.json and the safetensors files'
scale tensors are read (safetensors needs torch to hand back bf16 tensors; imported lazily).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

UNCALIBRATED_NOTE = "no KV scales in the checkpoint: vLLM runs the FP8 cache at scale 1.0"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# (pattern on the tensor name, which cache tensors it scales)
_SCALE_NAMES = (
    (re.compile(r"\.kv_scale$"), ("k", "v")),
    (re.compile(r"\.([kv])_proj\.output_scale$"), None),
    (re.compile(r"\.([kv])_cache\.scale$"), None),
    (re.compile(r"\.([kv])_scale$"), None),
)


def _result(**changes) -> dict:
    out = {"calibrated": False, "source": None, "k_scale": {}, "v_scale": {}, "auto_is_fp8": False, "notes": []}
    out.update(changes)
    return out


def _read_json(path: Path, notes: list[str]) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        notes.append(f"{path.name} could not be read: {error}")
        return None
    return data if isinstance(data, dict) else None


class _Fields(BaseModel):
    """The few fields kveval reads of a checkpoint's quantization config, as the file gives them (any
    value: vLLM, not kveval, decides what is valid); other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    @classmethod
    def of(cls, value: Any) -> Optional["_Fields"]:
        """The fields of a JSON object; None for anything else (a config without that part)."""
        return cls.model_validate(value) if isinstance(value, dict) else None


class _ConfigJson(_Fields):
    """config.json: where the quantization config is (transformers' name, or compressed-tensors' older one)."""

    quantization_config: Any = None
    compression_config: Any = None


class _QuantConfig(_Fields):
    quant_method: Any = None
    kv_cache_scheme: Any = None       # compressed-tensors: an object (_KvScheme); ModelOpt: a string
    kv_cache_quant_algo: Any = None   # ModelOpt


class _KvScheme(_Fields):
    """compressed-tensors' kv_cache_scheme."""

    type: Any = None
    num_bits: Any = None
    dynamic: Any = None
    strategy: Any = None


class _HfQuantConfig(_Fields):
    """hf_quant_config.json (ModelOpt): the fields at the top or under `quantization`."""

    quantization: Any = None
    kv_cache_quant_algo: Any = None
    kv_cache_scheme: Any = None


def _kv_fp8(scheme) -> bool:
    """A kv_cache_scheme dict / kv_cache_quant_algo string that means an FP8 cache."""
    fields = _KvScheme.of(scheme)
    if fields is not None:
        return fields.type == "float" and fields.num_bits == 8
    return isinstance(scheme, str) and scheme.lower() in ("fp8", "fp8_e4m3")


def _quant_facts(config: dict | None, hf_quant: dict | None) -> tuple[str | None, bool, bool, list[str]]:
    """(source, declares a KV scheme, vLLM resolves kv_cache_dtype auto to FP8, notes)."""
    notes: list[str] = []
    where = _ConfigJson.of(config) or _ConfigJson()
    quant = _QuantConfig.of(where.quantization_config or where.compression_config)
    if quant is not None:
        method = str(quant.quant_method or "")
        scheme = quant.kv_cache_scheme
        if method.startswith("modelopt"):
            algo = scheme or quant.kv_cache_quant_algo
            if algo:
                # vLLM's resolve_kv_cache_dtype_string: ModelOpt KV quantisation makes `auto` FP8.
                return "modelopt quantization_config", True, _kv_fp8(algo), notes
        elif scheme:
            details = _KvScheme.of(scheme)
            if details is not None and details.dynamic:
                notes.append("kv_cache_scheme is dynamic: scales are computed at run time, not read from the checkpoint")
            if details is not None and details.strategy == "attn_head":
                notes.append("kv_cache_scheme strategy attn_head: per-head scales")
            return f"{method or 'compressed-tensors'} kv_cache_scheme", True, False, notes
        elif method:
            return f"{method} quantization_config", False, False, notes
    hf = _HfQuantConfig.of(hf_quant)
    if hf is not None:
        inner = _HfQuantConfig.of(hf.quantization) or hf
        algo = inner.kv_cache_quant_algo or inner.kv_cache_scheme
        if algo:
            return "modelopt hf_quant_config.json", True, _kv_fp8(algo), notes
        return "modelopt hf_quant_config.json (no KV quantisation)", False, False, notes
    return None, False, False, notes


def _scale_target(name: str) -> tuple[int, tuple[str, ...]] | None:
    layer = _LAYER.search(name)
    if layer is None:
        return None
    for pattern, tensors in _SCALE_NAMES:
        match = pattern.search(name)
        if match:
            return int(layer.group(1)), tensors or (match.group(1),)
    return None


def _read_scale_tensors(model_dir: Path, notes: list[str]) -> dict[str, dict[int, list[float]]]:
    from safetensors import safe_open

    found: dict[str, dict[int, list[float]]] = {"k": {}, "v": {}}
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    target = _scale_target(name)
                    if target is None:
                        continue
                    values = handle.get_tensor(name).float().reshape(-1).tolist()
                    layer, tensors = target
                    for tensor in tensors:
                        # A later specific k_scale wins over the deprecated shared kv_scale.
                        if layer not in found[tensor] or not name.endswith(".kv_scale"):
                            found[tensor][layer] = values
        except Exception as error:  # a broken shard: say so, keep what the others hold
            notes.append(f"{file.name} could not be read: {error}".splitlines()[0])
    return found


def read_kv_scales(model_dir: str | Path) -> dict:
    """{"calibrated", "source", "k_scale": {layer: float}, "v_scale": {...}, "auto_is_fp8", "notes"}.

    calibrated: the checkpoint gives vLLM positive K and V scales (layers it leaves out run at 1.0).
    auto_is_fp8: vLLM turns kv_cache_dtype `auto` into FP8 for this checkpoint (ModelOpt KV
    quantisation, vllm#34752), so even a run "without FP8" uses these scales.
    """
    path = Path(str(model_dir)).expanduser()
    if not path.is_dir():
        return _result(notes=[f"{model_dir} is not a local directory (hub id or missing): scales not read; "
                              "assuming " + UNCALIBRATED_NOTE.split(": ", 1)[1]])
    notes: list[str] = []
    config = _read_json(path / "config.json", notes)
    hf_quant = _read_json(path / "hf_quant_config.json", notes)
    source, declared, auto_is_fp8, quant_notes = _quant_facts(config, hf_quant)
    notes += quant_notes
    found = _read_scale_tensors(path, notes) if any(path.glob("*.safetensors")) else {"k": {}, "v": {}}

    out = {"k": {}, "v": {}}
    per_head = {"k": {}, "v": {}}
    for tensor in ("k", "v"):
        for layer, values in sorted(found[tensor].items()):
            positive = [v for v in values if v > 0]
            if not positive:
                continue  # vLLM treats a non-positive scale as "not given": 1.0
            if len(values) > 1:
                per_head[tensor][layer] = values
            # Several values (per head): the smallest is the conservative per-layer bound.
            out[tensor][layer] = min(positive)
    calibrated = bool(out["k"] or out["v"])
    if calibrated and source is None:
        notes.append("scale tensors found but no quantization config: vLLM may not load them")
        calibrated = False
    if declared and not calibrated:
        notes.append("the checkpoint declares KV quantisation but holds no k/v scale tensors: "
                     "vLLM runs the FP8 cache at scale 1.0")
    if not declared and not calibrated:
        notes.append(UNCALIBRATED_NOTE)
    if calibrated:
        layers = len(set(out["k"]) | set(out["v"]))
        notes.append(f"checkpoint k/v scales for {layers} layers (layers without one run at 1.0)")
    if any(per_head.values()):
        notes.append("per-head scales: each layer's smallest head scale is used, a conservative bound")
    result = _result(calibrated=calibrated, source=source if (declared or calibrated) else None,
                     k_scale=out["k"] if calibrated else {}, v_scale=out["v"] if calibrated else {},
                     auto_is_fp8=auto_is_fp8, notes=notes)
    if calibrated and any(per_head.values()):
        result["per_head"] = {f"{t}_scale": per_head[t] for t in ("k", "v") if per_head[t]}
    return result
