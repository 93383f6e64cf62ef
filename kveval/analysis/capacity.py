"""Start-up and KV-pool tables."""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV, pool_tokens
from kveval.files.schema import CellResult


def startup_table(cells: dict[str, CellResult]) -> pd.DataFrame:
    rows = []
    for name, facts in cells.items():
        failure, capacity, crash = facts.failure, facts.capacity, facts.crash
        rows.append({
            "cell": name,
            "kv_spec": facts.kv_spec,
            "max_model_len": facts.max_model_len,
            "started": facts.started,
            "startup_s": facts.startup_seconds,
            "kv_pool_tokens": capacity.kv_pool_tokens if capacity else None,
            "max_concurrency": capacity.max_concurrency if capacity else None,
            # The block count is the memory-true size; for hybrid (sliding-window) models vLLM's
            # token figure is concurrency x max_model_len and moves with max_model_len.
            "num_blocks": capacity.num_blocks if capacity else None,
            # Sized by vLLM before it gave up (e.g. FP8 refused by the attention backend afterwards).
            "logged_pool_tokens": None if facts.started else facts.logged_capacity.kv_pool_tokens,
            "reason": failure.reason if failure else None,
            "message": failure.message if failure else None,
            "estimated_max_model_len": failure.estimated_max_model_len if failure else None,
            "attention_backend": facts.info.attention_backend,
            "crash": crash.message if crash else None,
            # Only where a cell crashed (rows of runs without a crash keep their old keys).
            **({"crash_advice": crash.advice} if crash and crash.advice else {}),
            **({"crash_cause": crash.cause} if crash and crash.cause == "stalled" else {}),
            # Only where the engine reported it (issue 41): rows of older runs keep their keys.
            **({"max_num_seqs": capacity.max_num_seqs} if capacity and capacity.max_num_seqs is not None else {}),
        })
    return pd.DataFrame(rows)


def pool_by_length(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    """One row per (max_model_len, non-baseline dtype): both pools and their ratio."""
    by_length: dict[int, dict[str, CellResult]] = {}
    for facts in cells.values():
        by_length.setdefault(facts.max_model_len, {})[facts.kv_spec] = facts
    rows = []
    for length in sorted(by_length):
        dtypes = by_length[length]
        base = dtypes.get(baseline_kv)
        others: list[str | None] = [kv for kv in dtypes if kv != baseline_kv] or [None]
        for kv in others:
            other = dtypes.get(kv) if kv else None
            base_tokens = pool_tokens(base) if base else None
            other_tokens = pool_tokens(other) if other else None
            base_fallback, base_source = _unstarted_pool(base)
            other_fallback, other_source = _unstarted_pool(other)
            ratio = other_tokens / base_tokens if base_tokens and other_tokens else None
            mine, theirs = other_tokens or other_fallback, base_tokens or base_fallback
            rows.append({
                "max_model_len": length,
                "kv_spec": kv,
                "baseline_pool_tokens": base_tokens,
                "pool_tokens": other_tokens,
                "ratio": ratio,
                # A cell that did not start may still tell its pool: vLLM logged it before failing,
                # or (kv_capacity) its estimated maximum model length is what the budget holds.
                "fallback_ratio": mine / theirs if ratio is None and mine and theirs else None,
                "fallback_sources": ", ".join(sorted({s for s in (base_source, other_source) if s})),
                "baseline_fallback_tokens": theirs if ratio is None else None,
                "fallback_tokens": mine if ratio is None else None,
                "not_started": ", ".join(
                    f"{f.cell} ({f.failure.reason if f.failure else '?'})"
                    for f in (base, other) if f is not None and not f.started
                ),
            })
    return pd.DataFrame(rows)


def _unstarted_pool(facts: CellResult | None) -> tuple[int | None, str | None]:
    if not facts or facts.started:
        return None, None
    logged = facts.logged_capacity.kv_pool_tokens
    if logged:
        return logged, "the engine log"
    failure = facts.failure
    if failure and failure.reason == "kv_capacity" and failure.estimated_max_model_len:
        return failure.estimated_max_model_len, "vLLM's estimated maximum model length"
    return None, None
