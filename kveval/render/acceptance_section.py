"""The review's prompt acceptance section: which prompts each started cell accepted, and the engine's
message for the first refusal of each cell. Pure: evidence in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.files import schema
from kveval.render.markdown import escape_cell, escape_name, fmt_int, long_table, rows_frame


def acceptance_section(evidence: schema.Evidence) -> str:
    acceptance = evidence.acceptance
    matrix = pd.DataFrame(acceptance.matrix)   # one column per cell id: the rows stay dicts
    if matrix.empty:
        return ""
    # Quality references (auto started only to judge quality) have no acceptance column: they are not a finding.
    started = [name for name, cell in evidence.cells.items() if cell.started and name in matrix.columns]
    symbols = {"accepted": "✓", "rejected": "✗ rejected", "error": "⚠ error", "not run": "—", "not started": ""}
    view = matrix[["prompt", "prompt_tokens", *started]].copy()
    view["prompt_tokens"] = view.prompt_tokens.map(fmt_int)
    # Probe rounds (more than one look) send their probes only to the cells of their round.
    partial = any(len(entry.looks or []) > 1 for entry in evidence.degeneration.cells.values())
    for name in started:
        view[name] = view[name].map(lambda status: symbols.get(status, status))
    submitted = ("Every prompt of the first look was submitted to every started cell, and each round's new probes "
                 "only to the cells of that round (— where a cell was decided before it)" if partial
                 else "Every prompt was submitted to every started cell")
    out = ["## Prompt acceptance", "",
           f"{submitted}; ✗ means the engine refused it (nothing is predicted or truncated).", "",
           long_table(view, f"{len(view)} prompts × {len(started)} cells", names=("prompt",))]
    refused = rows_frame(acceptance.rejections, columns=["cell", "prompt", "kind", "message"])
    if not refused.empty:
        out += ["", "Engine messages (the first refusal of each cell; every message is in the cell files):", ""]
        for cell, group in refused.groupby("cell", sort=False):
            first = group.iloc[0]
            others = (f" (+{len(group) - 1} more: {', '.join(escape_name(p) for p in group.prompt.iloc[1:])})"
                      if len(group) > 1 else "")
            out.append(f"- {cell} / {escape_name(first.prompt)} ({first.kind}){others}: "
                       f"{escape_cell(first.message, 400)}")
    return "\n".join(out)
