"""Throughput under concurrency: per cell and level, requests/s, output tokens/s, TTFT and
inter-token latency percentiles, preemptions; and each non-baseline cell against the baseline.

A level run several times (issue 41) is one row: output tok/s and requests/s are the medians of its repeats
with the median's interval, the latency percentiles pool every repeat's requests, and the ratio to the
baseline is analysis/repeat_interval.ratio_interval's over both cells' repeats. Rows of runs without repeats
keep the keys they had."""
from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.repeat_interval import median_interval, ratio_interval
from kveval.files.schema import CellResult, ThroughputPhase, ThroughputRow, ThroughputRun

COLUMNS = ["cell", "kv_spec", "max_model_len", "concurrency", "requests", "prompt_tokens", "wall_s",
           "requests_per_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p90",
           "itl_ms_p99", "preemptions", "error", "output_tok_s_vs_baseline", "max_concurrency"]
REPEAT_COLUMNS = ["repeats", "output_tok_s_repeats", "output_tok_s_low", "output_tok_s_high", "output_tok_s_confidence",
                  "vs_baseline_low", "vs_baseline_high", "vs_baseline_confidence", "max_num_seqs"]


def _percentile(values: Sequence[float | None], q: float) -> float | None:
    clean = [v for v in values if v is not None]
    return float(np.percentile(clean, q)) * 1000.0 if clean else None


def _level_groups(runs: Iterable[ThroughputRun]) -> dict[int | None, list[ThroughputRun]]:
    """Each level's runs in order (one per level before issue 41)."""
    groups: dict[int | None, list[ThroughputRun]] = {}
    for run in runs:
        groups.setdefault(run.concurrency, []).append(run)
    return groups


def _rate(count: float, wall: float | None) -> float | None:
    return count / wall if wall and count else None


def _median(values: Sequence[float | None]) -> float | None:
    return median_interval(values).estimate


def _level_row(name: str, facts: CellResult, phase: ThroughputPhase, level: int | None,
               runs: list[ThroughputRun]) -> dict[str, Any]:
    requests = [r for run in runs for r in (run.requests or [])]
    per_run = [(run.requests or [], run.wall_seconds) for run in runs]
    rates = [_rate(sum(r.output_tokens or 0 for r in reqs), wall) for reqs, wall in per_run]
    # The level's count from vLLM's engine counter; older runs kept a per-request field (always None).
    counted = [run.preemptions for run in runs if run.preemptions is not None]
    preemptions = counted or [r.preemptions for r in requests if r.preemptions is not None]
    row = {
        "cell": name, "kv_spec": facts.kv_spec, "max_model_len": facts.max_model_len,
        "concurrency": level, "requests": len(runs[0].requests or []),
        "prompt_tokens": phase.prompt_tokens, "wall_s": _median([run.wall_seconds for run in runs]),
        "requests_per_s": _median([_rate(len(reqs), wall) for reqs, wall in per_run]),
        "output_tok_s": _median(rates),
        "ttft_ms_p50": _percentile([r.ttft_s for r in requests], 50),
        "ttft_ms_p90": _percentile([r.ttft_s for r in requests], 90),
        "ttft_ms_p99": _percentile([r.ttft_s for r in requests], 99),
        "itl_ms_p50": _percentile([r.itl_s for r in requests], 50),
        "itl_ms_p90": _percentile([r.itl_s for r in requests], 90),
        "itl_ms_p99": _percentile([r.itl_s for r in requests], 99),
        "preemptions": sum(preemptions) if preemptions else None,
        "error": next((run.error for run in runs if run.error), None), "output_tok_s_vs_baseline": None,
        "max_concurrency": phase.max_concurrency,
    }
    if runs[0].repeat is not None:   # issue 41's runs: the repeats and the median's interval
        interval = median_interval(rates)
        row.update(repeats=len(runs), output_tok_s_repeats=[r for r in rates if r is not None],
                   output_tok_s_low=interval.low, output_tok_s_high=interval.high,
                   output_tok_s_confidence=interval.confidence, max_num_seqs=phase.max_num_seqs)
    return row


def throughput_table(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    rows = []
    for name, facts in cells.items():
        phase = facts.phases.throughput
        if phase is None:
            continue
        for level, runs in _level_groups(phase.runs or []).items():
            rows.append(_level_row(name, facts, phase, level, runs))
    repeated = any("repeats" in row for row in rows)
    table = pd.DataFrame(rows, columns=COLUMNS + (REPEAT_COLUMNS if repeated else []))
    if table.empty:
        return table
    base = table[table.kv_spec == baseline_kv].set_index(["max_model_len", "concurrency"])
    def ratio(row: Any) -> Any:
        key = (row.max_model_len, row.concurrency)
        if row.kv_spec == baseline_kv or key not in base.index or not base.output_tok_s[key] or pd.isna(row.output_tok_s):
            return None
        mine, theirs = _repeats(row), _repeats(base.loc[key])
        if mine is None or theirs is None:   # runs before issue 41: one run each, the plain ratio
            return row.output_tok_s / base.output_tok_s[key]
        return ratio_interval(mine, theirs)
    ratios = table.apply(ratio, axis=1)
    table["output_tok_s_vs_baseline"] = [r.estimate if hasattr(r, "estimate") else r for r in ratios]
    if repeated:
        for part in ("low", "high", "confidence"):
            table[f"vs_baseline_{part}"] = [getattr(r, part) if hasattr(r, "estimate") else None for r in ratios]
    return table


def _repeats(row: Any) -> list[float] | None:
    values = row.get("output_tok_s_repeats") if hasattr(row, "get") else None
    return list(values) if isinstance(values, list) and values else None


# Runs with one run per level: output tokens/s beyond ±10 % of the baseline's at the same length and level is
# worth a sentence, smaller differences are not told apart from noise. With repeats (issue 41) a level is ahead
# or behind when the ratio's 95 % interval lies wholly above or below 1.
AHEAD_RATIO, BEHIND_RATIO = 1.10, 0.90


class ThroughputFinding(NamedTuple):
    """One tested cell against the baseline: the levels where it outran or trailed it by more than 10 %."""

    cell: str
    ahead: list[int]
    behind: list[int]
    max_concurrency: float | None     # requests of max_model_len its pool holds (its first compared row's)
    max_num_seqs: int | None = None   # the engine's cap on requests at once (issue 41; None before)
    by_interval: bool = False         # told by the ratio's interval (repeats), not the ±10 % rule
    too_few: list[int] = []           # levels whose ratio interval has under 95 % coverage: not told either way


def _side(row: ThroughputRow) -> int:
    """+1 ahead, -1 behind, 0 neither: by the ratio's interval where it has one at 95 %, else by ±10 % (runs
    before repeats); a level with repeats whose interval falls short of 95 % is neither (_too_few)."""
    low, high, confidence = row.vs_baseline_low, row.vs_baseline_high, row.vs_baseline_confidence
    if low is not None and high is not None:
        if (confidence or 0) < 0.95 - 1e-9:
            return 0
        return 1 if low > 1.0 else -1 if high < 1.0 else 0
    ratio = row.output_tok_s_vs_baseline
    if ratio is None:
        return 0
    return 1 if ratio > AHEAD_RATIO else -1 if ratio < BEHIND_RATIO else 0


def _too_few(row: ThroughputRow) -> bool:
    return row.vs_baseline_low is not None and (row.vs_baseline_confidence or 0) < 0.95 - 1e-9


def _level(row: ThroughputRow) -> int:
    return int(row.concurrency or 0)   # every throughput row is a concurrency level


def throughput_findings(rows: list[ThroughputRow]) -> list[ThroughputFinding]:
    """Per cell with a baseline to compare with (in row order): the concurrency levels beyond ±10 %."""
    compared: dict[str, list[ThroughputRow]] = {}
    for row in rows or []:
        ratio = row.output_tok_s_vs_baseline
        if ratio is not None and not math.isnan(ratio):
            compared.setdefault(row.cell, []).append(row)
    return [ThroughputFinding(cell, [_level(r) for r in mine if _side(r) > 0],
                              [_level(r) for r in mine if _side(r) < 0], mine[0].max_concurrency,
                              int(mine[0].max_num_seqs) if mine[0].max_num_seqs else None,
                              any(r.vs_baseline_low is not None for r in mine),
                              [_level(r) for r in mine if _too_few(r)])
            for cell, mine in compared.items()]
