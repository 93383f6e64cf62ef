"""The review's throughput section: output tokens/s, TTFT and ITL per concurrency level against the
baseline, and where each tested cell outran or trailed it. Pure: evidence in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.throughput import ThroughputFinding, throughput_findings
from kveval.files import schema
from kveval.files.rundir import RunDir
from kveval.render.markdown import escape_cell, fmt_float, fmt_int, long_table, rows_frame


def throughput_section(evidence: schema.Evidence) -> str:
    rows = rows_frame(evidence.throughput)
    if rows.empty:
        return ""
    view = pd.DataFrame({
        "cell": rows.cell, "concurrency": rows.concurrency.map(fmt_int), "prompt tokens": rows.prompt_tokens.map(fmt_int),
        "requests/s": rows.requests_per_s.map(lambda v: fmt_float(v, 2)),
        "output tok/s": rows.output_tok_s.map(lambda v: fmt_float(v, 1)),
        f"× {BASELINE_KV}": rows.output_tok_s_vs_baseline.map(lambda v: fmt_float(v, 2) + "×" if fmt_float(v) else ""),
        **_repeat_columns(rows),
        "TTFT ms p50 / p99": [f"{fmt_float(a, 0)} / {fmt_float(b, 0)}" if fmt_float(a) else ""
                              for a, b in zip(rows.ttft_ms_p50, rows.ttft_ms_p99)],
        "ITL ms p50 / p99": [f"{fmt_float(a, 1)} / {fmt_float(b, 1)}" if fmt_float(a) else ""
                             for a, b in zip(rows.itl_ms_p50, rows.itl_ms_p99)],
        "preemptions": rows.preemptions.map(fmt_int),
        "error": rows.error.map(lambda e: escape_cell(e, 160) if isinstance(e, str) else ""),
    })
    out = ["## Throughput under concurrency", "",
           "At each level N, N copies of one long prompt are submitted at once and each decodes the same number of "
           "tokens; vLLM runs as many together as the KV pool (and max_num_seqs) allows and queues the rest. "
           + _runs_sentence(rows) + " × auto: output tokens/s against the `auto` cell at the same length and level.",
           "",
           long_table(view, f"{len(view)} rows: each concurrency level in each cell")]
    out += _findings_lines(throughput_findings(evidence.throughput))
    if rows.output_tok_s.notna().any():
        out += ["", f"![output tokens/s and TTFT against concurrency]({RunDir.THROUGHPUT_PLOT})"]
    return "\n".join(out)


def _repeat_columns(rows: pd.DataFrame) -> dict:
    """Runs of issue 41 on: the repeats per level, the median's interval and the ratio's (with its coverage
    where below 95 %: few repeats); older runs show the columns they had."""
    if "repeats" not in rows or rows.repeats.isna().all():
        return {}
    def interval(low, high, confidence, digits, suffix=""):
        if not fmt_float(low) or not fmt_float(high):
            return ""
        short = f" ({100 * confidence:.0f} %)" if fmt_float(confidence) and confidence < 0.95 - 1e-9 else ""
        return f"{fmt_float(low, digits)}–{fmt_float(high, digits)}{suffix}{short}"
    return {"runs": rows.repeats.map(fmt_int),
            "tok/s 95 % CI": [interval(a, b, c, 1) for a, b, c in
                              zip(rows.output_tok_s_low, rows.output_tok_s_high, rows.output_tok_s_confidence)],
            f"× {BASELINE_KV} 95 % CI": [interval(a, b, c, 2, "×") for a, b, c in
                                        zip(rows.vs_baseline_low, rows.vs_baseline_high, rows.vs_baseline_confidence)]}


def _runs_sentence(rows: pd.DataFrame) -> str:
    if "repeats" not in rows or rows.repeats.isna().all():
        return "One run per level, so small differences are not significant."
    return ("Each level ran until the 95 % interval of its median output tok/s was within the target or the cell's "
            "repeat time was spent; figures are medians over the runs, the intervals distribution-free (order "
            "statistics for the median, Hodges-Lehmann with its Mann-Whitney interval for the ratio; "
            "docs/statistics.md), with their real coverage where few runs leave it under 95 %.")


def _findings_lines(findings: list[ThroughputFinding]) -> list[str]:
    """Per tested cell: the levels where it outran or trailed the baseline by more than 10 %
    (analysis.throughput.throughput_findings)."""
    lines = []
    for finding in findings:
        parts = []
        if finding.ahead:
            parts.append(f"ahead of `{BASELINE_KV}` at concurrency {', '.join(map(str, finding.ahead))}")
        if finding.behind:
            parts.append(f"behind at {', '.join(map(str, finding.behind))}")
        if finding.too_few:
            parts.append(f"too few runs to tell at {', '.join(map(str, finding.too_few))} (interval under 95 %: "
                         "raise --repeat-budget)")
        seqs = f"; vLLM admits {fmt_int(finding.max_num_seqs)} at once (max_num_seqs)" if finding.max_num_seqs else ""
        within = (f"not told apart from `{BASELINE_KV}` at any level" if finding.by_interval
                  else f"within 10 % of `{BASELINE_KV}` at every level")
        lines.append(f"- **{finding.cell}**: " + ("; ".join(parts) if parts else within)
                     + f" (its pool holds {fmt_float(finding.max_concurrency, 1)} requests of max_model_len{seqs}).")
    return ["", *lines] if lines else []
