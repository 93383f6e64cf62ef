"""The review's degeneration section: findings new against the baseline, those the baseline shows too,
and the counts per cell. Pure: evidence in, markdown out.
"""
from __future__ import annotations

import pandas as pd

from kveval.analysis.cell_records import BASELINE_KV
from kveval.analysis.degeneration import FINDING_COLUMNS, INFORMATIONAL_DETECTORS
from kveval.files import schema
from kveval.render.markdown import fmt_int, fmt_share, folded, long_table, rows_frame, shorten, table

MAX_FINDING_ROWS = 30


def _new_findings_table(new: pd.DataFrame) -> str:
    view = pd.DataFrame({"cell": new.cell, "workload": new.workload, "prompt": new.prompt, "detector": new.detector,
                         "detail": new.detail, "excerpt": new.excerpt.map(lambda t: shorten(t or "", 160))})
    untrusted = ("workload", "prompt", "detail", "excerpt")
    if "baseline_excerpt" in new and new.baseline_excerpt.notna().any():  # the baseline's answer, beside it
        view[f"{BASELINE_KV}'s output"] = new.baseline_excerpt.map(lambda t: shorten(t if isinstance(t, str) else "", 160))
        untrusted += (f"{BASELINE_KV}'s output",)
    shown = view.head(MAX_FINDING_ROWS)
    summary = (f"{len(view)} new findings" if len(shown) == len(view)
               else f"the first {len(shown)} of {len(view)} new findings")
    text = folded(table(shown, untrusted=untrusted), len(shown), summary)
    if len(view) > MAX_FINDING_ROWS:
        text += f"\n\n_{len(view) - MAX_FINDING_ROWS} more in `tables/degeneration_findings.csv`._"
    return text


def _already_table(old: pd.DataFrame) -> str:
    counts = old.groupby(["cell", "detector"], sort=False)["prompt"].nunique().reset_index(name="outputs")
    return long_table(counts.assign(outputs=counts.outputs.map(fmt_int)), f"{len(counts)} rows: cell and detector")


def _already_section(old: pd.DataFrame, nothing_new: bool) -> str:
    if old.empty:
        return ("None: no detector fired on any output, the baseline's included." if nothing_new else
                f"None: the `{BASELINE_KV}` outputs show no finding.")
    return (f"Findings in `{BASELINE_KV}` cells, and findings in other cells that the `{BASELINE_KV}` output for the "
            "same prompt shows too (not counted against the cell), as outputs per detector:\n\n" + _already_table(old))


def _degeneration_cells_table(cells: dict[str, schema.DegenerationCell]) -> str:
    rows = []
    for cell, entry in cells.items():
        fired = ", ".join(f"{d} {n}" for d, n in entry.detectors.items() if n and d not in INFORMATIONAL_DETECTORS)
        rows.append({"cell": cell, "outputs": fmt_int(entry.outputs),
                     "with findings": fmt_int(entry.outputs_with_findings),
                     "degenerate only here": "—" if entry.kv_spec == BASELINE_KV else
                     "not judged: no baseline" if entry.judged_outputs == 0 else fmt_int(entry.new_degenerate),
                     f"only in {BASELINE_KV}": "—" if entry.kv_spec == BASELINE_KV or entry.judged_outputs == 0
                     or entry.baseline_only_degenerate is None else fmt_int(entry.baseline_only_degenerate),
                     "findings by detector": fired or "none",
                     "stopped at the token limit": fmt_share(entry.token_limit_rate)})
    return long_table(pd.DataFrame(rows), f"{len(rows)} cells")


def degeneration_section(evidence: schema.Evidence) -> str:
    degeneration = evidence.degeneration
    findings = rows_frame(degeneration.findings, columns=FINDING_COLUMNS)
    failing = findings[~findings.detector.isin(INFORMATIONAL_DETECTORS)]
    judged = failing[failing.new_vs_baseline.notna()]
    new = judged[judged.new_vs_baseline.astype(bool)]
    old = judged[~judged.new_vs_baseline.astype(bool)]
    unjudged = failing[failing.new_vs_baseline.isna()]
    # The detectors of the run that made the evidence: a re-render names what was scanned then.
    detectors = ", ".join(d for d in degeneration.detectors if d not in INFORMATIONAL_DETECTORS)
    out = ["## Degeneration", "",
           f"Every accepted output is scanned by: {detectors} (hit_token_limit is informational). A finding is new "
           f"when the `{BASELINE_KV}` output for the same prompt does not show the same detector. The verdict counts "
           f"outputs, not findings: one that degenerates here while the `{BASELINE_KV}` output for the same prompt "
           f"does not, against one clean here whose `{BASELINE_KV}` output degenerates; an output that degenerates "
           "with both caches counts for neither, whichever detectors fired.",
           "", f"### New in non-`{BASELINE_KV}` cells", ""]
    if not degeneration.cells:
        out.append("_No started cell produced an output to scan._")
        return "\n".join(out)
    scanned = any(e.outputs for e in degeneration.cells.values() if e.kv_spec != BASELINE_KV)
    out.append(_new_findings_table(new) if not new.empty else
               f"Nothing new: no detector fired on a non-`{BASELINE_KV}` output that the `{BASELINE_KV}` output for "
               "the same prompt does not also show." if scanned else
               f"Nothing to scan: no non-`{BASELINE_KV}` cell produced an output.")
    if not unjudged.empty:
        counts = unjudged.groupby("cell", sort=False)["prompt"].nunique()
        out += ["", f"Not judged (no `{BASELINE_KV}` output for the same prompt, so nothing says whether it is new): "
                + ", ".join(f"{cell} {n} output{'s' if n != 1 else ''}" for cell, n in counts.items()) + "."]
    out += ["", "### Already in the baseline", "", _already_section(old, nothing_new=new.empty)]
    out += ["", "### Per cell", "", _degeneration_cells_table(degeneration.cells)]
    return "\n".join(out)
