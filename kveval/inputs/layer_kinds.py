"""Which layers of a model keep a K/V cache and which keep a fixed per-request state instead (hybrid models:
linear attention / Gated DeltaNet, Mamba, short convolutions), read from the config.

transformers (5.x) names every layer's mixer in `layer_types`, for hybrids too: "full_attention",
"sliding_attention" and "chunked_attention" cache K and V per token; "linear_attention" (Qwen3-Next / Qwen3.5
Gated DeltaNet, Mamba in Jamba, Bamba, Granite-4 hybrids, Nemotron-H) keeps a state whose size does not grow
with the context; "hybrid" (Falcon-H1) has both in one layer; "moe" and "mlp" have neither. vLLM caches
only the attention layers' K/V in the KV-cache dtype: the state stays in its own dtype, so FP8 does not shrink
it (vLLM's `mamba_ssm_cache_dtype`, the model dtype unless set; Nemotron-H's config asks for float32).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

KV_KINDS = {"full_attention", "sliding_attention", "chunked_attention", "attention", "hybrid"}
STATE_KINDS = {"linear_attention", "mamba", "mamba2", "conv", "hybrid"}
NO_CACHE_KINDS = {"moe", "mlp"}
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class LayerKinds(BaseModel):
    """The config's layers by what they cache. `kinds` is empty when the config names none (every layer
    is then attention, as in dense models)."""

    model_config = ConfigDict(frozen=True)

    kinds: list[str] = []
    kv_layers: list[int]                     # layers with a K/V cache
    state_layers: list[int] = []             # layers with a fixed per-request state
    state_elements_per_layer: int | None = None   # elements of one layer's state for one request
    state_dtype: str | None = None           # the dtype vLLM keeps that state in, where the config says

    def state_bytes_per_request(self, model_dtype: str) -> int | None:
        """Bytes of state one request holds across the state layers (None when the layer type's state size
        is not known here)."""
        if not self.state_layers or self.state_elements_per_layer is None:
            return None
        per_element = STATE_DTYPE_BYTES.get(self.state_dtype or model_dtype, 2)
        return self.state_elements_per_layer * per_element * len(self.state_layers)


def layer_kinds(text_config, layers: int) -> LayerKinds:
    """The layers of a (text) config by what they cache."""
    kinds = [str(kind) for kind in (getattr(text_config, "layer_types", None) or [])][:layers]
    if len(kinds) < layers:  # no per-layer kinds (or a short list): every layer is attention
        return LayerKinds(kinds=[], kv_layers=list(range(layers)))
    kv = [i for i, kind in enumerate(kinds) if kind in KV_KINDS or kind not in STATE_KINDS | NO_CACHE_KINDS]
    state = [i for i, kind in enumerate(kinds) if kind in STATE_KINDS]
    return LayerKinds(kinds=kinds, kv_layers=kv, state_layers=state,
                      state_elements_per_layer=_state_elements(text_config) if state else None,
                      state_dtype=_state_dtype(text_config) if state else None)


def _number(config, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _state_elements(text) -> int | None:
    """One state layer's elements for one request: convolution state plus recurrent (SSM) state, as vLLM
    allocates them (model_executor/layers/mamba/mamba_utils.py); None for a layer type not covered here."""
    # Gated DeltaNet (Qwen3-Next, Qwen3.5): conv over q, k, v; recurrent state per value head dk x dv.
    k_dim, v_dim = _number(text, "linear_key_head_dim"), _number(text, "linear_value_head_dim")
    k_heads, v_heads = _number(text, "linear_num_key_heads"), _number(text, "linear_num_value_heads")
    kernel = _number(text, "linear_conv_kernel_dim")
    if k_dim and v_dim and k_heads and v_heads and kernel:
        return (kernel - 1) * (2 * k_heads * k_dim + v_heads * v_dim) + v_heads * k_dim * v_dim
    # Mamba2 (Bamba, Granite-4 hybrid, Falcon-H1, Nemotron-H): conv over x, B, C; state heads x head dim x d_state.
    heads = _number(text, "mamba_n_heads", "mamba_num_heads")
    head_dim = _number(text, "mamba_d_head", "mamba_head_dim")
    d_state = _number(text, "mamba_d_state", "ssm_state_size")
    groups = _number(text, "mamba_n_groups", "n_groups") or 1
    conv = _number(text, "mamba_d_conv", "conv_kernel")
    if heads and head_dim and d_state and conv:
        inner = heads * head_dim
        return (conv - 1) * (inner + 2 * groups * d_state) + inner * d_state
    # Short convolutions (LFM2, LFM2-MoE "conv" layers): a conv state of (L_cache - 1) x hidden size, no SSM state
    # (vLLM's MambaStateShapeCalculator.short_conv_state_shape).
    l_cache, hidden_size = _number(text, "conv_L_cache"), _number(text, "hidden_size")
    if l_cache and hidden_size:
        return (l_cache - 1) * hidden_size
    # Mamba1 (Jamba): conv over the expanded hidden size; state inner x d_state.
    expand, hidden = _number(text, "mamba_expand"), _number(text, "hidden_size")
    if expand and hidden and d_state and conv:
        inner = expand * hidden
        return (conv - 1) * inner + inner * d_state
    return None


def _state_dtype(text) -> str | None:
    dtype = getattr(text, "mamba_ssm_cache_dtype", None)
    return str(dtype).replace("torch.", "") if dtype and str(dtype) != "auto" else None
