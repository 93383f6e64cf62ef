"""Speed at concurrency 1, with the change against the baseline cell at the same max_model_len, and
whether that change exceeds the run-to-run spread (a Δ inside the spread is not called a speed-up).

Cells whose speed phase repeats until its medians are pinned down (issue 41) also get the median TTFT's
interval and the ratios TTFT and decode tok/s × baseline with their intervals (analysis/repeat_interval);
rows of older runs keep the keys they had."""
from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.repeat_interval import median_interval, ratio_interval
from kveval.files.schema import CellResult, SpeedWorkload, Spread


def _spread(summary: Spread | None, part: str) -> Any:
    return getattr(summary, part) if summary is not None else None


def speed_table(cells: dict[str, CellResult], baseline_kv: str = BASELINE_KV) -> pd.DataFrame:
    rows = []
    for name, facts in cells.items():
        phase = facts.phases.speed
        if phase is None:
            continue
        for entry in phase.workloads or []:
            rows.append({
                "workload": entry.workload, "cell": name, "kv_spec": facts.kv_spec,
                "max_model_len": facts.max_model_len, "prompt_tokens": entry.prompt_tokens,
                "max_tokens": entry.max_tokens, "runs": _spread(entry.ttft_s, "n") or 0,
                "ttft_ms": _ms(_spread(entry.ttft_s, "median")),
                "ttft_ms_min": _ms(_spread(entry.ttft_s, "min")),
                "ttft_ms_max": _ms(_spread(entry.ttft_s, "max")),
                "decode_tok_s": _spread(entry.decode_tok_s, "median"),
                "decode_tok_s_min": _spread(entry.decode_tok_s, "min"),
                "decode_tok_s_max": _spread(entry.decode_tok_s, "max"),
                "throughput_tok_s": _spread(entry.throughput_tok_s, "median"),
                # What was really decoded: fewer than max_tokens when the prompt nearly fills max_model_len.
                "decoded_tokens": _median([run.output_tokens for run in entry.runs]),
                "rejected": entry.rejection,
                **(_repeat_figures(entry) if phase.repeat_max is not None else {}),
            })
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    if "repeat_ttft_s" in table:
        table = _with_ratios(table, baseline_kv)
    base = table[table.kv_spec == baseline_kv].set_index(["workload", "max_model_len"])
    for column, delta in (("ttft_ms", "ttft_delta_pct"), ("decode_tok_s", "decode_delta_pct")):
        def change(row: Any, column: str = column) -> float | None:
            key = (row.workload, row.max_model_len)
            if row.kv_spec == baseline_kv or key not in base.index:
                return None
            reference = base.loc[key, column]
            if reference is None or pd.isna(reference) or row[column] is None or pd.isna(row[column]) or not reference:
                return None
            return float(100.0 * (row[column] - reference) / reference)
        table[delta] = table.apply(change, axis=1)
    for column, verdict in (("ttft_ms", "ttft_vs_noise"), ("decode_tok_s", "decode_vs_noise")):
        table[verdict] = table.apply(lambda row, column=column: _against_noise(row, column, base, baseline_kv), axis=1)
    return table


MIN_RUNS_FOR_NOISE = 2


def _against_noise(row: Any, column: str, base: pd.DataFrame, baseline_kv: str) -> str | None:
    """"beyond" when the measured ranges of cell and baseline do not overlap, "within" when they do,
    "too few runs" below MIN_RUNS_FOR_NOISE on either side; None where there is no baseline. With repeats
    (issue 41) the ratio's interval decides instead: "beyond" when it excludes 1 at 95 %."""
    key = (row.workload, row.max_model_len)
    if row.kv_spec == baseline_kv or key not in base.index:
        return None
    figure = "ttft" if column == "ttft_ms" else "decode"
    low, high, confidence = (row.get(f"{figure}_ratio_{part}") for part in ("low", "high", "confidence"))
    if not any(v is None or pd.isna(v) for v in (low, high, confidence)):
        if confidence < 0.95 - 1e-9:
            return "too few runs"
        return "beyond" if low > 1.0 or high < 1.0 else "within"
    reference = base.loc[key]
    low, high = row[f"{column}_min"], row[f"{column}_max"]
    ref_low, ref_high = reference[f"{column}_min"], reference[f"{column}_max"]
    if any(v is None or pd.isna(v) for v in (low, high, ref_low, ref_high)):
        return None
    if min(row.runs, reference.runs) < MIN_RUNS_FOR_NOISE:
        return "too few runs"
    return "beyond" if high < ref_low or low > ref_high else "within"


def _median(values: Iterable[float | None]) -> float | None:
    clean = sorted(v for v in values if v is not None)
    return None if not clean else clean[len(clean) // 2]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


_RATIOS = (("ttft", "repeat_ttft_s"), ("decode", "repeat_decode_tok_s"))


def _repeat_figures(entry: SpeedWorkload) -> dict[str, Any]:
    ttft = [run.ttft_s for run in entry.runs]
    interval = median_interval(ttft)
    return {"ttft_ms_low": _ms(interval.low), "ttft_ms_high": _ms(interval.high),
            "repeat_ttft_s": ttft, "repeat_decode_tok_s": [run.decode_tok_s for run in entry.runs]}


def _with_ratios(table: pd.DataFrame, baseline_kv: str) -> pd.DataFrame:
    """TTFT and decode tok/s × baseline (same workload and length) over both cells' repeats; the raw repeat
    columns dropped."""
    base = {(r.workload, r.max_model_len): r for r in table.itertuples() if r.kv_spec == baseline_kv}
    for figure, runs in _RATIOS:
        intervals = []
        for row in table.itertuples():
            reference = base.get((row.workload, row.max_model_len))
            mine, theirs = getattr(row, runs), getattr(reference, runs, None) if reference is not None else None
            usable = row.kv_spec != baseline_kv and isinstance(mine, list) and isinstance(theirs, list)
            intervals.append(ratio_interval(mine, theirs or []) if usable else None)
        table[f"{figure}_ratio"] = [i.estimate if i else None for i in intervals]
        for part in ("low", "high", "confidence"):
            table[f"{figure}_ratio_{part}"] = [getattr(i, part) if i else None for i in intervals]
    return table.drop(columns=[runs for _, runs in _RATIOS])
