"""What a run needs to know from the model's own files: its tokenizer and its config's facts (ModelFacts)."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from kveval.errors import KvevalError
from kveval.inputs.layer_kinds import layer_kinds
from kveval.inputs.thinking_template import thinking_facts
from kveval.inputs.multimodal import Encoder, multimodal_encoder
from kveval.inputs.weights_quantization import WeightsQuantization, weights_quantization
from kveval.inputs.workloads.chat import encode


class ModelSource(BaseModel):
    """Which files kveval's own loaders read (tokenizer, config, the K/V diagnosis): the ones vLLM loads,
    so a --revision, --tokenizer or --trust-remote-code given for vLLM holds for kveval too."""

    model_config = ConfigDict(frozen=True)

    path: str
    revision: Optional[str] = None
    tokenizer: Optional[str] = None            # another tokenizer than the model's own (vLLM's tokenizer)
    tokenizer_revision: Optional[str] = None
    trust_remote_code: bool = False            # the model's own code runs only when the user asked

    @classmethod
    def of(cls, path: str, engine_args: dict) -> "ModelSource":
        """The source vLLM will load for these engine arguments."""
        text = lambda key: str(engine_args[key]) if engine_args.get(key) not in (None, "") else None  # noqa: E731
        return cls(path=path, revision=text("revision"), tokenizer=text("tokenizer"),
                   tokenizer_revision=text("tokenizer_revision"),
                   trust_remote_code=engine_args.get("trust_remote_code") is True)


def load_tokenizer(source: ModelSource):
    """The tokenizer vLLM uses for this model."""
    name = source.tokenizer or source.path
    revision = source.tokenizer_revision if source.tokenizer else source.revision
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=source.trust_remote_code)
    except Exception as error:  # noqa: BLE001 - hub/network/format errors all mean "cannot read it"
        raise KvevalError(f"cannot load the tokenizer of {name!r}{f' at revision {revision}' if revision else ''}: "
                          f"{type(error).__name__}: {error}") from None


def prompt_format(tokenizer) -> dict:
    """How prompts were made: a base model without a chat template (or a tokenizer that drops BOS)
    explains odd outputs, so the manifest and the review say so."""
    probe = encode(tokenizer, "x", add_special_tokens=True)
    bos = getattr(tokenizer, "bos_token_id", None)
    return {"chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "bos_token": getattr(tokenizer, "bos_token", None),
            "adds_bos": bool(bos is not None and probe and probe[0] == bos),
            **thinking_facts(tokenizer)}


class ModelFacts(BaseModel):
    """What a run needs from the model's config, read once per run (model_facts)."""

    model_config = ConfigDict(frozen=True)

    architecture: Optional[str] = None
    max_position_embeddings: Optional[int] = None   # the model's own maximum context
    served_limit: Optional[int] = None               # the longest max_model_len vLLM surely refuses to exceed
    served_limit_why: Optional[str] = None           # how served_limit was derived
    layers: Optional[int] = None                     # num_hidden_layers
    dtype: str = "bfloat16"                          # the checkpoint's dtype as a vLLM kv_cache_dtype name
    kv_layout: Optional[dict] = None                 # what one token costs in the KV cache (_kv_layout)
    weights_quantization: Optional[WeightsQuantization] = None   # AWQ, GPTQ, compressed-tensors, ... (None: none)
    encoder: Optional[Encoder] = None                # a multimodal checkpoint's encoder (None: a text-only model)

    @property
    def served_length_limit(self) -> tuple[int, str] | None:
        return (self.served_limit, self.served_limit_why) if self.served_limit else None


def model_facts(source: ModelSource) -> ModelFacts:
    """The model's config, read once. An unreadable config only means "unknown": every fact is None
    and the dtype bfloat16."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(source.path, revision=source.revision,
                                            trust_remote_code=source.trust_remote_code)
    except Exception:  # noqa: BLE001 - an unreadable config only means "unknown"
        return ModelFacts()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = _positive_number(text, "max_position_embeddings")
    served = _served_limit(text, limit)
    architectures = getattr(config, "architectures", None) or []
    return ModelFacts(architecture=architectures[0] if architectures else None, max_position_embeddings=limit,
                      served_limit=served[0] if served else None, served_limit_why=served[1] if served else None,
                      layers=_positive_number(text, "num_hidden_layers"), dtype=_dtype(config),
                      kv_layout=_kv_layout(text), weights_quantization=weights_quantization(config),
                      encoder=multimodal_encoder(config, source.path))


def _positive_number(text_config, name: str) -> int | None:
    """A positive whole number from the (text) config, or None when it does not say."""
    value = getattr(text_config, name, None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


class _RopeScaling(BaseModel):
    """The config's `rope_scaling` (its keys vary with the RoPE type): kveval reads the factor only."""

    model_config = ConfigDict(extra="ignore")

    factor: Any = None


def _served_limit(text_config, limit: int | None) -> tuple[int, str] | None:
    """max_position_embeddings, times a RoPE scaling factor where the config has one (an upper bound of
    vLLM's own derivation, so kveval never refuses what vLLM would start)."""
    if limit is None:
        return None
    rope = getattr(text_config, "rope_scaling", None) or {}
    factor = _RopeScaling.model_validate(rope).factor if isinstance(rope, dict) else None
    if isinstance(factor, (int, float)) and factor > 1:
        return int(limit * factor), f"max_position_embeddings {limit:,} × RoPE scaling factor {factor:g}"
    return limit, f"max_position_embeddings {limit:,}"


def _dtype(config) -> str:
    """bfloat16 when the config says none or something vLLM would not cache in."""
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
    dtype = dtype.replace("torch.", "")
    return dtype if dtype in ("bfloat16", "float16") else "bfloat16"


def _kv_layout(text) -> dict | None:
    """What one token costs in the KV cache: layers, KV heads, head dim, elements per layer (K and V;
    MLA's one latent), and which layers use a sliding window. None when the config does not say."""
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    if not layers or not heads:
        return None
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or getattr(text, "hidden_size", 0) // heads
    lora_rank = getattr(text, "kv_lora_rank", None)
    if lora_rank:  # MLA: one compressed latent plus the rotary part per token and layer
        per_layer, attention = lora_rank + (getattr(text, "qk_rope_head_dim", None) or 0), "mla"
    else:
        per_layer, attention = 2 * kv_heads * head_dim, "mha" if kv_heads == heads else "gqa"
    types = list(getattr(text, "layer_types", None) or [])
    sliding = [i for i, kind in enumerate(types) if "sliding" in str(kind)]
    if not types and getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
        sliding = list(range(layers))  # a window on every layer (e.g. Mistral-7B-v0.1)
    layout = {"layers": int(layers), "kv_heads": int(kv_heads), "head_dim": int(head_dim), "attention": attention,
              "per_layer_elements": int(per_layer), "sliding_window_layers": sliding,
              "sliding_window": getattr(text, "sliding_window", None) if sliding else None}
    kinds = layer_kinds(text, int(layers))
    # A hybrid: only some layers cache K and V, or some keep a state beside them (Falcon-H1's "hybrid" layers do both).
    if kinds.kv_layers != list(range(int(layers))) or kinds.state_layers:
        layout |= {"kv_layers": kinds.kv_layers, "state_layers": kinds.state_layers,
                   "state_bytes_per_request": kinds.state_bytes_per_request(_dtype(text)),
                   "layer_kinds": sorted(set(kinds.kinds))}
    return layout
