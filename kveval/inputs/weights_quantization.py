"""How the checkpoint's weights are quantized (its config's `quantization_config`), and whether kveval's
per-layer K/V range pass (transformers, kveval/worker/kv_ranges.py) can load them here.

vLLM serves AWQ, GPTQ, compressed-tensors (FP8-dynamic, W4A16, ...) and FP8 checkpoints as they are. The
range pass loads the same checkpoint with transformers, which needs each method's own backend package (and,
for transformers' FP8 weights, a GPU). When that is missing the pass cannot run: kveval says so before any
engine starts, and what is lost (the per-layer diagnosis, its remedy and --search's candidates from it).
"""
from __future__ import annotations

import importlib.util

from pydantic import BaseModel, ConfigDict

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


def weights_quantization(config) -> WeightsQuantization | None:
    """The `quantization_config` of a transformers config (object or dict), or None for unquantized weights."""
    raw = config.get("quantization_config") if isinstance(config, dict) else getattr(config, "quantization_config", None)
    if raw is not None and not isinstance(raw, dict):
        raw = raw.to_dict() if hasattr(raw, "to_dict") else vars(raw)
    if not raw or not raw.get("quant_method"):
        return None
    bits = raw.get("bits") or raw.get("w_bit")
    detail = f"{bits}-bit" if bits else _scheme(raw) or raw.get("format") or raw.get("fmt")
    return WeightsQuantization(method=str(raw["quant_method"]), detail=str(detail) if detail else None)


def _scheme(raw: dict) -> str | None:
    """compressed-tensors' scheme from its first config group, as llm-compressor names them: "W4A16: int4 weights in
    groups of 64" (pack-quantized), "W8A8: fp8 weights per channel, fp8 dynamic activations per token" (FP8-dynamic);
    None where the config has no groups."""
    groups = raw.get("config_groups")
    group = next(iter(groups.values()), None) if isinstance(groups, dict) and groups else None
    weights = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(weights, dict) or not weights.get("num_bits"):
        return None
    activations = group.get("input_activations") if isinstance(group.get("input_activations"), dict) else None

    def described(args: dict, what: str) -> str:
        kind = "fp" if args.get("type") == "float" else "int"
        strategy = args.get("strategy")
        how = (f" in groups of {args['group_size']}" if strategy == "group" and args.get("group_size")
               else f" per {strategy}" if strategy else "")
        return f"{kind}{args['num_bits']} {'dynamic ' if args.get('dynamic') is True else ''}{what}{how}"

    scheme = f"W{weights['num_bits']}A{activations.get('num_bits', 16) if activations else 16}: "
    scheme += described(weights, "weights")
    if activations and activations.get("num_bits"):
        scheme += ", " + described(activations, "activations")
    fmt = raw.get("format") or group.get("format")
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
