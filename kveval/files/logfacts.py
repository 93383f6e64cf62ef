"""Facts vLLM only prints: read them from a cell's log text (pure, no vLLM import)."""
from __future__ import annotations

import re
from typing import Any

# "CPU KV cache size: 13,568 tokens, Maximum concurrency for 8,192 tokens per request: 1.66x"
# (on GPU the line starts "GPU KV cache size"). vLLM sizes the pool before it builds the attention
# backend, so this line can exist even for a cell that then failed to start.
_POOL = re.compile(r"(?:GPU|CPU|XPU|TPU)?\s*KV cache size:\s*([\d,]+)\s*tokens", re.I)
_CONCURRENCY = re.compile(r"Maximum concurrency for\s*[\d,]+\s*tokens per request:\s*([\d.]+)x", re.I)


def kv_pool_from_log(text: str) -> dict[str, Any]:
    """The last KV-pool size and max concurrency that vLLM logged, or Nones."""
    pools = _POOL.findall(text)
    concurrency = _CONCURRENCY.findall(text)
    return {
        "kv_pool_tokens": int(pools[-1].replace(",", "")) if pools else None,
        "max_concurrency": float(concurrency[-1]) if concurrency else None,
    }
