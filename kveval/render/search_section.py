"""The review's search section (`--search`, issue 20): the ladder of KV configurations, and at each
max_model_len every candidate tried with its verdict, its KV pool and throughput against `auto`, and
where the search stopped. Pure: verdict + evidence in, markdown out."""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.files import schema
from kveval.files.rundir import cell_id
from kveval.render.headline import pool_ratio
from kveval.render.markdown import bullet, escape_cell, fmt_float, table


def _throughput_ratio(evidence: schema.Evidence, cell: str) -> float | None:
    """Output tokens/s × auto at the highest concurrency both ran (the sweep's own comparison)."""
    rows = [row for row in evidence.throughput or []
            if row.cell == cell and row.output_tok_s_vs_baseline is not None and row.concurrency is not None]
    return max(rows, key=lambda row: row.concurrency).output_tok_s_vs_baseline if rows else None


def _passed_over_undecided(verdict, length: schema.SearchLength) -> list[str]:
    """Candidates tried before the chosen one (or with none chosen) that ended INCONCLUSIVE: they hold
    more capacity than what follows, and were not shown harmful, only undecided on the budget given, so
    the user learns what would decide them (the gate's own words)."""
    out = []
    for text in length.tried:
        cell = cell_id(text, length.max_model_len)
        if text == length.chosen or verdict.cells.get(cell) != "INCONCLUSIVE":
            continue
        decide = next((r.decide for r in verdict.reasons if r.cell == cell and r.level == "INCONCLUSIVE" and r.decide),
                      "")
        out.append(bullet(f"{length.max_model_len}: `{escape_cell(text)}` was passed over undecided, not shown "
                          "harmful" + (f"; to decide: {escape_cell(decide, None)}" if decide else "") + "."))
    return out


def search_section(verdict, evidence: schema.Evidence) -> str:
    search = evidence.search
    if search is None:
        return ""
    out = ["## Search", "",
           "`--search` tries the KV configurations in order of capacity (plain FP8, calibrated per-tensor then "
           "per-head scales, the diagnosed layers kept in the model dtype fewest first, then combinations) and stops "
           "at each max_model_len at the first that PASSes the same gate.", "",
           "Ladder: " + ", ".join(f"`{escape_cell(text)}`" for text in search.candidates) + ".", ""]
    rows = []
    for length in search.lengths:
        for text in length.tried:
            cell = cell_id(text, length.max_model_len)
            ratio, estimated = pool_ratio(evidence.pools, text, [length.max_model_len])
            throughput = _throughput_ratio(evidence, cell)
            rows.append({"max_model_len": length.max_model_len, "candidate": text,
                         "verdict": verdict.cells.get(cell, "MISSING"),
                         f"KV pool × {BASELINE_KV}": fmt_float(ratio, 2) + (" (estimate)" if estimated else ""),
                         f"throughput × {BASELINE_KV}": fmt_float(throughput, 2),
                         "chosen": "yes" if length.chosen == text else ""})
    if rows:
        out += [table(pd.DataFrame(rows), untrusted=("candidate",)), ""]
    for length in search.lengths:
        if length.chosen:
            out.append(bullet(f"{length.max_model_len}: `{escape_cell(length.chosen)}` is the first candidate that "
                              f"passes ({len(length.tried)} tried)."))
        elif length.next:
            out.append(bullet(f"{length.max_model_len}: the search stopped before it ended (next: "
                              f"`{escape_cell(length.next)}`)."))
        out += _passed_over_undecided(verdict, length)
        out += [bullet(escape_cell(note, None)) for note in length.notes]
    for text, why in search.unavailable.items():
        out.append(bullet(f"`{escape_cell(text)}` not run: {escape_cell(why, 300)}"))
    return "\n".join(out).rstrip() + "\n"
