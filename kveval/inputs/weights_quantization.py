"""How the checkpoint's weights are quantized (its config's `quantization_config`), and whether kveval's
per-layer K/V range pass (transformers, kveval/worker/kv_ranges.py) can load them here.

vLLM serves AWQ, GPTQ, compressed-tensors (FP8-dynamic, W4A16, ...) and FP8 checkpoints as they are. The
range pass loads the same checkpoint with transformers, which needs each method's own backend package (and,
for transformers' FP8 weights, a GPU). When that is missing the pass cannot run: kveval says so before any
engine starts, and what is lost (the per-layer diagnosis, its remedy and --search's candidates from it).
"""
from __future__ import annotations

import importlib.util
from typing import Annotated, Any, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict

# quant_method -> the import names of which transformers needs at least one to load the weights
BACKENDS: dict[str, tuple[str, ...]] = {
    "awq": ("gptqmodel", "awq"),
    "gptq": ("gptqmodel", "auto_gptq"),
    "compressed-tensors": ("compressed_tensors",),
    "bitsandbytes": ("bitsandbytes",),
    "fp8": ("accelerate",),
}
GPU_ONLY = {"fp8"}   # transformers' fine-grained FP8 weights load on a GPU only


class WeightsQuantization(BaseModel):
    """The checkpoint's weight quantization as its config names it."""

    model_config = ConfigDict(frozen=True)

    method: str                    # quant_method: awq, gptq, compressed-tensors, fp8, bitsandbytes, ...
    detail: str | None = None      # bits / format where the config says (e.g. "4-bit", "float-quantized")

    @property
    def label(self) -> str:
        return f"{self.method} ({self.detail})" if self.detail else self.method


def _mapping(value: Any) -> Any:
    return value if isinstance(value, dict) else None


class _ConfigPart(BaseModel):
    """A part of a checkpoint's config.json as read: keys kveval does not read are ignored, and values are
    taken as they are (configs of many tools and versions); a part that is not a mapping reads as absent."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _QuantizationArgs(_ConfigPart):
    """compressed-tensors' `weights` or `input_activations` of a config group."""

    num_bits: Any = None
    type: Any = None
    strategy: Any = None
    group_size: Any = None
    dynamic: Any = None


class _ConfigGroup(_ConfigPart):
    weights: Annotated[Optional[_QuantizationArgs], BeforeValidator(_mapping)] = None
    input_activations: Annotated[Optional[_QuantizationArgs], BeforeValidator(_mapping)] = None
    format: Any = None


class _QuantizationConfig(_ConfigPart):
    """The `quantization_config` of a config: each method names its bits and format its own way."""

    quant_method: Any = None
    bits: Any = None                 # GPTQ, AWQ (transformers)
    w_bit: Any = None                # AWQ (AutoAWQ)
    format: Any = None
    fmt: Any = None
    config_groups: Any = None        # compressed-tensors: group name -> its _ConfigGroup


class _CheckpointConfig(_ConfigPart):
    quantization_config: Annotated[Optional[_QuantizationConfig], BeforeValidator(_mapping)] = None


def weights_quantization(config: Any) -> WeightsQuantization | None:
    """The `quantization_config` of a transformers config (object or dict), or None for unquantized weights."""
    if isinstance(config, dict):
        raw = _CheckpointConfig.model_validate(config).quantization_config
    else:   # a transformers config holds a dict, or a QuantizationConfig object
        given = getattr(config, "quantization_config", None)
        if given is not None and not isinstance(given, dict):
            given = given.to_dict() if hasattr(given, "to_dict") else vars(given)
        raw = _QuantizationConfig.model_validate(given) if isinstance(given, dict) else None
    if raw is None or not raw.quant_method:
        return None
    bits = raw.bits or raw.w_bit
    detail = f"{bits}-bit" if bits else _scheme(raw) or raw.format or raw.fmt
    return WeightsQuantization(method=str(raw.quant_method), detail=str(detail) if detail else None)


def _scheme(raw: _QuantizationConfig) -> str | None:
    """compressed-tensors' scheme from its first config group, as llm-compressor names them: "W4A16: int4 weights in
    groups of 64" (pack-quantized), "W8A8: fp8 weights per channel, fp8 dynamic activations per token" (FP8-dynamic);
    None where the config has no groups."""
    groups = raw.config_groups
    first = next(iter(groups.values()), None) if isinstance(groups, dict) and groups else None
    group = _ConfigGroup.model_validate(first) if isinstance(first, dict) else None
    weights = group.weights if group is not None else None
    if group is None or weights is None or not weights.num_bits:
        return None
    activations = group.input_activations

    def described(args: _QuantizationArgs, what: str) -> str:
        kind = "fp" if args.type == "float" else "int"
        strategy = args.strategy
        how = (f" in groups of {args.group_size}" if strategy == "group" and args.group_size
               else f" per {strategy}" if strategy else "")
        return f"{kind}{args.num_bits} {'dynamic ' if args.dynamic is True else ''}{what}{how}"

    # An activations part that leaves out num_bits means 16-bit activations (one naming it null says so).
    activation_bits = (activations.num_bits if "num_bits" in activations.model_fields_set else 16) if activations else 16
    scheme = f"W{weights.num_bits}A{activation_bits}: " + described(weights, "weights")
    if activations and activations.num_bits:
        scheme += ", " + described(activations, "activations")
    fmt = raw.format or group.format
    return scheme + (f"; {fmt}" if fmt else "")


def range_pass_obstacle(quantization: WeightsQuantization | None, has_gpu: bool) -> str | None:
    """Why the K/V range pass cannot load these weights on this machine, or None when nothing is known to stop it."""
    if quantization is None:
        return None
    needs = BACKENDS.get(quantization.method)
    if needs and not any(importlib.util.find_spec(name) for name in needs):
        return (f"its {quantization.label} weights need {' or '.join(needs)} for transformers to load them, "
                "and this environment has none")
    if quantization.method in GPU_ONLY and not has_gpu:
        return f"transformers loads {quantization.label} weights on a GPU only, and this machine has none"
    return None
