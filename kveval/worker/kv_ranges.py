"""Measure the range of every layer's K and V on real text, exactly as they enter the KV cache.

vLLM writes K after the projection bias, the k-norm (if the model has one) and the rotary
embedding. transformers hands exactly that tensor to `past_key_values.update(...)` in every
attention module (llama, qwen2, gemma3, ...), so a DynamicCache subclass that records statistics
there sees what vLLM would quantise — without vLLM, on any machine (this one cannot run FP8 vLLM).

Run in a child process (it loads the model with torch):

    python -m kveval.worker.kv_ranges --model DIR --documents scoring.json --out ranges.json \
        [--max-tokens 4096] [--device auto|cpu|cuda] [--scales scales.json]

torch and transformers are imported inside functions, so importing this module stays cheap.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kveval.analysis.kv_range import FP8_MAX, normalise_scales
from kveval.files.rundir import write_json_atomic

SCHEMA_VERSION = 1
SAMPLE_LIMIT = 1_000_000   # |x| values kept per layer and tensor for quantiles (torch.quantile caps input size)
SEED = 20240607            # fixed: the same documents always give the same sample
LIMITS = {"fp8_e4m3": FP8_MAX["fp8_e4m3"], "fp8_e5m2": FP8_MAX["fp8_e5m2"]}
QUANTILES = (("p50", 0.5), ("p99", 0.99), ("p99_9", 0.999), ("p99_99", 0.9999))
# Tokens measured at most, by device. On the 2-core CPU 4096 tokens took 17.8 s alone (make demo at
# 9ea140a) and 203 s with the cores shared (a test run beside a real engine), so the CPU measures 2048
# tokens; outlier layers show on every document (the planted K×128 layers were named from one
# 665-token document).
MAX_TOKENS = {"cpu": 2048, "cuda": 4096}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class InputError(ValueError):
    """Bad input (model path, documents, scales); the CLI prints it on one line and exits 2."""


# ---------------------------------------------------------------------------------------------
# Statistics of one layer's K (or V), accumulated over documents.

class _Accumulator:
    """Exact count / absmax / mean / over-limit counts, plus a deterministic random sample of |x|
    for quantiles. Each document contributes sample values in proportion to its tokens."""

    def __init__(self, limits: dict[str, float], scale: float, generator):
        self.limits, self.scale, self.generator = limits, scale, generator
        self.count = self.nonfinite = 0
        self.sum_abs = 0.0
        self.absmax = 0.0
        self.over = dict.fromkeys(limits, 0)
        self.head_absmax = None
        self.samples = []

    def add(self, states, take: int) -> None:
        import torch

        x = states.detach().float().abs()
        for name, limit in self.limits.items():
            self.over[name] += int((x > limit).sum().item())   # inf counts as over, NaN does not
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            self.nonfinite += int((~finite).sum().item())
            x = torch.where(finite, x, torch.zeros_like(x))
        if x.dim() == 4:  # [batch, kv_heads, seq, head_dim]
            heads = x.amax(dim=(0, 2, 3)).cpu()
            self.head_absmax = heads if self.head_absmax is None else torch.maximum(self.head_absmax, heads)
        flat = x.reshape(-1)
        self.count += flat.numel()
        self.sum_abs += float(flat.double().sum().item())
        self.absmax = max(self.absmax, float(flat.max().item()) if flat.numel() else 0.0)
        if take >= flat.numel():
            self.samples.append(flat.cpu())
        elif take > 0:
            index = torch.randint(flat.numel(), (take,), generator=self.generator)
            self.samples.append(flat.cpu()[index])

    def result(self) -> dict:
        import torch

        out = {"count": self.count, "absmax": self.absmax,
               "mean_abs": self.sum_abs / self.count if self.count else None}
        sample = torch.cat(self.samples) if self.samples else torch.empty(0)
        if sample.numel() > SAMPLE_LIMIT:  # rounding per document can overshoot a little
            sample = sample[torch.randint(sample.numel(), (SAMPLE_LIMIT,), generator=self.generator)]
        if sample.numel():
            levels = torch.tensor([level for _, level in QUANTILES], dtype=torch.float32)
            values = torch.quantile(sample, levels).tolist()
            out.update({key: float(value) for (key, _), value in zip(QUANTILES, values)})
        else:
            out.update(dict.fromkeys((key for key, _ in QUANTILES)))
        out.update({
            "sampled": sample.numel() < self.count, "sample_size": int(sample.numel()),
            "nonfinite": self.nonfinite, "scale": self.scale,
            "limits": dict(self.limits), "over": dict(self.over),
            "absmax_per_head": [float(v) for v in self.head_absmax.tolist()] if self.head_absmax is not None else None,
        })
        return out


def _recording_cache_class():
    """A DynamicCache that records K/V statistics on every `update` and then caches as usual.

    transformers 5.x: attention calls `past_key_values.update(key_states, value_states,
    self.layer_idx)` right after the rotary embedding, so K here is post-bias, post-k-norm,
    post-RoPE: the tensor vLLM writes into its cache."""
    from transformers import DynamicCache

    class RecordingCache(DynamicCache):
        def __init__(self, recorder, **kwargs):
            super().__init__(**kwargs)
            self._recorder = recorder

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self._recorder(layer_idx, key_states, value_states)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return RecordingCache


def _record_queries(model, recorder) -> str | None:
    """Route the model's attention through a wrapper that hands every layer's query (after the rotary
    embedding: what an FP8 attention kernel quantises) to `recorder`, then runs the model's own attention.
    None when it is installed, else why the query is not measured."""
    try:
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        current = model.config._attn_implementation
        attend = ALL_ATTENTION_FUNCTIONS.get(current)
        if attend is None:
            return f"the model's attention ({current}) cannot be wrapped"

        def recording_attention(module, query, key, value, attention_mask, **kwargs):
            recorder(module.layer_idx, query)
            return attend(module, query, key, value, attention_mask, **kwargs)

        AttentionInterface.register("kveval_query", recording_attention)
        model.set_attn_implementation("kveval_query")
    except Exception as error:  # noqa: BLE001 - the query is extra evidence; K and V are measured anyway
        return f"the query could not be recorded ({type(error).__name__}: {error})"
    return None


# ---------------------------------------------------------------------------------------------
# Inputs.

def _cut_documents(documents, max_tokens: int, max_positions: int | None) -> list[list[int]]:
    """Documents in order, each truncated so that the total stays within max_tokens."""
    if max_tokens <= 0:
        raise InputError(f"max_tokens must be positive, got {max_tokens}")
    cut, left = [], max_tokens
    for number, document in enumerate(documents):
        if not isinstance(document, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in document):
            raise InputError(f"document {number} is not a list of non-negative integer token ids")
        if left <= 0:
            break
        take = min(len(document), left, max_positions or len(document))
        if take:
            cut.append(list(document[:take]))
            left -= take
    if not cut:
        raise InputError("no tokens to measure: every document is empty")
    return cut


def _scale_table(scales: dict | None) -> dict:
    """The scales as stored in the result: JSON keys, plus calibrated/source when given."""
    try:
        normalised = normalise_scales(scales)
    except (ValueError, TypeError, AttributeError) as error:
        raise InputError(f"bad scales: {error}") from None
    out = {f"{t}_scale": {str(layer): value for layer, value in sorted(normalised[t].items())} for t in ("k", "v")}
    for key in ("calibrated", "source"):
        if scales and key in scales:
            out[key] = scales[key]
    return out


def _resolve_device(device: str) -> str:
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise InputError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("device cuda asked for, but torch sees no CUDA device")
    return device


def _check_model_path(model_path: str) -> None:
    path = Path(model_path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{model_path} has no config.json: not a transformers model directory")
    elif path.exists() or not _HUB_ID.match(model_path):
        raise InputError(f"model directory not found: {model_path}")


def _load_model(model_path: str, device: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model in the checkpoint's dtype (bf16 when it names none), with sdpa attention when the
    architecture supports it; at the revision vLLM loads. The last value: whether quantized weights were
    expanded to that dtype (_dequantized)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    where = {"revision": revision, "trust_remote_code": trust_remote_code}
    config = AutoConfig.from_pretrained(model_path, **where)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    dtype = getattr(text, "dtype", None) or getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.bfloat16
    expanded = _dequantized(config)
    auto = _model_class(config, AutoModelForCausalLM)
    try:
        model = auto.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa", **where, **expanded)
    except (ValueError, ImportError):  # architecture without sdpa support
        model = auto.from_pretrained(model_path, dtype=dtype, **where, **expanded)
    return model.to(device).eval(), text, dtype, bool(expanded)


def _model_class(config, causal_lm):
    """transformers' auto class for the checkpoint: AutoModelForCausalLM, or AutoModelForImageTextToText for a
    multimodal one that has no causal-LM class (Qwen2.5-VL; Gemma-3 and Qwen3.5 have both). Text-only ids run
    through its text model as through a causal LM's."""
    try:
        from transformers import AutoModelForImageTextToText
        from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                            MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    except ImportError:   # an older transformers: the causal LM class, as before
        return causal_lm
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return causal_lm


DEQUANTIZED_NOTE = ("weights quantized with compressed-tensors were expanded to the model dtype for this pass "
                    "(the weight values vLLM serves)")
ACTIVATIONS_NOTE = ("input activations of {layers} linear layers were quantized as the checkpoint's scheme says "
                    "(FP8-dynamic: each token rounded to FP8 e4m3 on its own scale), as vLLM quantizes them")


def _dequantized(config) -> dict:
    """compressed-tensors checkpoints (llm-compressor's FP8-dynamic, W4A16, ...) expanded to the model dtype at
    load: kept compressed, transformers expands every packed weight again in each forward, and the linears
    cannot take the fast fp32 path. {} for other checkpoints."""
    raw = getattr(config, "quantization_config", None)
    method = raw.get("quant_method") if isinstance(raw, dict) else getattr(raw, "quant_method", None)
    if str(method) != "compressed-tensors":
        return {}
    from transformers import CompressedTensorsConfig

    try:
        return {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    except TypeError:   # transformers before the `dequantize` name
        return {"quantization_config": CompressedTensorsConfig(run_compressed=False)}


def _fast_cpu_linears(model) -> int:
    """Run the model's bf16/fp16 linear layers as fp32 GEMMs whose output is rounded to the model
    dtype. That is the arithmetic of every bf16 GEMM (cuBLAS included): products accumulated in
    fp32, the output rounded once. CPUs without native bf16 (AVX2) run it several times faster
    than torch's bf16 kernel. The output embedding is left alone (tied to the input embedding, and
    only one position's logits are computed). Layers whose weights stay quantized (compressed-tensors' packed
    int4 or FP8 weights, which transformers keeps compressed and expands in their own forward) are left as
    they are. Returns how many layers were switched."""
    import torch
    import torch.nn.functional as F

    skip = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    switched = 0
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or module is skip:
            continue
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dtype not in (torch.bfloat16, torch.float16):
            continue
        fp8_inputs = _fp8_token_inputs(module)
        if _quantizes_inputs(module) and not fp8_inputs:   # its own forward rounds the input as the scheme says
            continue
        weight = module.weight.detach().float()
        bias = module.bias.detach().float() if module.bias is not None else None

        def forward(x, weight=weight, bias=bias, fp8_inputs=fp8_inputs):
            inputs = x.float()
            if fp8_inputs:   # FP8-dynamic (W8A8): each token's input rounded to FP8 e4m3 on its own scale, as vLLM does
                scale = inputs.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448.0
                inputs = (inputs / scale).to(torch.float8_e4m3fn).float() * scale
            return F.linear(inputs, weight, bias).to(x.dtype)

        module.forward = forward
        switched += 1
    return switched


def _quantizes_inputs(module) -> bool:
    """A linear whose compressed-tensors scheme quantizes its input activations (FP8-dynamic's W8A8): its own
    forward does that rounding, so it is not replaced by the fp32 GEMM."""
    scheme = getattr(module, "quantization_scheme", None)
    return getattr(scheme, "input_activations", None) is not None


def _fp8_token_inputs(module) -> bool:
    """A scheme that rounds each token's input to FP8 on its own dynamic scale (llm-compressor's FP8_DYNAMIC): the
    fast fp32 path does that rounding itself (compressed-tensors' own forward also re-rounds the weights each call)."""
    args = getattr(getattr(module, "quantization_scheme", None), "input_activations", None)
    return (args is not None and str(getattr(args, "type", "")).endswith("float") and getattr(args, "num_bits", None) == 8
            and str(getattr(args, "strategy", "")).endswith("token") and getattr(args, "dynamic", None) is True)


def _model_facts(model_path: str, text, dtype) -> dict:
    heads = getattr(text, "num_attention_heads", None)
    head_dim = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    return {"path": str(model_path), "model_type": getattr(text, "model_type", None),
            "num_layers": getattr(text, "num_hidden_layers", None),
            "num_attention_heads": heads,
            "num_kv_heads": getattr(text, "num_key_value_heads", None) or heads,
            "head_dim": head_dim, "dtype": str(dtype).replace("torch.", ""),
            "layer_types": _layer_types(text) or None}


def _layer_types(text) -> list:
    """Each layer's attention type, as the config names it ([] when it does not say)."""
    return list(getattr(text, "layer_types", None) or [])


# ---------------------------------------------------------------------------------------------
# Measurement.

def measure_kv_ranges(model_path: str, documents: list[list[int]], *, max_tokens: int | None = None,
                      device: str = "auto", scales: dict | None = None, revision: str | None = None,
                      trust_remote_code: bool = False) -> dict:
    """Per-layer statistics of |K| and |V| as handed to the KV cache, over `documents` (token ids,
    one forward pass each, at most `max_tokens` tokens in all: None takes MAX_TOKENS of the device). `scales` (read_kv_scales' dict, or
    {"k_scale": {layer: s}, "v_scale": {...}}) sets the limits the exact over-limit counts use:
    FP8 max × scale, scale 1.0 for layers it does not name (vLLM's default)."""
    started = time.monotonic()
    _check_model_path(model_path)
    scale_table = _scale_table(scales)   # validates them
    normalised = normalise_scales(scales)
    resolved = _resolve_device(device)
    max_tokens = MAX_TOKENS.get(resolved, MAX_TOKENS["cuda"]) if max_tokens is None else max_tokens
    _cut_documents(documents, max_tokens, None)  # bad documents fail before the model loads

    import inspect

    import torch

    model, text, dtype, dequantized = _load_model(model_path, resolved, revision, trust_remote_code)
    facts = _model_facts(model_path, text, dtype)
    fp32_linears = _fast_cpu_linears(model) if resolved == "cpu" else 0
    max_positions = getattr(text, "max_position_embeddings", None)
    cut = _cut_documents(documents, max_tokens, max_positions)
    total = sum(len(d) for d in cut)

    generator = torch.Generator().manual_seed(SEED)
    stats: dict[tuple[int, str], _Accumulator] = {}
    budget = {"take": 0}

    def record(layer_idx, key_states, value_states):
        for tensor, states in (("k", key_states), ("v", value_states)):
            slot = stats.get((layer_idx, tensor))
            if slot is None:
                scale = normalised[tensor].get(int(layer_idx), 1.0)
                slot = stats[(layer_idx, tensor)] = _Accumulator(
                    {name: value * scale for name, value in LIMITS.items()}, scale, generator)
            slot.add(states, budget["take"])

    def record_query(layer_idx, query_states):
        # vLLM's FlashAttention-3 backend quantises the query to FP8 with the layer's q_scale (1.0 unless
        # the checkpoint gives one) when the KV cache is FP8: the same ±448 limit applies.
        slot = stats.get((layer_idx, "q"))
        if slot is None:
            slot = stats[(layer_idx, "q")] = _Accumulator(dict(LIMITS), 1.0, generator)
        slot.add(query_states, budget["take"])

    query_note = _record_queries(model, record_query)
    cache_class = _recording_cache_class()
    # Only the last position's logits: a full [tokens, vocab] logits tensor would dwarf the model.
    extra = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.inference_mode():
        for document in cut:
            budget["take"] = math.ceil(SAMPLE_LIMIT * len(document) / total)
            ids = torch.tensor([document], dtype=torch.long, device=resolved)
            cache = cache_class(record, config=model.config)
            model(input_ids=ids, past_key_values=cache, use_cache=True, **extra)
            del cache

    layer_types = _layer_types(text)
    layers = []
    for layer_idx in sorted({layer for layer, tensor in stats if tensor != "q"}):
        layers.append({
            "layer": int(layer_idx),
            "attention_type": layer_types[layer_idx] if layer_idx < len(layer_types) else None,
            "k": stats[(layer_idx, "k")].result(), "v": stats[(layer_idx, "v")].result(),
            **({"q": stats[(layer_idx, "q")].result()} if (layer_idx, "q") in stats else {})})
    notes = [] if query_note is None else [query_note]
    if dequantized:
        notes.append(DEQUANTIZED_NOTE)
        if rounded := sum(1 for module in model.modules() if _quantizes_inputs(module)):
            notes.append(ACTIVATIONS_NOTE.format(layers=rounded))
    if getattr(text, "kv_lora_rank", None):
        notes.append("MLA model: vLLM caches the compressed latent (kv_c, k_pe), not these K/V tensors; "
                     "the ranges here do not describe its FP8 cache")
    if facts["num_layers"] and len(layers) != facts["num_layers"]:
        notes.append(f"{len(layers)} of {facts['num_layers']} layers wrote to the cache "
                     "(the others share another layer's KV or are not attention layers)")
    return {
        "schema_version": SCHEMA_VERSION,
        "model": facts,
        "measurement": {"tokens": total, "documents_given": len(documents), "documents_used": len(cut),
                        "max_tokens": max_tokens, "device": resolved, "seconds": round(time.monotonic() - started, 3),
                        "sample_limit": SAMPLE_LIMIT,
                        "linears": ("fp32 GEMM, output rounded to the model dtype" if fp32_linears else "native"),
                        "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__},
        "scales": scale_table,
        "limits_at_scale_1": dict(LIMITS),
        "layers": layers,
        "notes": notes,
    }


# ---------------------------------------------------------------------------------------------
# CLI.

def _read_json(path: str, what: str):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {what} file {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{what} file {path} is not valid JSON: {error}") from None


class _Document(BaseModel):
    """One entry of a documents file (a run's scoring.json: {"id", "token_ids"}); other keys ignored.
    The ids are checked where the documents are cut (_cut_documents)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    token_ids: list[Any]


def load_documents(path: str) -> list[list[int]]:
    """Token id lists from a JSON list of {"token_ids": [...]} objects (a run's scoring.json)."""
    data = _read_json(path, "documents")
    if not isinstance(data, list):
        raise InputError(f"documents file {path} must hold a JSON list of objects with token_ids")
    documents = []
    for number, entry in enumerate(data):
        try:
            documents.append(_Document.model_validate(entry).token_ids)
        except ValidationError:
            raise InputError(f"documents file {path}: entry {number} has no token_ids list") from None
    if not documents:
        raise InputError(f"documents file {path} holds no documents")
    return documents


def load_scales(path: str) -> dict:
    data = _read_json(path, "scales")
    if not isinstance(data, dict):
        raise InputError(f"scales file {path} must hold a JSON object with k_scale / v_scale")
    try:
        normalise_scales(data)
    except (ValueError, TypeError, AttributeError) as error:
        raise InputError(f"scales file {path}: {error}") from None
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kveval.worker.kv_ranges", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="transformers model directory")
    parser.add_argument("--documents", required=True, help="JSON list of objects with token_ids (scoring.json)")
    parser.add_argument("--out", required=True, help="where to write the ranges JSON")
    parser.add_argument("--max-tokens", type=int, default=None, help="tokens measured at most (default: MAX_TOKENS by device)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--scales", default=None, help="JSON with k_scale / v_scale per layer (default 1.0)")
    parser.add_argument("--revision", default=None, help="the model revision vLLM loads (a hub id's branch, tag or commit)")
    parser.add_argument("--trust-remote-code", action="store_true", help="run the model's own code (as vLLM was told)")
    args = parser.parse_args(argv)
    try:
        if args.max_tokens is not None and args.max_tokens <= 0:
            raise InputError(f"--max-tokens must be positive, got {args.max_tokens}")
        _check_model_path(args.model)
        documents = load_documents(args.documents)
        scales = load_scales(args.scales) if args.scales else None
        _cut_documents(documents, args.max_tokens or 1, None)  # validate before loading the model
        result = measure_kv_ranges(args.model, documents, max_tokens=args.max_tokens, device=args.device,
                                   scales=scales, revision=args.revision, trust_remote_code=args.trust_remote_code)
    except InputError as error:
        print(f"kveval.worker.kv_ranges: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # transformers could not load the model (hub id offline, broken files)
        print(f"kveval.worker.kv_ranges: error: cannot load model {args.model}: {error}".splitlines()[0], file=sys.stderr)
        return 2
    write_json_atomic(Path(args.out), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
