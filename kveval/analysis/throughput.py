"""Throughput under concurrency: per cell and level, requests/s, output tokens/s, TTFT and
inter-token latency percentiles, preemptions; and each non-baseline cell against the baseline."""
from __future__ import annotations

import numpy as np
import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV

COLUMNS = ["cell", "kv_cache_dtype", "max_model_len", "concurrency", "requests", "prompt_tokens", "wall_s",
           "requests_per_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p90",
           "itl_ms_p99", "preemptions", "error", "output_tok_s_vs_baseline", "max_concurrency"]


def _percentile(values: list, q: float) -> float | None:
    clean = [v for v in values if v is not None]
    return float(np.percentile(clean, q)) * 1000.0 if clean else None


def throughput_table(cells: dict[str, dict], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    rows = []
    for name, facts in cells.items():
        phase = (facts.get("phases") or {}).get("throughput") or {}
        for run in phase.get("runs", []):
            requests = run.get("requests") or []
            tokens = sum(r.get("output_tokens") or 0 for r in requests)
            wall = run.get("wall_seconds")
            # The level's count from vLLM's engine counter; older runs kept a per-request field (always None).
            preemptions = [run["preemptions"]] if run.get("preemptions") is not None else \
                [r.get("preemptions") for r in requests if r.get("preemptions") is not None]
            rows.append({
                "cell": name, "kv_cache_dtype": facts.get("kv_cache_dtype"), "max_model_len": facts.get("max_model_len"),
                "concurrency": run.get("concurrency"), "requests": len(requests),
                "prompt_tokens": phase.get("prompt_tokens"), "wall_s": wall,
                "requests_per_s": len(requests) / wall if wall and requests else None,
                "output_tok_s": tokens / wall if wall and requests else None,
                "ttft_ms_p50": _percentile([r.get("ttft_s") for r in requests], 50),
                "ttft_ms_p90": _percentile([r.get("ttft_s") for r in requests], 90),
                "ttft_ms_p99": _percentile([r.get("ttft_s") for r in requests], 99),
                "itl_ms_p50": _percentile([r.get("itl_s") for r in requests], 50),
                "itl_ms_p90": _percentile([r.get("itl_s") for r in requests], 90),
                "itl_ms_p99": _percentile([r.get("itl_s") for r in requests], 99),
                "preemptions": sum(preemptions) if preemptions else None,
                "error": run.get("error"), "output_tok_s_vs_baseline": None,
                "max_concurrency": phase.get("max_concurrency"),
            })
    table = pd.DataFrame(rows, columns=COLUMNS)
    if table.empty:
        return table
    base = table[table.kv_cache_dtype == baseline_kv].set_index(["max_model_len", "concurrency"])["output_tok_s"]
    def ratio(row):
        key = (row.max_model_len, row.concurrency)
        if row.kv_cache_dtype == baseline_kv or key not in base.index or not base[key] or pd.isna(row.output_tok_s):
            return None
        return row.output_tok_s / base[key]
    table["output_tok_s_vs_baseline"] = table.apply(ratio, axis=1)
    return table
