"""What a run needs to know from the model's own files: its tokenizer, context limit, layer count and dtype."""
from __future__ import annotations

from kveval.errors import KvevalError


def load_tokenizer(model_path: str, trust_remote_code: bool = False):
    """The model's tokenizer; its own code runs only when the user asked (trust_remote_code)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except Exception as error:  # noqa: BLE001 - hub/network/format errors all mean "cannot read it"
        raise KvevalError(f"cannot load the tokenizer of {model_path!r}: {type(error).__name__}: {error}") from None


def prompt_format(tokenizer) -> dict:
    """How prompts were made: a base model without a chat template (or a tokenizer that drops BOS)
    explains odd outputs, so the manifest and the review say so."""
    probe = tokenizer("x", add_special_tokens=True)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    return {"chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "bos_token": getattr(tokenizer, "bos_token", None),
            "adds_bos": bool(bos is not None and probe and probe[0] == bos)}


def text_config_number(model_path: str, name: str) -> int | None:
    """A positive whole number from the model's (text) config, or None when it does not say."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - an unreadable config only means "unknown"
        return None
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, name, None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def model_length_limit(model_path: str) -> int | None:
    """The model's own maximum context (max_position_embeddings), if its config says."""
    return text_config_number(model_path, "max_position_embeddings")


def served_length_limit(model_path: str) -> tuple[int, str] | None:
    """The longest max_model_len vLLM surely refuses to exceed for this model, and how it was derived:
    max_position_embeddings, times a RoPE scaling factor where the config has one (an upper bound of
    vLLM's own derivation, so kveval never refuses what vLLM would start). None when the config does not say."""
    limit = model_length_limit(model_path)
    if limit is None:
        return None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        rope = getattr(text, "rope_scaling", None) or {}
    except Exception:  # noqa: BLE001
        rope = {}
    factor = rope.get("factor") if isinstance(rope, dict) else None
    if isinstance(factor, (int, float)) and factor > 1:
        return int(limit * factor), f"max_position_embeddings {limit:,} × RoPE scaling factor {factor:g}"
    return limit, f"max_position_embeddings {limit:,}"


def model_layer_count(model_path: str) -> int | None:
    """num_hidden_layers of the model's (text) config, if its config says."""
    return text_config_number(model_path, "num_hidden_layers")


def model_dtype(model_path: str) -> str:
    """The checkpoint's own dtype as a vLLM kv_cache_dtype name (bfloat16 when the config says none)."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - unreadable config: the common case
        return "bfloat16"
    dtype = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "bfloat16")
    dtype = dtype.replace("torch.", "")
    return dtype if dtype in ("bfloat16", "float16") else "bfloat16"


def kv_layout(model_path: str) -> dict | None:
    """What one token costs in the KV cache, from the model's (text) config: layers, KV heads, head
    dim, elements per layer (K and V; MLA's one latent), and which layers use a sliding window.
    None when the config cannot be read or does not say."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path)
    except Exception:  # noqa: BLE001 - an unreadable config only means "unknown"
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
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
    return {"layers": int(layers), "kv_heads": int(kv_heads), "head_dim": int(head_dim), "attention": attention,
            "per_layer_elements": int(per_layer), "sliding_window_layers": sliding,
            "sliding_window": getattr(text, "sliding_window", None) if sliding else None}
