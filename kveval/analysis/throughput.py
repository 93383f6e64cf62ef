"""Throughput under concurrency: per cell and level, requests/s, output tokens/s, TTFT and
inter-token latency percentiles, preemptions; and each non-baseline cell against the baseline."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV, CellLike, typed_cells
from kveval.files.schema import ThroughputRow

COLUMNS = ["cell", "kv_spec", "max_model_len", "concurrency", "requests", "prompt_tokens", "wall_s",
           "requests_per_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p90",
           "itl_ms_p99", "preemptions", "error", "output_tok_s_vs_baseline", "max_concurrency"]


def _percentile(values: list, q: float) -> float | None:
    clean = [v for v in values if v is not None]
    return float(np.percentile(clean, q)) * 1000.0 if clean else None


def throughput_table(cells: dict[str, CellLike], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    rows = []
    for name, facts in typed_cells(cells).items():
        phase = facts.phases.throughput
        for run in (phase.runs or []) if phase else []:
            requests = run.requests or []
            tokens = sum(r.output_tokens or 0 for r in requests)
            wall = run.wall_seconds
            # The level's count from vLLM's engine counter; older runs kept a per-request field (always None).
            preemptions = [run.preemptions] if run.preemptions is not None else \
                [r.preemptions for r in requests if r.preemptions is not None]
            rows.append({
                "cell": name, "kv_spec": facts.kv_spec, "max_model_len": facts.max_model_len,
                "concurrency": run.concurrency, "requests": len(requests),
                "prompt_tokens": phase.prompt_tokens, "wall_s": wall,
                "requests_per_s": len(requests) / wall if wall and requests else None,
                "output_tok_s": tokens / wall if wall and requests else None,
                "ttft_ms_p50": _percentile([r.ttft_s for r in requests], 50),
                "ttft_ms_p90": _percentile([r.ttft_s for r in requests], 90),
                "ttft_ms_p99": _percentile([r.ttft_s for r in requests], 99),
                "itl_ms_p50": _percentile([r.itl_s for r in requests], 50),
                "itl_ms_p90": _percentile([r.itl_s for r in requests], 90),
                "itl_ms_p99": _percentile([r.itl_s for r in requests], 99),
                "preemptions": sum(preemptions) if preemptions else None,
                "error": run.error, "output_tok_s_vs_baseline": None,
                "max_concurrency": phase.max_concurrency,
            })
    table = pd.DataFrame(rows, columns=COLUMNS)
    if table.empty:
        return table
    base = table[table.kv_spec == baseline_kv].set_index(["max_model_len", "concurrency"])["output_tok_s"]
    def ratio(row):
        key = (row.max_model_len, row.concurrency)
        if row.kv_spec == baseline_kv or key not in base.index or not base[key] or pd.isna(row.output_tok_s):
            return None
        return row.output_tok_s / base[key]
    table["output_tok_s_vs_baseline"] = table.apply(ratio, axis=1)
    return table


# Output tokens/s beyond ±10 % of the baseline's at the same length and level is worth a sentence;
# one run per level, so smaller differences are not told apart from noise.
AHEAD_RATIO, BEHIND_RATIO = 1.10, 0.90


class ThroughputFinding(NamedTuple):
    """One tested cell against the baseline: the levels where it outran or trailed it by more than 10 %."""

    cell: str
    ahead: list[int]
    behind: list[int]
    max_concurrency: float | None     # requests of max_model_len its pool holds (its first compared row's)


def throughput_findings(rows: list[ThroughputRow]) -> list[ThroughputFinding]:
    """Per cell with a baseline to compare with (in row order): the concurrency levels beyond ±10 %."""
    compared: dict[str, list[ThroughputRow]] = {}
    for row in rows or []:
        ratio = row.output_tok_s_vs_baseline
        if ratio is not None and not math.isnan(ratio):
            compared.setdefault(row.cell, []).append(row)
    return [ThroughputFinding(cell, [int(r.concurrency) for r in mine if r.output_tok_s_vs_baseline > AHEAD_RATIO],
                              [int(r.concurrency) for r in mine if r.output_tok_s_vs_baseline < BEHIND_RATIO],
                              mine[0].max_concurrency)
            for cell, mine in compared.items()]
