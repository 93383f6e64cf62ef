"""The review's speed section (concurrency 1): TTFT and decode tok/s per workload and cell, the change
against the baseline, and whether it exceeds the run-to-run spread. Pure: evidence in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.render.markdown import fmt_float, fmt_int, fmt_pct, long_table, rows_frame


_NOISE_WORDS = {"within": " (within run-to-run spread)", "too few runs": " (too few runs to tell from noise)",
                "beyond": ""}


def speed_section(evidence: schema.Evidence) -> str:
    speed = rows_frame(evidence.speed)
    if speed.empty:
        return ""
    measured = speed[speed.runs > 0]
    view = pd.DataFrame({
        "workload": measured.workload,
        "cell": measured.cell,
        "prompt tokens": measured.prompt_tokens.map(fmt_int),
        "runs": measured.runs,
        "new tokens": measured.decoded_tokens.map(fmt_int) if "decoded_tokens" in measured else "",
        "TTFT ms (median)": measured.ttft_ms.map(lambda v: fmt_float(v, 1)),
        "TTFT range": [f"{fmt_float(a, 1)}–{fmt_float(b, 1)}" for a, b in zip(measured.ttft_ms_min, measured.ttft_ms_max)],
        f"Δ TTFT vs {BASELINE_KV}": _deltas(measured, "ttft_delta_pct", "ttft_vs_noise"),
        "decode tok/s (median)": measured.decode_tok_s.map(lambda v: fmt_float(v, 1)),
        "decode range": [f"{fmt_float(a, 1)}–{fmt_float(b, 1)}"
                         for a, b in zip(measured.decode_tok_s_min, measured.decode_tok_s_max)],
        f"Δ decode vs {BASELINE_KV}": _deltas(measured, "decode_delta_pct", "decode_vs_noise"),
        **_ratio_columns(measured),
    })
    eager = evidence.speed_settings.enforce_eager
    return "\n".join([
        "## Speed (concurrency 1)", "",
        "TTFT and decode tok/s from vLLM's per-request stats; each run decodes the same number of new tokens "
        "in every cell (ignore_eos; fewer than asked only where the prompt nearly fills max_model_len). "
        "Median over the measured runs after warm-up; Δ is against the `auto` cell at the same max_model_len."
        + (" Runs repeat until the medians' 95 % intervals are tight or the cell's repeat time is spent; × auto "
           "is the Hodges-Lehmann ratio with its distribution-free interval (docs/statistics.md)."
           if "ttft_ratio" in measured else ""),
        "" if eager is None else f"enforce_eager: {eager}.",
        "", long_table(view, f"{len(view)} rows: each workload in each cell"),
        *(["", note] if (note := _speed_note(measured)) else []),
    ])


def _ratio(value, low, high, confidence) -> str:
    if not fmt_float(value):
        return ""
    text = f"{fmt_float(value, 2)}×"
    if fmt_float(low) and fmt_float(high):
        short = f", {100 * confidence:.0f} %" if fmt_float(confidence) and confidence < 0.95 - 1e-9 else ""
        text += f" ({fmt_float(low, 2)}–{fmt_float(high, 2)}{short})"
    return text


def _ratio_columns(measured: pd.DataFrame) -> dict:
    """Issue 41's runs: TTFT and decode tok/s × auto with their intervals; older runs show none."""
    if "ttft_ratio" not in measured:
        return {}
    return {f"TTFT × {BASELINE_KV} (95 % CI)": [_ratio(*values) for values in zip(
                measured.ttft_ratio, measured.ttft_ratio_low, measured.ttft_ratio_high, measured.ttft_ratio_confidence)],
            f"decode × {BASELINE_KV} (95 % CI)": [_ratio(*values) for values in zip(
                measured.decode_ratio, measured.decode_ratio_low, measured.decode_ratio_high,
                measured.decode_ratio_confidence)]}


def _deltas(measured: pd.DataFrame, delta: str, noise: str) -> list[str]:
    """Δ % against the baseline; said to be noise where the ranges overlap (runs before issue 10: Δ only)."""
    verdicts = measured[noise] if noise in measured else [None] * len(measured)
    return [fmt_pct(d) + (_NOISE_WORDS.get(v, "") if fmt_pct(d) else "") for d, v in zip(measured[delta], verdicts)]


def _speed_note(measured: pd.DataFrame) -> str:
    if "decode_vs_noise" not in measured or measured.decode_vs_noise.isna().all():
        return ""  # runs before issue 10, or nothing compared against a baseline
    beyond = measured[(measured.decode_vs_noise == "beyond") | (measured.ttft_vs_noise == "beyond")]
    too_few = measured[(measured.decode_vs_noise == "too few runs") | (measured.ttft_vs_noise == "too few runs")]
    if beyond.empty and not too_few.empty:
        return ("No speed difference against the baseline is shown beyond noise, but some rows had too few runs to "
                "tell (a longer --repeat-budget gives more).")
    if beyond.empty:
        return ("No speed difference against the baseline exceeds the run-to-run spread: FP8 is neither shown faster "
                "nor slower here.")
    how = ("the ratio's 95 % interval excludes 1" if "ttft_ratio" in measured and measured.ttft_ratio.notna().any()
           else "the measured ranges do not overlap")
    return (f"Differences beyond the run-to-run spread ({how}): "
            + "; ".join(f"{r.cell} {r.workload}" for r in beyond.itertuples()) + ".")
